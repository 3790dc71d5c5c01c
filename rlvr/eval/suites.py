"""Named, versioned evaluation suites: which held-out tasks ``rlvr eval --suite NAME`` runs.

A suite fixes the *task selection* (built-in domains, levels, task count, seed, the user's task
files), never the decoding (samples, temperature, ``max_new_tokens`` stay ``EvalConfig``'s,
``--set`` changes them). The built-in suites are entries of ``SUITES``; a user suite is a YAML
file (``--suite path/to/suite.yaml``, ``load_suite_file``). A suite's ``version`` changes
whenever what it selects changes, so a name and version name one task set.

Every eval report records ``suite: {name, version, ...}`` and a ``fingerprint``: the sha256 of
the sorted ``id<TAB>key`` lines of its tasks. Two reports were measured on the same tasks exactly
when their fingerprints are equal (``rlvr.eval.gate`` refuses to compare others).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError, UserError
from rlvr.registry import Registry
from rlvr.tasks.rows import TaskFileConfig
from rlvr.types import Task

EVERY_BUILTIN = "*"
"""In a suite's ``domains``: every registered built-in domain except the reasoning-gym ones (``rg.*``)."""
SELECTION_KEYS = ("domains", "tasks", "levels", "seed", "task_files")
"""The ``EvalConfig`` keys a suite sets."""


@dataclass(frozen=True)
class Suite:
    """One task selection. ``domains`` may hold ``EVERY_BUILTIN`` (resolved when the suite is used)."""

    name: str
    version: str
    domains: tuple[str, ...]
    tasks: int = 500
    levels: tuple[int, ...] = (1, 2, 3, 4)
    seed: int = 1234
    task_files: tuple[TaskFileConfig | str, ...] = ()
    description: str = ""
    source: str = "builtin"
    """``builtin`` or the YAML file the suite came from."""

    def resolved_domains(self) -> list[str]:
        """``domains`` with ``EVERY_BUILTIN`` expanded to the built-in domains registered now."""
        import rlvr.tasks  # noqa: F401  (registers the built-in domains)
        from rlvr.tasks.base import DOMAINS

        out: list[str] = []
        for name in self.domains:
            names = [n for n in DOMAINS.names() if not n.startswith("rg.")] if name == EVERY_BUILTIN else [name]
            out += [n for n in names if n not in out]
        return out

    def eval_fields(self) -> dict[str, Any]:
        """The suite as ``EvalConfig`` keys (a dict ``rlvr.config.from_dict`` accepts)."""
        return {"domains": self.resolved_domains(), "tasks": self.tasks, "levels": list(self.levels),
                "seed": self.seed, "task_files": list(self.task_files)}

    def record(self, modified: list[str] = ()) -> dict[str, Any]:
        """What an eval report keeps of the suite; ``modified``: selection keys a config changed."""
        out: dict[str, Any] = {"name": self.name, "version": self.version, "source": self.source}
        if modified:
            out["modified"] = sorted(modified)
        return out


SUITES: Registry[Suite] = Registry("eval suite")


def _builtin(suite: Suite) -> Suite:
    return SUITES.register(suite.name)(suite)


_builtin(Suite("default", "v1", ("math.arith", "math.word"), tasks=500,
               description="EvalConfig's defaults: 500 math tasks (what `rlvr eval` ran before suites)"))
_builtin(Suite("quickstart", "v1", ("math.arith", "math.word", "code.gen"), tasks=600,
               description="the quickstart's held-out set (runs/quickstart/eval/*.json; it decodes "
                           "with max_new_tokens=64)"))
_builtin(Suite("math", "v1", ("math.arith", "math.word"), tasks=1000,
               description="arithmetic and word problems, 500 each (95% CIs about +-4.4 points per domain)"))
_builtin(Suite("code", "v1", ("code.debug", "code.gen"), tasks=400,
               description="single-turn code: write and fix a function, run against hidden tests in the sandbox"))
_builtin(Suite("agentic", "v1", ("code.repair", "tool.use"), tasks=200,
               description="multi-turn episodes in their environments (repair a repository, query a table)"))
_builtin(Suite("professional", "v1", ("docs.tables", "render.svg", "cad.shapes", "data.analysis"), tasks=800,
               description="professional tools: numbers from quarterly reports (L1-L4, up to ~1.4k tokens), "
                           "SVG scenes rendered and 3D parts measured in the sandbox, SQL over messy data"))
_builtin(Suite("all", "v1", (EVERY_BUILTIN,), tasks=800,
               description="every built-in domain registered (reasoning-gym's rg.* left out); "
                           "the report lists the domains it took"))


def fingerprint(tasks: list[Task]) -> str:
    """sha256 of the sorted ``id<TAB>key`` lines of ``tasks``: equal exactly for the same task set."""
    lines = sorted(f"{t.id}\t{t.key}" for t in tasks)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def report_fingerprint(report: dict) -> str | None:
    """A report's ``fingerprint``, or one computed from its ``tasks`` list (reports written before
    fingerprints); None when it has neither."""
    if isinstance(report.get("fingerprint"), str):
        return report["fingerprint"]
    items = report.get("tasks")
    if not isinstance(items, list) or not items:
        return None
    try:
        lines = sorted(f"{item['id']}\t{item['task'].get('key', '')}" for item in items)
    except (KeyError, TypeError, AttributeError):
        return None
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ---------------------------------------------------------------- user suites (YAML)

_FIELDS = {"name": str, "version": str, "description": str, "domains": list, "levels": list, "tasks": int,
           "seed": int, "task_files": list}
_REQUIRED = ("name", "version")


def looks_like_file(spec: str) -> bool:
    """Whether ``--suite spec`` names a YAML file rather than a built-in suite."""
    return spec.endswith((".yaml", ".yml")) or "/" in spec or Path(spec).is_file()


