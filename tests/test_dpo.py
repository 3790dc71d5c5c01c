"""``rlvr dpo`` and ``rlvr pairs``: preference training on a tiny model, from files and from the
model's own verified rollouts; the reference computed once; a killed run resumes exactly."""

from __future__ import annotations

import json
import random
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main
from rlvr.config import from_dict
from rlvr.monitor.metrics import read_metrics
from rlvr.tasks import generate_tasks
from rlvr.tasks.pairs import load_pairs
from rlvr.train import dpo
from rlvr.train.verified_pairs import pairs_of_task
from rlvr.types import Trajectory, Verdict


def arithmetic_pairs(path, n=16):
    """Pairs of math.arith train prompts: the reference answer vs a wrong number."""
    rng = random.Random(0)
    rows = []
    for t in generate_tasks(["math.arith"], "train", n, seed=0):
        answer = t.spec.payload["answer"]
        rows.append({"prompt": list(t.prompt), "chosen": t.reference,
                     "rejected": t.reference.replace(str(answer), str(int(float(answer)) + rng.randint(1, 9)))})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def config(tiny_model_dir, pairs, out, **over) -> dpo.DPOConfig:
    data = {"model": tiny_model_dir, "pair_files": [pairs], "out": str(out), "batch_size": 4, "epochs": 2,
            "log_every": 1, "checkpoint_every": 3, "optim": {"lr": 3e-3, "warmup_steps": 0}, **over}
    return from_dict(dpo.DPOConfig, data)


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "robust", "simpo"])
def test_dpo_changes_every_parameter_and_raises_the_margin(tiny_model_dir, tmp_path, loss):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl")
    extra = {"robust": {"label_smoothing": 0.1}, "simpo": {"beta": 2.0}}.get(loss, {})  # SimPO's paper uses beta 2-2.5
    result = dpo.run_dpo(config(tiny_model_dir, pairs, tmp_path / "run", loss=loss, **extra), progress=False)
    assert result["pairs"] == 16 and result["steps"] == 8
    steps = read_metrics(tmp_path / "run")
    assert len(steps) == 8
    first, last = steps[0], steps[-1]
    assert last["train/rewards/margin"] > first["train/rewards/margin"] + 0.05, (first, last)
    assert last["train/loss"] < first["train/loss"]
    if loss != "simpo":  # the policy starts as the reference: every implicit reward is 0 at step 1
        assert abs(first["train/rewards/margin"]) < 1e-5
    before, after = load_file(f"{tiny_model_dir}/model.safetensors"), load_file(tmp_path / "run/final/model.safetensors")
    assert all(not torch.equal(before[k], after[k]) for k in before), "some parameter did not change"
    assert (tmp_path / "run" / dpo.REFERENCE_FILE).exists() == (loss != "simpo")


def test_reference_logps_are_computed_once_and_match_the_policy_at_step_0(tiny_model_dir, tmp_path, monkeypatch):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl", n=6)
    cfg = config(tiny_model_dir, pairs, tmp_path / "run", epochs=1)
    dpo.run_dpo(cfg, progress=False)
    saved = torch.load(tmp_path / "run" / dpo.REFERENCE_FILE)["logps"]
    from rlvr.model.load import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    rows, _ = dpo.encode_pairs(tok, load_pairs(pairs), None)
    with torch.no_grad():
        c, r, _, _ = dpo.response_logps(model, rows, tok.pad_token_id)
    assert torch.allclose(saved[:, 0], c, atol=1e-4) and torch.allclose(saved[:, 1], r, atol=1e-4)
    # a second run over the same pairs and reference reads the file instead of loading the reference
    import rlvr.train.policy as policy_module

    loads = []
    real = policy_module.load_model_and_tokenizer  # the policy's and a reference's loads go through Policy
    monkeypatch.setattr(policy_module, "load_model_and_tokenizer", lambda *a, **k: loads.append(a) or real(*a, **k))
    dpo.run_dpo(cfg, progress=False)
    assert len(loads) == 1  # the policy only


def test_response_logps_equal_a_plain_padded_forward(tiny_model_dir, tmp_path):
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.model.logprobs import sequence_logprobs

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    rows, _ = dpo.encode_pairs(tok, load_pairs(arithmetic_pairs(tmp_path / "p.jsonl", n=5)), None)
    with torch.no_grad():
        chosen, rejected, chosen_len, rejected_len = dpo.response_logps(model, rows, tok.pad_token_id)
        for i, r in enumerate(rows):  # one sequence at a time, no packing, no sharing
            for response, got, n in ((r.chosen, chosen[i], chosen_len[i]), (r.rejected, rejected[i], rejected_len[i])):
                ids = torch.tensor([list(r.prompt + response)])
                lp = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(r.prompt):].sum()
                assert abs(float(lp) - float(got)) < 1e-4 and int(n) == len(response)


