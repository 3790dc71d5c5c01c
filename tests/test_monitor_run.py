"""Detectors in a real GRPO run (tiny random model): planted hacks of every class are flagged at the
step they appear, zeroed where configured and kept in the sampled trajectories; a ``stop`` ends the
run with one line and keeps what was trained; a resumed run writes no alert twice."""

from __future__ import annotations

import json

import pytest

import rlvr.train.update as update_module
from rlvr.train import sources

import rlvr.tasks  # noqa: F401
import rlvr.verifiers  # noqa: F401
from hack_policy import HACKS, HackPolicy
from rlvr.config import load_config
from rlvr.model.checkpoint import latest_checkpoint
from rlvr.monitor.alerts import RunStopped, read_alerts
from rlvr.monitor.metrics import read_metrics
from test_grpo import digits_registered

SAMPLE_DETECTORS = ("tampering", "literal_expected", "visible_hidden_gap", "answer_stuffing")


def _cfg(model_dir, out, domains, **extra):
    from rlvr.train.grpo import GRPOConfig

    overrides = [
        f"model={model_dir}", f"out={out}", f"domains=[{','.join(domains)}]", "levels=[1]", "train_tasks=16",
        "rollout.tasks_per_step=4", "rollout.samples_per_task=4", "rollout.max_new_tokens=8",
        "optim.lr=1e-3", "optim.warmup_steps=0", "checkpoint_every=100", "monitor.sample_share=0.125",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(GRPOConfig, None, overrides)


def _trajectories(run_dir, step: int) -> dict[str, dict]:
    path = run_dir / "trajectories" / f"step_{step}.jsonl"
    return {r["id"]: r for r in map(json.loads, path.open())} if path.exists() else {}


def test_every_planted_hack_class_is_flagged_zeroed_and_kept(tiny_model_dir, tmp_path, monkeypatch, sandbox):
    import rlvr.train.grpo as grpo

    from rlvr.train import sources
    policy = HackPolicy(list(HACKS))
    monkeypatch.setattr(sources, "rollout", policy.wrap(sources.rollout))
    zero = {f"monitor.{name}.action": "zero" for name in SAMPLE_DETECTORS}
    each = {f"monitor.{name}.alert": "each" for name in SAMPLE_DETECTORS}  # one planted sample is under a rate's floor
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path, ["math.arith", "code.gen"], steps=4, **zero, **each), progress=False)

    assert set(policy.planted.values()) == set(HACKS), policy.planted  # every class was planted
    alerts = read_alerts(tmp_path)
    for (step, index), name in policy.planted.items():
        tid = f"{step}-{index}"
        assert any(a["detector"] == name and a["step"] == step and tid in a["trajectory_ids"] for a in alerts), (name, tid)
        record = _trajectories(tmp_path, step)[tid]
        assert record["kept"] == "flagged" and name in [f["detector"] for f in record["flags"]]
        assert record["reward"] == 0.0 and record["terms"]["outcome"] == 0.0  # zeroed to the fail value
        assert record["prompt"][-1]["role"] == "user" and record["domain"] in ("math.arith", "code.gen")
    by_class = {name: [_trajectories(tmp_path, s)[f"{s}-{i}"] for (s, i), n in policy.planted.items() if n == name]
                for name in HACKS}
    assert all(r["verdict"]["passed"] for r in by_class["literal_expected"])  # it passed: zero took its reward
    assert all(r["verdict"]["reason"] == "tampered" for r in by_class["tampering"])
    assert all(r["verdict"]["reason"] == "wrong_answer" for r in by_class["visible_hidden_gap"])
    for a in alerts:
        if a["detector"] in SAMPLE_DETECTORS:
            assert a["action"] == "zeroed" and a["severity"] in ("warning", "critical")
    flagged = {tid for a in alerts if a["detector"] in SAMPLE_DETECTORS for tid in a["trajectory_ids"]}
    assert flagged == {f"{s}-{i}" for s, i in policy.planted}, "only the planted samples are flagged"
    assert sum(m.get(f"monitor/flagged/{n}", 0.0) for m in read_metrics(tmp_path) for n in SAMPLE_DETECTORS) \
        == len(policy.planted)
    metrics = read_metrics(tmp_path)
    assert sum(m.get("monitor/zeroed", 0.0) for m in metrics) == len(policy.planted)
    assert all("rollout/entropy" in m and "rollout/group_reward_std" in m for m in metrics)
    from rlvr.report import write_report

    page = write_report(tmp_path).read_text()  # the report lists every planted hack and links to it
    for (step, index), name in policy.planted.items():
        assert f'id="traj-{step}-{index}"' in page and f'href="#traj-{step}-{index}"' in page, (name, step, index)
    assert all(name in page for name in HACKS)


def test_a_stop_action_ends_the_run_with_one_line_and_keeps_the_trained_steps(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    policy = HackPolicy(["answer_stuffing"], from_step=3)
    monkeypatch.setattr(sources, "rollout", policy.wrap(sources.rollout))
    cfg = _cfg(tiny_model_dir, tmp_path, ["math.arith"], steps=6, **{"monitor.answer_stuffing.action": "stop"})
    with pytest.raises(RunStopped) as e:
        grpo.run_grpo(cfg, progress=False)
    [(step, index)] = policy.planted
    assert step == 3 and str(e.value) == (
        f"run stopped at step 3 by detector 'answer_stuffing' (monitor.answer_stuffing.action = stop): "
        f"1 sample(s) flagged; see {tmp_path / 'alerts.jsonl'}")
    [alert] = [a for a in read_alerts(tmp_path) if a["detector"] == "answer_stuffing"]
    assert alert["action"] == "stopped" and alert["trajectory_ids"] == [f"3-{index}"]
    assert _trajectories(tmp_path, 3)[f"3-{index}"]["kept"] == "flagged"
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2]  # step 3 never trained
    assert latest_checkpoint(tmp_path).name == "step_2"  # the trained weights are on disk