def get_suite(spec: str) -> Suite:
    """The built-in suite named ``spec``, or the suite of the YAML file ``spec``."""
    return load_suite_file(spec) if looks_like_file(spec) else SUITES.get(spec)


def load_suite_file(path: str | Path) -> Suite:
    """A user suite from YAML; a problem raises ``ConfigError`` naming the file and the key.

    Keys: ``name``, ``version`` (required), ``description``, ``domains`` (built-in domain names, or
    ``"*"`` for every built-in one), ``levels``, ``tasks``, ``seed``, ``task_files`` (paths, or
    mappings of ``TaskFileConfig`` keys; a relative path is relative to the YAML file's folder).
    """
    from rlvr.config import read_yaml

    path = Path(path)
    data = read_yaml(path)

    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"suite file '{path}': key '{key}' {why}")

    for key in data:
        if key not in _FIELDS:
            raise fail(str(key), f"is unknown; allowed: {', '.join(_FIELDS)}")
    for key in _REQUIRED:
        if key not in data:
            raise fail(key, "is missing")
    for key, kind in _FIELDS.items():
        if key in data and (not isinstance(data[key], kind) or isinstance(data[key], bool)):
            raise fail(key, f"must be a {kind.__name__}, got {type(data[key]).__name__} {data[key]!r}")
    for key in ("name", "version"):
        if not data[key].strip():
            raise fail(key, "is empty")
    if data["name"] in SUITES:
        raise fail("name", f"{data['name']!r} is a built-in suite; choose another name")
    domains, levels = _draw(data, fail)
    files = _suite_files(path, data.get("task_files", []), fail)
    if not domains and not files:
        raise fail("domains", "and 'task_files' are both empty: the suite has no tasks")
    return Suite(name=data["name"], version=data["version"], domains=tuple(domains), tasks=data.get("tasks", 1),
                 levels=tuple(levels), seed=data.get("seed", 1234), task_files=tuple(files),
                 description=data.get("description", ""), source=str(path))


def _draw(data: dict, fail: Callable[[str, str], ConfigError]) -> tuple[list, list]:
    """A suite file's ``domains`` and ``levels``, checked (and ``tasks`` where domains are drawn)."""
    import rlvr.tasks  # noqa: F401  (registers the built-in domains)
    from rlvr.tasks.base import DOMAINS

    domains = data.get("domains", [])
    for i, name in enumerate(domains):
        if not isinstance(name, str):
            raise fail(f"domains[{i}]", f"must be a domain name, got {name!r}")
        if name != EVERY_BUILTIN:
            try:
                DOMAINS.get(name)
            except UserError as e:
                raise fail(f"domains[{i}]", f"names no domain: {e}") from None
    levels = data.get("levels", [1, 2, 3, 4])
    for i, level in enumerate(levels):
        if not isinstance(level, int) or isinstance(level, bool) or level < 1:
            raise fail(f"levels[{i}]", f"must be a level >= 1, got {level!r}")
    if not levels:
        raise fail("levels", "is empty")
    if "tasks" in data and data["tasks"] < 1:
        raise fail("tasks", f"must be >= 1, got {data['tasks']}")
    if domains and "tasks" not in data:
        raise fail("tasks", "is missing (how many tasks to draw from 'domains')")
    return domains, levels


def _suite_files(path: Path, entries: list, fail: Callable[[str, str], ConfigError]) -> list[TaskFileConfig]:
    """A suite file's ``task_files``: each a path or a mapping, relative to the suite file, existing."""
    from rlvr.config import from_dict

    files: list[TaskFileConfig] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise fail(f"task_files[{i}]", "must be a path or a mapping with a 'path'")
        entry = {**entry, "path": str(_relative_to(path, entry["path"]))}
        try:
            files.append(from_dict(TaskFileConfig, entry, prefix=f"task_files[{i}]"))
        except ConfigError as e:
            raise ConfigError(f"suite file '{path}': {e}") from None
        if not Path(files[-1].path).exists():
            raise fail(f"task_files[{i}]", f"names no file: {files[-1].path}")
    return files


def _relative_to(suite_file: Path, entry: str) -> Path:
    p = Path(entry).expanduser()
    return p if p.is_absolute() else suite_file.parent / p


def selection_changes(suite: Suite, data: dict[str, Any]) -> list[str]:
    """The selection keys the config/flags set to something other than the suite's."""
    fields = suite.eval_fields()
    return [k for k in SELECTION_KEYS if k in data and data[k] != fields[k]]


def describe(suite: Suite) -> str:
    """One line of ``rlvr eval suites``."""
    domains = ", ".join(suite.resolved_domains()) or "-"
    if EVERY_BUILTIN in suite.domains:
        domains = f"* = {domains}"
    files = f"; files {', '.join(str(getattr(f, 'path', f)) for f in suite.task_files)}" if suite.task_files else ""
    return (f"{suite.name} {suite.version}: {suite.tasks} tasks, levels {list(suite.levels)}, seed {suite.seed}; "
            f"domains {domains}{files}" + (f"\n    {suite.description}" if suite.description else ""))


def tasks_of(suite: Suite, *, check: bool = True, warn=print) -> list[Task]:
    """The suite's tasks, as ``rlvr eval`` builds them (generated eval split + the task files;
    ``check``: only file tasks whose own answer passes, as ``rlvr.tasks.sets.build_task_set``)."""
    from rlvr.tasks.sets import build_task_set

    f = suite.eval_fields()
    return build_task_set(f["domains"], "eval", f["tasks"], seed=f["seed"], levels=f["levels"],
                          files=f["task_files"], check=check, warn=warn)