def test_killed_dpo_run_resumes_to_the_same_metrics_and_model(tiny_model_dir, tmp_path, monkeypatch):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl")
    dpo.run_dpo(config(tiny_model_dir, pairs, tmp_path / "a"), progress=False)
    real_step, calls = dpo.clip_and_step, []

    def step_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # dies inside step 5: the newest checkpoint is step 3
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(dpo, "clip_and_step", step_then_die)
    with pytest.raises(KeyboardInterrupt):
        dpo.run_dpo(config(tiny_model_dir, pairs, tmp_path / "b"), progress=False)
    monkeypatch.setattr(dpo, "clip_and_step", real_step)
    dpo.run_dpo(config(tiny_model_dir, pairs, tmp_path / "b"), resume=True, progress=False)
    assert read_metrics(tmp_path / "a") == read_metrics(tmp_path / "b")
    a, b = load_file(tmp_path / "a/final/model.safetensors"), load_file(tmp_path / "b/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_batch_order_is_a_pure_function_of_seed_and_step():
    n, size = 10, 4
    epoch0 = [i for step in (1, 2, 3) for i in dpo.batch_indices(step, n, size, seed=0)]
    assert sorted(epoch0) == list(range(n))  # every pair once per epoch (the last batch is short)
    assert dpo.batch_indices(4, n, size, 0) != dpo.batch_indices(1, n, size, 0)  # a new order next epoch
    assert dpo.batch_indices(2, n, size, 0) == dpo.batch_indices(2, n, size, 0)
    assert dpo.batch_indices(1, n, size, 1) != dpo.batch_indices(1, n, size, 0)


def test_bad_dpo_configs_name_the_key(tiny_model_dir, tmp_path, capsys):
    pairs = arithmetic_pairs(tmp_path / "p.jsonl", n=2)
    for setting, needle in (("loss=kto", "dpo.loss"), ("beta=0", "dpo.beta"), ("label_smoothing=0.5", "dpo.label_smoothing")):
        assert main(["dpo", "--model", tiny_model_dir, "--pairs", pairs, "--out", str(tmp_path / "r"),
                     "--set", setting]) == 2
        assert needle in capsys.readouterr().err
    assert main(["dpo", "--model", tiny_model_dir, "--out", str(tmp_path / "r")]) == 2
    assert "--pairs" in capsys.readouterr().err


# ---------------------------------------------------------------- pairs from verified rollouts


def traj(text: str, n_tokens: int) -> Trajectory:
    return Trajectory(task_id="t", group_id=0, messages=(), completion=text, token_ids=tuple(range(n_tokens)),
                      loss_mask=(1,) * n_tokens, logprobs=(0.0,) * n_tokens, finish_reason="stop")


def verdict(passed: bool) -> Verdict:
    return Verdict(passed=passed, score=float(passed), reason="ok" if passed else "mismatch")


def test_pairs_of_a_task_prefer_short_correct_answers_and_skip_ties_duplicates_and_empties():
    long_ok, short_ok = (traj("the answer is 12", 6), verdict(True)), (traj("12", 2), verdict(True))
    wrong, wrong_again = (traj("13", 2), verdict(False)), (traj(" 13\n", 3), verdict(False))
    empty = (traj("  ", 1), verdict(False))
    rng = random.Random(0)
    pairs = pairs_of_task(None, [long_ok, wrong, short_ok, wrong_again, empty], 5, True, rng)
    assert [(c[0].completion, r[0].completion) for c, r in pairs] == [("12", "13"), ("the answer is 12", "13")]
    unsorted = pairs_of_task(None, [long_ok, wrong, short_ok], 1, False, rng)
    assert unsorted[0][0][0].completion == "the answer is 12"
    assert pairs_of_task(None, [long_ok, short_ok], 3, True, rng) == []  # all passed: a tie
    assert pairs_of_task(None, [wrong, empty], 3, True, rng) == []  # all failed


def test_pairs_command_then_dpo_from_the_command_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits.py").write_text(textwrap.dedent('''
        def has_digit(prompts, completions, **columns):
            return [float(any(ch.isdigit() for ch in c)) for c in completions]
    '''))
    rows = [{"question": f"What is {a} plus {a + 1}?"} for a in range(8)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "pairs.jsonl"
    assert main(["pairs", "--model", tiny_model_dir, "--tasks", "t.jsonl", "--map", "prompt=question",
                 "--reward", "digits:has_digit", "--out", str(out), "--set", "samples=8",
                 "--set", "max_new_tokens=6", "--set", "pairs_per_task=2"]) == 0
    printed = capsys.readouterr().out
    counts = json.loads(printed[printed.index("{"):])
    pairs = load_pairs(str(out))
    assert len(pairs) == counts["pairs"] > 0 and counts["tasks"] == 8
    assert counts["tasks_with_pairs"] + counts["all_passed"] + counts["all_failed"] == 8
    for p in pairs:
        assert any(ch.isdigit() for ch in p.chosen) and not any(ch.isdigit() for ch in p.rejected)
        assert p.meta["chosen_verdict"]["passed"] and not p.meta["rejected_verdict"]["passed"]
        assert p.meta["model"] == tiny_model_dir and p.prompt[-1]["role"] == "user"
    assert main(["dpo", "--model", tiny_model_dir, "--pairs", str(out), "--out", str(tmp_path / "run"),
                 "--set", "batch_size=2", "--set", "log_every=1"]) == 0
    assert (tmp_path / "run/final/model.safetensors").is_file()
    assert all("train/rewards/accuracy" in m for m in read_metrics(tmp_path / "run"))


def test_rpo_alpha_adds_the_chosen_token_nll(tiny_model_dir, tmp_path):
    import math

    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl", n=8)
    dpo.run_dpo(config(tiny_model_dir, pairs, tmp_path / "run", rpo_alpha=0.5, epochs=1), progress=False)
    first = read_metrics(tmp_path / "run")[0]
    # at step 1 the policy is the reference: DPO's loss is log 2 for every pair
    assert first["train/nll/chosen"] > 0
    assert abs(first["train/loss"] - (math.log(2) + 0.5 * first["train/nll/chosen"])) < 1e-5
