"""``backend: ray`` on a real local Ray instance (2 CPUs): the same run as in-process, lost actors
retried with every trajectory exactly once, a lost trainer resumed from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rlvr.config import load_config  # noqa: E402
from rlvr.errors import ConfigError, UserError  # noqa: E402
from rlvr.monitor.metrics import read_metrics  # noqa: E402
from rlvr import oplog  # noqa: E402
from rlvr.oplog import verify  # noqa: E402
from rlvr.train import grpo  # noqa: E402
from rlvr.train.ray_train import run_on_ray  # noqa: E402
from rlvr.workers.events import read_events  # noqa: E402
from rlvr.workers.group import ActorGroup  # noqa: E402
from procs import named  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(model: str, out: Path, backend: str, *extra: str) -> grpo.GRPOConfig:
    # math (answer verifier), code.gen (the sandbox on a verifier actor) and tool.use (multi-turn
    # episodes played in the rollout actor's own environments)
    return load_config(grpo.GRPOConfig, None, [
        f"model={model}", f"out={out}", f"steps={STEPS}", "domains=[math.arith,code.gen,tool.use]", "train_tasks=30",
        "rollout.tasks_per_step=3", "rollout.samples_per_task=4", "rollout.max_new_tokens=12", "checkpoint_every=1",
        f"backend={backend}", "sandbox.workers=1", "ray.rollout_cpus=0.5", "ray.verifier_cpus=0.5",
        "ray.trainer_cpus=0.5", "reward.length_penalty=0.05", *extra])  # rewards that vary: updates happen


def _same_metrics(a: list[dict], b: list[dict]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        differ = {k: (x[k], y.get(k)) for k in x if not k.startswith("time/") and x[k] != y.get(k)}
        assert not differ, f"step {x['step']}: {differ}"


@pytest.fixture(scope="module")
def local_run(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local") / "run"
    grpo.run_grpo(_cfg(tiny_model_dir, out, "local"), progress=False)
    return out


def test_ray_backend_repeats_the_in_process_run(tiny_model_dir, local_run, tmp_path):
    out = tmp_path / "ray"
    result = run_on_ray(_cfg(tiny_model_dir, out, "ray"))
    assert result["steps"] == STEPS
    ray_metrics = read_metrics(out)
    _same_metrics(read_metrics(local_run), ray_metrics)
    assert ray_metrics[-1]["workers/retries"] == 0 and not read_events(out)
    assert any(m.get("train/grad_norm", 0) > 0 for m in ray_metrics[:-1])  # updates changed what later steps sampled


def test_async_mode_on_ray_keeps_the_staleness_bound_across_workers(tiny_model_dir, tmp_path):
    out = tmp_path / "async"
    run_on_ray(_cfg(tiny_model_dir, out, "ray", "asynchronous.enabled=true", "asynchronous.max_staleness=1",
                    "ray.rollout_workers=2", "ray.rollout_cpus=0.25"))
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(0 <= m["async/staleness"] <= 1 for m in metrics)
    assert max(m["async/policy_version"] for m in metrics) >= 1  # the actors took pushed weights


def _source(model: str, out: Path, *extra: str):
    cfg = _cfg(model, out, "ray", "ray.rollout_workers=2", "ray.verifier_workers=2", "ray.rollout_cpus=0.25",
               "ray.verifier_cpus=0.25", *extra)
    run = grpo.setup(cfg, resume=False)
    return run, grpo.rollout_source(run, cfg)


def test_a_worker_killed_mid_batch_is_replaced_and_every_trajectory_counted_once(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    run, source = _source(tiny_model_dir, tmp_path / "clean")
    try:
        clean = [source.next(trainer_version=0)]
    finally:
        source.close()

    killed: list[tuple[str, int]] = []
    submit = ActorGroup._submit

    def submit_then_kill(self, method, k, chunk):
        first = method in ("generate", "verify") and k == 0 and method not in [m for m, _ in killed]
        pid = ray.get(self.actors[0].pid.remote()) if first else None
        ref, held = submit(self, method, k, chunk)
        if first:  # the chunk is the actor's now (running or next): kill it under the chunk
            os.kill(pid, signal.SIGKILL)
            killed.append((method, pid))
        return ref, held

    monkeypatch.setattr(ActorGroup, "_submit", submit_then_kill)
    run, source = _source(tiny_model_dir, tmp_path / "killed")
    try:
        batch = source.next(trainer_version=0)
        metrics = source.metrics(batch, 0)
    finally:
        source.close()
    assert [m for m, _ in killed] == ["generate", "verify"]
    n = run.cfg.rollout.samples_per_task
    keys = [(s.trajectory.group_id, s.trajectory.completion) for s in batch.scored]
    assert len(batch.scored) == len(batch.tasks) * n
    assert sorted(s.trajectory.group_id for s in batch.scored) == sorted(g for g in range(len(batch.tasks)) for _ in range(n))
    # the retried chunks drew the same numbers: the batch is the unkilled one, sample for sample
    assert keys == [(s.trajectory.group_id, s.trajectory.completion) for s in clean[0].scored]
    assert [s.reward for s in batch.scored] == [s.reward for s in clean[0].scored]
    assert metrics["workers/retries"] >= 2 and metrics["workers/replaced"] == 2
    events = read_events(run.dir)
    assert {(e["event"], e["role"]) for e in events} >= {("retry", "rollout"), ("retry", "verifier"),
                                                          ("replaced", "rollout"), ("replaced", "verifier")}


def test_a_lost_trainer_resumes_from_its_last_checkpoint(tiny_model_dir, local_run, tmp_path):
    out = tmp_path / "lost"
    killed: list[int] = []

    def kill_after_first_checkpoint():
        deadline = time.time() + 240
        while time.time() < deadline and not (out / "checkpoints" / "step_1").exists():
            time.sleep(0.05)
        for pid in named("ray::TrainerActor"):  # this session's Ray: the driver is this process
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    result = run_on_ray(_cfg(tiny_model_dir, out, "ray"))
    killer.join()
    assert killed and result["steps"] == STEPS
    lost = [e for e in read_events(out) if e["event"] == "trainer_lost"]
    assert len(lost) == 1 and "checkpoints/step_" in lost[0]["resume_from"]
    _same_metrics(read_metrics(local_run), read_metrics(out))  # every step once, as if never lost


def test_the_canary_on_a_rollout_actor_refuses_weights_that_are_not_the_pushed_ones(tiny_model_dir):
    import torch

    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.rollout.engine import SamplingParams
    from rlvr.rollout.weights import StaleWeightsError, canary_ids, probe
    from rlvr.sandbox.config import SandboxConfig
    from rlvr.workers.actors import RolloutWorker

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    ids = canary_ids(model.config.vocab_size)
    expected = probe(model, ids)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    lost: list[dict] = []
    actor_cls = ray.remote(RolloutWorker).options(num_cpus=0.5)
    group = ActorGroup("rollout", lambda i: actor_cls.remote(model, tokenizer, SamplingParams(), 8, None,
                                                             SandboxConfig(), "/tmp", 1), 1, max_retries=1, log=lost.append)
    try:
        assert group.broadcast("load", (1, state, expected, ids, 1e-4)) == [1]
        skipped = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
        with pytest.raises(StaleWeightsError, match="trainer pushed version 2"):  # an update the probe never saw
            group.broadcast("load", (2, skipped, expected, ids, 1e-4))
        with pytest.raises(StaleWeightsError, match="version 1 serves -1"):  # nothing after a failed load
            group.run("generate", [([], 1, torch.Generator().get_state())])
        group.broadcast("load", (1, state, expected, ids, 1e-4))
        with pytest.raises(StaleWeightsError, match="version 5 serves 1"):  # a chunk for a version it does not serve
            group.run("generate", [([], 5, torch.Generator().get_state())])
        assert not lost and group.retries == 0  # errors of the work itself are not retried
    finally:
        group.close()


def _sandbox_run_pids() -> list[int]:
    """Processes running as a sandbox slot uid (``rlvr.sandbox.pool.UID_BASE`` ...): runs. The whole
    machine, on purpose: a run that outlived its killed pool is an orphan, outside this process's tree."""
    from rlvr.sandbox.pool import UID_BASE, UID_COUNT

    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = next(int(line.split()[1]) for line in Path(f"/proc/{entry}/status").read_text().splitlines()
                           if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if UID_BASE <= uid < UID_BASE + UID_COUNT:
                found.append(int(entry))
    return found


def test_verification_service_survives_a_lost_actor_and_leaves_no_run_behind(tmp_path, monkeypatch):
    from rlvr.sandbox.config import SandboxConfig
    from rlvr.sandbox.detect import choose
    from rlvr.sandbox.types import Job, Limits
    from rlvr.workers.config import RayConfig
    from rlvr.workers.verify_service import VerificationService

    if choose("auto").name not in ("forkserver", "bwrap"):
        pytest.skip("runs are told apart by their slot uid only on the root backends")
    wall = 3.0
    add = "def f(a, b):\n    return a + b\n"
    loop = "import time\ndef f(a, b):\n    while True:\n        time.sleep(0.05)\n"
    jobs = [Job.io(loop if i == 1 else add, "f", [(i, 1)], limits=Limits(wall_s=wall)) for i in range(8)]
    killed: list[int] = []
    submit = ActorGroup._submit

    def submit_then_kill_when_the_loop_runs(self, method, k, chunk):
        pid = ray.get(self.actors[0].pid.remote()) if k == 0 and not killed else None
        out = submit(self, method, k, chunk)
        if pid is not None:
            deadline = time.time() + 30
            while not _sandbox_run_pids() and time.time() < deadline:
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)  # the actor owning the pool dies while the loop runs
            killed.append(pid)
        return out

    monkeypatch.setattr(ActorGroup, "_submit", submit_then_kill_when_the_loop_runs)
    cfg = RayConfig(verifier_workers=2, verifier_cpus=0.5, max_retries=2)
    oplog.open_log(tmp_path / "operations.jsonl")
    try:
        with VerificationService(cfg, SandboxConfig(workers=1), work_dir=tmp_path, chunk_size=4) as service:
            t0 = time.time()
            results = service.map(jobs)
            assert killed and service.retries == 1
    finally:
        oplog.close_log()
    # the actors' sandbox executions reach the caller's operation log, each once (the killed
    # actor's records died with it; its chunk's retry brought its own)
    log = [json.loads(line) for line in (tmp_path / "operations.jsonl").read_text().splitlines()]
    execs = [r for r in log if r["op"] == "sandbox_exec"]
    assert verify(tmp_path / "operations.jsonl").intact and len(execs) == len(jobs)
    assert {r["origin"] for r in execs} == {"verifier 0", "verifier 1"} and all(r["at"] <= r["time"] for r in execs)
    assert [r.status for r in results] == ["timeout" if i == 1 else "ok" for i in range(8)]
    assert [r.compare([i + 1]) for i, r in enumerate(results) if i != 1] == [1] * 7
    time.sleep(max(0.0, t0 + wall + 1.0 - time.time()))
    assert not _sandbox_run_pids(), "a run of the killed actor's pool outlived it"
    assert any(e["event"] == "replaced" for e in read_events(tmp_path))


