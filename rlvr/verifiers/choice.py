"""The ``choice`` verifier: a multiple-choice answer, by its letter or by the correct option's text.

Payload ``{"answer": "B" | "<option text>", "choices": ["...", "..."], "answer_at": "final"}``
(``choices`` optional; with them, ``answer`` may be the correct option's text and letters run
A.. up to the number of options). The answer at ``answer_at`` passes when it is:

- the correct letter alone, in any of ``B``, ``b``, ``(B)``, ``[B]``, ``B.``, ``B)``, ``B:``;
- the letter followed by the correct option's text (``B. Paris``, ``(B) Paris``);
- the correct option's text alone (case and surrounding whitespace/period ignored).

Two letters (``B, C``, ``B or C``), a letter with another option's text, a letter outside the
options, a letter that is also another option's text (``B`` when option A is ``B``), an unclosed
bracket (``(B``), or any other text fail. Reasons: ``ok``, ``no_answer``, ``multiple_answers``
(from the extraction), ``not_a_choice`` (it names no option), ``mismatch`` (another option).
"""

from __future__ import annotations

import re
import string

from rlvr.types import Task, Verdict
from rlvr.verifiers.answer import check_keys, format_instruction, locate_answer, place_answer
from rlvr.verifiers.base import VERIFIERS, example_task

LETTERS = string.ascii_uppercase
MAX_CHARS = 1000
# (B), [B], or B with an optional ".", ")" or ":"; then optionally the option's text
_LETTER = re.compile(
    r"(?:\((?P<paren>[A-Za-z])\)|\[(?P<bracket>[A-Za-z])\]|(?P<bare>[A-Za-z])[).:]?)(?:\s+(?P<rest>.*))?", re.DOTALL)


def _norm(text: str) -> str:
    return " ".join(text.strip().rstrip(".").split()).casefold()


def gold_letter(payload: dict) -> str:
    answer, choices = str(payload["answer"]).strip(), payload.get("choices") or []
    if len(answer) == 1 and answer.upper() in LETTERS:
        return answer.upper()
    matches = [i for i, c in enumerate(choices) if _norm(c) == _norm(answer)]
    if len(matches) != 1:
        raise ValueError(f"'answer' = {answer!r} is neither a letter nor the text of exactly one of 'choices'")
    return LETTERS[matches[0]]


def read_choice(text: str, choices: list[str]) -> str | None:
    """The letter ``text`` names, or None when it names none or more than one option (``B`` when
    option A's text is ``B`` names both)."""
    s = text.strip()
    if len(s) > MAX_CHARS:
        return None
    texts = [_norm(c) for c in choices]
    if _norm(s) in texts:
        hits = [i for i, t in enumerate(texts) if t == _norm(s)]
        by_letter = _read_letter(s, choices, texts)
        if len(hits) != 1 or by_letter not in (None, LETTERS[hits[0]]):
            return None
        return LETTERS[hits[0]]
    return _read_letter(s, choices, texts)


def _read_letter(s: str, choices: list[str], texts: list[str]) -> str | None:
    m = _LETTER.fullmatch(s)
    if not m:
        return None
    written = m.group("paren") or m.group("bracket") or m.group("bare")
    letter, rest = written.upper(), m.group("rest")
    if choices and LETTERS.index(letter) >= len(choices):
        return None
    if rest is None or not rest.strip():
        return letter if (s[0] in "([" or len(s) <= 2 or written.isupper()) else None
    if choices and _norm(rest) == texts[LETTERS.index(letter)]:
        return letter  # "B. Paris": the letter and its own option
    return None


class ChoiceVerifier:
    """Spec kind ``choice`` (see the module docstring)."""

    name = "choice"

    def check(self, task: Task, completion: str) -> Verdict:
        p = task.spec.payload
        extracted, status = locate_answer(completion, p.get("answer_at", "final"))
        details = {"extracted": extracted, "format_ok": extracted is not None}
        if extracted is None:
            return Verdict(False, 0.0, status, details)
        gold = gold_letter(p)
        got = read_choice(extracted, list(p.get("choices") or []))
        details.update(gold=gold, choice=got)
        if got is None:
            return Verdict(False, 0.0, "not_a_choice", details)
        passed = got == gold
        return Verdict(passed, float(passed), "ok" if passed else "mismatch", details)

    def validate_payload(self, payload: dict) -> None:
        check_keys(payload, ("answer", "choices", "answer_at"))
        if payload.get("answer") is None or not str(payload["answer"]).strip():
            raise ValueError("'answer' is missing")
        choices = payload.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, str) and c.strip() for c in choices) \
                or len(choices) > len(LETTERS):
            raise ValueError(f"'choices' must be a list of at most {len(LETTERS)} non-empty strings")
        if len({_norm(c) for c in choices}) != len(choices):
            raise ValueError("'choices' repeats an option")
        letter = gold_letter(payload)
        if choices and LETTERS.index(letter) >= len(choices):
            raise ValueError(f"'answer' = {letter!r} is not among the {len(choices)} choices")
        if choices and read_choice(str(payload["answer"]), choices) is None:
            raise ValueError(f"'answer' = {payload['answer']!r} is ambiguous: it is a letter and another option's text")

    def gold_completion(self, payload: dict) -> str:
        return place_answer(gold_letter(payload), payload.get("answer_at", "final"))

    def instruction(self, payload: dict) -> str:
        choices = payload.get("choices") or []
        listed = "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(choices))
        where = format_instruction(payload.get("answer_at", "final")).replace("your final answer", "the letter")
        return (f"Options:{listed}\n" if listed else "") + where

    def examples(self) -> list[tuple[Task, str]]:
        rows = [("Largest planet?", ["Mars", "Jupiter", "Venus"], "B"), ("2 + 2?", ["3", "5", "4"], "C"),
                ("Colour of grass?", ["green", "red"], "A"), ("Freezing point of water in C?", ["100", "0", "37", "-40"], "B")]
        return [(example_task("choice", i, q, {"answer": a, "choices": c}), f"Let me think.\nAnswer: {a}")
                for i, (q, c, a) in enumerate(rows)]


VERIFIERS.register("choice")(ChoiceVerifier())
