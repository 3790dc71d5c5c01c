"""Elastic Ray workers: a GRPO run on a real two-node Ray cluster (``ray.cluster_utils.Cluster``)
gets a node added mid-run, grows its rollout group onto it from the next step, then loses a rollout
worker (SIGKILL) and replaces it, and finishes every step."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from procs import named  # noqa: E402

from rlvr.config import load_config  # noqa: E402
from rlvr.monitor.metrics import read_metrics  # noqa: E402
from rlvr.train import grpo  # noqa: E402
from rlvr.train.ray_train import run_on_ray  # noqa: E402
from rlvr.workers.events import read_events  # noqa: E402

STEPS = 24


def wait_for(check, timeout: float = 240.0, what: str = ""):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(what)


@pytest.mark.slow  # ~60 s: a second Ray node started mid-run (make test-slow)
def test_a_node_joins_and_a_worker_dies_mid_run(tiny_model_dir, tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address, log_to_driver=False)
    out = tmp_path / "run"
    slow = tmp_path / "slow.py"  # a reward source that takes a second a step: room to act between steps
    slow.write_text("import time\n"
                    "def slow(prompts, completions, **kw):\n"
                    "    time.sleep(1.0)\n"
                    "    return [len(c) % 5 / 5 for c in completions]\n")
    sources = json.dumps([{"kind": "python", "function": f"{slow}:slow", "weight": 0.5}])
    cfg = load_config(grpo.GRPOConfig, None, [
        f"model={tiny_model_dir}", f"out={out}", f"steps={STEPS}", "domains=[math.arith]", "train_tasks=24",
        "rollout.tasks_per_step=4", "rollout.samples_per_task=4", "rollout.max_new_tokens=8",
        "checkpoint_every=100", "backend=ray", f"ray.address={cluster.address}", "ray.rollout_workers=1",
        "ray.max_rollout_workers=2", "ray.rollout_cpus=1", "ray.verifier_cpus=0.5", "ray.trainer_cpus=0.5",
        f"reward.sources={sources}"])
    done: list = []
    runner = threading.Thread(target=lambda: done.append(run_on_ray(cfg)), daemon=True)
    try:
        runner.start()
        steps = lambda: len(read_metrics(out)) if (out / "metrics.jsonl").exists() else 0  # noqa: E731
        joined_after = wait_for(lambda: steps() >= 2 and steps(), what="step 2")
        cluster.add_node(num_cpus=1)  # a machine joins the running job
        cluster.wait_for_nodes()
        added = wait_for(lambda: [e for e in read_events(out) if e["event"] == "added"], what="a worker added")
        assert added[0]["role"] == "rollout" and added[0]["size"] == 2 and added[0]["version"] >= joined_after
        killed_after = wait_for(lambda: steps() >= added[0]["version"] + 2 and steps(), what="a step on two workers")
        victims = named("ray::RolloutWorker")
        assert len(victims) == 2, victims
        os.kill(victims[0], signal.SIGKILL)
        runner.join(timeout=300)
        assert not runner.is_alive() and done and done[0]["steps"] == STEPS
    finally:
        ray.shutdown()
        cluster.shutdown()
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[0]["workers/rollout"] == 1 and rows[-1]["workers/rollout"] == 2
    events = read_events(out)
    replaced = [e for e in events if e["event"] == "replaced" and e["role"] == "rollout"]
    assert replaced, json.dumps(events)
    print(f"node joined after step {joined_after}; worker added at version {added[0]['version']}; "
          f"killed after step {killed_after}; replaced: {replaced[0]}")
