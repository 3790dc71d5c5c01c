"""Asynchronous GRPO: bounded queues, staleness <= k, truncated IS on stale samples, the weight-sync
canary, the log-prob mismatch metric, and async training that learns and resumes."""

from __future__ import annotations

import copy
import dataclasses
import threading
from types import SimpleNamespace

import pytest
import torch

from rlvr.monitor.metrics import read_metrics
from rlvr.types import Trajectory

from test_grpo import _cfg, digits  # noqa: F401  (digits: an autouse fixture, test.digits is registered here too)


def _model(tiny_model_dir):
    from rlvr.model.load import load_model

    return load_model(tiny_model_dir)


def _perturb(model, scale=1e-2, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


# --------------------------------------------------------------------------- weight sync + canary


def test_canary_passes_on_a_real_sync_and_catches_stale_weights(tiny_model_dir, monkeypatch):
    from rlvr.rollout.weights import StaleWeightsError, WeightSync

    model = _model(tiny_model_dir)
    engine = copy.deepcopy(model)
    sync = WeightSync(model.config.vocab_size)
    sync.push(model, 0)
    assert sync.pull(engine, serving=0) == 0  # nothing newer: no load
    _perturb(model, seed=1)
    sync.push(model, 1)
    assert sync.pull(engine, serving=0) == 1  # real load: the canary agrees
    assert all(torch.equal(a, b) for a, b in zip(engine.state_dict().values(), model.state_dict().values()))

    _perturb(model, seed=2)
    sync.push(model, 2)
    monkeypatch.setattr(sync, "load", lambda engine, state: None)  # a sync that forgets to load
    with pytest.raises(StaleWeightsError, match=r"version 2.*serving version 1"):
        sync.pull(engine, serving=1)
    monkeypatch.undo()

    # the wrong version loaded: version 1's weights while the trainer pushed version 3
    v1 = {k: v.clone() for k, v in engine.state_dict().items()}
    _perturb(model, seed=3)
    sync.push(model, 3)
    monkeypatch.setattr(sync, "load", lambda engine, state: engine.load_state_dict(v1))
    with pytest.raises(StaleWeightsError, match="version 3"):
        sync.pull(engine, serving=1)

    with pytest.raises(ValueError, match="increase"):
        sync.push(model, 3)


# --------------------------------------------------------------------------- producer, queues, staleness


def _fake_rollout(model, k, queue_size, ahead, n=8, patience=60.0):
    """Drive AsyncRollout with an instant fake generator/verifier and a trainer that, after
    taking batch ``step``, holds its update until the producer has started generating batch
    ``step + ahead`` (event-driven: no sleeps, so a loaded machine changes no outcome; ``patience``
    only stops a hang). The producer's own gates (staleness, queues) decide how far it may go."""
    from rlvr.curriculum.pool import TaskPool
    from rlvr.rollout.async_rollout import AsyncConfig, AsyncRollout
    from rlvr.rollout.episodes import Episode

    consumed = []
    in_flight = []  # batches generated but not yet consumed, seen at each generate call
    started = []  # the batch index of each generate call
    cond = threading.Condition()

    def generate(engine, tasks, version, envs, generator):
        with cond:
            in_flight.append(rollout.next_index - len(consumed) + 1)
            started.append(rollout.next_index)
            cond.notify_all()
        traj = Trajectory(task_id="t", group_id=0, messages=(), completion="", token_ids=(1, 5, 6, 7),
                          loss_mask=(0, 1, 1, 1), logprobs=(0.0, -1.0, -1.0, -1.0), finish_reason="stop",
                          policy_version=version)
        return [Episode(traj)]

    def verify(tasks, episodes):
        return [ep.trajectory for ep in episodes]

    pool = TaskPool(["task"] * 4, seed=0)
    rollout = AsyncRollout(model, AsyncConfig(enabled=True, max_staleness=k, queue_size=queue_size),
                           pool=pool, tasks_per_step=1, start=0, total=n, generate=generate, verify=verify,
                           pad_token_id=0)
    rollout.start()
    try:
        for step in range(n):
            got = rollout.next(trainer_version=step)
            assert all(s.policy_version == got.version for s in got.scored)
            target = min(step + ahead, n - 1)
            with cond:
                consumed.append((got.index, got.version, step))
                assert cond.wait_for(lambda: started and started[-1] >= target, timeout=patience), \
                    f"step {step}: the producer never started batch {target} ({started})"
            rollout.push(model, version=step + 1)
    finally:
        rollout.close()
    return consumed, in_flight, rollout


@pytest.mark.parametrize("k", [0, 1, 2])
def test_staleness_never_exceeds_k_and_queues_are_bounded(tiny_model_dir, k):
    model = _model(tiny_model_dir)
    # the trainer is the bottleneck: it lets the producer run as far ahead as k allows
    consumed, in_flight, rollout = _fake_rollout(model, k, queue_size=1, ahead=k)
    assert [index for index, _, _ in consumed] == list(range(8))
    staleness = [step - version for _, version, step in consumed]
    assert max(staleness) <= k, staleness
    assert min(staleness) >= 0
    # batch j is generated while the newest version is j - k (the trainer holds its update until
    # then), so from step k on every batch is exactly k versions old
    assert staleness[k:] == [k] * (8 - k), staleness
    assert rollout.dropped == 0
    assert max(in_flight) <= 2 * 1 + 2  # two queues of 1 + one generating + one verifying


def test_the_producer_cannot_run_past_the_staleness_gate(tiny_model_dir):
    """With room in the queues, a trainer that waits for batch step + k + 1 before its update
    would wait forever: the gate holds the producer until that update (the wait gives up)."""
    model = _model(tiny_model_dir)
    with pytest.raises(AssertionError, match="never started batch 2"):
        _fake_rollout(model, 1, queue_size=4, ahead=2, patience=0.5)


def test_queue_backpressure_blocks_the_producer(tiny_model_dir):
    model = _model(tiny_model_dir)
    # k is large, so only the bounded queues stop the producer from running ahead of a slow
    # trainer: after each batch the trainer waits until generation of batch step + 4 has started
    _, in_flight, _ = _fake_rollout(model, k=50, queue_size=2, ahead=4, n=10)
    assert max(in_flight) <= 2 * 2 + 2, in_flight
    assert max(in_flight) >= 4, in_flight  # and it did run ahead


def test_producer_errors_reach_the_trainer(tiny_model_dir):
    from rlvr.curriculum.pool import TaskPool
    from rlvr.rollout.async_rollout import AsyncConfig, AsyncRollout

    def generate(*args):
        raise RuntimeError("engine exploded")

    model = _model(tiny_model_dir)
    rollout = AsyncRollout(model, AsyncConfig(enabled=True), pool=TaskPool(["t"], 0), tasks_per_step=1,
                           start=0, total=3, generate=generate, verify=lambda t, e: e, pad_token_id=0).start()
    with pytest.raises(RuntimeError, match="engine exploded"):
        rollout.next(trainer_version=0)
    rollout.close()


# --------------------------------------------------------------------------- off-policy correction


def test_is_weights_apply_to_stale_samples_and_are_one_on_policy(tiny_model_dir):
    from rlvr.algos.penalties import truncated_is_weights
    from rlvr.model.logprobs import sequence_logprobs
    from rlvr.train.batching import collate
    from rlvr.train.grpo import GRPOConfig
    from rlvr.train.update import micro_loss, off_policy_correction

    trainer = _model(tiny_model_dir)
    old = copy.deepcopy(trainer)
    _perturb(trainer, scale=5e-2)  # the trainer moved on since the old policy generated
    ids = torch.tensor([[3, 10, 11, 12, 13, 14], [3, 20, 21, 22, 23, 0], [3, 30, 31, 32, 33, 34]])
    attn = torch.tensor([[1] * 6, [1] * 5 + [0], [1] * 6])
    with torch.no_grad():
        old_lp, new_lp = sequence_logprobs(old, ids, attn), sequence_logprobs(trainer, ids, attn)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.float32)
    versions = [4, 5, 3]  # trainer is at version 5: rows 0 and 2 are stale, row 1 on-policy
    behaviour = [old_lp[0], new_lp[1], old_lp[2]]
    trajs = [Trajectory(task_id="t", group_id=i, messages=(), completion="",
                        token_ids=tuple(ids[i][attn[i] > 0].tolist()),
                        loss_mask=tuple(int(m) for m in mask[i][attn[i] > 0]),
                        logprobs=tuple((behaviour[i] * mask[i])[attn[i] > 0].tolist()),
                        finish_reason="stop", policy_version=versions[i]) for i in range(3)]
    kept = [SimpleNamespace(trajectory=t) for t in trajs]
    batch = collate(trajs, [1.0, -1.0, 0.5], pad_token_id=0)
    behaviour_lp = batch.old_logprobs.clone()
    cfg = GRPOConfig()
    cfg.asynchronous.is_cap = 1.5
    cfg.algo.ppo_epochs = 2  # several optimizer steps per batch: pi_old needs its own forward up front
    batch, out = off_policy_correction(SimpleNamespace(model=trainer, step=5), batch, kept, cfg)

    assert out["async/stale_frac"] == pytest.approx(2 / 3)
    expected = truncated_is_weights(new_lp, behaviour_lp, 1.5)
    on = mask > 0
    for r in (0, 2):  # stale: weights = min(pi_old / pi_behaviour, C), pi_old = the trainer's now
        assert torch.allclose(batch.is_weights[r][on[r]], expected[r][on[r]], atol=1e-6)
        assert not torch.allclose(batch.is_weights[r][on[r]], torch.ones(int(on[r].sum())))
        assert torch.allclose(batch.old_logprobs[r][on[r]], new_lp[r][on[r]], atol=1e-6)
    assert torch.equal(batch.is_weights[1], torch.ones(6))  # on-policy: exactly 1, pi_old = behaviour
    assert torch.equal(batch.old_logprobs[1], behaviour_lp[1])
    assert torch.equal(batch.is_weights[~on], torch.ones(int((~on).sum())))
    assert float(batch.is_weights.max()) <= 1.5

    # the loss uses them: zero weights -> zero loss and no gradient
    totals = {"num_tokens": float(batch.loss_mask.sum()), "num_seqs": 3.0, "max_tokens": 6}
    loss, _ = micro_loss(trainer, batch, cfg.algo, totals, is_cap=1.5)
    assert float(loss.detach().abs()) > 0
    loss.backward()
    grads = [p.grad.clone() for p in trainer.parameters()]
    trainer.zero_grad()

    # single-pass update (the default): no extra forward, the loss's own forward gives pi_old;
    # same weights, same loss, same gradient
    fused = collate(trajs, [1.0, -1.0, 0.5], pad_token_id=0)
    cfg.algo.ppo_epochs = 1
    fused, out = off_policy_correction(SimpleNamespace(model=None, step=5), fused, kept, cfg)
    assert out["async/stale_frac"] > 0
    assert fused.is_weights is None and fused.stale.tolist() == [True, False, True]
    fused_loss, metrics = micro_loss(trainer, fused, cfg.algo, totals, is_cap=1.5)
    assert torch.allclose(fused_loss, loss, atol=1e-6)
    assert 0 < metrics["is_weight_mean"] <= 1.5 and metrics["behaviour_kl"] > 0
    fused_loss.backward()
    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(trainer.parameters(), grads))
    loss, _ = micro_loss(trainer, dataclasses.replace(batch, is_weights=torch.zeros_like(batch.is_weights)),
                         cfg.algo, totals, is_cap=1.5)
    assert float(loss.detach().abs()) == 0.0

    # all on-policy: no extra forward, no weights
    batch = collate(trajs[2:], [0.5], pad_token_id=0)
    batch, out = off_policy_correction(SimpleNamespace(model=None, step=3), batch, kept[2:], cfg)
    assert out == {"async/stale_frac": 0.0} and batch.is_weights is None


