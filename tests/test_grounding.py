"""tool.use grounding: answers laundered through a tool fail, honest multi-step episodes pass.

The hacks are what a policy that already "knows" the answer (or fishes for it) can make a tool
print; ``rlvr/envs/tool_grounding.py`` says which rule stops each.
"""

from __future__ import annotations

import re

import pytest

import rlvr.tasks  # noqa: F401  (registers the domains)
from rlvr.envs.base import play
from rlvr.envs.tool_grounding import (
    COPIES,
    calc_replays,
    calc_tracks,
    perturbed_tables,
    question_numbers,
    replay,
    sql_literals_ok,
    tracks,
)
from rlvr.envs.tool_use import FOUND_SCORE, ToolUseEnv, calculate
from rlvr.sandbox import Sandbox
from rlvr.tasks.base import DOMAINS
from rlvr.tool_calls import format_call
from rlvr.verifiers.math import answers_equal

DOMAIN = DOMAINS.get("tool.use")


@pytest.fixture(scope="module")
def env():
    with Sandbox(workers=2) as box:
        yield ToolUseEnv(sandbox=box)


def sql(query: str) -> str:
    return format_call("sql", {"query": query})


def calc(expression: str) -> str:
    return format_call("calculator", {"expression": expression})


def answer(value) -> str:
    return f"Answer: \\boxed{{{value}}}"


def find(level: int, want, limit: int = 400):
    """The first train task of ``level`` (seed 0) for which ``want(task)`` holds."""
    for i in range(limit):
        t = DOMAIN.generate("train", level, i, 0)
        if want(t):
            return t
    raise AssertionError(f"no L{level} task found")


def form(t, query_part: str) -> bool:
    return any(query_part in str(args) for _, args in t.spec.payload["calls"])


def literal_free(g: int, col: str = "qty") -> str:
    """An SQL expression equal to ``g`` with no literal: ``qty/qty`` is 1 on every row."""
    one, two = f"{col}/{col}", f"({col}/{col}+{col}/{col})"
    expr = one
    for bit in bin(g)[3:]:
        expr = f"({expr})*{two}" + (f"+{one}" if bit == "1" else "")
    return expr


def verdict(env, t, actions):
    return play(env, t, actions)[1]


# ---------------------------------------------------------------- the rules, pure


def test_literals_must_come_from_the_question():
    prompt = "Table items(name, kind, price, qty).\nHow many items have a price above 30?"
    assert sql_literals_ok("SELECT COUNT(*) FROM items WHERE price > 30", prompt)
    assert sql_literals_ok("SELECT price FROM items ORDER BY price LIMIT 1 OFFSET 2", prompt)
    for bad in ("SELECT 238 FROM items", "SELECT 200+38 FROM items LIMIT 1",
                "SELECT COUNT(*) FROM items WHERE price > 31", "SELECT CAST('238' AS INT) FROM items",
                "SELECT 0xEE + price - price FROM items", "SELECT 2.38e2 FROM items",
                "SELECT .5 FROM items", "SELECT \"238\" FROM items",
                "SELECT price /* ' */ + 238 /* ' */ FROM items",
                "SELECT COUNT(*) FROM items WHERE kind = 'toy'"):  # 'toy' is not in this question
        assert not sql_literals_ok(bad, prompt), bad
    prompt = "Table items(name, kind, price, qty).\nHow much do 7 'lamp' items cost?"
    assert sql_literals_ok("SELECT price * 7 FROM items WHERE name = 'lamp'", prompt)
    assert not sql_literals_ok("SELECT price * 7 FROM items WHERE name = 'cup'", prompt)
    assert question_numbers(prompt) == {7.0}


def test_perturbed_tables_keep_names_and_kinds_and_are_deterministic():
    rows = [["cup", "toy", 10, 3], ["ink", "food", 5, 1], ["pen", "toy", 99, 20]]
    a, b = perturbed_tables(rows, "k"), perturbed_tables(rows, "k")
    assert a == b and len(a) == len(COPIES) and perturbed_tables(rows, "other") != a
    assert len({str(t) for t in a}) == len(a)  # every copy differs
    for table, what in zip(a, COPIES):
        assert [r[:2] for r in table[:3]] == [r[:2] for r in rows]
        assert all(new[2] > old[2] and new[3] > old[3] for new, old in zip(table, rows))
        extra = table[3:]
        if what == "values":
            assert extra == []
            continue
        assert sorted(r[1] for r in extra) == ["food", "toy"]  # one new row per kind
        assert all(r[0] not in {"cup", "ink", "pen"} and r[2] > max(x[2] for x in table[:3])
                   for r in extra)


