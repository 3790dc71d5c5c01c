"""One row of a user's data file -> one ``Task``, by a declared column mapping.

A row is read in one of four schemas, detected per row:

- **HumanEval-style** (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
  ``entry_point``; optional ``domain``, ``level``, ``timeout``): a ``code`` task whose test
  defines ``check(candidate)``; the prompt's code is trusted (helpers it defines are visible to
  the tests, ``rlvr.verifiers.code.tests_with_prompt``). Id ``file:<stem>/<task_id>``.
- **MBPP-style** (``text``, ``code``, ``test_list``; optional ``test_setup_code``, ``task_id``):
  a ``code`` task whose asserts call the function by name (``rlvr.verifiers.code_tests``); the
  prompt shows the description and the first assert as an example, every assert is a hidden test.
- **rlvr's own** (``id``, ``domain``, ``level``, ``prompt``, ``spec``; ``Task.to_dict()``).
- **Question rows**, anything else: the fields below, each read from the column of the same name
  unless ``map`` names another (``map: {prompt: question, answer: solution}``).

Question-row fields:

    prompt      the user's text, or a list of chat messages ({role, content})
    answer      the gold answer (verifiers: math, number, exact, choice, json)
    reference   a reference assistant response (the SFT demonstration)
    verifier    the spec kind for this row (else the file's ``verifier``, else ``math``)
    id  level  tags  split  domain  system
    and the payload fields of verifiers: choices, schema, pattern, example, unit, abs_tol,
    rel_tol, test, entry_point

``options`` adds fixed payload keys for every row (``{answer_at: last_line, abs_tol: 0.01}``; on
HumanEval and MBPP rows too, e.g. ``{image: NAME}``: every row's code runs on that environment
image); a row's own column wins. ``reward: [mod:fn, file.py:fn=0.5]`` makes custom Python functions the
acceptance criteria (spec kind ``python``; every column of the row but the prompt is passed to
them). The prompt gets ``system_prompt`` (unless it has a system message) and an answer-format
instruction: ``instruction: auto`` asks the verifier where the answer must be
(``Verifier.instruction``), ``""`` adds nothing, other text is added as given.

Problems are ``RowError(field, message)``; the loader adds file and line.
"""

from __future__ import annotations

import dataclasses

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlvr.config import check_choice
from rlvr.errors import ConfigError
from rlvr.tasks.readers import FORMATS, Row
from rlvr.types import SINGLE_TURN, Spec, Task

HUMANEVAL_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
RLVR_FIELDS = ("id", "domain", "level", "prompt", "spec")
TASK_FIELDS = ("prompt", "answer", "reference", "verifier", "id", "level", "tags", "split", "domain", "system")
PAYLOAD_FIELDS = ("answer", "choices", "schema", "pattern", "example", "unit", "abs_tol", "rel_tol", "test",
                  "entry_point")
MAPPABLE = tuple(dict.fromkeys(TASK_FIELDS + PAYLOAD_FIELDS))
INSTRUCTION = ("Complete the following Python function. Answer with the whole function in one "
               "```python code block.\n\n```python\n{prompt}```")
MBPP_INSTRUCTION = ("{text}\nAnswer with the function in one ```python code block. "
                    "It should pass tests like this one:\n{example}")
DEFAULT_CODE_DOMAIN = "code.file"
DEFAULT_VERIFIER = "math"
ROLES = ("system", "user", "assistant", "tool")


class RowError(Exception):
    """A problem with one field of one row; the loader adds the file and line."""

    def __init__(self, field_name: str, message: str) -> None:
        label = field_name if field_name.startswith("'") else f"'{field_name}'"
        super().__init__(f"field {label} {message}" if field_name else message)
        self.field = field_name


