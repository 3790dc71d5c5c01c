"""Every advantage estimator and policy loss runs through ``run_grpo`` (2 steps, tiny model).

The math is tested against loops in test_advantages.py / test_losses.py; this checks that each
registered name is a valid config value the trainer runs end to end with finite metrics.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_grpo import _cfg, digits  # noqa: F401  (digits: an autouse fixture registering test.digits)

from rlvr.algos import ADVANTAGES, POLICY_LOSSES
from rlvr.monitor.metrics import read_metrics

CASES = [{"algo.advantage": name} for name in ADVANTAGES.names() if name != "grpo"] + [
    {"algo.policy_loss": name, **({"algo.clip_low": 3e-4, "algo.clip_high": 4e-4,
                                   "algo.aggregation": "seq_mean_token_mean"} if name == "gspo" else {}),
     **({"algo.clip_low": 1.0} if name == "cispo" else {})}
    for name in POLICY_LOSSES.names() if name != "ppo_clip"
]


@pytest.mark.parametrize("extra", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in CASES])
def test_every_estimator_and_loss_trains(tiny_model_dir, tmp_path, extra):
    from rlvr.train.grpo import run_grpo

    torch.set_num_threads(1)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=2, checkpoint_every=100, **{"algo.ppo_epochs": 2, **extra})
    run_grpo(cfg, progress=False)
    metrics = read_metrics(tmp_path / "run")
    assert len(metrics) == 2
    for row in metrics:
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad
    trained = [row for row in metrics if "train/pg_loss" in row]
    assert trained, "no step trained"
    assert any(row.get("train/approx_kl", 0.0) != 0.0 for row in trained)  # a second epoch moved the policy
