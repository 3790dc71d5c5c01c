"""Memory options: float32 master weights over a bf16 model (against a plain float32 AdamW
reference), bf16 AdamW states, activation checkpointing (same update as without)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.monitor.metrics import read_metrics
from rlvr.train import grpo
from rlvr.train.common import MasterWeightAdamW, OptimConfig, build_optimizer, clip_and_step
from rlvr.train.memory import enable_activation_checkpointing
from test_grpo import digits  # noqa: F401  (an autouse fixture: test.digits, partial-credit rewards that vary)


def _pair():
    torch.manual_seed(0)
    low = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
    return low, copy.deepcopy(low).float()  # the reference starts from the same (rounded) weights


@pytest.mark.parametrize("grad_clip", [0.0, 0.05])
def test_master_weights_step_like_float32_adamw_and_round_into_the_model(grad_clip):
    low, ref = _pair()
    opt, sched = build_optimizer(low, OptimConfig(lr=1e-2, master_weights=True, grad_clip=grad_clip), 10)
    ref_opt, ref_sched = build_optimizer(ref, OptimConfig(lr=1e-2, grad_clip=grad_clip), 10)
    assert isinstance(opt, MasterWeightAdamW) and all(m.dtype == torch.float32 for m in opt.masters)
    index = {id(p): i for i, p in enumerate(low.parameters())}
    ref_params = list(ref.parameters())
    for _ in range(4):
        ref(torch.randn(4, 8)).square().sum().backward()
        for p, q in zip(low.parameters(), ref.parameters()):  # the same (bf16) gradients on both sides
            p.grad = q.grad.to(torch.bfloat16)
            q.grad = p.grad.float()
        norm = clip_and_step(low, opt, sched, grad_clip)
        assert norm == pytest.approx(clip_and_step(ref, ref_opt, ref_sched, grad_clip), rel=1e-6)
    for p, m in opt.pairs:
        assert torch.equal(m, ref_params[index[id(p)]])  # the masters are the float32 run
        assert torch.equal(p, m.to(torch.bfloat16))  # the model holds them rounded
    changed = [not torch.equal(m.to(torch.bfloat16).float(), m) for m in opt.masters]
    assert any(changed)  # precision the bf16 weights alone would have lost


def test_master_weights_hold_one_gradient_copy_at_the_step():
    """``load_grads`` moves the bf16 gradients into float32 ones on the masters and frees the bf16
    ones: the step's peak holds one gradient copy (4 B/param), not both (6 B/param)."""
    low, _ = _pair()
    opt, _ = build_optimizer(low, OptimConfig(lr=1e-2, master_weights=True), 10)
    low(torch.randn(4, 8, dtype=torch.bfloat16)).float().square().sum().backward()
    grads = {id(p): p.grad.clone() for p in low.parameters()}
    opt.load_grads()
    assert all(p.grad is None for p in low.parameters())
    assert all(m.grad.dtype == torch.float32 and torch.equal(m.grad, grads[id(p)].float()) for p, m in opt.pairs)


def test_master_weights_resume_from_the_float32_copies_not_the_rounded_weights():
    low, _ = _pair()
    cfg = OptimConfig(lr=1e-3, master_weights=True)
    opt, sched = build_optimizer(low, cfg, 10)
    low(torch.randn(4, 8, dtype=torch.bfloat16)).sum().backward()
    clip_and_step(low, opt, sched, 1.0)
    again = copy.deepcopy(low)
    opt2, _ = build_optimizer(again, cfg, 10)
    opt2.load_state_dict(opt.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(opt2.masters, opt.masters))
    assert opt2.state_dict()["state"][0]["exp_avg"].dtype == torch.float32


def test_without_master_weights_a_bf16_model_keeps_bf16_adamw_states():
    low, _ = _pair()
    opt, sched = build_optimizer(low, OptimConfig(lr=1e-3), 10)
    assert type(opt) is torch.optim.AdamW
    low(torch.randn(4, 8, dtype=torch.bfloat16)).sum().backward()
    clip_and_step(low, opt, sched, 1.0)
    assert {s["exp_avg"].dtype for s in opt.state.values()} == {torch.bfloat16}


def _cfg(model: str, out, *extra: str) -> grpo.GRPOConfig:
    return load_config(grpo.GRPOConfig, None, [
        f"model={model}", f"out={out}", "steps=2", "domains=[test.digits]", "levels=[1]", "train_tasks=16",
        "rollout.tasks_per_step=2", "rollout.samples_per_task=4", "rollout.max_new_tokens=6",
        "reward.outcome=score", "checkpoint_every=1", *extra])


@pytest.mark.parametrize("precision", ["model", "bf16"])
def test_activation_checkpointing_gives_the_same_run(tiny_model_dir, tmp_path, precision):
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "plain", f"algo.precision={precision}"), progress=False)
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "ckpt", f"algo.precision={precision}",
                       "algo.gradient_checkpointing=true"), progress=False)
    plain, ckpt = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "ckpt")
    assert any("train/grad_norm" in m for m in plain)
    # fp32: the same numbers; bf16 autocast: the checkpointed forward runs padded rows on torch's
    # default attention backend (docs/training_step.md), so bf16 rounding differs a little
    rel, abs_ = (1e-5, 1e-7) if precision == "model" else (3e-2, 1e-4)
    assert plain[0]["rollout/reward_mean"] == ckpt[0]["rollout/reward_mean"]
    for a, b in zip(plain, ckpt):
        for k in ("train/pg_loss", "train/grad_norm"):
            if k in a:
                assert b[k] == pytest.approx(a[k], rel=rel, abs=abs_), k


def test_chunked_logits_give_the_same_run(tiny_model_dir, tmp_path):
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "plain"), progress=False)
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "chunked", "algo.logits_chunk=3"), progress=False)
    plain, chunked = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "chunked")
    assert any("train/grad_norm" in m for m in plain)
    for a, b in zip(plain, chunked):
        for k in ("rollout/reward_mean", "train/pg_loss", "train/grad_norm"):
            if k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k


def test_a_bf16_run_with_master_weights_trains_and_resumes_exactly(tiny_model_dir, tmp_path):
    extra = ("model_load.dtype=bfloat16", "optim.master_weights=true")
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "full", *extra), progress=False)
    cut = _cfg(tiny_model_dir, tmp_path / "cut", *extra)
    cut.steps = 1
    grpo.run_grpo(cut, progress=False)
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "cut", *extra), resume=True, progress=False)
    full, resumed = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert any("train/grad_norm" in m for m in full)
    for a, b in zip(full, resumed):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith("time/")}


def test_a_model_without_checkpointing_support_is_a_config_error(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="algo.compile"):
        _cfg(tiny_model_dir, tmp_path, "algo.compile=true", "algo.gradient_checkpointing=true")
    with pytest.raises(ConfigError, match="algo.gradient_checkpointing"):
        enable_activation_checkpointing(torch.nn.Linear(2, 2))