# --------------------------------------------------------------------------- the mismatch metric


def test_logprob_mismatch_kl_function():
    from rlvr.algos.kl import logprob_mismatch_kl

    lp = torch.tensor([[0.0, -1.0, -2.0, -0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    assert logprob_mismatch_kl(lp, lp.clone(), mask) == 0.0
    off_mask_garbage = lp.clone()
    off_mask_garbage[0, 3] = float("-inf")
    assert logprob_mismatch_kl(lp, off_mask_garbage, mask) == 0.0
    d = torch.tensor([0.3, -0.2])
    expected = float((d.exp() - d - 1).mean())
    assert logprob_mismatch_kl(lp, lp - torch.tensor([[0.0, 0.3, -0.2, 0.0]]), mask) == pytest.approx(expected)


def test_mismatch_metric_near_zero_in_sync_mode_and_positive_when_perturbed(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    from rlvr.train import sources
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "clean", steps=2), progress=False)
    clean = [m["rollout/logprob_mismatch_kl"] for m in read_metrics(tmp_path / "clean")]
    assert len(clean) == 2 and max(clean) < 1e-6, clean

    real_rollout = sources.rollout

    def perturbed(run, tasks, policy_version):  # an engine whose logprobs are off by 0.3 nats
        episodes = real_rollout(run, tasks, policy_version)
        for ep in episodes:
            t = ep.trajectory
            ep.trajectory = dataclasses.replace(
                t, logprobs=tuple(lp - 0.3 * m for lp, m in zip(t.logprobs, t.loss_mask)))
        return episodes

    monkeypatch.setattr(sources, "rollout", perturbed)
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "off", steps=1), progress=False)
    off = read_metrics(tmp_path / "off")[0]["rollout/logprob_mismatch_kl"]
    assert off == pytest.approx(float(torch.tensor(0.3).exp() - 0.3 - 1), rel=1e-3)


