"""Task files: JSONL, one task per line, in either of two schemas (detected per line).

- **HumanEval-style** (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
  ``entry_point``; optional ``domain``, ``level``, ``timeout``): ``prompt`` is the signature and
  docstring, ``canonical_solution`` the body, ``test`` defines ``check(candidate)``. Becomes a
  ``code`` task with id ``file:<stem>/<task_id>``, the prompt in an instruction, and the
  canonical solution as ``reference`` (one fenced block, as the verifier expects).
- **rlvr's own**: a ``Task.to_dict()`` line (``id``, ``domain``, ``level``, ``prompt``,
  ``spec``; optional ``key``, ``reference``, ``env``, ``actions``, ``meta``), as ``rlvr tasks show``
  prints them; files written before ``key``/``reference``/``env``/``actions`` were fields keep
  them in ``meta``, which is read the same way.

A malformed line is a ``UserError`` naming the file, the 1-based line and the field. A task whose
own reference solution fails its own tests (code tasks: checked in the sandbox, all in one batch)
is dropped, with the reason, and the rest are kept: a task no solution can pass only adds noise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlvr.errors import UserError
from rlvr.types import Spec, Task

HUMANEVAL_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
RLVR_FIELDS = ("id", "domain", "level", "prompt", "spec")
INSTRUCTION = ("Complete the following Python function. Answer with the whole function in one "
               "```python code block.\n\n```python\n{prompt}```")
DEFAULT_DOMAIN = "code.file"
MAX_REASONS_SHOWN = 3


class _LineError(Exception):
    """A problem with one field of one line; ``load_task_file`` adds the file and line."""


def _string(obj: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    if key not in obj:
        if required:
            raise _LineError(f"field {key!r} is missing")
        return None
    if not isinstance(obj[key], str):
        raise _LineError(f"field {key!r} is not a string")
    return obj[key]


def _level(obj: dict[str, Any], key: str = "level", default: int | None = 1) -> int:
    if key not in obj and default is not None:
        return default
    value = obj.get(key)
    if type(value) is not int or value < 1:  # not bool, not "2", not 2.5
        raise _LineError(f"field {key!r} is missing" if key not in obj
                         else f"field {key!r} is not a positive integer")
    return value


def _with_newline(s: str) -> str:
    return s if s.endswith("\n") else s + "\n"


def _humaneval_task(obj: dict[str, Any], stem: str, source: str) -> Task:
    if type(obj.get("task_id")) is int:  # MBPP-style numeric ids
        obj = {**obj, "task_id": str(obj["task_id"])}
    fields = {key: _string(obj, key) for key in HUMANEVAL_FIELDS}
    if not fields["task_id"].strip():
        raise _LineError("field 'task_id' is empty")
    if not fields["entry_point"].isidentifier():
        raise _LineError("field 'entry_point' is not a Python name")
    domain = _string(obj, "domain", required=False) or DEFAULT_DOMAIN
    payload: dict[str, Any] = {"entry_point": fields["entry_point"], "test": fields["test"],
                               "prompt_code": fields["prompt"]}
    if "timeout" in obj:
        if type(obj["timeout"]) not in (int, float) or not obj["timeout"] > 0:
            raise _LineError("field 'timeout' is not a positive number")
        payload["timeout"] = obj["timeout"]
    prompt = _with_newline(fields["prompt"])
    return Task(
        id=f"file:{stem}/{fields['task_id']}", domain=domain, level=_level(obj),
        prompt=({"role": "user", "content": INSTRUCTION.format(prompt=prompt)},),
        spec=Spec("code", payload),
        key=fields["task_id"],
        reference="```python\n" + _with_newline(prompt + fields["canonical_solution"]) + "```",
        meta={"source": source},
    )


def _rlvr_task(obj: dict[str, Any]) -> Task:
    from rlvr.verifiers import VERIFIERS

    for key in ("id", "domain"):
        if not _string(obj, key):
            raise _LineError(f"field {key!r} is empty")
    _level(obj, default=None)
    messages = obj.get("prompt")
    if not isinstance(messages, list) or not messages:
        raise _LineError("field 'prompt' is missing" if "prompt" not in obj
                         else "field 'prompt' is not a non-empty list of messages")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise _LineError(f"field 'prompt[{i}]' is not a message with string 'role' and 'content'")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise _LineError("field 'spec' is missing" if "spec" not in obj else "field 'spec' is not an object")
    if not isinstance(spec.get("kind"), str):
        raise _LineError("field 'spec.kind' is missing" if "kind" not in spec
                         else "field 'spec.kind' is not a string")
    if spec["kind"] not in VERIFIERS:
        raise _LineError(f"field 'spec.kind': no verifier {spec['kind']!r}; "
                         f"choose one of: {', '.join(VERIFIERS.names())}")
    if not isinstance(spec.get("payload", {}), dict):
        raise _LineError("field 'spec.payload' is not an object")
    if not isinstance(obj.get("meta", {}), dict):
        raise _LineError("field 'meta' is not an object")
    for where, fields in (("", obj), ("meta.", obj.get("meta", {}))):
        if fields.get("reference") is not None and not isinstance(fields["reference"], str):
            raise _LineError(f"field '{where}reference' is not a string")
    return Task.from_dict(obj)


def parse_line(text: str, stem: str, source: str) -> Task:
    """One JSONL line as a Task (raises ``_LineError`` naming the field)."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise _LineError(f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise _LineError(f"expected a JSON object, got {type(obj).__name__}")
    if "task_id" in obj or "canonical_solution" in obj:
        return _humaneval_task(obj, stem, source)
    if "spec" in obj or "id" in obj:
        return _rlvr_task(obj)
    raise _LineError("neither a HumanEval-style task (fields " + ", ".join(HUMANEVAL_FIELDS)
                     + ") nor an rlvr task (fields " + ", ".join(RLVR_FIELDS) + ")")