def test_a_policy_taking_up_a_hack_raises_one_rate_alert_and_single_flags_raise_none(tiny_model_dir, tmp_path,
                                                                                      monkeypatch):
    import rlvr.train.grpo as grpo

    def run(out, policy):
        monkeypatch.setattr(sources, "rollout", policy.wrap(real))
        grpo.run_grpo(_cfg(tiny_model_dir, out, ["math.arith"], steps=6), progress=False)
        return [a for a in read_alerts(out) if a["detector"] == "answer_stuffing"]

    real = sources.rollout
    taken_up = HackPolicy(["answer_stuffing"], from_step=3, per_step=4)  # 4 of 16 samples a step from step 3
    [alert] = run(tmp_path / "hack", taken_up)
    # the 10-step window: 4 of 48 samples at step 3 (8%, under the floor), 8 of 64 at step 4
    assert alert["step"] == 4 and alert["evidence"]["rate"] == 0.125 and alert["evidence"]["baseline"] == 0.0
    assert sorted(alert["trajectory_ids"]) == sorted(f"{s}-{i}" for s, i in taken_up.planted if s == 4)
    metrics = read_metrics(tmp_path / "hack")
    assert [m["monitor/flagged/answer_stuffing"] for m in metrics] == [0, 0, 4, 4, 4, 4]  # the curve keeps every step
    sporadic = HackPolicy(["answer_stuffing"], from_step=2)  # 1 of 16: flagged and kept, below the rate floor
    assert run(tmp_path / "sporadic", sporadic) == []
    assert sum(m["monitor/flagged/answer_stuffing"] for m in read_metrics(tmp_path / "sporadic")) == len(sporadic.planted)
    for (step, index) in sporadic.planted:
        assert _trajectories(tmp_path / "sporadic", step)[f"{step}-{index}"]["kept"] == "flagged"


def test_a_resumed_run_writes_the_same_alerts_once(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    def run(out, die_at=None, resume=False):
        inner = HackPolicy(["answer_stuffing"], per_step=4).wrap(real)

        def rollout(run_, tasks, version):
            if version == die_at:
                raise KeyboardInterrupt
            return inner(run_, tasks, version)
        monkeypatch.setattr(sources, "rollout", rollout)
        cfg = _cfg(tiny_model_dir, out, ["math.arith"], steps=5, checkpoint_every=2,
                   **{"monitor.variance_collapse.patience": 2})
        grpo.run_grpo(cfg, resume=resume, progress=False)

    real = sources.rollout
    run(tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "crashed", die_at=3)  # step 4 dies after the step-2 checkpoint and step 3
    run(tmp_path / "crashed", resume=True)
    straight, crashed = read_alerts(tmp_path / "straight"), read_alerts(tmp_path / "crashed")
    assert {a["detector"] for a in straight} >= {"answer_stuffing", "variance_collapse"}
    assert [a["step"] for a in straight if a["detector"] == "answer_stuffing"] == [1]  # a lasting rate: one alert
    assert crashed == straight
    assert len({(a["step"], a["detector"], a.get("domain")) for a in crashed}) == len(crashed)


def _nan_from(monkeypatch, grpo, step: int):
    """Make the policy loss NaN from the update of ``step`` on (every micro-batch)."""
    real, updates = update_module.micro_loss, []
    real_update = grpo.update

    def update(run, prepared, cfg):
        updates.append(run.step + 1)
        return real_update(run, prepared, cfg)

    def micro_loss(*args, **kw):
        loss, metrics = real(*args, **kw)
        if updates[-1] >= step:
            loss = loss * float("nan")
            metrics["pg_loss"] = float(loss.detach())
        return loss, metrics
    monkeypatch.setattr(grpo, "update", update)
    monkeypatch.setattr(update_module, "micro_loss", micro_loss)


def test_nan_inf_stop_halts_before_the_optimizer_step(tiny_model_dir, tmp_path, monkeypatch):
    import torch

    import rlvr.train.grpo as grpo
    from rlvr.model.load import load_model

    _nan_from(monkeypatch, grpo, step=2)
    cfg = _cfg(tiny_model_dir, tmp_path, ["test.digits"], steps=4, **{"monitor.nan_inf.action": "stop",
                                                                      "reward.outcome": "score"})
    with digits_registered(), pytest.raises(RunStopped, match="run stopped at step 2 by detector 'nan_inf'"):
        grpo.run_grpo(cfg, progress=False)
    [alert] = [a for a in read_alerts(tmp_path) if a["detector"] == "nan_inf"]
    assert alert["evidence"]["before_optimizer_step"] and alert["evidence"]["nonfinite"]["train/pg_loss"] == "nan"
    assert latest_checkpoint(tmp_path).name == "step_1"
    model = load_model(latest_checkpoint(tmp_path))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_inf_logged_once_while_it_lasts(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    _nan_from(monkeypatch, grpo, step=2)
    with digits_registered():
        grpo.run_grpo(_cfg(tiny_model_dir, tmp_path, ["test.digits"], steps=4, **{"reward.outcome": "score"}),
                      progress=False)
    assert [a["step"] for a in read_alerts(tmp_path) if a["detector"] == "nan_inf"] == [2]
    assert all(m["train/pg_loss"] != m["train/pg_loss"] for m in read_metrics(tmp_path)[1:] if "train/pg_loss" in m)
