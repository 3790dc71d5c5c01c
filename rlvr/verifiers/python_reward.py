"""The ``python`` verifier: the user's own reward functions as acceptance criteria.

A reward function is plain Python, called like TRL's ``reward_funcs``::

    def fn(prompts: list, completions: list[str], **columns) -> list[float | None] | list[Verdict]

once per batch: ``prompts[i]`` is task i's prompt (the text when it is a single user message,
else the message list), ``completions[i]`` the completion text, ``task_ids`` the task ids, and
every other column of the task file a list over the batch (None where a task lacks it). A value
of None means "does not apply to this sample" (skipped in the weighted sum, as in TRL).

Payload: ``{"functions": [{"ref": "mypkg.rewards:fn" | "path/file.py:fn", "weight": 1.0}, ...],
"columns": {...}, "pass_threshold": 1.0}``. A ref names a module importable from the current
directory, or a ``.py`` file; it is resolved once and cached. The verdict of a sample:

    details["reward"]   the weighted sum of the functions' values (unbounded, like TRL's reward);
                        ``rlvr.rewards`` uses it as the outcome term
    details["rewards"]  each function's value
    score               the weighted sum clipped to [0, 1] (``Verdict.score``'s contract)
    passed              weighted sum >= pass_threshold (reason ``ok`` / ``below_threshold``)

A function may return any sequence with a length (a list, tuple, numpy array or tensor) of
numbers (numpy / torch scalars too). One that returns ``Verdict``s contributes
``weight * verdict.score`` to the sum; a failing one fails the sample with its own reason (the sum
is still the reward).

Failures are never a crash with a traceback, and never a hang (nothing here waits):

    reward_error    the function raised: every sample of that call fails, with the ref and the
                    exception in details (outcome = ``reward.fail_reward``); a warning is
                    printed once per ref
    invalid_reward  NaN, infinity or a value that is not a number (a string included) for this
                    sample (outcome = ``reward.fail_reward``)
    UserError       the run stops with one line: a wrong-length or non-sequence return, a ref that
                    cannot be resolved, or a function that raised on ``MAX_CONSECUTIVE_ERRORS``
                    calls in a row (each call is a whole rollout batch, so nothing was learned
                    from any of them: a systematic bug, not a bad sample)

The function runs in the trainer's process, synchronously and without a timeout: it is the user's
own trusted code, but it receives model output, which it must never execute. A function that
never returns stops the run like any user code would.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlvr.errors import UserError
from rlvr.types import Spec, Task, Verdict
from rlvr.verifiers.base import VERIFIERS

PAYLOAD_KEYS = ("functions", "columns", "pass_threshold", "answer_at")
MAX_CONSECUTIVE_ERRORS = 20  # calls of one function in a row that all raised: the run stops
RESERVED_DETAILS = ("reward", "rewards", "format_ok")  # a returned Verdict's details cannot override these
_cache: dict[str, Callable] = {}
_files: dict[Path, Any] = {}  # one module per resolved file, however many refs name it
_warned: set[str] = set()
_consecutive_errors: dict[str, int] = {}
_lock = threading.RLock()  # multi-turn environments verify from threads


def resolve_reward_fn(ref: str) -> Callable:
    """The callable ``ref`` names (``module.path:fn`` or ``path/to/file.py:fn``), cached.

    ``UserError`` naming the ref and what is wrong: no ``:``, no such module or file, an import
    that fails (a syntax error with its file and line), no such attribute, not callable.
    """
    with _lock:
        if ref not in _cache:
            _cache[ref] = _resolve(ref)
        return _cache[ref]


def _resolve(ref: str) -> Callable:
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise UserError(f"reward function {ref!r}: write it as module.path:function or path/file.py:function")
    module = _load_file(ref, Path(where)) if where.endswith(".py") else _import_module(ref, where)
    fn = getattr(module, name, None)
    if fn is None:
        raise UserError(f"reward function {ref!r}: {where} has no attribute {name!r}")
    if not callable(fn):
        raise UserError(f"reward function {ref!r}: {where}.{name} is not callable")
    return fn


def _load_file(ref: str, path: Path) -> Any:
    """The module of a ``.py`` file, run once per file; its directory is importable (appended to
    ``sys.path``, as when Python runs a script), so it can import its neighbours."""
    if not path.is_file():
        raise UserError(f"reward function {ref!r}: no file {path}")
    path = path.resolve()
    if path in _files:
        return _files[path]
    name = f"rlvr_user_reward_{len(_files)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    sys.modules[name] = module  # dataclasses, pickle and typing look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[name]
        if not isinstance(e, Exception):
            raise
        raise _import_error(ref, str(path), e) from None
    _files[path] = module
    return module


def _import_module(ref: str, where: str) -> Any:
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        if e.name and (where == e.name or where.startswith(e.name + ".")):  # the ref's own module
            raise UserError(f"reward function {ref!r}: no module named {e.name!r} (run from the directory "
                            "that holds it, or give a path/file.py)") from None
        raise _import_error(ref, where, e) from None
    except Exception as e:
        raise _import_error(ref, where, e) from None


def _import_error(ref: str, what: str, e: Exception) -> UserError:
    if isinstance(e, SyntaxError):
        return UserError(f"reward function {ref!r}: {e.filename or what}:{e.lineno}: {e.msg}")
    return UserError(f"reward function {ref!r}: importing {what} raised {type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:300]


def validate_payload(payload: dict[str, Any]) -> None:
    """``ValueError`` naming the key when the payload cannot work (functions resolved too)."""
    unknown = sorted(set(payload) - set(PAYLOAD_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; allowed: {', '.join(PAYLOAD_KEYS)}")
    functions = payload.get("functions")
    if not isinstance(functions, list) or not functions:
        raise ValueError("'functions' must be a non-empty list of {ref, weight}")
    for i, f in enumerate(functions):
        if not isinstance(f, dict) or not isinstance(f.get("ref"), str):
            raise ValueError(f"'functions[{i}]' must be {{ref: 'module:fn', weight: 1.0}}")
        weight = f.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"'functions[{i}].weight' must be a finite number")
        try:
            resolve_reward_fn(f["ref"])
        except UserError as e:
            raise ValueError(str(e)) from None
    if not isinstance(payload.get("columns", {}), dict):
        raise ValueError("'columns' must be an object")
    threshold = payload.get("pass_threshold", 1.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise ValueError("'pass_threshold' must be a number")


def _prompt_of(task: Task) -> Any:
    if len(task.prompt) == 1 and task.prompt[0]["role"] == "user":
        return task.prompt[0]["content"]
    return [dict(m) for m in task.prompt]


def _value(x: Any) -> tuple[float | None, str | None]:
    """(number, None), (None, None) for "does not apply", or (None, why it is invalid)."""
    if x is None:
        return None, None
    if isinstance(x, Verdict):
        x = x.score
    if isinstance(x, (str, bytes)):
        return None, f"returned {type(x).__name__} {x!r:.40}, not a number"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:  # numpy / torch scalars
            x = float(x)
        except (TypeError, ValueError):
            return None, f"returned {type(x).__name__}, not a number"
    x = float(x)
    return (x, None) if math.isfinite(x) else (None, f"returned {x}")


class _Raised:
    """What a reward function raised, as ``Type: first line of the message``."""

    def __init__(self, message: str) -> None:
        self.message = message


class PythonRewardVerifier:
    """Spec kind ``python`` (see the module docstring)."""

    name = "python"

    validate_payload = staticmethod(validate_payload)

    def instruction(self, payload: dict[str, Any]) -> str:
        return ""

    def gold_completion(self, payload: dict[str, Any]) -> None:
        return None  # a function states no gold answer

    def check(self, task: Task, completion: str) -> Verdict:
        return self.check_many([(task, completion)])[0]

    def check_many(self, pairs: list[tuple[Task, str]]) -> list[Verdict]:
        groups: dict[tuple, list[int]] = {}
        for i, (task, _) in enumerate(pairs):
            fns = tuple((f["ref"], float(f.get("weight", 1.0))) for f in task.spec.payload["functions"])
            groups.setdefault(fns, []).append(i)
        out: list[Verdict | None] = [None] * len(pairs)
        for fns, idx in groups.items():
            for i, verdict in zip(idx, self._judge(fns, [pairs[i] for i in idx])):
                out[i] = verdict
        return out  # type: ignore[return-value]

    def _judge(self, fns: tuple, pairs: list[tuple[Task, str]]) -> list[Verdict]:
        tasks = [t for t, _ in pairs]
        names = sorted({k for t in tasks for k in t.spec.payload.get("columns", {})}
                       - {"prompts", "completions", "task_ids"})
        columns = {k: [t.spec.payload.get("columns", {}).get(k) for t in tasks] for k in names}
        completions = [c if isinstance(c, str) else "" for _, c in pairs]
        n = len(pairs)
        values: list[dict[str, float]] = [{} for _ in range(n)]
        failures: list[tuple[str, dict] | None] = [None] * n
        total = [0.0] * n
        for ref, weight in fns:
            fn = resolve_reward_fn(ref)
            returned = self._call(fn, ref, tasks, completions, columns)
            if isinstance(returned, _Raised):
                for i in range(n):
                    failures[i] = failures[i] or ("reward_error", {"function": ref, "error": returned.message})
                continue
            for i, x in enumerate(returned):
                value, invalid = _value(x)
                if invalid:
                    failures[i] = failures[i] or ("invalid_reward", {"function": ref, "error": invalid})
                    continue
                if value is None:
                    continue
                values[i][ref] = value
                total[i] += weight * value
                if isinstance(x, Verdict) and not x.passed and failures[i] is None:
                    extra = {k: v for k, v in x.details.items() if k not in RESERVED_DETAILS}
                    failures[i] = (x.reason, {"function": ref, **extra})
        threshold = [float(t.spec.payload.get("pass_threshold", 1.0)) for t in tasks]
        verdicts = []
        for i in range(n):
            details = {"reward": total[i], "rewards": values[i], "format_ok": True}
            score = min(max(total[i], 0.0), 1.0)
            if failures[i] is None:
                passed = total[i] >= threshold[i]
                verdicts.append(Verdict(passed, score, "ok" if passed else "below_threshold", details))
                continue
            reason, extra = failures[i]
            if reason in ("reward_error", "invalid_reward"):  # no value: the outcome is reward.fail_reward
                details.pop("reward")
                score = 0.0
            verdicts.append(Verdict(False, score, reason, {**extra, **details}))
        return verdicts

    @staticmethod
    def _call(fn: Callable, ref: str, tasks: list[Task], completions: list[str],
              columns: dict[str, list]) -> list | _Raised:
        """One TRL-style call on fresh lists (a function may mutate its arguments): the returned
        values as a list of the batch's length, or what it raised."""
        n = len(tasks)
        try:
            returned = fn(prompts=[_prompt_of(t) for t in tasks], completions=list(completions),
                          task_ids=[t.id for t in tasks], **{k: list(v) for k, v in columns.items()})
        except Exception as e:  # the user's code: failing verdicts, not a crashed run
            message = f"{type(e).__name__}: {_first_line(e)}".rstrip(": ")
            with _lock:
                _consecutive_errors[ref] = count = _consecutive_errors.get(ref, 0) + 1
                first = ref not in _warned
                _warned.add(ref)
            if count >= MAX_CONSECUTIVE_ERRORS:
                raise UserError(f"reward function {ref} raised on {count} calls in a row, so no sample got a "
                                f"reward (last: {message}); a function should return None or 0.0 for a "
                                "completion it cannot score: one exception fails its whole batch") from None
            if first:
                print(f"rlvr: warning: reward function {ref} raised {message}; every sample of that call "
                      "fails (reward_error); this is warned once", file=sys.stderr)
            return _Raised(message)
        with _lock:
            _consecutive_errors[ref] = 0
        try:
            length = None if isinstance(returned, (str, bytes, Mapping)) else len(returned)
            values = list(returned) if length is not None else None
        except TypeError:  # no length (a generator, a number, a 0-d tensor)
            length = values = None
        if values is None:
            raise UserError(f"reward function {ref} returned {type(returned).__name__} for {n} completions; "
                            "it must return a list of one float (or None, or Verdict) per completion")
        if length != n:
            raise UserError(f"reward function {ref} returned {length} values for {n} completions; "
                            "it must return one float (or None, or Verdict) per completion")
        return values

    def examples(self) -> list[tuple[Task, str]]:
        """Tasks with passing completions for the registry conformance suite."""
        ref = "rlvr.verifiers.python_reward:exact_answer_reward"
        out = []
        for i, (question, answer) in enumerate([("Name the colour of the sky.", "blue"), ("2 + 2?", "4"),
                                                ("Capital of France?", "Paris"), ("Opposite of up?", "down")]):
            task = Task(id=f"python/example/{i}", domain="file.python", level=1,
                        prompt=({"role": "user", "content": question},),
                        spec=Spec("python", {"functions": [{"ref": ref, "weight": 1.0}], "columns": {"answer": answer}}),
                        key=question)
            out.append((task, f"Answer: {answer}"))
        return out


def exact_answer_reward(prompts: list, completions: list[str], answer: list, **_: Any) -> list[float]:
    """A reward function in TRL's form: 1.0 when the completion has exactly one ``Answer:`` line,
    it is the last line, and it says ``Answer: <answer>``."""
    out = []
    for completion, gold in zip(completions, answer):
        lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
        answers = [line for line in lines if line.startswith("Answer:")]
        out.append(float(gold is not None and len(answers) == 1 and lines[-1] == f"Answer: {gold}"))
    return out


VERIFIERS.register("python")(PythonRewardVerifier())
