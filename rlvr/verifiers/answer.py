r"""Where the final answer of a completion is, read strictly: the ``answer_at`` of a spec.

``locate_answer(text, where)`` returns ``(answer, "ok")`` or ``(None, "no_answer" |
"multiple_answers")`` and never raises on model output. The places (``ANSWER_AT``):

    final        exactly one ``\boxed{...}``, or a last non-empty line ``Answer: ...`` (both may
                 appear when they agree, e.g. ``Answer: \boxed{42}``); the default, and the math
                 domains' rule (``extract_final_answer``)
    boxed        exactly one ``\boxed{...}`` (balanced braces), anywhere
    answer_line  exactly one ``Answer:`` line, and it is the last non-empty line
    last_line    the last non-empty line, stripped
    whole        the whole completion, stripped

Several answers, or none, fail: the gold appearing only in the reasoning counts for nothing. A box
inside an expression is no answer (``-\boxed{42}``, ``2 \cdot \boxed{42}``, ``\boxed{42}^2``,
``\frac{\boxed{42}}{2}``, ``\boxed{42} + 1``: a reader of the box alone would see 42); an operator,
digit or LaTeX operator command right before or after the box (spaces and brackets skipped) makes
it one. ``format_instruction(where)`` is the sentence a prompt gets so the model knows the rule, and
``place_answer(answer, where)`` a completion that states ``answer`` there (a gold answer must pass
its own verifier that way).
"""

from __future__ import annotations

import re

ANSWER_AT = ("final", "boxed", "answer_line", "last_line", "whole")
MAX_ANSWER_TEXT = 1_000_000  # longer completions are not searched (they fail as no_answer); the search is linear
_ANSWER_LINE = re.compile(r"^[ \t]*Answer:(.*)$")
_INSTRUCTIONS = {
    "final": "Give your final answer as \\boxed{...} or on a last line 'Answer: ...'.",
    "boxed": "Put your final answer in \\boxed{...}, once.",
    "answer_line": "End with one line 'Answer: ...' that states your final answer.",
    "last_line": "Write your final answer alone on the last line.",
    "whole": "Reply with the answer only, nothing else.",
}