def test_mismatch_metric_is_logged_when_every_group_is_dropped(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    monkeypatch.setattr(grpo, "select_samples", lambda scored, cfg: [])  # nothing to train
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "none", steps=2), progress=False)
    rows = read_metrics(tmp_path / "none")
    assert [m["train/skipped"] for m in rows] == [1.0, 1.0]
    assert all(0.0 <= m["rollout/logprob_mismatch_kl"] < 1e-6 for m in rows), rows


# --------------------------------------------------------------------------- async GRPO end to end


def test_async_grpo_changes_every_parameter_raises_reward_and_bounds_staleness(tiny_model_dir, tmp_path):
    from rlvr.model.load import load_model
    from rlvr.train.grpo import run_grpo

    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=12, **{"asynchronous.enabled": "true",
                                                              "asynchronous.max_staleness": 1})
    run_grpo(cfg, progress=False)
    before = dict(load_model(tiny_model_dir).named_parameters())
    after = dict(load_model(tmp_path / "run" / "final").named_parameters())
    unchanged = [n for n, p in after.items() if torch.equal(p, before[n])]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    rows = read_metrics(tmp_path / "run")
    rewards = [m["rollout/reward_mean"] for m in rows]
    assert len(rewards) == 12
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.05, rewards
    staleness = [m["async/staleness"] for m in rows]
    assert max(staleness) <= 1 and min(staleness) >= 0, staleness
    assert all(m["rollout/logprob_mismatch_kl"] < 1e-5 for m in rows)
    assert all(m["async/dropped_stale"] == 0 for m in rows)
    stale_rows = [m for m in rows if m["async/staleness"] > 0]
    assert stale_rows and all(0 < m["train/is_weight_mean"] <= 2.0 for m in stale_rows)


