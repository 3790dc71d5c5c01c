"""The trainer's DAPO / KL options: KL in the reward, overlong filtering, dynamic sampling."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from rlvr.monitor.metrics import read_metrics
from rlvr.tasks.base import DOMAINS, seeded_rng
from rlvr.types import Spec, Task, Verdict
from rlvr.verifiers.base import VERIFIERS

from test_grpo import _cfg, digits  # noqa: F401  (digits: an autouse fixture, test.digits is registered here too)


def _step_inputs(model_dir, out, **extra):
    """A fresh run and one verified batch of its first step (the synchronous phases, by hand)."""
    import rlvr.train.grpo as grpo

    from rlvr.train import sources
    torch.set_num_threads(1)
    cfg = _cfg(model_dir, out, steps=1, **extra)
    run = grpo.setup(cfg, resume=False)
    tasks = run.pool.next(cfg.rollout.tasks_per_step, step=0)
    return cfg, run, sources.verify_and_reward(tasks, sources.rollout(run, tasks, 0), cfg)


# --------------------------------------------------------------------------- KL in the reward


def test_kl_in_reward_subtracts_the_sequence_kl_before_the_estimator_and_leaves_the_loss(tiny_model_dir, tmp_path):
    import rlvr.train.grpo as grpo
    from rlvr.algos.advantages import ADVANTAGES

    beta = 0.5
    cfg, run, scored = _step_inputs(tiny_model_dir, tmp_path / "r", **{
        "algo.kl_coef": beta, "algo.kl_in_reward": "true", "algo.kl_estimator": "k1"})
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a reference away from the policy, so the penalty is not ~0
        for p in run.components["kl_reference"].model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    kept = grpo.select_samples(scored, cfg)
    prepared = grpo.prepare(run, kept, cfg)
    prepared, metrics = grpo.compute_advantages(prepared, cfg)
    b = prepared.batch
    assert b.ref_logprobs is None  # no KL term in the loss
    penalties = []
    for i in range(len(kept)):  # loop reference: beta * sum over policy tokens of k1(old, ref)
        penalties.append(beta * sum(float(b.old_logprobs[i, t] - prepared.ref_logprobs[i, t])
                                    for t in range(b.loss_mask.shape[1]) if b.loss_mask[i, t] > 0))
    assert max(abs(x) for x in penalties) > 0.05
    rewards = torch.tensor([s.reward - pen for s, pen in zip(kept, penalties)])
    groups = torch.tensor([s.trajectory.group_id for s in kept])
    torch.testing.assert_close(b.advantages, ADVANTAGES.get("grpo")(rewards, groups), rtol=1e-4, atol=1e-5)
    assert metrics["rollout/kl_penalty_mean"] == pytest.approx(sum(penalties) / len(penalties), rel=1e-4)
    out = grpo.update(run, prepared, cfg)
    assert "train/kl" not in out and out["train/samples"] == len(kept)


def test_kl_in_reward_needs_kl_coef(tiny_model_dir, tmp_path):
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match=r"algo\.kl_in_reward.*algo\.kl_coef"):
        _cfg(tiny_model_dir, tmp_path / "x", **{"algo.kl_in_reward": "true"})


# --------------------------------------------------------------------------- overlong filtering


def test_overlong_filter_trains_on_the_finished_rows_with_the_whole_groups_advantages(tiny_model_dir, tmp_path):
    """The filtered update equals an update on only the finished samples whose advantages were
    computed with the truncated samples still in their groups."""
    import rlvr.train.grpo as grpo
    from rlvr.algos.advantages import ADVANTAGES
    from rlvr.train.phases import with_advantages

    cfg, run, scored = _step_inputs(tiny_model_dir, tmp_path / "f", **{"algo.overlong_filter": "true"})
    scored = [dataclasses.replace(s, trajectory=dataclasses.replace(
        s.trajectory, finish_reason="length" if i % 3 == 0 else "stop")) for i, s in enumerate(scored)]
    plain = _cfg(tiny_model_dir, tmp_path / "m", steps=1)
    manual = grpo.setup(plain, resume=False)  # the same start weights

    kept = grpo.select_samples(scored, cfg)
    prepared = grpo.prepare(run, kept, cfg)
    prepared, _ = grpo.compute_advantages(prepared, cfg)
    advantage = {s.trajectory.task_id + str(i): float(a) for i, (s, a) in enumerate(zip(kept, prepared.batch.advantages))}
    finished = [(i, s) for i, s in enumerate(kept) if s.trajectory.finish_reason != "length"]
    assert 0 < len(finished) < len(kept)
    run.generator.manual_seed(7)
    out = grpo.update(run, prepared, cfg)

    by_hand = grpo.prepare(manual, [s for _, s in finished], plain)
    by_hand = with_advantages(by_hand, torch.tensor([advantage[s.trajectory.task_id + str(i)] for i, s in finished]))
    manual.generator.manual_seed(7)
    out_by_hand = grpo.update(manual, by_hand, plain)

    for (name, a), b in zip(run.model.named_parameters(), manual.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=name)
    tokens = sum(s.trajectory.num_policy_tokens for _, s in finished)
    assert out["train/policy_tokens"] == out_by_hand["train/policy_tokens"] == tokens
    assert out["train/samples"] == len(finished)
    assert out["train/overlong_filtered_frac"] == pytest.approx(1 - len(finished) / len(kept))
    # the truncated samples counted in their groups: recomputing without them gives other advantages
    rewards = torch.tensor([s.reward for _, s in finished])
    alone = ADVANTAGES.get("grpo")(rewards, torch.tensor([s.trajectory.group_id for _, s in finished]))
    assert not torch.allclose(alone, by_hand.batch.advantages)


def test_overlong_filter_in_a_run_trains_only_finished_samples(tiny_model_dir, tmp_path):
    from rlvr.train.grpo import run_grpo

    torch.set_num_threads(1)
    run_grpo(_cfg(tiny_model_dir, tmp_path / "run", steps=2, **{"algo.overlong_filter": "true"}), progress=False)
    for m in read_metrics(tmp_path / "run"):  # 6 new tokens: a random model is mostly cut off
        kept = round(32 * m["rollout/kept_frac"])
        assert m["train/overlong_filtered_frac"] > 0.5
        trained = round(kept * (1 - m["train/overlong_filtered_frac"]))
        assert m.get("train/samples", 0.0) == trained, m


# --------------------------------------------------------------------------- dynamic sampling


class FlatDomain:
    """Tasks two in three of which give every sample the same reward: ``index % 3`` 0: the share
    of digits written (varies), 1: always passed, 2: always failed."""

    name = "test.flat"
    version = "v1"
    levels = (1,)

    def generate(self, split: str, level: int, index: int, seed: int) -> Task:
        rng = seeded_rng(seed, self.name, split, index)
        return Task(id=f"{self.name}/v1/{split}/{level}/{index:06d}", domain=self.name, level=level,
                    prompt=({"role": "user", "content": "Write digits."},),
                    spec=Spec(kind="test.flat", payload={"mode": ("digits", "pass", "fail")[index % 3]}),
                    key=f"{split}:{index}:{rng.randrange(10**6)}", reference="123")

    def corpus(self, seed: int, n_docs: int) -> list[str]:
        return ["123"] * n_docs


class FlatVerifier:
    name = "test.flat"

    def check(self, task: Task, completion: str) -> Verdict:
        mode = task.spec.payload["mode"]
        score = sum(c.isdigit() for c in completion) / max(len(completion), 1) if mode == "digits" else \
            float(mode == "pass")
        return Verdict(passed=score == 1.0, score=score, reason="ok")


@contextlib.contextmanager
def flat_registered():
    with DOMAINS.temporary("test.flat", FlatDomain()), VERIFIERS.temporary("test.flat", FlatVerifier()):
        yield


def test_dynamic_sampling_keeps_every_update_at_the_batch_size_when_most_groups_are_flat(tiny_model_dir, tmp_path):
    from rlvr.train.grpo import run_grpo

    torch.set_num_threads(1)
    extra = {"domains": "[test.flat]", "train_tasks": 90}
    with flat_registered():
        run_grpo(_cfg(tiny_model_dir, tmp_path / "refill", steps=3, **extra,
                      **{"algo.dynamic_sampling_rounds": 12}), progress=False)
        run_grpo(_cfg(tiny_model_dir, tmp_path / "plain", steps=3, **extra), progress=False)
    refill, plain = read_metrics(tmp_path / "refill"), read_metrics(tmp_path / "plain")
    assert [m["train/samples"] for m in refill] == [4 * 8] * 3  # never fewer, never more
    assert all(m["dynamic_sampling/rounds"] > 1 and m["dynamic_sampling/groups_drawn"] > 4 for m in refill), refill
    assert all(m["dynamic_sampling/zero_variance_frac"] > 0.3 for m in refill)
    assert all(m.get("train/samples", 0.0) < 4 * 8 for m in plain)  # without it the batch shrinks
    assert not any(k.startswith("dynamic_sampling/") for k in plain[0])


@pytest.mark.parametrize("extra,key", [
    ({"algo.dynamic_sampling_rounds": 2, "curriculum.enabled": "true"}, "curriculum.filter.refill_rounds"),
    ({"algo.dynamic_sampling_rounds": 2, "algo.drop_zero_variance": "false"}, "algo.drop_zero_variance"),
    ({"algo.dynamic_sampling_rounds": -1}, "algo.dynamic_sampling_rounds"),
])
def test_dynamic_sampling_refusals_name_the_key(tiny_model_dir, tmp_path, extra, key):
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _cfg(tiny_model_dir, tmp_path / "x", **extra)


def test_dynamic_sampling_with_the_curriculum_off_its_refill(tiny_model_dir, tmp_path):
    """The curriculum with its own refill off takes ``algo.dynamic_sampling_rounds`` (and its metric names)."""
    from rlvr.train.sources import dynamic_sampling

    cfg = _cfg(tiny_model_dir, tmp_path / "x", **{"algo.dynamic_sampling_rounds": 3, "curriculum.enabled": "true",
                                                 "curriculum.filter.refill_rounds": 0})
    assert dynamic_sampling(cfg) == {"refill_rounds": 3, "refill_metrics": "dynamic_sampling"}
    cfg = _cfg(tiny_model_dir, tmp_path / "x", **{"curriculum.enabled": "true"})
    assert dynamic_sampling(cfg) == {"refill_rounds": 2, "refill_metrics": "curriculum"}


def test_dynamic_sampling_and_kl_in_reward_under_torchrun_train_what_one_process_does(tiny_model_dir, tmp_path):
    """Data parallel (2 processes, gloo) with dynamic sampling and the KL in the reward: the same
    metrics as one process (the refill rounds run on every rank alike)."""
    import os
    import subprocess
    import sys
    import textwrap

    from rlvr.cli import main
    from test_distributed import ROOT, _close, _metrics, _train_args

    args = _train_args(tmp_path, tiny_model_dir)
    (tmp_path / "variety.py").write_text(textwrap.dedent('''
        def variety(prompts, completions, **columns):  # flat for 6 of the 8 prompts
            return [len(set(c)) / 8 if ("cats" in str(p) or "tea" in str(p)) else 0.5
                    for p, c in zip(prompts, completions)]
    '''))
    args += [a for s in ("steps=3", "algo.dynamic_sampling_rounds=6", "algo.kl_coef=0.1", "algo.kl_in_reward=true",
                         "rollout.tasks_per_step=2") for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "rlvr.cli", *args, "--out", str(tmp_path / "two")], env=env, capture_output=True,
                          text=True, check=False, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    one = _metrics(tmp_path / "one")
    assert [m["train/samples"] for m in one] == [2 * 4] * 3
    assert max(m["dynamic_sampling/rounds"] for m in one) > 1 and all("rollout/kl_penalty_mean" in m for m in one)
    _close(one, _metrics(tmp_path / "two"))


def test_a_killed_run_with_every_option_resumes_to_the_same_metrics(tiny_model_dir, tmp_path, monkeypatch):
    """Dynamic sampling (refills drawn from the pool: its state is checkpointed after them), KL in
    the reward, overlong filtering and distillation (the teacher reloaded) together."""
    import json

    from test_grpo import killed_and_straight_metrics

    torch.set_num_threads(1)
    extra = {"domains": "[test.flat]", "train_tasks": 90, "algo.dynamic_sampling_rounds": 4, "algo.kl_coef": 0.1,
             "algo.kl_in_reward": "true", "algo.overlong_filter": "true", "rollout.max_new_tokens": 12,
             "distill.teacher": tiny_model_dir, "distill.coef": 0.5}
    with flat_registered():
        straight, crashed = killed_and_straight_metrics(tiny_model_dir, tmp_path, monkeypatch, extra)
    assert max(m["dynamic_sampling/rounds"] for m in straight) > 1
    assert sum(m.get("train/samples", 0.0) > 0 for m in straight) >= 3, straight  # most steps trained
    assert all({"rollout/kl_penalty_mean", "distill/reverse_kl", "train/overlong_filtered_frac"} <= set(m) for m in straight)
    assert [r["step"] for r in crashed] == [1, 2, 3, 4, 5]
    assert json.dumps(straight, sort_keys=True) == json.dumps(crashed, sort_keys=True)