@dataclass
class TaskFileConfig:
    """One task file and how to read it (``task_files`` entries; a plain string is its path)."""

    path: str = ""
    """JSONL, CSV or Parquet file, or a Hugging Face datasets directory."""
    format: str = "auto"
    """auto | jsonl | csv | parquet | hf (auto: by suffix; a directory is hf)."""
    hf_split: str = ""
    """Split of a DatasetDict directory to read (needed when it has several)."""
    map: dict[str, str] = field(default_factory=dict)
    """Task field -> column, e.g. {prompt: question, answer: solution}; unmapped fields use the
    column of the same name."""
    verifier: str = ""
    """Spec kind of rows without a verifier column (empty: math, or python when reward is set)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Payload keys added to every row's spec, e.g. {answer_at: last_line, abs_tol: 0.01}."""
    reward: list[str] = field(default_factory=list)
    """Custom reward functions as acceptance criteria: module:fn or file.py:fn, optional =weight."""
    system_prompt: str = ""
    """System message put before prompts that have none."""
    instruction: str = "auto"
    """Answer-format instruction added to the user's prompt: auto (the verifier's), '' or text."""
    domain: str = ""
    """Domain of rows without a domain column (empty: file.<verifier>)."""
    split: str = ""
    """Keep only rows whose split column equals this (empty: every row)."""
    level: int = 1
    """Level of rows without a level column."""

    def __post_init__(self) -> None:
        check_choice("task_files.format", self.format, FORMATS)
        for name, column in self.map.items():
            if name not in MAPPABLE:
                raise ConfigError(f"config key 'map.{name}' is not a task field; map one of: {', '.join(MAPPABLE)}")
            if not isinstance(column, str) or not column:
                raise ConfigError(f"config key 'map.{name}' must name a column, got {column!r}")
        if self.reward and self.verifier and self.verifier != "python":
            raise ConfigError(f"a task file has both verifier {self.verifier!r} and reward functions; "
                              "choose one (the functions are the acceptance criteria)")
        if self.reward:
            from rlvr.verifiers.python_reward import resolve_reward_fn

            for f in reward_functions(self.reward):
                resolve_reward_fn(f["ref"])  # a ref that cannot work stops here, once
        if self.verifier:
            from rlvr.verifiers import VERIFIERS

            check_choice("task_files.verifier", self.verifier, VERIFIERS.names())
        if self.level < 1:
            raise ConfigError(f"config key 'level' = {self.level} must be >= 1")


def as_file_config(entry: TaskFileConfig | str) -> TaskFileConfig:
    return entry if isinstance(entry, TaskFileConfig) else TaskFileConfig(path=entry)


def parse_map(text: str) -> dict[str, str]:
    """``"prompt=question,answer=solution"`` -> ``{"prompt": "question", "answer": "solution"}``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, column = part.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ConfigError(f"--map {text!r}: '{part}' must look like field=column")
        out[name.strip()] = column.strip()
    return out


def normalised_prompt(task: Task) -> str:
    """The task's user text, case-folded with whitespace collapsed: duplicates and train/eval
    overlap are found by it."""
    text = " ".join(m["content"] for m in task.prompt if m["role"] == "user")
    return " ".join(text.casefold().split())


# ---------------------------------------------------------------- small readers


def _str(obj: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    if key not in obj:
        if required:
            raise RowError(key, "is missing")
        return None
    if not isinstance(obj[key], str):
        raise RowError(key, "is not a string")
    return obj[key]


def _level(value: Any, name: str = "level", *, text_ok: bool = False) -> int:
    if text_ok and isinstance(value, str) and value.strip().isdigit():  # CSV cells are strings
        value = int(value)
    if type(value) is not int or value < 1:  # not bool, not 2.5
        raise RowError(name, "is not a positive integer")
    return value


def _with_newline(s: str) -> str:
    return s if s.endswith("\n") else s + "\n"


def _messages(value: Any, name: str) -> tuple[dict[str, str], ...]:
    if isinstance(value, str):
        if not value.strip():
            raise RowError(name, "is empty")
        return ({"role": "user", "content": value},)
    if not isinstance(value, (list, tuple)) or not value:
        raise RowError(name, "is not text or a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise RowError(f"{name}[{i}]", f"is not a message with a role ({', '.join(ROLES)}) and string content")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise RowError(name, "has no non-empty user message")
    return tuple(out)


def _tags(value: Any) -> list[str]:
    if isinstance(value, str):
        return [t.strip() for t in re.split(r"[,|;]", value) if t.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
        return list(value)
    raise RowError("tags", "is not a list of strings or a comma-separated string")


def _json_cell(value: Any, name: str, kind: type) -> Any:
    """A list/dict column; CSV cells hold it as JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            if kind is list:  # "a|b|c" is a list of choices too
                return [v.strip() for v in value.split("|")]
            raise RowError(name, "is not valid JSON") from None
    if not isinstance(value, kind):
        raise RowError(name, f"is not a JSON {'list' if kind is list else 'object'}")
    return value