def test_async_run_resumes_from_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    extra = {"asynchronous.enabled": "true", "asynchronous.max_staleness": 2, "asynchronous.queue_size": 2}
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=4, **extra)
    real_update = grpo.update

    def update_then_die(run, prepared, cfg):
        if run.step == 2:  # step 3 starts: step 2 is checkpointed
            raise KeyboardInterrupt
        return real_update(run, prepared, cfg)

    monkeypatch.setattr(grpo, "update", update_then_die)
    with pytest.raises(KeyboardInterrupt):
        grpo.run_grpo(cfg, progress=False)
    monkeypatch.setattr(grpo, "update", real_update)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    from rlvr.model.checkpoint import latest_checkpoint, load_trainer_state

    state = load_trainer_state(latest_checkpoint(tmp_path / "run"))
    assert state["step"] == 2
    assert state["pool"]["cursor"] == 2 * 4, state["pool"]  # the trained batches' draws, not the producer's
    grpo.run_grpo(cfg, resume=True, progress=False)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["async/policy_version"] >= 2  # the refilled queue starts from the restored weights
    assert (tmp_path / "run" / "final").exists()


def test_async_config_is_validated(tiny_model_dir, tmp_path):
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match="asynchronous.max_staleness"):
        _cfg(tiny_model_dir, tmp_path, **{"asynchronous.max_staleness": -1})
    with pytest.raises(ConfigError, match="asynchronous.queue_size"):
        _cfg(tiny_model_dir, tmp_path, **{"asynchronous.queue_size": 0})


