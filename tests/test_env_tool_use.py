"""tool.use: the domain's generator and the environment, driven by scripted policies."""

from __future__ import annotations

import re
import time

import pytest

import rlvr.tasks  # noqa: F401  (registers the domains)
from rlvr.envs.base import EnvConfig, make_env, play
from rlvr.envs.tool_use import FOUND_SCORE, ToolUseEnv, calculate
from rlvr.tool_calls import format_call
from rlvr.sandbox import Sandbox
from rlvr.tasks.base import DOMAINS, check_disjoint, generate_tasks, split_of

DOMAIN = DOMAINS.get("tool.use")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=2) as box:
        yield box


@pytest.fixture
def env(sandbox):
    return ToolUseEnv(sandbox=sandbox)


def task(level: int, index: int = 0, split: str = "train", seed: int = 0):
    return DOMAIN.generate(split, level, index, seed)


def sql(query: str) -> str:
    return format_call("sql", {"query": query})


def calc(expression: str) -> str:
    return format_call("calculator", {"expression": expression})


# ---------------------------------------------------------------- the expert passes


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("split", ["train", "eval"])
def test_expert_actions_pass_every_level(env, seed, split):
    for level in DOMAIN.levels:
        for index in range(6):
            t = task(level, index, split, seed)
            assert t.env == "tool.use" and split_of("tool.use", t.key) == split
            messages, verdict = play(env, t, t.actions)
            assert verdict.passed and verdict.reason == "ok" and verdict.score == 1.0, (t.id, verdict)
            # the reference transcript shows exactly the tool results the environment returned
            observed = [m["content"] for m in messages if m["role"] == "tool"]
            assert observed == t.spec.payload["results"]
            assert [f"tool: {r}" for r in observed] == [x for x in t.reference.split("\n")
                                                        if x.startswith("tool: ")]
            chars = sum(len(m["content"]) for m in messages)
            assert chars < 400, (t.id, chars)
            assert len(env.log) == len(t.actions) - 1


def test_make_env_and_tools(sandbox):
    env = make_env("tool.use", sandbox=sandbox)
    assert isinstance(env, ToolUseEnv)
    env.reset(task(1))
    assert [t.name for t in env.tools()] == ["calculator"]
    env.reset(task(3))
    assert [t.name for t in env.tools()] == ["calculator", "sql"]


# ---------------------------------------------------------------- verdicts


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_right_answer_without_a_tool_is_unsupported(env, level):
    t = task(level)
    gold = t.spec.payload["answer"]
    _, verdict = play(env, t, [f"Answer: \\boxed{{{gold}}}"])
    assert verdict.reason == "unsupported" and verdict.score == 0.0 and not verdict.passed


def test_echoing_the_answer_through_a_tool_is_unsupported(env):
    t = task(1)
    gold = t.spec.payload["answer"]
    _, verdict = play(env, t, [calc(gold), f"Answer: {gold}"])
    assert verdict.reason == "unsupported"
    t = task(3)
    gold = t.spec.payload["answer"]
    _, verdict = play(env, t, [sql(f"SELECT {gold}"), f"Answer: {gold}"])
    assert verdict.reason == "unsupported"
    # a number computed without reading the table does not count on a database task
    a = int(gold) + 1
    _, verdict = play(env, t, [sql(f"SELECT {a} - 1"), f"Answer: {gold}"])
    assert verdict.reason == "unsupported"
    _, verdict = play(env, t, [calc(f"{a} - 1"), f"Answer: {gold}"])
    assert verdict.reason == "unsupported"


def test_other_correct_routes_pass(env):
    # L4 "n items cost": one SQL with the arithmetic in it is as good as sql + calculator
    for i in range(20):
        t = task(4, i)
        if t.spec.payload["relies_on"] == "calculator":
            break
    expr = t.spec.payload["calls"][1][1]["expression"]
    n = expr.split(" * ")[1]
    name_query = t.spec.payload["calls"][0][1]["query"]
    query = name_query.replace("SELECT price", f"SELECT price * {n}")
    _, verdict = play(env, t, [sql(query), f"Answer: {t.spec.payload['answer']}"])
    assert verdict.reason == "ok", verdict


