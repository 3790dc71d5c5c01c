"""Custom reward functions as plain Python (the ``python`` verifier): TRL's call signature,
weights, None, Verdicts, and every way a user's function can go wrong."""

from __future__ import annotations

import json
import math
import textwrap

import pytest

from rlvr.cli import main
from rlvr.errors import UserError
from rlvr.rewards import RewardConfig, score_all
from rlvr.types import Spec, Task, Trajectory, Verdict
from rlvr.verifiers import VERIFIERS, check_all
from rlvr.verifiers.python_reward import resolve_reward_fn, validate_payload

USER_MODULE = '''
from rlvr.types import Verdict
CALLS = []

def exact(prompts, completions, answer, **kw):
    CALLS.append((list(prompts), list(completions), list(answer), sorted(kw)))
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def length(prompts, completions, **kw):
    return [len(c) / 10 for c in completions]

def only_long(prompts, completions, **kw):
    return [None if len(c) < 3 else 1.0 for c in completions]

def verdicts(prompts, completions, **kw):
    return [Verdict(c == "yes", float(c == "yes"), "ok" if c == "yes" else "said_no") for c in completions]

def boom(prompts, completions, **kw):
    raise ValueError("the user's bug")

def nan(prompts, completions, **kw):
    return [float("nan") if c == "x" else 1.0 for c in completions]

def short(prompts, completions, **kw):
    return [1.0]

def text(prompts, completions, **kw):
    return ["high" if c == "x" else "0.5" for c in completions]

def mutate(prompts, completions, **kw):
    completions.clear()
    kw["answer"].clear()
    return [0.0] * len(prompts)

def columns(prompts, completions, task_ids, answer, extra, note=None, **kw):
    return [1.0 if (t, a, e, n) == ("t0", "4", 0, "hi") else 0.5 if (t, n) == ("t1", None) else 0.0
            for t, a, e, n in zip(task_ids, answer, extra, note or [None] * len(task_ids))]

def tensor(prompts, completions, **kw):
    import torch
    return torch.tensor([0.25] * len(completions))

def as_dict(prompts, completions, **kw):
    return {c: 1.0 for c in completions}

def scalar(prompts, completions, **kw):
    import torch
    return torch.tensor(1.0)

def partial(prompts, completions, **kw):
    return [Verdict(False, 0.5, "half", {"reward": 99.0, "why": "half right"}) for c in completions]

FLAKY = {"raise": True}

def flaky(prompts, completions, **kw):
    if FLAKY["raise"]:
        raise RuntimeError("flaky")
    return [1.0] * len(completions)

NOT_CALLABLE = 3
'''


@pytest.fixture()
def mod(tmp_path, monkeypatch):
    name = f"user_rewards_{tmp_path.name[-8:].replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def task(i: int, fns: list, answer: str = "4", columns: dict | None = None, **payload) -> Task:
    return Task(id=f"t{i}", domain="file.python", level=1, prompt=({"role": "user", "content": f"q{i}"},),
                spec=Spec("python", {"functions": [{"ref": r, "weight": w} for r, w in fns],
                                     "columns": {"answer": answer, "extra": i, **(columns or {})}, **payload}))


def test_trl_call_signature_and_weights(mod):
    fns = [(f"{mod}:exact", 1.0), (f"{mod}:length", 0.5)]
    pairs = [(task(0, fns, "4"), "4"), (task(1, fns, "6"), "five")]
    v0, v1 = check_all(pairs)
    assert v0.details["rewards"] == {f"{mod}:exact": 1.0, f"{mod}:length": 0.1}
    assert math.isclose(v0.details["reward"], 1.05) and v0.passed and v0.score == 1.0
    assert math.isclose(v1.details["reward"], 0.2) and not v1.passed and v1.reason == "below_threshold"
    assert math.isclose(v1.score, 0.2)
    import importlib

    calls = importlib.import_module(mod).CALLS
    assert calls == [(["q0", "q1"], ["4", "five"], ["4", "6"], ["extra", "task_ids"])]  # one call per batch


def test_none_skips_and_verdicts_count_by_score(mod):
    v_short, v_long = check_all([(task(0, [(f"{mod}:only_long", 1.0)]), "ab"),
                                 (task(1, [(f"{mod}:only_long", 1.0)]), "abcd")])
    assert v_short.details["rewards"] == {} and v_short.details["reward"] == 0.0 and not v_short.passed
    assert v_long.passed
    yes, no = check_all([(task(0, [(f"{mod}:verdicts", 1.0)]), "yes"), (task(1, [(f"{mod}:verdicts", 1.0)]), "no")])
    assert yes.passed and not no.passed and no.reason == "said_no"


