"""``math.word``: short word problems with integer answers, in four levels.

    L1  one + or - step, 2-digit and 1-digit, no carry   L3  two + / - steps, small numbers
    L2  one + or - step, 2-digit numbers, no carry       L4  two steps with * or exact /

A template is a sentence with ``{n}`` (a name) and ``{a} {b} {c}`` (numbers) plus the operators
applied left to right: ``"+-"`` means ``a + b - c``. The key is the template id and the numbers
(``buy_eat:12:7:4``); the name is decoration, so the same numbers with another name are the same
problem and can never sit in both splits. The reference shows each step as an equation, then
``Answer: N``; those steps are ``math.arith`` facts, so a train word problem never reveals an
eval arithmetic problem.

Not here: answer checking (the ``math`` verifier), paraphrase or distractor sentences.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.tasks.math_arith import apply, math_problem, one_step_level, sample_ops

NAME = "math.word"
NAMES = ("Tom", "Ana", "Sam", "Mia", "Ben", "Lea", "Max", "Zoe")


class Template(NamedTuple):
    id: str
    ops: str
    text: str


def level_of(ops: str) -> tuple[int, ...]:
    """One-step templates serve L1 and L2 (numbers differ), two +/- steps L3, * or / L4."""
    if len(ops) == 1:
        return (1, 2)
    return (4,) if set(ops) & set("*/") else (3,)


TEMPLATES = (
    Template("buy", "+", "{n} has {a} apples and buys {b} more. How many apples does {n} have now?"),
    Template("eat", "-", "{n} has {a} apples and eats {b}. How many apples are left?"),
    Template("spend", "-", "{n} has {a} dollars and spends {b}. How many dollars are left?"),
    Template("join", "+", "There are {a} kids in a park. {b} more come. How many kids are there now?"),
    Template("buy_eat", "+-", "{n} has {a} apples, buys {b} more and eats {c}. How many apples are left?"),
    Template("spend2", "--", "{n} has {a} dollars, spends {b} on a book and {c} on a pen. How many dollars are left?"),
    Template("bus", "-+", "A bus has {a} people. At a stop {b} get off and {c} get on. How many are on the bus now?"),
    Template("boxes", "*-", "{n} buys {a} boxes of {b} pencils and gives away {c}. How many pencils are left?"),
    Template("bags", "*+", "{n} has {a} bags of {b} marbles and finds {c} more. How many marbles are there?"),
    Template("share", "+/", "{n} has {a} sweets, gets {b} more and shares them equally among {c} kids."
                            " How many does each kid get?"),
    Template("split", "/+", "{a} cookies are shared equally among {b} kids. Then each kid gets {c} more."
                            " How many does each kid have?"),
)


def operands(template: Template, level: int, rng: random.Random) -> tuple[int, ...]:
    """Numbers for ``template`` such that every step is a non-negative (exact) integer."""
    ops = template.ops
    if level in (1, 2):  # the numbers of a math.arith problem of the same level and operator
        while True:
            a, [(_, b)] = sample_ops(level, rng)
            if one_step_level(a, ops, b) == level:
                return a, b
    if ops == "+/":
        c = rng.randint(2, 6)
        total = c * rng.randint(2, 10)
        a = rng.randint(1, total - 1)
        return a, total - a, c
    if ops == "/+":
        b = rng.randint(2, 6)
        return b * rng.randint(2, 10), b, rng.randint(1, 9)
    while True:  # rejection: keep drawing until no step goes negative
        if level == 3:
            numbers = (rng.randint(10, 50), rng.randint(1, 20), rng.randint(1, 20))
        else:
            numbers = (rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 20))
        value = numbers[0]
        for op, x in zip(ops, numbers[1:]):
            value = apply(value, op, x)
            if value < 0:
                break
        else:
            return numbers


class WordDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)

    def sample(self, level: int, rng: random.Random) -> Problem:
        template = rng.choice([t for t in TEMPLATES if level in level_of(t.ops)])
        numbers = operands(template, level, rng)
        a, *rest = numbers
        prompt = template.text.format(n=rng.choice(NAMES), **dict(zip("abc", numbers)))
        key = ":".join([template.id, *map(str, numbers)])
        return math_problem(key, prompt, a, list(zip(template.ops, rest)), show_single_step=True)


DOMAINS.register(NAME)(WordDomain())
