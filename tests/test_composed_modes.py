"""The modes that used to refuse each other, composed and run for real on the tiny model: LoRA with
asynchronous rollouts, LoRA on Ray, the curriculum with asynchronous rollouts, the critic under
torchrun (2 gloo processes) and distillation on Ray. Each run is stopped after a checkpoint, resumed
from it, and learns: the reward of its last steps is above that of its first.

The stop is as hard as the mode allows: the in-process asynchronous runs are interrupted inside an
update (the producer thread still running), Ray's trainer actor and the torchrun process group get
SIGKILL. Where a run is deterministic, the resumed run's metrics are also compared with an uninterrupted
run: the in-process run of the same config for Ray's synchronous source, the same 2-process run
for torchrun.

Every run starts from a prior (the tiny model pretrained 150 steps on the math corpus: a random
model's near-zero logits leave a LoRA adapter nothing to steer) and trains on a task file and a user
reward (the fraction of digits in the completion), so the Ray actors and the torchrun ranks load
the same tasks and reward a user's run would."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from procs import descendants, named

from rlvr.config import load_config
from rlvr.monitor.metrics import read_metrics
from rlvr.train import grpo

ROOT = Path(__file__).resolve().parents[1]
STEPS, STOP_AFTER = 10, 5  # a run is stopped once the checkpoint of step STOP_AFTER is written


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """A recipe file naming the task file and the reward: 16 prompts, reward = share of digits."""
    d = tmp_path_factory.mktemp("digits")
    (d / "digits.py").write_text(textwrap.dedent('''
        import os, time

        def digits(prompts, completions, **columns):
            time.sleep(float(os.environ.get("SLOW_REWARD", "0")))  # a step long enough to stop the run in
            return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]
    '''))
    (d / "tasks.jsonl").write_text("".join(json.dumps({"prompt": f"Write digits ({i})."}) + "\n" for i in range(16)))
    recipe = {"domains": [], "task_files": [{"path": str(d / "tasks.jsonl"), "reward": [f"{d / 'digits.py'}:digits"]}]}
    (d / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return d / "recipe.yaml"


@pytest.fixture(scope="module")
def prior(tmp_path_factory) -> str:
    from rlvr.model.tiny import TinyModelConfig
    from rlvr.train.pretrain import PretrainConfig, run_pretrain

    out = tmp_path_factory.mktemp("prior")
    run_pretrain(PretrainConfig(out=str(out), seed=0, domains=["math.arith"], docs_per_domain=200, steps=150,
                                batch_size=16, seq_len=64, checkpoint_every=10**6,
                                model=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                                      intermediate_size=64)), progress=False)
    return str(out / "final")


def _sets(model: str, out: Path, **extra) -> list[str]:
    base = {"model": model, "out": out, "steps": STEPS, "rollout.tasks_per_step": 4, "rollout.samples_per_task": 8,
            "rollout.max_new_tokens": 6, "optim.lr": "1e-2", "optim.warmup_steps": 0, "checkpoint_every": 1,
            "save_trajectories_every": 100, **extra}
    return [f"{k}={v}" for k, v in base.items()]


def _cfg(recipe: Path, model: str, out: Path, **extra) -> grpo.GRPOConfig:
    return load_config(grpo.GRPOConfig, str(recipe), _sets(model, out, **extra))


def _rewards(out: Path) -> list[float]:
    rows = read_metrics(out)
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1)), "every step logged once"
    return [m["rollout/reward_mean"] for m in rows]


def _learned(out: Path, margin: float = 0.1) -> None:
    r = _rewards(out)
    assert sum(r[-3:]) / 3 > sum(r[:3]) / 3 + margin, r
    assert (out / "final").is_dir()


def _same(a: Path, b: Path, rel: float = 0.0, abs_: float = 0.0) -> None:
    """Per-step metrics of ``a`` equal in ``b`` (within rel/abs: float sums taken in another order),
    times aside; ``b`` may log more (Ray: its workers' counters)."""
    for x, y in zip(read_metrics(a), read_metrics(b), strict=True):
        assert x.keys() <= y.keys(), f"step {x['step']}: {sorted(x.keys() - y.keys())} missing"
        differ = {k: (x[k], y[k]) for k in x if not k.startswith("time/")
                  and not math.isclose(x[k], y[k], rel_tol=rel, abs_tol=abs_)}
        assert not differ, f"step {x['step']}: {differ}"


def _stop_in_update(monkeypatch, at_step: int) -> None:
    real = grpo.update

    def update_then_stop(run, prepared, cfg):
        if run.step == at_step:  # the update of step at_step + 1: step at_step is checkpointed
            raise KeyboardInterrupt
        return real(run, prepared, cfg)

    monkeypatch.setattr(grpo, "update", update_then_stop)


def _stopped_and_resumed(cfg, monkeypatch) -> dict:
    """Stop the run inside the update after STOP_AFTER, resume it; the trainer state it resumed from."""
    from rlvr.model.checkpoint import latest_checkpoint, load_trainer_state

    _stop_in_update(monkeypatch, STOP_AFTER)
    with pytest.raises(KeyboardInterrupt):
        grpo.run_grpo(cfg, progress=False)
    monkeypatch.undo()
    out = Path(cfg.out)
    assert [m["step"] for m in read_metrics(out)] == list(range(1, STOP_AFTER + 1))
    state = load_trainer_state(latest_checkpoint(out))
    assert state["step"] == STOP_AFTER
    grpo.run_grpo(cfg, resume=True, progress=False)
    return state


# --------------------------------------------------------------------------- in process, asynchronous


def test_lora_with_asynchronous_rollouts_learns_and_resumes(tasks, prior, tmp_path, monkeypatch):
    from rlvr.model.load import load_model

    cfg = _cfg(tasks, prior, tmp_path / "run", **{
        "lora.enabled": "true", "lora.r": 8, "lora.alpha": 16,
        "asynchronous.enabled": "true", "asynchronous.max_staleness": 1})
    _stopped_and_resumed(cfg, monkeypatch)
    _learned(tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    assert all(0 <= m["async/staleness"] <= 1 for m in rows)
    assert rows[STOP_AFTER]["async/policy_version"] >= STOP_AFTER  # the producer restarted from the restored adapter
    assert all(m["rollout/logprob_mismatch_kl"] < 1e-5 for m in rows)  # the producer samples the merged weights
    assert (tmp_path / "run" / "checkpoints" / f"step_{STEPS}" / "adapter_config.json").is_file()  # the adapter alone
    base = dict(load_model(prior).named_parameters())
    final = dict(load_model(tmp_path / "run" / "final").named_parameters())  # merged: the adapter moved it
    assert any(not p.equal(base[n]) for n, p in final.items())


def test_curriculum_with_asynchronous_rollouts_learns_and_resumes(tasks, prior, tmp_path, monkeypatch):
    from rlvr.model.checkpoint import load_trainer_state

    cfg = _cfg(tasks, prior, tmp_path / "run", **{
        "curriculum.enabled": "true", "asynchronous.enabled": "true", "asynchronous.max_staleness": 1})
    stopped = _stopped_and_resumed(cfg, monkeypatch)
    _learned(tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    assert all(0 <= m["async/staleness"] <= 1 for m in rows)
    end = load_trainer_state(tmp_path / "run" / "checkpoints" / f"step_{STEPS}")
    # the scheduler observed each consumed batch (its refills too), before and after the stop: the
    # resumed run continued from the counts the checkpoint held, nothing lost or counted twice
    seen = lambda state: sum(n for n, _ in state["pool"]["tally"].values())
    drawn = [8 * m["curriculum/groups_drawn"] for m in rows]
    assert seen(stopped) == sum(drawn[:STOP_AFTER]) and seen(end) == sum(drawn)


# --------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _ray_run_losing_its_trainer(cfg) -> None:
    """``run_on_ray`` with its trainer actor SIGKILLed once the checkpoint of STOP_AFTER exists;
    the driver restarts it from that checkpoint."""
    from rlvr.train.ray_train import run_on_ray
    from rlvr.workers.events import read_events

    out, killed = Path(cfg.out), []

    def kill_the_trainer():
        deadline = time.time() + 240
        while time.time() < deadline and not (out / "checkpoints" / f"step_{STOP_AFTER}").exists():
            time.sleep(0.05)
        for pid in named("ray::TrainerActor"):  # this session's Ray: the driver is this process
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_the_trainer, daemon=True)
    killer.start()
    assert run_on_ray(cfg)["steps"] == STEPS
    killer.join()
    lost = [e for e in read_events(out) if e["event"] == "trainer_lost"]
    assert killed and len(lost) == 1 and "checkpoints/step_" in lost[0]["resume_from"]


RAY = {"backend": "ray", "ray.rollout_cpus": 0.5, "ray.verifier_cpus": 0.5, "ray.trainer_cpus": 0.5}


def test_lora_on_ray_learns_and_resumes_as_the_in_process_run(cluster, tasks, prior, tmp_path):
    lora = {"lora.enabled": "true", "lora.r": 8, "lora.alpha": 16}
    grpo.run_grpo(_cfg(tasks, prior, tmp_path / "local", **lora), progress=False)
    _ray_run_losing_its_trainer(_cfg(tasks, prior, tmp_path / "ray", **lora, **RAY))
    _learned(tmp_path / "ray")
    _same(tmp_path / "local", tmp_path / "ray")  # the actors sampled the merged adapter the trainer pushed


@pytest.fixture(scope="module")
def teacher(tasks, prior, tmp_path_factory) -> Path:
    """A teacher that writes digits: the prior after 10 GRPO steps on the reward."""
    out = tmp_path_factory.mktemp("teacher") / "run"
    grpo.run_grpo(_cfg(tasks, prior, out, steps=10, checkpoint_every=100), progress=False)
    return out / "final"


def test_distillation_on_ray_learns_and_resumes_as_the_in_process_run(cluster, tasks, teacher, prior,
                                                                       tmp_path):
    distill = {"distill.teacher": teacher, "distill.coef": 0.5}
    grpo.run_grpo(_cfg(tasks, prior, tmp_path / "local", **distill), progress=False)
    _ray_run_losing_its_trainer(_cfg(tasks, prior, tmp_path / "ray", **distill, **RAY))
    _learned(tmp_path / "ray")
    _same(tmp_path / "local", tmp_path / "ray")
    kl = [m["distill/reverse_kl"] for m in read_metrics(tmp_path / "ray")]
    assert sum(kl[-3:]) / 3 < sum(kl[:3]) / 3, kl  # the student moved towards the teacher


# --------------------------------------------------------------------------- torchrun


def _torchrun(recipe: Path, model: str, out: Path, *flags: str, stop_after: int | None = None) -> None:
    """``rlvr train`` on 2 gloo processes; with ``stop_after``, the process group is SIGKILLed as soon
    as that step's checkpoint exists."""
    sets = [a for s in _sets(model, out, **CRITIC) for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "SLOW_REWARD": "0.15"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "-m", "rlvr.cli", "train", "-c", str(recipe), *sets, *flags], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    if stop_after is None:
        log = proc.communicate(timeout=300)[0]
        assert proc.returncode == 0, log[-4000:]
        return
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and not (out / "checkpoints" / f"step_{stop_after}").exists():
        time.sleep(0.01)
    for pid in [proc.pid, *descendants(proc.pid)]:  # torchrun starts its ranks in sessions of their own
        os.kill(pid, signal.SIGKILL)
    log = proc.communicate(timeout=60)[0]
    assert proc.returncode == -signal.SIGKILL, log[-4000:]


CRITIC = {"algo.advantage": "gae", "critic.lr": "1e-2", "distributed.rollout_chunk": 1, "algo.minibatch_size": 16,
          "algo.microbatch_size": 4, "distributed.bucket_mb": 0.001}


def test_the_critic_under_torchrun_learns_and_resumes_as_if_never_stopped(tasks, prior, tmp_path):
    out = tmp_path / "stopped"
    _torchrun(tasks, prior, out, stop_after=STOP_AFTER)
    done = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").iterdir())
    assert STOP_AFTER in done and STEPS not in done and not (out / "final").exists()
    _torchrun(tasks, prior, out, "--resume")
    _learned(out)
    assert (out / "checkpoints" / f"step_{STEPS}" / "critic").is_dir()
    assert all(m["critic/value_loss"] > 0 for m in read_metrics(out))

    _torchrun(tasks, prior, tmp_path / "whole")
    _same(tmp_path / "whole", out)  # the critic's weights and optimizer came back with the policy's
