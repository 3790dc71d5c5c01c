"""A stage's task set: generated built-in domains plus the user's task files, in one call.

``build_task_set`` is what ``rlvr train``, ``rlvr sft`` and ``rlvr eval`` use: ``domains`` may be
empty (the user's files alone), ``files`` may be empty (the built-in domains alone). File tasks
whose own answer fails their acceptance criteria are dropped with a summary line; code checks
run in the process-wide sandbox, so a caller that owns a run's sandbox opens it first
(``needs_sandbox`` says whether to).
"""

from __future__ import annotations

from rlvr.tasks.base import DOMAINS, generate_tasks
from rlvr.tasks.files import drop_failing, load_tasks
from rlvr.tasks.rows import TaskFileConfig, as_file_config
from rlvr.types import Task


def file_tasks(files: list[TaskFileConfig | str], *, check: bool = True, warn=print) -> list[Task]:
    """The tasks of every file, parsed (a malformed row stops with its file and line), and with
    ``check`` only those that pass their own acceptance criteria."""
    out: list[Task] = []
    for entry in files:
        cfg = as_file_config(entry)
        tasks, _ = load_tasks(cfg, check_solutions=False)
        out += drop_failing(tasks, cfg.path, warn)[0] if check else tasks
    return out


def needs_sandbox(domains: list[str], tasks: list[Task] = ()) -> bool:
    """Whether model output will run as code: a built-in domain that executes it, a code task or
    a multi-turn task among ``tasks``."""
    return any(getattr(DOMAINS.get(d), "needs_sandbox", False) for d in domains) or any(
        t.spec.kind == "code" or t.multi_turn for t in tasks)


def build_task_set(domains: list[str], split: str, n: int, *, seed: int, levels: list[int] | None = None,
                   weights: dict[str, float] | None = None, files: list[TaskFileConfig | str] = (),
                   check: bool = True, warn=print) -> list[Task]:
    """``n`` generated tasks of ``split`` from ``domains`` (none when empty) + the file tasks."""
    tasks = generate_tasks(domains, split, n, seed=seed, levels=levels, weights=weights) if domains else []
    return tasks + file_tasks(list(files), check=check, warn=warn)