def test_ray_config_is_checked_and_a_missing_extra_is_named(tiny_model_dir, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="ray.address"):
        _cfg(tiny_model_dir, tmp_path, "ray", "ray.address=not an address")
    with pytest.raises(ConfigError, match="backend"):
        _cfg(tiny_model_dir, tmp_path, "slurm")
    with pytest.raises(ConfigError, match="ray.rollout_workers"):
        _cfg(tiny_model_dir, tmp_path, "ray", "ray.rollout_workers=0")
    from rlvr.workers.cluster import check_resources, reachable
    from rlvr.workers.config import RayConfig

    check_resources(ray, RayConfig(rollout_cpus=0.5, verifier_cpus=0.5, trainer_cpus=0.5))  # fits in 2 CPUs
    with pytest.raises(UserError, match=r"reserve 5 CPUs.*cluster has 2"):  # would wait forever
        check_resources(ray, RayConfig(rollout_workers=2, verifier_workers=2))
    with pytest.raises(UserError, match="GPUs"):
        check_resources(ray, RayConfig(rollout_cpus=0.5, verifier_cpus=0.5, trainer_cpus=0.5, trainer_gpus=1))
    with pytest.raises(UserError, match="nothing answers at 127.0.0.1:1"):
        reachable("127.0.0.1:1", timeout=1.0)
    from rlvr.cli import _load, build_parser

    args = build_parser().parse_args(["train", "--model", tiny_model_dir, "--backend", "ray", "--ray-address", "head:6379"])
    cfg = _load(grpo.GRPOConfig, args, eval_section="eval")
    assert (cfg.backend, cfg.ray.address) == ("ray", "head:6379")
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    from rlvr.workers.cluster import ray_module

    with pytest.raises(UserError, match=r"rlvr\[ray\]"):
        ray_module()


def test_a_reward_model_source_scores_on_the_verifier_actors_as_in_process(tiny_model_dir, tmp_path):
    """reward.sources run in the verify phase, wherever it runs: here each verifier actor loads the
    reward model itself; the first step (same weights, same samples) scores as the local run."""
    import torch

    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.rm.model import RewardMeta, RewardModel, save_reward_model

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    save_reward_model(tmp_path / "rm", RewardModel(model), model, tok, RewardMeta(max_length=96))
    sources = json.dumps([{"kind": "verifier", "weight": 0.5},
                          {"kind": "reward_model", "path": str(tmp_path / "rm"), "weight": 0.3}])
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "local", "local", f"reward.sources={sources}"), progress=False)
    run_on_ray(_cfg(tiny_model_dir, tmp_path / "ray", "ray", f"reward.sources={sources}"))
    local, remote = read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray")
    assert len(remote) == STEPS and all("rollout/score/reward_model" in m and "rollout/reward_reward_model" in m
                                        for m in remote)
    for key in ("rollout/score/reward_model", "rollout/score/verifier", "rollout/reward_mean"):
        assert remote[0][key] == pytest.approx(local[0][key], rel=1e-4, abs=1e-5), key
