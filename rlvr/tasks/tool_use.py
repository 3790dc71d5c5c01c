r"""``tool.use``: questions that need a tool to answer reliably, in the ``tool.use`` environment.

    L1  calculator, one op on multi-digit numbers   "What is 347 * 58?"
    L2  calculator, two ops stated in words         "Multiply 47 by 23, then add 318."
    L3  sql: one aggregate with a filter            "How many items have kind 'toy'?"
    L4  sql with arithmetic, or sql then calculator "What is the total price * qty of the 'toy'
                                                     items?" / "How much do 7 'lamp' items cost?"

Each SQL task has its own small table ``items(name, kind, price, qty)`` (5-8 rows from the
seeded rng), which is in the spec, never in the prompt: the model has to query it. The gold
answer is computed here in Python (never by running anything). The spec payload::

    {"rows": [[name, kind, price, qty], ...],   # empty for calculator levels
     "answer": "238",
     "relies_on": "calculator" | "sql",         # the tool whose result the expert answer rests on
     "calls": [[tool, {arguments}], ...],       # the scripted expert's calls, in order; also
                                                # replayed on perturbed copies of the table to
                                                # ground answers (rlvr.envs.tool_grounding)
     "results": ["34", "238"]}                  # what those calls return

``Task.actions`` are the expert's assistant turns (each one call, then ``Answer: \boxed{N}``)
and ``Task.reference`` the whole expert episode as plain text (calls, ``tool:`` results, the
answer) for the pretraining corpus. The problem key covers the question and the table, so a
table and question seen in training never come back in eval.
"""

from __future__ import annotations

import hashlib
import json
import random
import re

from rlvr.tool_calls import format_call
from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.types import Spec

NAME = "tool.use"
NAMES = ("apple", "bolt", "cup", "desk", "egg", "fan", "gear", "hat", "ink", "jar", "key",
         "lamp", "map", "nut", "pen", "rope")
KINDS = ("tool", "food", "toy")
SCHEMA = "items(name, kind, price, qty)"


def _answer(value: int) -> str:
    return f"Answer: \\boxed{{{value}}}"


def _rows(rng: random.Random) -> list[list]:
    names = rng.sample(NAMES, rng.randint(5, 8))
    return [[n, rng.choice(KINDS), rng.randint(2, 99), rng.randint(1, 20)] for n in names]


def _calc_level(level: int, rng: random.Random) -> tuple[str, str, int]:
    """(question, expression, value) for L1/L2."""
    if level == 1:
        op = rng.choice("*+-")
        if op == "*":
            a, b = rng.randint(100, 999), rng.randint(11, 99)
        else:
            a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
            if op == "-" and b > a:
                a, b = b, a
        expr = f"{a} {op} {b}"
        return f"What is {expr}?", expr, eval_int(a, op, b)
    form = rng.choice(("mul_add", "mul_sub", "add_mul", "sub_mul"))
    a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(100, 999)
    if form == "mul_add":
        return f"Multiply {a} by {b}, then add {c}.", f"{a} * {b} + {c}", a * b + c
    if form == "mul_sub":
        return f"Multiply {a} by {b}, then subtract {c}.", f"{a} * {b} - {c}", a * b - c
    c, d = rng.randint(100, 999), rng.randint(11, 99)
    if form == "add_mul":
        return f"Add {c} and {a}, then multiply by {d}.", f"({c} + {a}) * {d}", (c + a) * d
    return f"Subtract {a} from {c}, then multiply by {d}.", f"({c} - {a}) * {d}", (c - a) * d


def eval_int(a: int, op: str, b: int) -> int:
    return a * b if op == "*" else a + b if op == "+" else a - b


