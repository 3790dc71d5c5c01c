"""``math.arith``: integer arithmetic in four levels, sized for a tiny model trained on a CPU.

    L1  2-digit +/- 1-digit, no carry or borrow      "Compute: 34 + 5"       -> "34 + 5 = 39\nAnswer: 39"
    L2  2-digit +/- 2-digit, no carry or borrow      "Compute: 64 - 23"      -> "64 - 23 = 41\nAnswer: 41"
    L3  2-digit +/- 1- or 2-digit with a carry/borrow "Compute: 47 + 38"     -> "47 + 38 = 85\nAnswer: 85"
    L4  two steps: (a + b) * c, a * b + c, a * b - c "Compute: (3 + 4) * 5"  -> steps, "Answer: 35"

Why these levels: a held-out problem is a new *combination* (new operands), while the skills it
needs (single-digit facts, carrying, the multiplication table) all occur in training problems.
That is what generalisation means for a model this small; held-out atomic facts would demand
grokking. The reference restates each step as an equation (``x op y = z``) before the final
``Answer: N`` line, so the result is computed right next to its operands.

Every answer is a non-negative integer. A worked step that is itself a one-step problem of some
level (``34 + 5``) is a *fact* keyed by its spaceless expression; train problems only reveal
train facts (see ``base``). Steps no level asks for (``3 * 4``) are not problems and reveal
nothing.

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
        if one_step_level(value, op, b) is not None:
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


def carries(a: int, op: str, b: int) -> bool:
    """Whether ``a op b`` needs a carry (+) or a borrow (-) in some digit column."""
    while a or b:
        da, db = a % 10, b % 10
        if (op == "+" and da + db > 9) or (op == "-" and da < db):
            return True
        a, b = a // 10, b // 10
    return False


def one_step_level(a: int, op: str, b: int) -> int | None:
    """The level whose one-step problems include ``a op b``, or None if no level asks it."""
    if op not in "+-" or not 10 <= a <= 99 or not 1 <= b <= 99 or (op == "-" and b > a):
        return None
    if carries(a, op, b):
        return 3
    return 1 if b <= 9 else 2


def _one_step(rng: random.Random, level: int) -> tuple[int, Ops]:
    """Rejection-sample a +/- problem of ``level`` (see ``one_step_level``)."""
    while True:
        a = rng.randint(10, 99)
        b = rng.randint(1, 9) if level == 1 else rng.randint(1, 99) if level == 3 else rng.randint(10, 99)
        op = rng.choice("+-")
        if one_step_level(a, op, b) == level:
            return a, [(op, b)]


def sample_ops(level: int, rng: random.Random) -> tuple[int, Ops]:
    if level in (1, 2, 3):
        return _one_step(rng, level)
    if level == 4:
        form = rng.choice(("add_mul", "mul_add", "mul_sub"))
        if form == "add_mul":
            return rng.randint(1, 9), [("+", rng.randint(1, 9)), ("*", rng.randint(2, 5))]
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        if form == "mul_add":
            return a, [("*", b), ("+", rng.randint(1, 9))]
        return a, [("*", b), ("-", rng.randint(1, min(9, a * b)))]
    raise ValueError(f"{NAME} has no level {level}")


class ArithDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)

    def sample(self, level: int, rng: random.Random) -> Problem:
        a, ops = sample_ops(level, rng)
        text = expression(a, ops)
        return math_problem(text.replace(" ", ""), f"Compute: {text}", a, ops, show_single_step=True)

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