def test_tracks_and_replay():
    eq = answers_equal
    assert tracks("34", ["40", "37"], "34", ["40", "37"], eq)
    assert not tracks("34", ["40", "38"], "34", ["40", "37"], eq)  # one copy off
    # the gold among listed rows: only the position that moves with the gold counts
    assert tracks("food, 2\ntoy, 3", ["food, 3\ntoy, 4", "food, 3\ntoy, 4"], "3", ["4", "4"], eq)
    assert not tracks("food, 2\ntoy, 3", ["food, 3\ntoy, 9", "food, 3\ntoy, 9"], "3", ["4", "4"], eq)
    # the expert "price then price * n", even when n equals the price
    calls = [("sql", {"query": "SELECT price FROM items WHERE name = 'x'"}),
             ("calculator", {"expression": "5 * 5"})]
    assert replay(calls, ["5", "25"], ["8"], calculate) == "40"
    assert replay(calls, ["5", "25"], [None], calculate) is None
    # a calculation replayed: each operand from each of its sources, on each copy
    from rlvr.envs.bodies.calculator import evaluate as _evaluate

    known = {34.0: [("41", "40", "37", "36")], 7.0: [("7",) * 4]}
    assert calc_replays("-(34 - 7) * 7", known, 4, _evaluate) == [("-238", "-231", "-210", "-203")]
    assert calc_replays("34 * 8", known, 4, _evaluate) is None  # 8 is not known
    assert calc_replays("1 +", known, 4, _evaluate) is None
    known[7.0].append(("9", "9", "9", "9"))  # 7 also came from somewhere that moves
    assert len(calc_replays("34 * 7", known, 4, _evaluate)) == 2
    replays = [("287", "280", "259", "252")]
    assert calc_tracks(replays, "238", [None, None, "259", "252"], eq)
    assert not calc_tracks(replays, "238", [None, None, "259", "250"], eq)
    assert not calc_tracks([("238",) * 4], "238", ["238"] * 4, eq)  # a gold that never moves


def test_replay_on_the_real_table_gives_the_gold():
    # the replay's substitution reads the generator's calls as they are written (a generator
    # change that breaks it fails here, not as silently unsupported episodes)
    for level in DOMAIN.levels:
        for i in range(60):
            p = DOMAIN.generate("train", level, i, 1).spec.payload
            sql_results = [r for (name, _), r in zip(p["calls"], p["results"]) if name == "sql"]
            assert replay(p["calls"], p["results"], sql_results, calculate) == p["answer"], p


# ---------------------------------------------------------------- honest episodes pass


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_expert_episodes_pass_every_level(env, seed):
    for level in DOMAIN.levels:
        for index in range(12):
            t = DOMAIN.generate("eval" if seed % 2 else "train", level, index, seed)
            v = verdict(env, t, t.actions)
            assert v.passed and v.reason == "ok", (t.id, v)


def test_honest_other_routes_pass(env):
    # a calculation in two calculator steps, the first result feeding the second
    t = find(2, lambda t: "then add" in t.prompt[0]["content"])
    a, b, c = map(int, re.findall(r"\d+", t.spec.payload["calls"][0][1]["expression"]))
    assert verdict(env, t, [calc(f"{a} * {b}"), calc(f"{a * b} + {c}"), answer(a * b + c)]).passed
    # a count read off a GROUP BY listing
    t = find(3, lambda t: form(t, "COUNT(*) FROM items WHERE kind"))
    assert verdict(env, t, [sql("SELECT kind, COUNT(*) FROM items GROUP BY kind"),
                            answer(t.spec.payload["answer"])]).passed
    # a maximum by ORDER BY ... LIMIT 1
    t = find(3, lambda t: form(t, "MAX(price)"))
    kind = t.spec.payload["calls"][0][1]["query"].split("'")[1]
    assert verdict(env, t, [sql(f"SELECT price FROM items WHERE kind = '{kind}' ORDER BY price DESC "
                                "LIMIT 1"), answer(t.spec.payload["answer"])]).passed
    # a minimum read off a listing of every row: the cell moves with the gold on every copy
    t = find(3, lambda t: form(t, "MIN(price)"))
    assert verdict(env, t, [sql("SELECT * FROM items"), answer(t.spec.payload["answer"])]).passed
    # a sum of products: the rows from sql, the sum by the calculator
    t = find(4, lambda t: form(t, "SUM(price * qty)"))
    kind = t.spec.payload["calls"][0][1]["query"].split("'")[1]
    products = [p * q for _, k, p, q in t.spec.payload["rows"] if k == kind]
    assert verdict(env, t, [sql(f"SELECT price * qty FROM items WHERE kind = '{kind}'"),
                            calc(" + ".join(map(str, products))), answer(t.spec.payload["answer"])]).passed
    # a lookup from a listing of every row, then the calculator
    t = find(4, lambda t: t.spec.payload["relies_on"] == "calculator")
    price, n = t.spec.payload["calls"][1][1]["expression"].split(" * ")
    assert verdict(env, t, [sql("SELECT name, price FROM items"), calc(f"{price} * {n}"),
                            answer(t.spec.payload["answer"])]).passed