def _check_references(tasks: list[Task]) -> list[str | None]:
    """For each task, why its reference fails its own acceptance criteria, or None."""
    from rlvr.verifiers import check_all
    from rlvr.verifiers.code import check_spec

    reasons: list[str | None] = [None] * len(tasks)
    to_check: list[int] = []
    for i, task in enumerate(tasks):
        if task.spec.kind != "code":
            continue  # only code references are executed here
        try:
            check_spec(task)
        except UserError as e:
            reasons[i] = str(e)
            continue
        if isinstance(task.reference, str):
            to_check.append(i)
    verdicts = check_all([(tasks[i], tasks[i].reference) for i in to_check])
    for i, verdict in zip(to_check, verdicts):
        if not verdict.passed:
            error = verdict.details.get("error") or verdict.details.get("stderr") or ""
            reasons[i] = (f"task {tasks[i].id}: reference solution fails its tests: "
                          f"{verdict.reason}" + (f" ({str(error).strip()[:200]})" if error else ""))
    return reasons


def load_task_file(path: str | Path, *, check_solutions: bool = True,
                   warn=print) -> tuple[list[Task], list[str]]:
    """Tasks from a JSONL file, and the reasons for the ones dropped.

    Raises ``UserError`` (``FILE:LINE: field 'x' is missing``) on a malformed line or a duplicate
    id. With ``check_solutions``, each code task's reference must pass its own tests (one
    sandbox batch for the whole file); failing tasks are dropped and ``warn`` gets one summary
    line. Blank lines are skipped.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read task file {path}: {e}") from None
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            task = parse_line(text, path.stem, str(path))
        except _LineError as e:
            raise UserError(f"{path}:{lineno}: {e}") from None
        if task.id in seen:
            raise UserError(f"{path}:{lineno}: field 'id' repeats task {task.id!r} "
                            f"(line {seen[task.id]})")
        seen[task.id] = lineno
        tasks.append(task)
    if not check_solutions:
        return tasks, []
    reasons = _check_references(tasks)
    kept = [t for t, r in zip(tasks, reasons) if r is None]
    dropped = [r for r in reasons if r is not None]
    summary = f"kept {len(kept)} of {len(tasks)} tasks from {path}"
    if dropped:
        shown = "; ".join(dropped[:MAX_REASONS_SHOWN])
        more = f"; and {len(dropped) - MAX_REASONS_SHOWN} more" if len(dropped) > MAX_REASONS_SHOWN else ""
        summary += f"; dropped {len(dropped)}: {shown}{more}"
    warn(summary)
    return kept, dropped
