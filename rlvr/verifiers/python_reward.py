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

A function that returns ``Verdict``s contributes ``weight * verdict.score``, and its failing
reason is kept. Failures are never a crashed run, and never a hang (nothing here waits):

    reward_error    the function raised: every sample of that call fails, with the ref and the
                    exception in details; a warning is printed once per ref
    invalid_reward  NaN, infinity or a value that is not a number for this sample
    UserError       a wrong-length or non-list return (a systematic bug: one line, the run
                    stops), or a ref that cannot be resolved

The function runs in the trainer's process: it is the user's trusted code, but it receives model
output, which it must never execute.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.errors import UserError
from rlvr.types import Spec, Task, Verdict
from rlvr.verifiers.base import VERIFIERS

PAYLOAD_KEYS = ("functions", "columns", "pass_threshold", "answer_at")
_cache: dict[str, Callable] = {}
_warned: set[str] = set()


def resolve_reward_fn(ref: str) -> Callable:
    """The callable ``ref`` names (``module.path:fn`` or ``path/to/file.py:fn``), cached."""
    if ref in _cache:
        return _cache[ref]
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise UserError(f"reward function {ref!r}: write it as module.path:function or path/file.py:function")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UserError(f"reward function {ref!r}: no file {path}")
        spec = importlib.util.spec_from_file_location(f"rlvr_user_reward_{abs(hash(str(path.resolve())))}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except SyntaxError as e:
            raise UserError(f"reward function {ref!r}: {path}:{e.lineno}: {e.msg}") from None
        except Exception as e:
            raise UserError(f"reward function {ref!r}: importing {path} raised {type(e).__name__}: {e}") from None
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            raise UserError(f"reward function {ref!r}: no module named {e.name!r} (run from the directory "
                            "that holds it, or give a path/file.py)") from None
        except SyntaxError as e:
            raise UserError(f"reward function {ref!r}: {e.filename}:{e.lineno}: {e.msg}") from None
        except Exception as e:
            raise UserError(f"reward function {ref!r}: importing {where} raised {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise UserError(f"reward function {ref!r}: {where} has no attribute {name!r}")
    if not callable(fn):
        raise UserError(f"reward function {ref!r}: {where}.{name} is not callable")
    _cache[ref] = fn
    return fn


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
        return float(x.score), None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:  # numpy / torch scalars
            x = float(x)
        except (TypeError, ValueError):
            return None, f"returned {type(x).__name__}, not a number"
    x = float(x)
    return (x, None) if math.isfinite(x) else (None, f"returned {x}")


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
        names = sorted({k for t in tasks for k in t.spec.payload.get("columns", {})} - {"prompts", "completions"})
        kwargs = {k: [t.spec.payload.get("columns", {}).get(k) for t in tasks] for k in names}
        kwargs["task_ids"] = [t.id for t in tasks]
        prompts = [_prompt_of(t) for t in tasks]
        completions = [c if isinstance(c, str) else "" for _, c in pairs]
        n = len(pairs)
        values: list[dict[str, float]] = [{} for _ in range(n)]
        failures: list[tuple[str, dict] | None] = [None] * n
        total = [0.0] * n
        for ref, weight in fns:
            fn = resolve_reward_fn(ref)
            try:
                returned = fn(prompts=prompts, completions=completions, **kwargs)
            except Exception as e:  # the user's code: a failing verdict, never a crashed run
                message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                if ref not in _warned:
                    _warned.add(ref)
                    print(f"rlvr: warning: reward function {ref} raised {message}; its samples fail (reward_error)",
                          file=sys.stderr)
                for i in range(n):
                    failures[i] = failures[i] or ("reward_error", {"function": ref, "error": message})
                continue
            if not isinstance(returned, (list, tuple)) or len(returned) != n:
                got = f"{len(returned)} values" if isinstance(returned, (list, tuple)) else type(returned).__name__
                raise UserError(f"reward function {ref} returned {got} for {n} completions; it must return "
                                "one float (or None, or Verdict) per completion")
            for i, x in enumerate(returned):
                value, invalid = _value(x)
                if invalid:
                    failures[i] = failures[i] or ("invalid_reward", {"function": ref, "error": invalid})
                    continue
                if value is None:
                    continue
                values[i][ref] = value
                total[i] += weight * value
                if isinstance(x, Verdict) and not x.passed:
                    failures[i] = failures[i] or (x.reason, {"function": ref, **x.details})
        threshold = [float(t.spec.payload.get("pass_threshold", 1.0)) for t in tasks]
        verdicts = []
        for i in range(n):
            details = {"reward": total[i], "rewards": values[i], "format_ok": True}
            if failures[i] is not None:
                reason, extra = failures[i]
                details.pop("reward")  # no value: the outcome is the configured fail_reward
                verdicts.append(Verdict(False, 0.0, reason, {**details, **extra}))
                continue
            passed = total[i] >= threshold[i]
            verdicts.append(Verdict(passed, min(max(total[i], 0.0), 1.0), "ok" if passed else "below_threshold", details))
        return verdicts

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
