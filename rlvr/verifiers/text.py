"""The ``exact`` and ``regex`` verifiers: the final answer as text, after declared normalisation.

``exact``: payload ``{"answer": str | [str, ...], "normalize": [...], "answer_at": "final"}``;
passes when the normalised answer equals the normalised gold (any of a list).
``regex``: payload ``{"pattern": str, "flags": [...], "normalize": [...], "answer_at": "final",
"example": str}``; passes when the pattern matches the whole normalised answer (``fullmatch``).
``flags``: ``ignorecase``, ``multiline``, ``dotall``. ``example`` (optional) is an answer that must
pass: it is what ``rlvr tasks validate`` checks the pattern against.

Normalisation steps, applied in this order, only those declared (the answer is always stripped):

    latex        drop ``$``/``\\(``...``\\)`` delimiters, ``\\text{x}``/``\\mathrm{x}`` -> ``x``
    punctuation  drop sentence punctuation (``.,;:!?``), quotes, ``*`` and backticks around the
                 answer (not inside it); signs and symbols stay (``-5``, ``C++``, ``#a1``, ``(x)``)
    whitespace   runs of whitespace become one space
    case         case-folded

Answers longer than ``MAX_CHARS`` fail (``too_long``) before any matching: a task author's pattern
may backtrack badly on long input, and Python's ``re`` has no timeout. Reasons: ``ok``,
``no_answer``, ``multiple_answers``, ``too_long``, ``mismatch``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from rlvr.types import Task, Verdict
from rlvr.verifiers.answer import check_keys, format_instruction, locate_answer, place_answer
from rlvr.verifiers.base import VERIFIERS, example_task

NORMALIZE = ("latex", "punctuation", "whitespace", "case")
FLAGS = {"ignorecase": re.IGNORECASE, "multiline": re.MULTILINE, "dotall": re.DOTALL}
MAX_CHARS = 2000
# sentence punctuation, quotes and markdown emphasis; not signs or symbols, which carry meaning
_PUNCT = ".,;:!?'\"`*“”‘’«»…"
_LATEX_WRAP = re.compile(r"\\(?:text|mathrm|textbf|mathbf|operatorname)\{([^{}]*)\}")


def normalize(text: str, steps: list[str] | tuple[str, ...]) -> str:
    s = text.strip()
    if "latex" in steps:
        s = _LATEX_WRAP.sub(r"\1", s)
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left): -len(right)].strip()
    if "punctuation" in steps:
        s = s.strip(_PUNCT + " \t")
    if "whitespace" in steps:
        s = " ".join(s.split())
    if "case" in steps:
        s = s.casefold()
    return s


def _check_normalize(payload: dict) -> None:
    steps = payload.get("normalize", [])
    if not isinstance(steps, list) or any(s not in NORMALIZE for s in steps):
        raise ValueError(f"'normalize' must be a list of: {', '.join(NORMALIZE)}")


def _locate(task: Task, completion: str) -> tuple[str | None, Verdict | None, dict]:
    p = task.spec.payload
    extracted, status = locate_answer(completion, p.get("answer_at", "final"))
    details: dict[str, Any] = {"extracted": extracted, "format_ok": extracted is not None}
    if extracted is None:
        return None, Verdict(False, 0.0, status, details), details
    if len(extracted) > MAX_CHARS:
        return None, Verdict(False, 0.0, "too_long", {**details, "extracted": extracted[:200]}), details
    return normalize(extracted, p.get("normalize", [])), None, details


class ExactVerifier:
    """Spec kind ``exact`` (see the module docstring)."""

    name = "exact"

    def check(self, task: Task, completion: str) -> Verdict:
        got, failed, details = _locate(task, completion)
        if failed:
            return failed
        golds = task.spec.payload["answer"]
        golds = [golds] if isinstance(golds, str) else golds
        steps = task.spec.payload.get("normalize", [])
        passed = got in {normalize(g, steps) for g in golds}
        return Verdict(passed, float(passed), "ok" if passed else "mismatch", {**details, "gold": golds})

    def validate_payload(self, payload: dict) -> None:
        check_keys(payload, ("answer", "normalize", "answer_at"))
        answer = payload.get("answer")
        golds = [answer] if isinstance(answer, str) else answer
        if not isinstance(golds, list) or not golds or not all(isinstance(g, str) and g.strip() for g in golds):
            raise ValueError("'answer' is missing" if answer is None else
                             "'answer' must be a non-empty string or a list of them")
        _check_normalize(payload)

    def gold_completion(self, payload: dict) -> str:
        answer = payload["answer"]
        return place_answer(answer if isinstance(answer, str) else answer[0], payload.get("answer_at", "final"))

    def instruction(self, payload: dict) -> str:
        return format_instruction(payload.get("answer_at", "final"))

    def examples(self) -> list[tuple[Task, str]]:
        rows = [("Capital of France?", "Paris", ["case"]), ("Opposite of 'up'?", ["down", "downward"], ["case"]),
                ("Chemical symbol of gold?", "Au", []), ("Name a primary colour of light.", ["red", "green", "blue"],
                                                           ["case", "punctuation"])]
        out = []
        for i, (q, a, steps) in enumerate(rows):
            gold = a if isinstance(a, str) else a[0]
            out.append((example_task("exact", i, q, {"answer": a, "normalize": steps}), f"Thinking.\nAnswer: {gold}"))
        return out


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str, flags: int) -> re.Pattern:
    return re.compile(pattern, flags)


def _flags(payload: dict) -> int:
    out = 0
    for name in payload.get("flags", []):
        out |= FLAGS[name]
    return out


class RegexVerifier:
    """Spec kind ``regex`` (see the module docstring)."""

    name = "regex"

    def check(self, task: Task, completion: str) -> Verdict:
        got, failed, details = _locate(task, completion)
        if failed:
            return failed
        p = task.spec.payload
        passed = _compiled(p["pattern"], _flags(p)).fullmatch(got) is not None
        return Verdict(passed, float(passed), "ok" if passed else "mismatch", {**details, "pattern": p["pattern"]})

    def validate_payload(self, payload: dict) -> None:
        check_keys(payload, ("pattern", "flags", "normalize", "answer_at", "example"))
        pattern = payload.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("'pattern' is missing" if pattern is None else "'pattern' must be a non-empty string")
        flags = payload.get("flags", [])
        if not isinstance(flags, list) or any(f not in FLAGS for f in flags):
            raise ValueError(f"'flags' must be a list of: {', '.join(FLAGS)}")
        try:
            _compiled(pattern, _flags(payload))
        except re.error as e:
            raise ValueError(f"'pattern' does not compile: {e}") from None
        _check_normalize(payload)
        if "example" in payload and not isinstance(payload["example"], str):
            raise ValueError("'example' must be a string")

    def gold_completion(self, payload: dict) -> str | None:
        example = payload.get("example")
        return place_answer(example, payload.get("answer_at", "final")) if example else None

    def instruction(self, payload: dict) -> str:
        return format_instruction(payload.get("answer_at", "final"))

    def examples(self) -> list[tuple[Task, str]]:
        rows = [("Give a US ZIP code of five digits.", r"\d{5}", [], "90210"),
                ("Write a date as YYYY-MM-DD.", r"\d{4}-\d{2}-\d{2}", [], "2024-02-29"),
                ("Say yes or no.", r"yes|no", ["case"], "Yes"),
                ("Give a hex colour like #a1b2c3.", r"#[0-9a-f]{6}", ["case"], "#A1B2C3")]
        return [(example_task("regex", i, q, {"pattern": pat, "normalize": steps, "example": ex}),
                 f"Here it is.\nAnswer: {ex}") for i, (q, pat, steps, ex) in enumerate(rows)]


VERIFIERS.register("exact")(ExactVerifier())
VERIFIERS.register("regex")(RegexVerifier())