def _number(value: Any, name: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise RowError(name, "is not a number") from None
    if not x >= 0:
        raise RowError(name, "must be a number >= 0")
    return x


# ---------------------------------------------------------------- the four schemas


def humaneval_task(obj: dict[str, Any], stem: str, source: str) -> Task:
    if type(obj.get("task_id")) is int:  # MBPP-style numeric ids
        obj = {**obj, "task_id": str(obj["task_id"])}
    fields = {key: _str(obj, key) for key in HUMANEVAL_FIELDS}
    if not fields["task_id"].strip():
        raise RowError("task_id", "is empty")
    if not fields["entry_point"].isidentifier():
        raise RowError("entry_point", "is not a Python name")
    domain = _str(obj, "domain", required=False) or DEFAULT_CODE_DOMAIN
    payload: dict[str, Any] = {"entry_point": fields["entry_point"], "test": fields["test"],
                               "prompt_code": fields["prompt"]}
    if "timeout" in obj:
        if type(obj["timeout"]) not in (int, float) or not obj["timeout"] > 0:
            raise RowError("timeout", "is not a positive number")
        payload["timeout"] = obj["timeout"]
    prompt = _with_newline(fields["prompt"])
    return Task(
        id=f"file:{stem}/{fields['task_id']}", domain=domain, level=_level(obj.get("level", 1)),
        prompt=({"role": "user", "content": INSTRUCTION.format(prompt=prompt)},),
        spec=Spec("code", payload), key=fields["task_id"],
        reference="```python\n" + _with_newline(prompt + fields["canonical_solution"]) + "```",
        meta={"source": source},
    )


def mbpp_task(obj: dict[str, Any], stem: str, source: str, index: str) -> Task:
    from rlvr.verifiers.code_tests import entry_point_of, tests_from_asserts

    text, code = _str(obj, "text"), _str(obj, "code")
    asserts = obj["test_list"]
    if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
        raise RowError("test_list", "is not a non-empty list of assert strings")
    setup = _str(obj, "test_setup_code", required=False) or ""
    entry_point = entry_point_of(code, asserts)
    if not entry_point:
        raise RowError("code", "defines no function that the asserts call")
    try:
        test = tests_from_asserts(asserts, entry_point, setup)
    except ValueError as e:
        raise RowError("test_list", str(e)) from None
    task_id = str(obj.get("task_id", index))
    return Task(
        id=f"file:{stem}/{task_id}", domain=_str(obj, "domain", required=False) or DEFAULT_CODE_DOMAIN,
        level=_level(obj.get("level", 1)),
        prompt=({"role": "user", "content": MBPP_INSTRUCTION.format(text=text.strip(), example=asserts[0])},),
        spec=Spec("code", {"entry_point": entry_point, "test": test}), key=text.strip(),
        reference="```python\n" + _with_newline(code) + "```", meta={"source": source},
    )


def rlvr_task(obj: dict[str, Any]) -> Task:
    from rlvr.verifiers import VERIFIERS

    for key in ("id", "domain"):
        if not _str(obj, key):
            raise RowError(key, "is empty")
    if "level" not in obj:
        raise RowError("level", "is missing")
    if type(obj["level"]) is not int or obj["level"] < 1:
        raise RowError("level", "is not a positive integer")
    messages = obj.get("prompt")
    if not isinstance(messages, list) or not messages:
        raise RowError("prompt", "is missing" if "prompt" not in obj else "is not a non-empty list of messages")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise RowError(f"prompt[{i}]", "is not a message with string 'role' and 'content'")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise RowError("spec", "is missing" if "spec" not in obj else "is not an object")
    if not isinstance(spec.get("kind"), str):
        raise RowError("spec.kind", "is missing" if "kind" not in spec else "is not a string")
    env = obj.get("env", SINGLE_TURN)
    if env != SINGLE_TURN:  # an episode: its environment judges it, and its spec kind names it
        import rlvr.tasks  # noqa: F401  (registers the built-in domains; rlvr.envs would be a cycle)
        from rlvr.tasks.base import DOMAINS

        envs = sorted({getattr(DOMAINS.get(n), "env", SINGLE_TURN) for n in DOMAINS.names()} - {SINGLE_TURN})
        if not isinstance(env, str) or env not in envs:
            raise RowError("env", f"names no environment {env!r}; choose one of: {', '.join(envs)}")
        if spec["kind"] != env:
            raise RowError("spec.kind", f"is {spec['kind']!r}; a task of environment {env!r} has spec kind {env!r}")
    elif spec["kind"] not in VERIFIERS:
        raise RowError("spec.kind", f"names no verifier {spec['kind']!r}; choose one of: {', '.join(VERIFIERS.names())}")
    if not isinstance(spec.get("payload", {}), dict):
        raise RowError("spec.payload", "is not an object")
    if not isinstance(obj.get("meta", {}), dict):
        raise RowError("meta", "is not an object")
    for where, fields in (("", obj), ("meta.", obj.get("meta", {}))):
        if fields.get("reference") is not None and not isinstance(fields["reference"], str):
            raise RowError(f"{where}reference", "is not a string")
    return Task.from_dict(obj)


def reward_functions(refs: list[str]) -> list[dict[str, Any]]:
    """``["mod:fn", "f.py:g=0.5"]`` -> ``[{"ref": "mod:fn", "weight": 1.0}, {"ref": "f.py:g", "weight": 0.5}]``."""
    out = []
    for text in refs:
        ref, weight = text, 1.0
        head, sep, tail = text.rpartition("=")
        if sep:
            try:
                ref, weight = head, float(tail)
            except ValueError:
                raise ConfigError(f"reward {text!r}: the weight after '=' is not a number") from None
        out.append({"ref": ref.strip(), "weight": weight})
    return out


class _Cells:
    """A row's cells by task field, read through the file's ``map`` (field -> column)."""

    def __init__(self, data: dict[str, Any], mapping: dict[str, str]) -> None:
        self.data, self.mapping = data, mapping

    def column(self, name: str) -> str:
        return self.mapping.get(name, name)

    def get(self, name: str) -> Any:
        return self.data.get(self.column(name))

    def where(self, name: str) -> str:
        """The field as an error names it: the column, and the field it is mapped to."""
        return name if self.column(name) == name else f"'{self.column(name)}' (mapped to '{name}')"


def question_task(row: Row, cfg: TaskFileConfig, stem: str, index: int) -> Task | None:
    """A question row (see the module docstring); None when the file keeps one split and this
    row is in another."""
    from rlvr.verifiers import VERIFIERS

    cells = _Cells(row.data, cfg.map)
    for name, col in cfg.map.items():
        if col not in row.data and name in ("prompt", "answer"):
            raise RowError(cells.where(name), f"is missing (the row has: {', '.join(sorted(row.data)) or 'nothing'})")
    split = cells.get("split")
    if cfg.split and split != cfg.split:
        return None
    if cells.get("prompt") is None:
        raise RowError(cells.where("prompt"), "is missing" + ("" if cfg.map else "; name the prompt column with "
                                                              "--map prompt=COLUMN"))
    prompt = _messages(cells.get("prompt"), cells.where("prompt"))
    kind = cells.get("verifier") or cfg.verifier or ("python" if cfg.reward else DEFAULT_VERIFIER)
    if not isinstance(kind, str) or kind not in VERIFIERS:
        raise RowError(cells.where("verifier"),
                       f"names no verifier {kind!r}; choose one of: {', '.join(VERIFIERS.names())}")
    payload = _payload(cells, kind, cfg)
    prompt = _framed(prompt, cells.get("system") or cfg.system_prompt, _instruction(kind, payload, cfg.instruction))
    reference = cells.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise RowError(cells.where("reference"), "is not a string")
    raw_id = cells.get("id")
    if raw_id is not None and (not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or not str(raw_id).strip()):
        raise RowError(cells.where("id"), "is not a non-empty string or integer")
    meta: dict[str, Any] = {"source": row.where.rsplit(":", 1)[0], "where": row.where}
    if cells.get("tags") is not None:
        meta["tags"] = _tags(cells.get("tags"))
    if split is not None:
        meta["split"] = str(split)
    level = cells.get("level")
    task = Task(id=str(raw_id) if raw_id is not None else f"{stem}:{index}",
                domain=str(cells.get("domain") or cfg.domain or f"file.{kind}"),
                level=_level(level, cells.where("level"), text_ok=True) if level is not None else cfg.level,
                prompt=prompt, spec=Spec(kind, payload), reference=reference, meta=meta)
    return Task(**{**task.__dict__, "key": normalised_prompt(task)})


def _payload(cells: _Cells, kind: str, cfg: TaskFileConfig) -> dict[str, Any]:
    """The spec payload of a question row for verifier ``kind``, checked by the verifier's own
    ``validate_payload`` (a ``python`` row: the reward functions and the row's other columns)."""
    from rlvr.verifiers import VERIFIERS

    payload = dict(cfg.options)
    for name in PAYLOAD_FIELDS:
        value = cells.get(name)
        if value is None:
            continue
        if name == "choices":
            value = _json_cell(value, cells.where(name), list)
        elif name == "schema" or (name == "answer" and kind == "json"):
            value = _json_cell(value, cells.where(name), dict)
        elif name in ("abs_tol", "rel_tol"):
            value = _number(value, cells.where(name))
        elif name == "answer" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        payload[name] = value
    if kind == "python":
        prompt_col = cells.column("prompt")
        payload = {"functions": reward_functions(cfg.reward), **dict(cfg.options),
                   "columns": {k: v for k, v in cells.data.items() if k != prompt_col}}
        if not payload["functions"]:
            raise RowError(cells.where("verifier"), "is python, but no reward functions are configured (--reward mod:fn)")
    validate = getattr(VERIFIERS.get(kind), "validate_payload", None)
    if callable(validate):
        try:
            validate(payload)
        except ValueError as e:
            raise RowError("", f"{kind} spec: {e}") from None
    return payload


def _framed(prompt: tuple, system: Any, instruction: str) -> tuple:
    """The prompt with the system message (when it has none) and the answer-format instruction
    appended to its last user message."""
    if system and not any(m["role"] == "system" for m in prompt):
        prompt = ({"role": "system", "content": str(system)}, *prompt)
    if instruction:
        last = max(i for i, m in enumerate(prompt) if m["role"] == "user")
        prompt = tuple({**m, "content": m["content"].rstrip() + "\n\n" + instruction} if i == last else m
                       for i, m in enumerate(prompt))
    return prompt


def _instruction(kind: str, payload: dict[str, Any], setting: str) -> str:
    from rlvr.verifiers import VERIFIERS

    if setting != "auto":
        return setting
    make = getattr(VERIFIERS.get(kind), "instruction", None)
    return make(payload) if callable(make) else ""


def row_to_task(row: Row, cfg: TaskFileConfig, stem: str, index: int) -> Task | None:
    """The task of one row in whichever schema it is written (``RowError`` naming the field)."""
    obj = row.data
    task = None
    if not cfg.map and "spec" not in obj:
        if "test_list" in obj:
            task = mbpp_task(obj, stem, row.where.rsplit(":", 1)[0], str(index))
        elif "canonical_solution" in obj or "task_id" in obj:
            task = humaneval_task(obj, stem, row.where.rsplit(":", 1)[0])
    if task is not None:  # a code row: the file's options (e.g. {image: NAME}) join its payload
        return dataclasses.replace(task, spec=Spec(task.spec.kind, {**cfg.options, **task.spec.payload})) \
            if cfg.options else task
    if "spec" in obj and not cfg.map:
        return rlvr_task(obj)
    return question_task(row, cfg, stem, index)