def _sql_level(level: int, rng: random.Random, rows: list[list]) -> tuple[str, list, list[str], int, str]:
    """(question, expert calls, their results, value, relies_on) for L3/L4 over ``rows``."""
    kinds = [k for k in KINDS if any(r[1] == k for r in rows)]
    kind = rng.choice(kinds)
    of_kind = [r for r in rows if r[1] == kind]
    where = f"WHERE kind = '{kind}'"
    if level == 3:
        form = rng.choice(("count", "sum_qty", "max_price", "min_price", "count_price"))
        if form == "count":
            q, sql, v = f"How many items have kind '{kind}'?", f"SELECT COUNT(*) FROM items {where}", len(of_kind)
        elif form == "sum_qty":
            q, sql, v = (f"What is the total qty of the '{kind}' items?",
                         f"SELECT SUM(qty) FROM items {where}", sum(r[3] for r in of_kind))
        elif form == "max_price":
            q, sql, v = (f"What is the highest price of a '{kind}' item?",
                         f"SELECT MAX(price) FROM items {where}", max(r[2] for r in of_kind))
        elif form == "min_price":
            q, sql, v = (f"What is the lowest price of a '{kind}' item?",
                         f"SELECT MIN(price) FROM items {where}", min(r[2] for r in of_kind))
        else:
            t = rng.choice((20, 30, 40, 50, 60, 70))
            q, sql, v = (f"How many items have a price above {t}?",
                         f"SELECT COUNT(*) FROM items WHERE price > {t}", sum(r[2] > t for r in rows))
        return q, [("sql", {"query": sql})], [str(v)], v, "sql"
    if rng.random() < 0.5:
        v = sum(r[2] * r[3] for r in of_kind)
        return (f"What is the total price * qty of the '{kind}' items?",
                [("sql", {"query": f"SELECT SUM(price * qty) FROM items {where}"})], [str(v)], v, "sql")
    name, _, price, _ = rng.choice(rows)
    n = rng.randint(3, 9)
    return (f"How much do {n} '{name}' items cost?",
            [("sql", {"query": f"SELECT price FROM items WHERE name = '{name}'"}),
             ("calculator", {"expression": f"{price} * {n}"})], [str(price), str(price * n)], price * n, "calculator")


def _numbers_in_args(calls: list) -> set[str]:
    text = " ".join(str(v) for _, args in calls for v in args.values())
    return set(re.findall(r"\d+", text))


def _key(level: int, question: str, rows: list[list]) -> str:
    if not rows:
        return f"L{level}:{question}"
    blob = json.dumps([question, rows], separators=(",", ":"))
    return f"L{level}:" + hashlib.sha256(blob.encode()).hexdigest()[:20]


class ToolUseDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)
    needs_sandbox = True  # the sql tool runs model-written queries in the sandbox
    env = NAME  # episodes in the tool.use environment (rlvr.envs.tool_use)

    def sample(self, level: int, rng: random.Random) -> Problem:
        if level not in self.levels:
            raise ValueError(f"{NAME} has no level {level}")
        while True:
            if level in (1, 2):
                rows: list[list] = []
                question, expr, value = _calc_level(level, rng)
                calls, relies_on = [("calculator", {"expression": expr})], "calculator"
                results = [str(value)]
                prompt = question
            else:
                rows = _rows(rng)
                question, calls, results, value, relies_on = _sql_level(level, rng, rows)
                prompt = f"Table {SCHEMA}.\n{question}"
            # the gold must come from a tool, not be echoed from the call's own arguments
            if str(value) not in _numbers_in_args(calls):
                break
        payload = {"rows": rows, "answer": str(value), "relies_on": relies_on,
                   "calls": [[n, a] for n, a in calls], "results": results}
        actions = [format_call(n, a) for n, a in calls] + [_answer(value)]
        lines = []
        for action, result in zip(actions, results):
            lines += [action, f"tool: {result}"]
        lines.append(actions[-1])
        return Problem(key=_key(level, question, rows), prompt=prompt,
                       spec=Spec(kind=NAME, payload=payload), reference="\n".join(lines),
                       actions=tuple(actions))

    def corpus_text(self, problem: Problem, rng: random.Random) -> str:
        return f"{problem.prompt}\n{problem.reference}"


DOMAINS.register(NAME)(ToolUseDomain())