def test_a_raising_function_fails_its_samples_and_warns_once(mod, capsys):
    pairs = [(task(i, [(f"{mod}:boom", 1.0)]), "4") for i in range(3)]
    for _ in range(2):
        verdicts = check_all(pairs)
        assert all(not v.passed and v.reason == "reward_error" for v in verdicts)
        assert "ValueError: the user's bug" in verdicts[0].details["error"]
    assert capsys.readouterr().err.count("raised ValueError") == 1


def test_nan_and_non_numbers_are_invalid_rewards(mod):
    bad, good = check_all([(task(0, [(f"{mod}:nan", 1.0)]), "x"), (task(1, [(f"{mod}:nan", 1.0)]), "y")])
    assert bad.reason == "invalid_reward" and not bad.passed and good.passed
    high, half = check_all([(task(0, [(f"{mod}:text", 1.0)]), "x"), (task(1, [(f"{mod}:text", 1.0)]), "y")])
    assert high.reason == half.reason == "invalid_reward" and "str" in high.details["error"]  # even "0.5"
    assert "reward" not in high.details  # no value: the outcome term is reward.fail_reward


def test_columns_are_lists_over_the_batch_with_none_where_a_task_lacks_one(mod):
    fns = [(f"{mod}:columns", 1.0)]
    first, second = check_all([(task(0, fns, columns={"note": "hi"}), "a"), (task(1, fns), "b")])
    assert first.details["reward"] == 1.0 and second.details["reward"] == 0.5


def test_each_function_gets_fresh_lists_and_any_sequence_is_accepted(mod):
    fns = [(f"{mod}:mutate", 1.0), (f"{mod}:exact", 1.0), (f"{mod}:tensor", 2.0)]
    (v,) = check_all([(task(0, fns, "4"), "4")])
    assert v.details["rewards"] == {f"{mod}:mutate": 0.0, f"{mod}:exact": 1.0, f"{mod}:tensor": 0.25}
    assert v.details["reward"] == pytest.approx(1.5) and v.passed


def test_a_failing_verdict_keeps_its_reason_and_the_sum_as_reward(mod):
    (v,) = check_all([(task(0, [(f"{mod}:partial", 2.0)]), "x")])
    assert not v.passed and v.reason == "half" and v.details["why"] == "half right"
    assert v.details["reward"] == 1.0 and v.score == 1.0  # the function's own "reward" key cannot override


def test_a_function_raising_on_every_call_stops_the_run_after_a_limit(mod, monkeypatch):
    import importlib

    from rlvr.verifiers import python_reward

    monkeypatch.setattr(python_reward, "MAX_CONSECUTIVE_ERRORS", 3)
    flaky = importlib.import_module(mod).FLAKY
    pairs = [(task(0, [(f"{mod}:flaky", 1.0)]), "a")]
    for _ in range(2):
        assert check_all(pairs)[0].reason == "reward_error"
    flaky["raise"] = False
    assert check_all(pairs)[0].passed  # a call that returns resets the count
    flaky["raise"] = True
    for _ in range(2):
        assert check_all(pairs)[0].reason == "reward_error"
    with pytest.raises(UserError, match=f"reward function {mod}:flaky raised on 3 calls in a row.*RuntimeError: flaky"):
        check_all(pairs)


def test_wrong_length_is_one_located_error(mod):
    with pytest.raises(UserError, match=f"reward function {mod}:short returned 1 values for 2 completions"):
        check_all([(task(0, [(f"{mod}:short", 1.0)]), "a"), (task(1, [(f"{mod}:short", 1.0)]), "b")])
    with pytest.raises(UserError, match=f"reward function {mod}:as_dict returned dict for 1 completions"):
        check_all([(task(0, [(f"{mod}:as_dict", 1.0)]), "a")])
    with pytest.raises(UserError, match=f"reward function {mod}:scalar returned Tensor for 1 completions"):
        check_all([(task(0, [(f"{mod}:scalar", 1.0)]), "a")])


