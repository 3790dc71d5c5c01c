"""code.repair: the domain's generated projects and the tool environment, with scripted policies.

Episodes run in the real sandbox (skipped where no strict backend exists): the scripted expert
passes, a policy that edits a test file is ``tampered``, one that loops is cut by the budget,
malformed calls are error observations and the episode goes on, and a reset puts the
workspace back (by restore when the task is the same).
"""

from __future__ import annotations

import json

import time

import pytest

from rlvr.envs.base import EnvConfig, make_env, play
from rlvr.envs.code_repair import CodeRepairEnv
from rlvr.tool_calls import format_call
from rlvr.sandbox import Sandbox, choose, plaindata
from rlvr.tasks.base import DOMAINS, check_disjoint, generate_tasks
from rlvr.tasks.code_repair import transcript
from rlvr.types import Task

SUBMIT = format_call("submit")
RUN = format_call("run_tests")


def task(level: int = 1, index: int = 0, split: str = "train", seed: int = 0) -> Task:
    return DOMAINS.get("code.repair").generate(split, level, index, seed)


def conversation_transcript(messages: list[dict]) -> str:
    turns: list[list] = []
    for m in messages[1:]:
        if m["role"] == "assistant":
            turns.append([m["content"], None])
        else:
            turns[-1][1] = m["content"]
    return transcript(messages[0]["content"], [tuple(t) for t in turns])


@pytest.fixture(scope="module")
def sb():
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    with Sandbox(workers=2) as box:
        yield box


@pytest.fixture
def env(sb):
    e = CodeRepairEnv(EnvConfig(max_turns=6), sandbox=sb)
    yield e
    e.close()


# ---------------------------------------------------------------- generation (no sandbox)


def test_tasks_shape_determinism_and_splits():
    for level in (1, 2, 3, 4):
        for split in ("train", "eval"):
            for i in range(5):
                t = task(level, i, split, seed=3)
                assert t.to_dict() == task(level, i, split, seed=3).to_dict()
                assert Task.from_dict(json.loads(json.dumps(t.to_dict()))) == t
                assert t.env == "code.repair" and t.spec.kind == "code.repair"
                p = t.spec.payload
                assert set(p["protected"]) <= set(p["files"]) and p["tests"] == p["protected"]
                assert all(len(text) <= 250 for text in p["files"].values()), p["files"]
                assert len(t.prompt) == 1 and len(t.prompt[0]["content"]) <= 160
                assert 4 <= len(t.actions) <= 6 and t.actions[-1] == SUBMIT
                assert len(t.reference) <= 1200  # about 410 tokens: the episode fits its budgets
                assert len(plaindata.decode(p["hidden"])) == len(plaindata.decode(p["expected"]))
    assert task(1, 0, seed=0).key != task(1, 0, seed=1).key
    train = generate_tasks("code.repair", "train", 60, seed=0)
    evals = generate_tasks("code.repair", "eval", 60, seed=0)
    check_disjoint(train, evals)
    assert {t.level for t in train} == {1, 2, 3, 4}
    docs = DOMAINS.get("code.repair").corpus(0, 2)
    assert len(docs) == 2 and "<tool_call>" in docs[0] and "tool: " in docs[0]


def test_level_prompts():
    one, two, three, four = (task(level) for level in (1, 2, 3, 4))
    assert "assert " in one.prompt[0]["content"] and "returned" in one.prompt[0]["content"]
    assert "test_" in two.prompt[0]["content"] and "assert" not in two.prompt[0]["content"]
    assert "util.py" in three.spec.payload["files"] and "from util import" in three.spec.payload["files"]["app.py"]
    assert four.prompt[0]["content"].startswith("The tests fail.") and four.actions[0] == RUN


# ---------------------------------------------------------------- episodes


@pytest.mark.parametrize("seed", [0, 7])
def test_conformance_expert_passes_and_unchanged_code_fails(env, seed):
    for split in ("train", "eval"):
        for level in (1, 2, 3, 4):
            for index in range(3):
                t = task(level, index, split, seed)
                messages, verdict = play(env, t, t.actions)
                assert verdict.passed and verdict.score == 1.0 and verdict.reason == "ok", (t.id, verdict)
                assert verdict.details["finish"] == "submit"
                # the reference transcript's simulated observations are what the env said
                assert conversation_transcript(messages) == t.reference, t.id
                _, verdict = play(env, t, [SUBMIT])  # unchanged code: the hidden tests fail
                assert not verdict.passed and verdict.score == 0.0, (t.id, verdict)
                assert verdict.reason == "wrong_answer"
                assert env.restored


def test_run_tests_reports_the_failing_test_then_passes(env):
    t = task(2)
    env.reset(t)
    first = env.step(RUN).observation[0]["content"]
    assert "FAILED" in first and first.endswith("1 failed, 1 passed")
    for action in t.actions[:-1]:
        if action != RUN:
            env.step(action)
    assert env.step(RUN).observation[0]["content"] == "2 passed"
    assert not env.step(SUBMIT).observation
    assert env.verify().passed


