r"""The ``number`` verifier: the final answer is one number, compared exactly or within tolerance.

Payload ``{"answer": "1250" | 1250, "abs_tol": 0.0, "rel_tol": 0.0, "unit": "", "answer_at": "final"}``.
The answer at ``answer_at`` (``rlvr.verifiers.answer``) must read as exactly one number:

- integers, decimals, ``3/4``, ``\frac{3}{4}``, scientific ``1.2e3``, a sign (``-``, ``−``);
- thousands separators in the usual shapes (``1,250``, ``1{,}250``, ``1,\!250``, ``1 250``);
  a comma in any other shape (``1,25``) separates two numbers, which fails;
- a leading currency sign (``$``, ``\$``, ``€``, ``£``), a trailing period, LaTeX math delimiters
  around the whole answer (``$42$``, ``\(42\)``) and ``\text{...}`` around a unit are dropped;
- a trailing ``%`` (or ``\%``, ``percent``) is a unit: ``50%`` is the number 50. A gold of
  ``50%`` (or a payload ``unit`` of ``%``) is matched by ``50%`` and ``50``; ``0.5`` does not
  match it (a fraction is not the percent). An answer with ``%`` fails against a gold without
  it (``wrong_unit``): ``50%`` is neither ``0.5`` nor ``50`` when the gold is a plain number;
- one trailing unit word (``12 cm``, ``8 apples``): when the payload (or a gold such as
  ``12 cm``) names a ``unit``, a unit in the answer must be it (case-insensitive, plural ``s``
  allowed); without one, any single word except those that change the value or hedge
  (``12 million``, ``12k``, ``12M``, ``12 squared``, ``12 or``: ``not_a_number``).
  Anything else around the number (``about 12``, ``12 or 13``, ``x = 12``, ``4 2``) fails;
- an exponent beyond ``MAX_EXPONENT`` (``1e400`` is fine, ``1e9999999`` is not) is not a number
  (the exact comparison would build a huge integer).

A fraction is a final answer only where the gold is not an integer (``3/4`` for ``0.75``): for a
whole-number gold, ``48/6`` is the question's arithmetic written back (``48 stickers shared among
6 kids``), not its answer (``not_final``), as in the ``math`` verifier.

Equal means: exactly equal (as fractions) when both tolerances are 0, else
``|answer - gold| <= max(abs_tol, rel_tol * |gold|)``, also in exact arithmetic on the decimals as
written (``abs_tol`` 0.3 is 3/10; nothing overflows). Reasons: ``ok``, ``no_answer``,
``multiple_answers`` (from the extraction, or several numbers), ``not_a_number``, ``wrong_unit``,
``not_final``, ``mismatch``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from rlvr.types import Task, Verdict
from rlvr.verifiers.answer import check_keys, format_instruction, locate_answer, place_answer
from rlvr.verifiers.base import VERIFIERS, example_task

PAYLOAD_KEYS = ("answer", "abs_tol", "rel_tol", "unit", "answer_at")
MAX_CHARS = 100
MAX_EXPONENT = 1000
_SPACE = re.compile(r"\\[,;:! ]|~|\u202f|\u2009|\u00a0")
_THOUSANDS = re.compile(r"\d{1,3}(?:(?:,|\{,\}|,\\!| )\d{3})+(?:\.\d+)?")
_NUMBER = r"[-+−]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_FORMS = [
    re.compile(rf"(?P<a>{_NUMBER})\s*/\s*(?P<b>\d+)"),
    re.compile(r"(?P<sign>[-+−]?)\\[dt]?frac\{(?P<a>\d+)\}\{(?P<b>\d+)\}"),
    re.compile(rf"(?P<a>{_NUMBER})"),
]
_FRACTION = re.compile(r"\d\s*/\s*\d|\\[dt]?frac\b")
_UNIT = re.compile(r"[A-Za-zµ°][A-Za-zµ°²³/.]{0,19}")
_ANY_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_TEXT = re.compile(r"\\(?:text|mathrm)\{([^{}]*)\}")  # 12\text{ cm}
_EXPONENT = re.compile(r"[eE]([-+]?\d+)")
# without a declared unit, a trailing word must not change the value (scale, power) or hedge
_NOT_A_UNIT = {"hundred", "thousand", "million", "billion", "trillion", "dozen", "lakh", "crore", "k", "mn",
               "bn", "squared", "cubed", "times", "or", "and", "to", "plus", "minus", "less", "more", "over",
               "by", "approx", "approx.", "approximately", "roughly", "about", "ish", "not", "maybe", "e"}
_SCALE_LETTERS = {"K", "M", "B", "G", "T"}  # 12M is twelve million unless the payload's unit says metres


def parse_number(text: str) -> tuple[Fraction | None, str, str]:
    """``(value, unit, reason)``: the one number in ``text`` and its unit word as written (``%`` for percent),
    or ``(None, "", reason)`` with reason ``not_a_number`` or ``multiple_answers``."""
    s = _SPACE.sub(" ", str(text).replace(",\\!", "{,}")).strip()
    if len(s) > MAX_CHARS:
        return None, "", "not_a_number"
    s = s.replace("\\%", "%").rstrip(".").strip()
    for left, right in (("$", "$"), ("\\(", "\\)")):  # LaTeX math delimiters around the whole answer
        if len(s) > len(left + right) and s.startswith(left) and s.endswith(right):
            s = s[len(left): -len(right)].strip().rstrip(".").strip()
    s = _TEXT.sub(r" \1", s).strip()
    s = re.sub(r"^(?:\\\$|\$|€|£)\s*", "", s)
    s = re.sub(r"^([-+−])\s*(?:\\\$|\$|€|£)\s*", r"\1", s)
    m = _THOUSANDS.match(s.lstrip("-+−"))
    if m:
        sign = s[: len(s) - len(s.lstrip("-+−"))]
        s = sign + re.sub(r",\\!|\{,\}|,| ", "", m.group(0)) + s.lstrip("-+−")[m.end():]
    for form in _FORMS:
        m = form.match(s)
        if m:
            break
    else:
        return None, "", ("multiple_answers" if len(_ANY_NUMBER.findall(s)) > 1 else "not_a_number")
    exponent = _EXPONENT.search(m.group("a"))
    if exponent and abs(int(exponent.group(1))) > MAX_EXPONENT:
        return None, "", "not_a_number"
    try:
        a = Fraction(m.group("a").replace("−", "-"))
        value = a / Fraction(m.group("b")) if "b" in m.groupdict() and m.group("b") else a
    except (ValueError, ZeroDivisionError):
        return None, "", "not_a_number"
    if m.groupdict().get("sign") in ("-", "−"):
        value = -value
    rest = s[m.end():].strip()
    if not rest:
        return value, "", "ok"
    if rest in ("%", "percent"):
        return value, "%", "ok"
    if _UNIT.fullmatch(rest):
        return value, rest.rstrip("."), "ok"
    return None, "", ("multiple_answers" if _ANY_NUMBER.search(rest) else "not_a_number")


def _same_unit(got: str, unit: str) -> bool:
    got, unit = got.lower(), unit.lower()
    return got in (unit, unit + "s", unit + "es") or (unit == "%" and got == "percent")


def _changes_value(word: str) -> bool:
    """A trailing word that is a scale, a power or a hedge, not a unit (``12 million``, ``12 or``)."""
    plain = word.lower()
    return word in _SCALE_LETTERS or plain in _NOT_A_UNIT or plain.rstrip("s") in _NOT_A_UNIT


def _as_float(value: Fraction) -> float | None:
    try:
        return float(value)
    except OverflowError:
        return None


class NumberVerifier:
    """Spec kind ``number`` (see the module docstring)."""

    name = "number"

    def check(self, task: Task, completion: str) -> Verdict:
        p = task.spec.payload
        gold, gold_unit, _ = parse_number(str(p["answer"]))
        unit = str(p.get("unit") or gold_unit)
        extracted, status = locate_answer(completion, p.get("answer_at", "final"))
        details: dict[str, Any] = {"extracted": extracted, "gold": str(p["answer"]), "format_ok": extracted is not None}
        if extracted is None:
            return Verdict(False, 0.0, status, details)
        value, got_unit, reason = parse_number(extracted)
        if value is None:
            return Verdict(False, 0.0, reason, details)
        details["value"] = _as_float(value)
        if got_unit and (unit and not _same_unit(got_unit, unit) or not unit and got_unit == "%"):
            return Verdict(False, 0.0, "wrong_unit", {**details, "unit": got_unit})
        if got_unit and not unit and _changes_value(got_unit):
            return Verdict(False, 0.0, "not_a_number", {**details, "unit": got_unit})
        if _FRACTION.search(extracted) and gold.denominator == 1 and not _FRACTION.search(str(p["answer"])):
            return Verdict(False, 0.0, "not_final", details)
        # exact arithmetic on the decimals as written (abs_tol 0.3 is 3/10), so nothing overflows
        tol = max(Fraction(str(p.get("abs_tol", 0.0))), Fraction(str(p.get("rel_tol", 0.0))) * abs(gold))
        passed = abs(value - gold) <= tol
        return Verdict(passed, float(passed), "ok" if passed else "mismatch", details)

    def validate_payload(self, payload: dict) -> None:
        check_keys(payload, PAYLOAD_KEYS)
        if "answer" not in payload:
            raise ValueError("'answer' is missing")
        value, gold_unit, _ = parse_number(str(payload["answer"]))
        if value is None or isinstance(payload["answer"], bool):
            raise ValueError(f"'answer' = {payload['answer']!r} is not one number")
        if gold_unit and _changes_value(gold_unit):
            raise ValueError(f"'answer' = {payload['answer']!r}: write the number in full "
                             f"({gold_unit!r} is not a unit)")
        for key in ("abs_tol", "rel_tol"):
            x = payload.get(key, 0.0)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < float("inf"):
                raise ValueError(f"'{key}' must be a finite number >= 0")
        if not isinstance(payload.get("unit", ""), str):
            raise ValueError("'unit' must be a string")

    def gold_completion(self, payload: dict) -> str:
        return place_answer(str(payload["answer"]), payload.get("answer_at", "final"))

    def instruction(self, payload: dict) -> str:
        return format_instruction(payload.get("answer_at", "final")) + " The answer is a number."

    def examples(self) -> list[tuple[Task, str]]:
        rows = [("How many legs do 3 spiders have?", "24", {}), ("Half of 3?", "1.5", {"abs_tol": 0.01}),
                ("What share of 8 is 2, in percent?", "25%", {}), ("Grams in 1.25 kg?", "1,250", {"unit": "g"}),
                ("Speed of light in km/s, to the nearest km/s?", "299792", {"abs_tol": 0.5})]
        return [(example_task("number", i, q, {"answer": a, **extra}), f"Some working.\nAnswer: {a}")
                for i, (q, a, extra) in enumerate(rows)]


VERIFIERS.register("number")(NumberVerifier())