# ---------------------------------------------------------------- laundered answers fail


@pytest.mark.parametrize("query", [
    "SELECT {g} FROM items",
    "SELECT {a}+{b} FROM items LIMIT 1",
    "SELECT MAX(price)*0+{g} FROM items",
    "SELECT {g} + price - price FROM items",
    "SELECT COUNT(*)*0+{g} FROM items",
    "SELECT {g} WHERE EXISTS(SELECT 1 FROM items)",
    "SELECT CAST('{g}' AS INTEGER) + qty - qty FROM items",
    "SELECT {ones} FROM items LIMIT 1",  # literal-free, but the same on every copy
])
@pytest.mark.parametrize("level", [3, 4])
def test_laundered_sql_fails_and_earns_nothing(env, level, query):
    t = DOMAIN.generate("train", level, 0, 0)
    g = int(t.spec.payload["answer"])
    q = query.format(g=g, a=g // 2, b=g - g // 2, ones=literal_free(g))
    assert verdict(env, t, [sql(q), answer(g)]).reason == "unsupported"
    v = verdict(env, t, [sql(q), answer(g + 1)])  # the result alone was the gold: no partial credit
    assert (v.reason, v.score) == ("mismatch", 0.0)


def test_data_dependent_but_off_target_sql_fails(env):
    t = find(3, lambda t: form(t, "COUNT(*) FROM items WHERE kind"))
    g = int(t.spec.payload["answer"])
    total = len(t.spec.payload["rows"])
    # the row count is known from a first query; the offset is typed in (not in the question)
    assert verdict(env, t, [sql("SELECT COUNT(*) FROM items"), sql(f"SELECT COUNT(*) - {total - g} "
                                                                     "FROM items"), answer(g)]).reason != "ok"
    # the gold found among listed values by coincidence: they change, but not as the gold does
    t = find(3, lambda t: form(t, "COUNT(*)") and int(t.spec.payload["answer"]) in
             [r[3] for r in t.spec.payload["rows"]])
    assert verdict(env, t, [sql("SELECT qty FROM items"), answer(t.spec.payload["answer"])]).reason \
        == "unsupported"


def test_laundered_calculator_fails(env):
    # calculator-only level: numbers from nowhere
    t = DOMAIN.generate("train", 1, 0, 0)
    g = int(t.spec.payload["answer"])
    assert 1000 not in question_numbers(t.prompt[0]["content"])
    assert verdict(env, t, [calc(f"{g - 1000} + 1000"), answer(g)]).reason == "unsupported"
    v = verdict(env, t, [calc(f"{g - 1000} + 1000"), answer(g + 1)])
    assert (v.reason, v.score) == ("mismatch", 0.0)
    # database level: a calculator seeded with a number an sql query laundered
    t = find(4, lambda t: t.spec.payload["relies_on"] == "calculator")
    g = t.spec.payload["answer"]
    name = t.spec.payload["calls"][0][1]["query"].split("'")[1]
    price, n = t.spec.payload["calls"][1][1]["expression"].split(" * ")
    laundered = sql(f"SELECT {price} + qty - qty FROM items WHERE name = '{name}'")
    assert verdict(env, t, [laundered, calc(f"{price} * {n}"), answer(g)]).reason == "unsupported"
    free = sql(f"SELECT {literal_free(int(price))} FROM items LIMIT 1")  # no literal, same on every copy
    assert verdict(env, t, [free, calc(f"{price} * {n}"), answer(g)]).reason == "unsupported"
    offset = int(price) - len(t.spec.payload["rows"])  # depends on the data, but the offset is typed
    assert offset not in question_numbers(t.prompt[0]["content"])
    typed = sql(f"SELECT {offset} + COUNT(*) FROM items")
    assert verdict(env, t, [typed, calc(f"{price} * {n}"), answer(g)]).reason == "unsupported"
    # and the chain goes no further: a second calculator step on an ungrounded result
    assert verdict(env, t, [calc(f"{price} * 1"), calc(f"{price} * {n}"), answer(g)]).reason \
        == "unsupported"
    # the honest chain, for contrast
    assert verdict(env, t, [*t.actions[:-1], answer(g)]).passed


def two_summing_to(values: list[int], total: int) -> tuple[int, int] | None:
    return next(((a, b) for i, a in enumerate(values) for b in values[i + 1:] if a + b == total), None)


def test_fishing_data_numbers_into_the_calculator_fails(env):
    # a count of 'kind' items, made from two quantities that happen to add up to it
    t = find(3, lambda t: form(t, "COUNT(*) FROM items WHERE kind") and two_summing_to(
        [r[3] for r in t.spec.payload["rows"]], int(t.spec.payload["answer"])) is not None)
    a, b = two_summing_to([r[3] for r in t.spec.payload["rows"]], int(t.spec.payload["answer"]))
    assert verdict(env, t, [sql("SELECT qty FROM items"), calc(f"{a} + {b}"),
                            answer(t.spec.payload["answer"])]).reason == "unsupported"
    # a total qty made from the wrong rows
    def fishable(t):
        if not form(t, "SUM(qty)"):
            return False
        kind = t.spec.payload["calls"][0][1]["query"].split("'")[1]
        others = [r[3] for r in t.spec.payload["rows"] if r[1] != kind]
        return two_summing_to(others, int(t.spec.payload["answer"])) is not None
    t = find(3, fishable)
    kind = t.spec.payload["calls"][0][1]["query"].split("'")[1]
    a, b = two_summing_to([r[3] for r in t.spec.payload["rows"] if r[1] != kind], int(t.spec.payload["answer"]))
    assert verdict(env, t, [sql("SELECT qty FROM items"), calc(f"{a} + {b}"),
                            answer(t.spec.payload["answer"])]).reason == "unsupported"
    # the right rows, summed by the calculator, for contrast
    right = [r[3] for r in t.spec.payload["rows"] if r[1] == kind]
    assert verdict(env, t, [sql("SELECT qty FROM items"), calc(" + ".join(map(str, right))),
                            answer(t.spec.payload["answer"])]).passed
    # a count built from the question's own number: 30/30 + 30/30 + ...
    t = find(3, lambda t: form(t, "price >"))
    g, threshold = int(t.spec.payload["answer"]), int(question_numbers(t.prompt[0]["content"]).pop())
    ones = " + ".join([f"{threshold}/{threshold}"] * g)
    assert verdict(env, t, [sql("SELECT COUNT(*) FROM items"), calc(ones), answer(g)]).reason == "unsupported"


def test_found_score_needs_grounding(env):
    t = find(4, lambda t: t.spec.payload["relies_on"] == "sql")
    g = int(t.spec.payload["answer"])
    assert verdict(env, t, [*t.actions[:-1], answer(g + 1)]).score == FOUND_SCORE
    free = sql(f"SELECT {literal_free(g, 'price')} FROM items LIMIT 1")
    assert verdict(env, t, [free, answer(g + 1)]).score == 0.0


def test_grounding_is_one_sandbox_job_and_only_when_needed(env):
    class Counting:
        def __init__(self, box):
            self.box, self.jobs = box, 0

        def run(self, job):
            self.jobs += 1
            return self.box.run(job)

    counting = Counting(env.sandbox)
    e = ToolUseEnv(sandbox=counting)
    t = find(4, lambda t: t.spec.payload["relies_on"] == "calculator")
    g = int(t.spec.payload["answer"])
    for last, jobs, ok in ((answer(g), 1, True), (answer(g + 1), 1, False)):  # FOUND reuses it
        counting.jobs = 0
        e.reset(t)
        for action in t.actions[:-1]:
            e.step(action)
        calls = counting.jobs
        e.step(last)
        v = e.verify()
        assert (v.passed, counting.jobs - calls) == (ok, jobs), v
    counting.jobs = 0
    _, v = play(e, t, [sql("SELECT name FROM items"), answer(g)])  # nothing shows the gold
    assert v.reason == "unsupported" and counting.jobs == 1  # the one sql call, no grounding job
