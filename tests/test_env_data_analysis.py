"""``data.analysis``: the expert's query passes on every level; the naive analysis of messy data
fails (duplicates counted twice, missing prices as zero, one date form only); answers laundered
through constant or offset queries, or typed without a query, are unsupported; tables are compared
cell by cell."""

from __future__ import annotations

import re

import pytest

import rlvr.envs  # noqa: F401  (registration)
import rlvr.tasks  # noqa: F401
from rlvr.envs.base import make_env, play
from rlvr.envs.data_analysis import read_table
from rlvr.tasks.base import DOMAINS
from rlvr.tasks.data_analysis import REGIONS, answer, copies, expert_sql, rows_for
from rlvr.tool_calls import format_call

DOMAIN = DOMAINS.get("data.analysis")


@pytest.fixture(scope="module")
def env(sandbox):
    e = make_env("data.analysis", sandbox=sandbox)
    yield e
    e.close()


def sql(query: str) -> str:
    return format_call("sql", {"query": query})


def task_of(level: int, kind: str, split: str = "train"):
    for i in range(200):
        t = DOMAIN.generate(split, level, i, 0)
        if t.spec.payload["question"]["kind"] == kind:
            return t
    raise AssertionError(f"no {kind} task at level {level}")


@pytest.mark.slow  # the conformance suite plays every domain's references by default
def test_the_expert_passes_every_level_and_split(env):
    for split in ("train", "eval"):
        for level in DOMAIN.levels:
            for i in range(3):
                t = DOMAIN.generate(split, level, i, 0)
                _, verdict = play(env, t, list(t.actions))
                assert verdict.passed, (t.id, verdict)


def test_the_data_is_messy_as_the_level_says():
    clean, missing, doubled, dated = (rows_for(7, level) for level in (1, 2, 3, 4))
    assert len(clean) == 200 and not any(r[4] is None or r[5] is None for r in clean)
    assert any(r[4] is None for r in missing) and any(r[5] is None for r in missing)
    assert len({r[0] for r in doubled}) < len(doubled)  # orders exported twice
    forms = {("-" if r[1][4] == "-" else "/" if r[1][2] == "/" else "name") for r in dated}
    assert forms == {"-", "/", "name"} and len(dated) > 2000


def test_naive_analyses_of_messy_data_fail(env):
    cases = [
        (task_of(3, "distinct_orders"), lambda q: q.replace("COUNT(DISTINCT order_id)", "COUNT(*)")
         .replace("(SELECT DISTINCT * FROM orders)", "orders")),
        (task_of(3, "sum_qty"), lambda q: q.replace("(SELECT DISTINCT * FROM orders)", "orders")),
        (task_of(4, "sum_qty"), lambda q: re.sub(r" OR order_date LIKE '[^']*'", "", q)),
    ]
    avg = task_of(2, "avg_price")
    product = avg.spec.payload["question"]["product"]
    cases.append((avg, lambda q: f"SELECT ROUND(SUM(COALESCE(unit_price, 0)) / COUNT(*), 2) FROM orders "
                                 f"WHERE product = '{product}'"))
    for task, naive in cases:
        rows = rows_for(task.spec.payload["seed"], task.level)
        query = naive(task.spec.payload["expert"])
        assert query != task.spec.payload["expert"]
        messages, _ = play(env, task, [sql(query), "Answer: 0"])
        shown = messages[2]["content"].split("\n")[-1].strip()
        _, verdict = play(env, task, [sql(query), f"Answer: {shown}"])
        assert verdict.reason == "mismatch", (task.id, query, shown, task.spec.payload["answer"])
        assert rows  # the data the naive query misread