def test_wrong_answer_is_a_mismatch(env):
    t = task(3)
    wrong = int(t.spec.payload["answer"]) + 1
    _, verdict = play(env, t, [sql("SELECT MAX(qty) + MIN(qty) FROM items"), f"Answer: \\boxed{{{wrong}}}"])
    assert verdict.reason == "mismatch" and verdict.score == 0.0 and not verdict.passed


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_right_call_wrong_answer_earns_partial_credit_only(env, level):
    t = task(level)
    gold = int(t.spec.payload["answer"])
    for last in (f"Answer: \\boxed{{{gold + 1}}}", "I am not sure."):
        _, verdict = play(env, t, [*t.actions[:-1], last])
        assert not verdict.passed and verdict.reason in ("mismatch", "no_answer")
        assert verdict.score == FOUND_SCORE


def test_partial_credit_needs_the_gold_alone_and_grounded(env):
    t = task(3)
    gold = t.spec.payload["answer"]
    wrong = f"Answer: \\boxed{{{int(gold) + 1}}}"
    # listing every row shows the gold among others: no credit for fishing
    _, verdict = play(env, t, [sql("SELECT price, qty FROM items"), wrong])
    assert verdict.reason == "mismatch" and verdict.score == 0.0
    # echoing it, or computing it without reading the table: no credit
    for call in (sql(f"SELECT {gold}"), calc(f"{int(gold) + 1} - 1")):
        _, verdict = play(env, t, [call, wrong])
        assert verdict.score == 0.0
    # a call whose result is another number: no credit
    _, verdict = play(env, task(1), [calc("1 + 1"), "Answer: \\boxed{3}"])
    assert verdict.score == 0.0


def test_no_or_several_answers(env):
    t = task(1)
    _, verdict = play(env, t, [*t.actions[:-1], "I am not sure."])
    assert verdict.reason == "no_answer"
    gold = t.spec.payload["answer"]
    _, verdict = play(env, t, [*t.actions[:-1], f"\\boxed{{{gold}}} \\boxed{{1}}"])
    assert verdict.reason == "no_answer" and verdict.details["status"] == "multiple_answers"


# ---------------------------------------------------------------- malformed calls


MALFORMED = [
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1+</tool_call>',  # bad JSON
    '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',  # missing argument
    format_call("shell", {"cmd": "ls"}),  # unknown tool
    '<tool_call>{"name": "calculator"',  # unclosed
    calc("__import__('os').system('id')"),
    calc("(1).__class__"),
    calc("9 ** 9 ** 9"),
    calc("10 ** 30"),
    calc("1 / 0"),
    calc("x + 1"),
    format_call("calculator", {"expression": 12}),  # wrong type
    sql("ATTACH DATABASE '/tmp/x.db' AS x"),
    sql("DROP TABLE items"),
    sql("INSERT INTO items VALUES ('a', 'b', 1, 2)"),
    sql("UPDATE items SET price = 0"),
    sql("PRAGMA table_info(items)"),
    sql("SELECT * FROM sqlite_master"),
    sql("SELEC price FROM items"),
    sql("SELECT 1; DROP TABLE items"),
    sql("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"),
    sql("SELECT length(randomblob(1000000000))"),
    sql("SELECT SUM(a.price + h.qty) FROM items a, items b, items c, items d, items e, items f, "
        "items g, items h, items i, items j"),  # stopped by the instruction limit
    sql("SELECT load_extension('/tmp/x.so')"),
]