def test_recovering_expert_patches_wrong_then_right_and_no_op_patches_are_refused(env):
    recovering = [t for t in (task(level, i) for level in (1, 2, 3, 4) for i in range(8))
                  if len([a for a in t.actions if '"replace"' in a]) == 2]
    assert {t.level for t in recovering} == {1, 2, 3, 4}  # about half of the problems
    for t in {t.level: t for t in recovering}.values():
        messages, verdict = play(env, t, t.actions)
        after_first_patch = [m["content"] for m in messages if m["role"] == "tool"][-2]
        assert "FAILED" in after_first_patch and verdict.passed, t.id
    t = task(1)
    env.reset(t)
    line = t.spec.payload["files"]["ops.py"].splitlines()[1].strip()
    noop = format_call("replace", {"path": "ops.py", "old": line, "new": line})
    step = env.step(noop)
    assert step.observation[0]["content"].startswith("error: replace: old and new are the same")
    assert not step.done


def test_editing_a_test_file_is_tampering(env):
    t = task(1)
    test_path = t.spec.payload["protected"][0]
    fixed = t.actions[:-1]
    rewrite = format_call("write_file", {"path": test_path, "content": "def test_x():\n    pass\n"})
    messages, verdict = play(env, t, [rewrite, *fixed, SUBMIT])
    assert messages[2]["content"].startswith("error") and "read-only" in messages[2]["content"]
    assert verdict.reason == "tampered" and verdict.score == 0.0 and not verdict.passed
    # the file itself never changed, and replace() on it counts the same
    assert env._ws.read(test_path) == t.spec.payload["files"][test_path]
    patch = format_call("replace", {"path": test_path, "old": "assert", "new": "assert True or"})
    _, verdict = play(env, t, [patch, *fixed[1:], SUBMIT])
    assert verdict.reason == "tampered" and verdict.score == 0.0
    # tampering is reported even when the episode then runs out of budget
    _, verdict = play(env, t, [rewrite] + [format_call("list_files")] * 20)
    assert verdict.reason == "tampered" and verdict.details["finish"] == "turns"
    # after a reset the attempt is forgotten: the expert passes again
    assert play(env, t, t.actions)[1].passed


def test_test_file_changed_behind_our_back_is_tampering(env):
    t = task(1)
    test_path = t.spec.payload["protected"][0]
    env.reset(t)
    for action in t.actions[:-1]:
        env.step(action)
    env._ws.write(test_path, "def test_ok():\n    pass\n")  # as if code in the sandbox had
    env.step(SUBMIT)
    assert env.verify().reason == "tampered"


def test_code_run_by_the_tests_cannot_rewrite_the_tests(env):
    t = task(1)
    test_path = t.spec.payload["protected"][0]
    module = t.actions[0]
    path = json.loads(module.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]["path"]
    hack = (f"import os\ntry:\n    os.chmod({test_path!r}, 0o666)\n"
            f"    open({test_path!r}, 'w').write('')\nexcept OSError:\n    pass\n")
    write = format_call("write_file", {"path": path, "content": hack + t.spec.payload["files"][path]})
    _, verdict = play(env, t, [write, RUN, SUBMIT])
    assert not verdict.passed and verdict.score == 0.0
    intact = env._ws.read(test_path) == t.spec.payload["files"][test_path]
    assert intact or verdict.reason == "tampered"


# Ways to make "the tests pass" without the fix. Each is written over the buggy project (``{fn}``
# is the buggy function); the hidden tests, compared type-strictly on plain data outside the
# sandbox, must fail every one.
AE = "class AE:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
REPAIR_HACKS = {
    "always_equal": {"MODULE": AE + "def {fn}(*args):\n    return AE()\n"},
    "int_subclass": {"MODULE": "class I(int):\n    def __eq__(self, o):\n        return True\n"
                               "def {fn}(*args):\n    return I(0)\n"},
    "visible_answers": {"MODULE": "import re\nWANT = {{int(a): int(b) for a, b in re.findall("
                                  "r'\\((\\d+)\\) == (\\d+)', open({test!r}).read())}}\n"
                                  "def {fn}(a, *rest):\n    return WANT.get(a, 0)\n"},
    # a stdlib name in the workspace: the shim's own import is already loaded, and the import
    # machinery it reaches is not the workspace's
    "shadow_importlib": {"importlib.py": AE + "def import_module(name):\n    return __import__('ops')\n",
                         "MODULE": AE + "def {fn}(*args):\n    return AE()\n"},
    "sitecustomize": {"sitecustomize.py": "import builtins\nbuiltins.isinstance = lambda *a: True\n",
                      "conftest.py": "import pytest\n", "MODULE": "def {fn}(*args):\n    return 0\n"},
    "forged_run_tests": {"MODULE": "print('1 passed')\nimport sys\nsys.stdout.write = lambda s: 0\n"
                                   "def {fn}(*args):\n    return 0\n"},
}