def test_laundered_and_memorised_answers_are_unsupported(env):
    for task in (task_of(1, "sum_qty"), task_of(2, "missing_qty"), task_of(3, "distinct_orders")):
        gold = task.spec.payload["answer"]
        product = task.spec.payload["question"].get("product") or "anchor"
        attempts = [
            [f"Answer: {gold}"],  # from memory
            [sql(f"SELECT {gold}"), f"Answer: {gold}"],
            [sql(f"SELECT MIN(qty) * 0 + {gold} FROM orders"), f"Answer: {gold}"],
            [sql(f"SELECT COUNT(*) - COUNT(*) + {gold} FROM orders WHERE product = '{product}'"), f"Answer: {gold}"],
            [sql("SELECT qty FROM orders LIMIT 20"), f"Answer: {gold}"],  # a listing that may show it
            [sql(task.spec.payload["expert"]), sql(f"SELECT {gold}"), f"Answer: {int(gold) + 1}"],
        ]
        reasons = [play(env, task, a)[1].reason for a in attempts]
        assert reasons[:5] == ["unsupported"] * 5, (task.id, reasons)
        assert reasons[5] == "mismatch"


def test_an_offset_query_does_not_track_the_gold(env):
    task = task_of(1, "count")
    q = task.spec.payload["question"]
    honest = expert_sql(q)
    offset = honest.replace("COUNT(*)", "COUNT(*) + 3")
    gold = int(task.spec.payload["answer"])
    _, verdict = play(env, task, [sql(offset), sql(honest.replace("COUNT(*)", "COUNT(*) - 3")),
                                  f"Answer: {gold}"])
    assert verdict.reason == "unsupported"


def test_tables_are_compared_cell_by_cell(env):
    task = task_of(4, "table")
    gold = task.spec.payload["answer"]
    expert = task.spec.payload["expert"]
    good = "```csv\nregion,orders\n" + "\n".join(f"{r},{n}" for r, n in gold) + "\n```"
    assert play(env, task, [sql(expert), good])[1].passed
    assert play(env, task, [sql(expert), "Here it is:\n" + good + "\nDone."])[1].passed
    missing_row = "```csv\nregion,orders\n" + "\n".join(f"{r},{n}" for r, n in gold[:-1]) + "\n```"
    off_by_one = good.replace(f"{gold[0][0]},{gold[0][1]}", f"{gold[0][0]},{gold[0][1] + 1}")
    cases = {
        "mismatch": [missing_row, off_by_one],
        "bad_table": [good.replace("region,orders", "area,count"), good.replace(f",{gold[0][1]}", ",many")],
        "no_answer": [good + "\n" + good, "no table at all"],
    }
    for reason, answers in cases.items():
        for a in answers:
            assert play(env, task, [sql(expert), a])[1].reason == reason, (reason, a)
    assert play(env, task, [good])[1].reason == "unsupported"  # the right table, never queried
    one_form = re.sub(r" OR order_date LIKE '[^']*'", "", expert)
    assert play(env, task, [sql(one_form), good])[1].reason == "unsupported"


def test_copies_move_every_kind_of_gold():
    for level in DOMAIN.levels:
        for i in range(6):
            t = DOMAIN.generate("train", level, i, 0)
            p = t.spec.payload
            rows = rows_for(p["seed"], level)
            golds = [answer(p["question"], c) for c in copies(rows, t.key, level)]
            assert all(g != p["answer"] for g in golds[1:]), (t.id, p["question"], golds)
            if p["question"]["kind"] != "missing_qty" and p["question"]["kind"] != "count" \
                    and p["question"]["kind"] != "distinct_orders" and p["kind"] != "table":
                assert golds[0] != p["answer"], (t.id, p["question"])


def test_read_table_rules():
    assert read_table("```csv\nregion,orders\nEast,3\n```") == [["East", 3]]
    assert read_table("```csv\nregion, orders\nEast, 3\nWest, 4\n```") == [["East", 3], ["West", 4]]
    assert read_table("```csv\nregion,orders\nEast,3.5\n```") == "bad"
    assert read_table("```csv\nregion,orders\nEast,3,4\n```") == "bad"
    assert read_table("no block") is None
    assert set(REGIONS) == {"Central", "East", "North", "South", "West"}