@pytest.mark.parametrize("action", MALFORMED)
def test_malformed_call_is_an_error_observation(env, action):
    t = task(3)
    env.reset(t)
    step = env.step(action)
    assert not step.done and len(step.observation) == 1
    obs = step.observation[0]
    assert obs["role"] == "tool" and obs["content"].startswith("error"), obs
    assert len(obs["content"]) < 250
    # the episode goes on, and the table is intact: the expert still passes
    for expert in t.actions:
        step = env.step(expert)
    assert step.done and env.verify().reason == "ok"


def test_sql_results_and_calculator():
    assert calculate("347 * 58") == "20126"
    assert calculate("-(2 + 3) * 4") == "-20"
    assert calculate("10 / 4") == "2.5" and calculate("10 / 2") == "5" and calculate("7 // 2 + 7 % 2") == "4"
    assert calculate("2 ** 10") == "1024"
    for bad in ("True + 1", "'a' * 3", "[1][0]", "abs(-1)", "1 if 1 else 2", "1e400", "2 ** -1"):
        with pytest.raises(ValueError):
            calculate(bad)


def test_sql_several_rows_and_no_rows(env):
    t = task(3)
    env.reset(t)
    rows = t.spec.payload["rows"]
    out = env.step(sql("SELECT name, price FROM items ORDER BY name")).observation[0]["content"]
    assert out.split("\n") == [f"{n}, {p}" for n, _, p, _ in sorted(rows)]
    out = env.step(sql("SELECT name FROM items WHERE price > 1000")).observation[0]["content"]
    assert out == "(no rows)"
    assert [e["name"] for e in env.log] == ["sql", "sql"] and all(e["ok"] and e["read"] for e in env.log)


# ---------------------------------------------------------------- budget


def test_looping_tool_calls_end_on_the_turn_budget(sandbox):
    env = ToolUseEnv(EnvConfig(max_turns=3), sandbox=sandbox)
    t = task(4)
    messages, verdict = play(env, t, [calc("1 + 1")] * 10)
    assert verdict.reason == "budget" and verdict.score == 0.0 and verdict.details["finish"] == "turns"
    assert sum(m["role"] == "assistant" for m in messages) == 3


# ---------------------------------------------------------------- generation


def test_generation_is_deterministic_and_db_not_in_prompt():
    for level in DOMAIN.levels:
        for i in range(10):
            a, b = task(level, i, "eval", 3), task(level, i, "eval", 3)
            assert a == b
            prompt = a.prompt[0]["content"]
            assert len(prompt) < 120
            words = re.findall(r"'?\w+'?", prompt)
            for name, _, price, qty in a.spec.payload["rows"]:
                assert name not in words  # a name appears only quoted, when the question asks about it
            # no row is in the prompt: never a (price, qty) pair, never the answer
            assert a.spec.payload["answer"] not in re.findall(r"\d+", prompt)
            assert not any(f"{p}, {q}" in prompt or f"{n}, {k}" in prompt
                           for n, k, p, q in a.spec.payload["rows"])
            assert bool(a.spec.payload["rows"]) == (level >= 3)
            if level >= 3:
                assert "items(name, kind, price, qty)" in prompt


def test_splits_disjoint_and_corpus():
    train = generate_tasks("tool.use", "train", 80, seed=0)
    evals = generate_tasks("tool.use", "eval", 40, seed=0)
    check_disjoint(train, evals)
    docs = DOMAIN.corpus(0, 3)
    assert len(docs) == 3 and "<tool_call>" in docs[0] and "tool: " in docs[0]
    eval_keys = {t.key for t in evals}
    assert not eval_keys & {t.key for t in train}


def test_sql_latency(env):
    t = task(3)
    env.reset(t)
    start = time.perf_counter()
    for _ in range(5):
        env.step(t.actions[0]) if not env.finish else None
        env.reset(t)
    # a sandboxed SQL call is tens of milliseconds; the bound is loose enough for a loaded machine
    # and still catches a per-call cost of seconds (e.g. a fresh sandbox per episode)
    assert (time.perf_counter() - start) / 5 < 5.0