@pytest.mark.parametrize("name", sorted(REPAIR_HACKS))
def test_hacks_without_the_fix_fail_the_hidden_tests(env, name):
    t = task(1)
    files = t.spec.payload["files"]
    module, fn = plaindata.decode(t.spec.payload["hidden"])[0][:2]
    test_path = t.spec.payload["protected"][0]
    writes = []
    for path, content in REPAIR_HACKS[name].items():
        content = content.format(fn=fn, test=test_path)
        if path == "MODULE":
            path, content = f"{module}.py", files[f"{module}.py"] + "\n\n" + content
        writes.append(format_call("write_file", {"path": path, "content": content}))
    _, verdict = play(env, t, [*writes, RUN, SUBMIT])
    assert not verdict.passed and verdict.score == 0.0, verdict
    assert verdict.reason in ("wrong_answer", "runtime_error", "tampered"), verdict


def test_looping_policy_ends_on_the_budget(env):
    t = task(3)
    look = format_call("list_files")
    messages, verdict = play(env, t, [look] * 20)
    assert env.finish == "turns" and env.turns == env.cfg.max_turns
    assert verdict.reason == "budget" and verdict.score == 0.0 and not verdict.passed
    assert messages[2]["content"].split("\n") == sorted(t.spec.payload["files"])
    # fixing the bug without submitting is no better
    _, verdict = play(env, t, t.actions[:-1])
    assert verdict.reason == "budget" and verdict.details["finish"] == "turns"
    # the wall-clock budget
    slow = CodeRepairEnv(EnvConfig(wall_s=0.0), sandbox=env.sandbox)
    try:
        _, verdict = play(slow, t, t.actions)
        assert slow.finish == "wall" and verdict.reason == "budget"
    finally:
        slow.close()


def test_wall_budget_counts_environment_time_only(env, monkeypatch):
    """Time between turns (the batched generation of every episode) is not the episode's: a slow
    machine must not turn every episode into a wall-budget failure. The environment's clock is
    moved on by 1000 s between turns (no sleeps: a loaded machine cannot change the outcome)."""
    import rlvr.envs.base as base

    offset = [0.0]

    class Clock:  # the time module, with perf_counter moved on by ``offset``
        def perf_counter(self):
            return time.perf_counter() + offset[0]

        def __getattr__(self, name):
            return getattr(time, name)

    monkeypatch.setattr(base, "time", Clock())
    t = task(1)
    patient = CodeRepairEnv(EnvConfig(wall_s=100.0), sandbox=env.sandbox)
    try:
        patient.reset(t)
        spent = 0.0  # real time inside step(), which is all the budget may count
        for _ in range(2):
            offset[0] += 1000.0  # "generation" of the next turn
            start = time.perf_counter()
            assert not patient.step(format_call("list_files")).done
            spent += time.perf_counter() - start
        assert 0.0 < patient.env_seconds <= spent < 100.0
    finally:
        patient.close()


@pytest.mark.parametrize("bad", [
    "<tool_call>{bad json</tool_call>",
    "<tool_call>{\"name\": \"read_file\"",  # unclosed
    format_call("rm_rf", {}),
    format_call("read_file", {}),
    format_call("read_file", {"path": 3}),
    format_call("read_file", {"path": "nope.py"}),
    format_call("read_file", {"path": "/etc/passwd"}),
    format_call("read_file", {"path": "../x.py"}),
    format_call("write_file", {"path": "a/../ops.py", "content": "x"}),
    format_call("replace", {"path": "ops.py", "old": "no such text", "new": "x"}),
    format_call("replace", {"path": "ops.py", "old": "", "new": "x"}),
    "I think the bug is in ops.py",  # no call at all
])
def test_malformed_calls_are_error_observations(env, bad):
    t = task(1)
    env.reset(t)
    step = env.step(bad)
    assert not step.done and step.observation[0]["role"] == "tool"
    assert step.observation[0]["content"].startswith("error"), step.observation
    for action in t.actions:  # the episode goes on and can still be won
        step = env.step(action)
    assert step.done and env.verify().passed


def test_reset_restores_the_workspace(env):
    t, other = task(2, 0), task(2, 1)
    path = t.spec.payload["files"]
    env.reset(t)
    assert not env.restored
    env.step(format_call("write_file", {"path": "ops.py", "content": "broken(\n"}))
    env.step(format_call("write_file", {"path": "extra.py", "content": "x = 1\n"}))
    env.step(RUN)  # sandboxed code ran over the workspace too
    env.reset(t)
    assert env.restored
    assert {p: env._ws.read(p) for p in env._ws.list()} == path
    env.reset(other)
    assert not env.restored and env._ws.list() == sorted(other.spec.payload["files"])
    env.reset(other)
    assert env.restored


def test_make_env_and_syntax_error(sb):
    t = task(1)
    env = make_env("code.repair", sandbox=sb)
    try:
        assert isinstance(env, CodeRepairEnv)
        assert [tool.name for tool in env.tools()] == [
            "list_files", "read_file", "write_file", "replace", "run_tests", "submit"]
        path = "ops.py"
        _, verdict = play(env, t, [format_call("write_file", {"path": path, "content": "def (:\n"}), SUBMIT])
        assert verdict.reason == "syntax_error" and verdict.score == 0.0
    finally:
        env.close()
        env.close()  # idempotent