def test_async_grpo_on_multi_turn_episodes(tiny_model_dir, tmp_path, monkeypatch):
    """Episodes of a batch are verified by their environments while the next batch plays: the
    environment pools rotate, so no environment is reset before its verdict."""
    import rlvr.train.grpo as grpo
    from rlvr.config import load_config
    from rlvr.model.load import load_model_and_tokenizer

    from test_grpo_multiturn import twoturn_registered

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    bias = torch.zeros(model.lm_head.out_features)
    bias[tok.eos_token_id] = 3.0  # as in test_grpo_multiturn: a random model rarely ends a turn
    model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
    monkeypatch.setattr("rlvr.train.policy.load_model_and_tokenizer", lambda path, **kw: (model, tok))
    overrides = [
        f"model={tiny_model_dir}", f"out={tmp_path / 'run'}", "domains=[test.twoturn]", "levels=[1]",
        "train_tasks=16", "rollout.tasks_per_step=4", "rollout.samples_per_task=8", "env.turn_tokens=8",
        "env.max_tokens=16", "env.max_turns=2", "reward.outcome=score", "optim.lr=1e-2", "optim.warmup_steps=0",
        "steps=16", "checkpoint_every=100", "save_trajectories_every=100", "asynchronous.enabled=true",
    ]
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with twoturn_registered():
        grpo.run_grpo(load_config(grpo.GRPOConfig, None, overrides), progress=False)
    assert not [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["rollout/reward_mean"] for m in metrics]
    # learning here is slow and noisy (sync too: see test_grpo_multiturn); a rise, not its size
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.02, rewards
    assert metrics[-1]["rollout/turns_mean"] > 1.5
    assert max(m["async/staleness"] for m in metrics) <= 1


def test_reward_sources_score_on_the_async_verifier_thread(tiny_model_dir, tmp_path):
    """reward.sources run wherever the verify phase runs: here the asynchronous verifier thread."""
    import json

    from rlvr.reward_sources.base import forget_sources
    from rlvr.train.grpo import run_grpo

    fns = tmp_path / "fns.py"
    fns.write_text("def digits(prompts, completions, **kw):\n"
                   "    return [sum(c.isdigit() for c in t) / max(len(t), 1) for t in completions]\n")
    sources = json.dumps([{"kind": "verifier", "weight": 0}, {"kind": "python", "function": f"{fns}:digits"}])
    forget_sources()
    try:
        run_grpo(_cfg(tiny_model_dir, tmp_path / "run", steps=12, **{"asynchronous.enabled": "true",
                                                                     "reward.sources": sources}), progress=False)
    finally:
        forget_sources()
    rows = read_metrics(tmp_path / "run")
    assert all("rollout/reward_outcome" not in m and m["rollout/reward_python"] == m["rollout/reward_mean"] for m in rows)
    proxy = [m["rollout/score/proxy"] for m in rows]
    assert sum(proxy[-3:]) / 3 > sum(proxy[:3]) / 3 + 0.02, proxy  # the source's reward was learned
