"""The trainers' optimizer: fused AdamW where torch has it, the same update and state as the default."""

from __future__ import annotations

import copy

import torch

import rlvr.train.common as common
from rlvr.train.common import OptimConfig, build_optimizer, clip_and_step, fused_adamw_supported


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def _train(model, opt, sched, steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        model(x).square().mean().backward()
        clip_and_step(model, opt, sched, grad_clip=1.0)


def test_cpu_optimizer_is_fused_and_matches_the_default_adamw(monkeypatch):
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=2, schedule="cosine")
    fused_model, plain_model = _model(), _model()
    opt, sched = build_optimizer(fused_model, cfg, total_steps=10)
    assert opt.defaults["fused"] is True
    # The reference: the same groups and schedule through torch's default (multi-tensor) AdamW.
    monkeypatch.setattr(common, "fused_adamw_supported", lambda params: False)
    plain_opt, plain_sched = build_optimizer(plain_model, cfg, total_steps=10)
    assert not plain_opt.defaults["fused"]
    _train(fused_model, opt, sched, steps=10)
    _train(plain_model, plain_opt, plain_sched, steps=10)
    for a, b in zip(fused_model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    changed = [not torch.equal(a, b) for a, b in zip(fused_model.parameters(), _model().parameters())]
    assert all(changed)


def test_fused_state_resumes_in_a_new_optimizer():
    cfg = OptimConfig(lr=1e-2)
    model = _model()
    opt, sched = build_optimizer(model, cfg, total_steps=6)
    _train(model, opt, sched, steps=3)
    state = copy.deepcopy(opt.state_dict())  # as a checkpoint holds it (state_dict shares the tensors)
    resumed = _model()
    resumed.load_state_dict(model.state_dict())
    opt2, sched2 = build_optimizer(resumed, cfg, total_steps=6)
    opt2.load_state_dict(state)
    _train(model, opt, sched, steps=3, seed=2)
    _train(resumed, opt2, sched2, steps=3, seed=2)
    for a, b in zip(model.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fused_only_where_torch_has_the_kernel():
    assert fused_adamw_supported([torch.zeros(2)])
    assert not fused_adamw_supported([])
    assert not fused_adamw_supported([torch.zeros(2, device="meta")])
    assert not fused_adamw_supported([torch.zeros(2, dtype=torch.int64)])
