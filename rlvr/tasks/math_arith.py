"""``math.arith``: integer arithmetic in four levels, sized for a tiny model trained on a CPU.

    L1  a + b, a - b         a, b in 0..20         "Compute: 17 + 5"        -> "Answer: 22"
    L2  a + b, a - b         a, b in 10..99        "Compute: 64 - 27"       -> "Answer: 37"
    L3  a * b (2..12) or a + b - c (small)         "Compute: 12 + 7 - 4"    -> steps, "Answer: 15"
    L4  (a + b) * c, a * b + c, a * b - c          "Compute: (12 + 7) * 3"  -> steps, "Answer: 57"

Every answer is a non-negative integer and every expression is evaluated left to right (with
parentheses where precedence needs them), so each worked step is one binary fact such as
``19 * 3 = 57``. A fact's key is its spaceless expression (``19*3``), which is also the key of
the one-step problem asking for it; train problems only reveal train facts (see ``base``).

The chain helpers here are shared with ``math.word``. Not here: answer checking (the ``math``
verifier) and curriculum decisions.
"""

from __future__ import annotations

import random
from typing import Sequence

from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.types import Spec

NAME = "math.arith"
Ops = Sequence[tuple[str, int]]  # left-to-right operations applied to a first operand


def apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0 or a % b:
            raise ValueError(f"{a} / {b} is not an exact division")
        return a // b
    raise ValueError(f"unknown operator {op!r}")


def expression(a: int, ops: Ops) -> str:
    """``expression(12, [("+", 7), ("*", 3)]) == "(12 + 7) * 3"``: left to right, as written."""
    text, prev = str(a), None
    for op, b in ops:
        if op in "*/" and prev in ("+", "-"):
            text = f"({text})"
        text, prev = f"{text} {op} {b}", op
    return text


def chain(a: int, ops: Ops) -> tuple[int, list[str], tuple[tuple[str, str], ...]]:
    """Evaluate left to right: (result, one ``"x op y = z"`` line per step, the facts revealed)."""
    value, lines, facts = a, [], []
    for op, b in ops:
        result = apply(value, op, b)
        lines.append(f"{value} {op} {b} = {result}")
        facts.append((NAME, f"{value}{op}{b}"))
        value = result
    return value, lines, tuple(facts)


def math_problem(key: str, prompt: str, a: int, ops: Ops, show_single_step: bool) -> Problem:
    """A ``Problem`` with a ``math`` spec; the reference is the steps, then ``Answer: N``.

    A one-step problem shows its step only when ``show_single_step`` (word problems do, bare
    arithmetic does not: ``Compute: 2 + 3`` -> ``Answer: 5``).
    """
    answer, lines, facts = chain(a, ops)
    steps = lines if (len(lines) > 1 or show_single_step) else []
    reference = "\n".join([*steps, f"Answer: {answer}"])
    spec = Spec(kind="math", payload={"answer": str(answer), "tolerance": 0.0})
    return Problem(key=key, prompt=prompt, spec=spec, reference=reference, reveals=facts)


def _add_or_sub(rng: random.Random, lo: int, hi: int) -> tuple[int, Ops]:
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    if rng.random() < 0.5:
        return a, [("+", b)]
    return max(a, b), [("-", min(a, b))]


def sample_ops(level: int, rng: random.Random) -> tuple[int, Ops]:
    if level == 1:
        return _add_or_sub(rng, 0, 20)
    if level == 2:
        return _add_or_sub(rng, 10, 99)
    if level == 3:
        if rng.random() < 0.5:
            return rng.randint(2, 12), [("*", rng.randint(2, 12))]
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return a, [("+", b), ("-", rng.randint(1, min(20, a + b)))]
    if level == 4:
        form = rng.choice(("add_mul", "mul_add", "mul_sub"))
        if form == "add_mul":
            return rng.randint(1, 12), [("+", rng.randint(1, 12)), ("*", rng.randint(2, 9))]
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        if form == "mul_add":
            return a, [("*", b), ("+", rng.randint(1, 20))]
        return a, [("*", b), ("-", rng.randint(1, min(20, a * b)))]
    raise ValueError(f"{NAME} has no level {level}")


class ArithDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)

    def sample(self, level: int, rng: random.Random) -> Problem:
        a, ops = sample_ops(level, rng)
        text = expression(a, ops)
        return math_problem(text.replace(" ", ""), f"Compute: {text}", a, ops, show_single_step=False)

    def corpus_text(self, problem: Problem, rng: random.Random) -> str:
        # Half the items are bare facts ("17 + 5 = 22", or the steps of a multi-step problem),
        # half are worked problems in the prompt/response layout the model is later asked in.
        if rng.random() < 0.5:
            return problem.prompt + "\n" + problem.reference
        *steps, answer_line = problem.reference.split("\n")
        if steps:
            return "\n".join(steps)
        return f"{problem.prompt.removeprefix('Compute: ')} = {answer_line.removeprefix('Answer: ')}"


DOMAINS.register(NAME)(ArithDomain())
