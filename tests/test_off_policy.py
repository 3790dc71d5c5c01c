"""``rlvr.algos.off_policy.correct_off_policy`` against a plain per-token loop, and the rollout
sources against the ``RolloutSource`` protocol."""

from __future__ import annotations

import inspect
import math

import torch

from rlvr.algos.off_policy import correct_off_policy
from rlvr.rollout.async_rollout import AsyncRollout
from rlvr.rollout.source import RolloutSource
from rlvr.rollout.sync_rollout import SyncRollout


def loop_reference(pi_old, behaviour, mask, cap):
    B, T = pi_old.shape
    old = [[0.0] * T for _ in range(B)]
    w = [[1.0] * T for _ in range(B)]
    picked_w, kl = [], []
    for b in range(B):
        for t in range(T):
            p, q = float(pi_old[b, t]), float(behaviour[b, t])
            if mask[b, t]:
                old[b][t] = p
                w[b][t] = min(math.exp(p - q), cap)
                picked_w.append(w[b][t])
                d = p - q  # k3 of KL(behaviour || trainer) on tokens drawn from behaviour
                kl.append(math.exp(d) - d - 1)
            else:
                old[b][t] = q
    n = max(len(picked_w), 1)
    metrics = {"is_weight_mean": sum(picked_w) / n,
               "is_weight_capped_frac": sum(x >= cap for x in picked_w) / n,
               "behaviour_kl": sum(kl) / max(len(kl), 1)}
    return torch.tensor(old), torch.tensor(w), metrics


def test_matches_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    for cap in (1.5, 2.0, 10.0):
        pi_old = -torch.rand(4, 7, generator=g) * 3
        behaviour = -torch.rand(4, 7, generator=g) * 3
        mask = torch.rand(4, 7, generator=g) > 0.4
        mask[2] = False  # a row with nothing to correct
        old, w, metrics = correct_off_policy(pi_old, behaviour, mask, cap)
        ref_old, ref_w, ref_metrics = loop_reference(pi_old, behaviour, mask, cap)
        torch.testing.assert_close(old, ref_old)
        torch.testing.assert_close(w, ref_w)
        assert w.max() <= cap and bool((w[~mask] == 1).all())
        for k, v in ref_metrics.items():
            assert math.isclose(metrics[k], v, rel_tol=1e-5, abs_tol=1e-6), k


def test_no_gradient_through_pi_old_and_empty_mask():
    pi_old = torch.full((2, 3), -1.0, requires_grad=True)
    behaviour = torch.full((2, 3), -2.0)
    old, w, metrics = correct_off_policy(pi_old, behaviour, torch.zeros(2, 3, dtype=torch.bool), 2.0)
    assert not old.requires_grad and not w.requires_grad
    assert torch.equal(old, behaviour) and torch.equal(w, torch.ones(2, 3))
    assert metrics == {"is_weight_mean": 0.0, "is_weight_capped_frac": 0.0, "behaviour_kl": 0.0}


def test_both_sources_implement_the_protocol():
    for impl in (SyncRollout, AsyncRollout):
        for name, proto in inspect.getmembers(RolloutSource, inspect.isfunction):
            if name.startswith("_"):
                continue
            method = getattr(impl, name, None)
            assert callable(method), f"{impl.__name__} lacks {name}"
            assert list(inspect.signature(method).parameters) == list(inspect.signature(proto).parameters), \
                f"{impl.__name__}.{name} differs from RolloutSource.{name}"


def test_sync_rollout_draws_generates_and_verifies_in_order():
    calls = []

    class Pool:
        drawn = 0

        def next(self, n, step=0):
            self.drawn += n
            return list(range(self.drawn - n, self.drawn))

        def observe(self, scored, step=0):
            calls.append(("observe", scored, step))

        def metrics(self):
            return {}

        def state_dict(self):
            return {"cursor": self.drawn}

    model = torch.nn.Linear(1, 1)

    def generate(tasks, version):
        calls.append(("generate", tasks, version))
        return [f"ep{t}" for t in tasks]

    def verify(tasks, episodes):
        calls.append(("verify", tasks, episodes))
        return [f"scored:{e}" for e in episodes]

    source = SyncRollout(pool=Pool(), tasks_per_step=2, generate=generate, verify=verify)
    first = source.next(trainer_version=0)
    source.push(model, version=1)
    second = source.next(trainer_version=1)
    assert calls == [("generate", [0, 1], 0), ("verify", [0, 1], ["ep0", "ep1"]),
                     ("observe", ["scored:ep0", "scored:ep1"], 0),
                     ("generate", [2, 3], 1), ("verify", [2, 3], ["ep2", "ep3"]),
                     ("observe", ["scored:ep2", "scored:ep3"], 1)]
    assert (first.index, first.version, first.tasks, first.scored) == (0, 0, [0, 1], ["scored:ep0", "scored:ep1"])
    assert (second.version, second.pool_state, second.mismatch_kl) == (1, {"cursor": 4}, None)
    assert set(source.metrics(second, 1)) == {"time/curriculum", "time/rollout", "time/verify"}
    source.close()