def _boxed_span(text: str) -> tuple[str, int] | None:
    """Content of the first ``\\boxed{...}`` (balanced braces) and the index just past it, or None
    if malformed."""
    j = text.find("\\boxed") + len("\\boxed")
    while j < len(text) and text[j] in " \t":
        j += 1
    if j >= len(text) or text[j] != "{":
        return None
    depth = 0
    for k in range(j, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[j + 1 : k].strip(), k + 1
    return None


def _boxed_content(text: str) -> str | None:
    """The content of the one box, or None if it is malformed or inside an expression."""
    span = _boxed_span(text)
    if span is None or in_expression(text, text.find("\\boxed"), span[1]):
        return None
    return span[0]


_OPERATOR_COMMANDS = r"\\(?:cdot|times|div|pm|mp|ast|frac|dfrac|tfrac|sqrt|neg|lnot|ln|log|exp|sin|cos|tan)"
_OPERATOR_BEFORE = re.compile(rf"(?:[-+−*/^_|·×÷]|\d|{_OPERATOR_COMMANDS})$")
_OPERATOR_AFTER = re.compile(rf"^(?:[-+−*/^_|·×÷(\[]|\d|{_OPERATOR_COMMANDS}(?![A-Za-z]))")
_EMPHASIS_BEFORE = re.compile(r"(?:^|(?<=\s))\*+$")  # markdown ** opening at a word start
_EMPHASIS_AFTER = re.compile(r"^\*+(?=\s|$|[.,;:!?])")  # and closing at a word end
_OPENING = ("\\left(", "\\left[", "(", "[", "{")
_CLOSING = ("\\right)", "\\right]", ")", "]", "}")


def in_expression(text: str, start: int, end: int) -> bool:
    """Whether the box ``text[start:end]`` is an operand: an operator, digit or operator command
    next to it, past spaces, brackets and markdown emphasis (``-(\\boxed{4})``,
    ``\\frac{\\boxed{4}}{2}``; ``**\\boxed{4}**`` is not)."""
    before, after = text[max(0, start - 100):start].rstrip(), text[end:end + 100].lstrip()  # bounded work
    before = _EMPHASIS_BEFORE.sub("", before).rstrip()
    after = _EMPHASIS_AFTER.sub("", after).lstrip()
    while before.endswith(_OPENING):
        before = before[: -len(next(o for o in _OPENING if before.endswith(o)))].rstrip()
    while after.startswith(_CLOSING):
        after = after[len(next(c for c in _CLOSING if after.startswith(c))):].lstrip()
    return bool(_OPERATOR_BEFORE.search(before) or _OPERATOR_AFTER.match(after))


def extract_final_answer(text: str) -> tuple[str | None, str]:
    """``(answer, "ok")``, or ``(None, "no_answer" | "multiple_answers")``. Fails closed."""
    lines = text.splitlines()
    matches = ((i, _ANSWER_LINE.match(line)) for i, line in enumerate(lines))
    answer_lines = [(i, m.group(1).strip()) for i, m in matches if m]
    n_boxed = text.count("\\boxed")
    if n_boxed > 1 or len(answer_lines) > 1:
        return None, "multiple_answers"
    boxed = _boxed_content(text) if n_boxed else None
    if n_boxed and boxed is None:
        return None, "no_answer"  # an unclosed \boxed{ (e.g. a truncated completion)
    line_answer, line_is_last = None, False
    if answer_lines:
        i, content = answer_lines[0]
        line_answer = boxed if "\\boxed" in content else content
        line_is_last = not any(line.strip() for line in lines[i + 1 :])
    if len({a for a in (boxed, line_answer) if a}) > 1:
        return None, "multiple_answers"
    if boxed:
        return boxed, "ok"
    if line_answer and line_is_last:
        return line_answer, "ok"
    return None, "no_answer"


def _answer_lines(text: str) -> tuple[list[str], list[tuple[int, str]]]:
    lines = text.splitlines()
    found = [(i, m.group(1).strip()) for i, line in enumerate(lines) if (m := _ANSWER_LINE.match(line))]
    return lines, found


def locate_answer(text: str, where: str = "final") -> tuple[str | None, str]:
    """The answer at ``where`` (see the module docstring). ``ValueError`` for an unknown place."""
    if where not in ANSWER_AT:
        raise ValueError(f"unknown answer_at {where!r}; choose one of: {', '.join(ANSWER_AT)}")
    if not isinstance(text, str) or len(text) > MAX_ANSWER_TEXT:
        return None, "no_answer"
    if where == "final":
        return extract_final_answer(text)
    if where == "boxed":
        n = text.count("\\boxed")
        if n > 1:
            return None, "multiple_answers"
        content = _boxed_content(text) if n else None
        return (content, "ok") if content else (None, "no_answer")
    if where == "answer_line":
        lines, found = _answer_lines(text)
        if len(found) > 1:
            return None, "multiple_answers"
        if not found or not found[0][1] or any(line.strip() for line in lines[found[0][0] + 1:]):
            return None, "no_answer"
        return found[0][1], "ok"
    if where == "last_line":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return (lines[-1], "ok") if lines else (None, "no_answer")
    stripped = text.strip()
    return (stripped, "ok") if stripped else (None, "no_answer")


def unwrap_boxed(answer: str) -> str | None:
    """``answer`` without ``\\boxed{...}`` when one box is all of it; ``answer`` itself when it has
    none; None when a box sits inside other text or there are several (``I guess \\boxed{1}``)."""
    n = answer.count("\\boxed")
    if n == 0:
        return answer
    s = answer.strip()
    span = _boxed_span(s) if n == 1 and s.startswith("\\boxed") else None
    return span[0] if span and span[0] and span[1] == len(s) else None


def format_instruction(where: str = "final") -> str:
    """One sentence telling the model where its final answer must be."""
    return _INSTRUCTIONS[where]


def place_answer(answer: str, where: str = "final") -> str:
    """A completion stating ``answer`` at ``where`` (``locate_answer`` reads it back)."""
    if where in ("final", "answer_line"):
        return f"Answer: {answer}"
    if where == "boxed":
        return f"The answer is \\boxed{{{answer}}}."
    return answer


def check_keys(payload: dict, allowed: tuple[str, ...]) -> None:
    """``ValueError`` naming the first key of ``payload`` not in ``allowed``, or a bad answer_at."""
    unknown = sorted(set(payload) - set(allowed))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")
    if payload.get("answer_at", "final") not in ANSWER_AT:
        raise ValueError(f"'answer_at' = {payload['answer_at']!r}; choose one of: {', '.join(ANSWER_AT)}")