def test_refs_resolve_from_a_module_or_a_file(mod, tmp_path):
    assert resolve_reward_fn(f"{mod}:exact").__name__ == "exact"
    assert resolve_reward_fn(f"{tmp_path}/{mod}.py:length").__name__ == "length"
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n    pass\n")
    (tmp_path / "needs_missing.py").write_text("import rlvr_no_such_dependency\n\ndef f(prompts, completions, **kw):\n    pass\n")
    (tmp_path / "raises_on_import.py").write_text("x = 1 / 0\n")
    for ref, needle in [("nocolon", "module.path:function"), ("no_such_module_xyz:f", "no module named 'no_such_module_xyz'"),
                        (f"{tmp_path}/missing.py:f", "no file"), (f"{mod}:absent", "has no attribute 'absent'"),
                        (f"{mod}:NOT_CALLABLE", "is not callable"), (f"{bad}:f", "broken.py:1"),
                        ("needs_missing:f", ("importing needs_missing raised ModuleNotFoundError: No module named "
                                             "'rlvr_no_such_dependency'")),
                        (f"{tmp_path}/raises_on_import.py:f", "raised ZeroDivisionError: division by zero")]:
        with pytest.raises(UserError, match=needle):
            resolve_reward_fn(ref)
    with pytest.raises(ValueError, match="functions"):
        validate_payload({"functions": []})
    with pytest.raises(ValueError, match="unknown key 'answr'"):
        validate_payload({"functions": [{"ref": f"{mod}:exact"}], "answr": 1})


def test_a_file_runs_once_for_all_its_refs_and_can_import_its_neighbours(tmp_path):
    sub = tmp_path / "rewards_dir"
    sub.mkdir()
    (sub / "rlvr_test_helper_mod.py").write_text("def bonus():\n    return 0.5\n")
    (sub / "rw.py").write_text(textwrap.dedent('''
        import dataclasses
        from rlvr_test_helper_mod import bonus
        RUNS = []
        RUNS.append(1)

        @dataclasses.dataclass
        class Config:
            scale: float = 1.0

        def a(prompts, completions, **kw):
            return [bonus() * Config().scale for _ in completions]

        def b(prompts, completions, **kw):
            return [float(len(RUNS))] * len(completions)
    '''))
    fns = [(f"{sub}/rw.py:a", 1.0), (f"{sub}/rw.py:b", 1.0)]
    (v,) = check_all([(task(0, fns), "x")])
    assert v.details["rewards"] == {f"{sub}/rw.py:a": 0.5, f"{sub}/rw.py:b": 1.0}  # one module, run once


def test_the_outcome_term_is_the_functions_value(mod):
    t = task(0, [(f"{mod}:length", 2.0)])
    traj = Trajectory(task_id="t0", group_id=0, messages=(), completion="abcde", token_ids=(1, 2),
                      loss_mask=(0, 1), logprobs=(0.0, -1.0), finish_reason="stop")
    (verdict,) = check_all([(t, "abcde")])
    (scored,) = score_all([t], [verdict], [traj], RewardConfig(), max_new_tokens=8)
    assert scored.terms["outcome"] == pytest.approx(1.0) and scored.reward == pytest.approx(1.0)
    failed = Verdict(False, 0.0, "reward_error", {})
    (scored,) = score_all([t], [failed], [traj], RewardConfig(fail_reward=-0.5), max_new_tokens=8)
    assert scored.reward == -0.5


def test_a_custom_reward_trains_end_to_end_from_the_command_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import load_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "myrewards.py").write_text(textwrap.dedent('''
        def variety(prompts, completions, **columns):
            return [len(set(c)) / 8 for c in completions]
    '''))
    rows = [{"question": f"Say something about {w}.", "topic": w} for w in ("cats", "rain", "tea", "maps")]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    assert main(["train", "--model", tiny_model_dir, "--tasks", "t.jsonl", "--map", "prompt=question",
                 "--reward", "myrewards:variety", "--out", str(run), "--set", "steps=2", "--set", "rollout.tasks_per_step=2",
                 "--set", "rollout.samples_per_task=4", "--set", "rollout.max_new_tokens=6", "--set", "optim.lr=1e-2"]) == 0
    before, after = load_file(f"{tiny_model_dir}/model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert all(not torch.equal(before[k], after[k]) for k in before), "some parameter did not change"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < s["rollout/reward_outcome"] <= 1 and s["rollout/kept_frac"] > 0 for s in steps)
    capsys.readouterr()
    (tmp_path / "myrewards.py").write_text("def variety(prompts, completions, **c):\n    return [0.5]\n")
    import sys

    sys.modules.pop("myrewards", None)
    from rlvr.verifiers import python_reward

    python_reward._cache.clear()
    assert main(["train", "--model", tiny_model_dir, "--tasks", "t.jsonl", "--map", "prompt=question",
                 "--reward", "myrewards:variety", "--out", str(tmp_path / "run2"), "--set", "steps=1",
                 "--set", "rollout.tasks_per_step=2", "--set", "rollout.samples_per_task=2"]) == 2
    assert "returned 1 values for 4 completions" in capsys.readouterr().err


def test_python_verifier_is_registered():
    assert "python" in VERIFIERS
