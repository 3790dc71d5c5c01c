"""Data-parallel GRPO (torchrun, gloo on CPU): 2 processes train what 1 process trains, and a
2-process checkpoint resumes in 1 (docs/distributed.md, "Data parallel (torchrun)")."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main, torchrun_command
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.monitor.metrics import read_metrics
from rlvr.rollout.episodes import Episode
from rlvr.rollout.sharded import ShardedPhases
from rlvr.types import Trajectory

ROOT = Path(__file__).resolve().parents[1]
REL, ABS = 1e-4, 1e-6  # float tolerance: the ranks' gradients are summed in another order


def _train_args(tmp: Path, model: str) -> list[str]:
    """A user reward that varies on a random model (distinct characters), so every step updates;
    chunks of one task and micro-batches of 2 rows: both ranks generate and train each step."""
    (tmp / "variety.py").write_text(textwrap.dedent('''
        def variety(prompts, completions, **columns):
            return [len(set(c)) / 8 for c in completions]
    '''))
    words = ("cats", "rain", "tea", "maps", "dogs", "snow", "milk", "roads")
    (tmp / "t.jsonl").write_text("".join(json.dumps({"question": f"Say something about {w}."}) + "\n" for w in words))
    sets = ["rollout.tasks_per_step=4", "rollout.samples_per_task=4", "rollout.max_new_tokens=6",
            "distributed.rollout_chunk=1", "algo.minibatch_size=8", "algo.microbatch_size=2", "steps=5",
            "checkpoint_every=3", "monitor.sample_share=1.0", "save_trajectories_every=1", "optim.lr=1e-2",
            "distributed.bucket_mb=0.001"]  # ~1 KB buckets: the gradients are summed in many all-reduces
    return ["train", "--model", model, "--tasks", str(tmp / "t.jsonl"), "--map", "prompt=question",
            "--reward", f"{tmp / 'variety.py'}:variety", *[a for s in sets for a in ("--set", s)]]


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in read_metrics(run)]


def _close(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y), f"step {x['step']}: keys differ"
        differ = {k: (x[k], y[k]) for k in x if not math.isclose(x[k], y[k], rel_tol=REL, abs_tol=ABS)}
        assert not differ, f"step {x['step']}: {differ}"


def _trajectories(run: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories" / f"step_{step}.jsonl").read_text().splitlines()]


def test_two_processes_train_what_one_does_and_the_checkpoint_resumes_in_one(tiny_model_dir, tmp_path):
    args = _train_args(tmp_path, tiny_model_dir)
    two, one, resumed = tmp_path / "two", tmp_path / "one", tmp_path / "resumed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "rlvr.cli", *args, "--out", str(two)], env=env, capture_output=True, text=True, check=False,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("model: ") == 1  # rank 0 reports
    assert main([*args, "--out", str(one)]) == 0

    steps = _metrics(one)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert all(r["train/samples"] > 0 and "train/skipped" not in r for r in steps)  # every step trained
    _close(steps, _metrics(two))
    for step in range(1, 6):  # the same samples, completions and rewards in the same order
        assert _trajectories(two, step) == _trajectories(one, step)
    # rank 1 computed the same numbers (its own log: ranks/rank_1) and wrote nothing else
    assert _metrics(two / "ranks" / "rank_1") == _metrics(two)
    assert sorted(p.name for p in (two / "ranks" / "rank_1").iterdir()) == ["alerts.jsonl", "metrics.jsonl",
                                                                             "operations.jsonl", "trajectories"]
    from rlvr.oplog import verify

    assert verify(two / "ranks" / "rank_1" / "operations.jsonl").intact  # its own chain
    w1, w2 = load_file(one / "final" / "model.safetensors"), load_file(two / "final" / "model.safetensors")
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-6) for k in w1)

    # the 2-process checkpoint of step 3, resumed by one plain process, trains steps 4-5 the same
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_5")
    shutil.rmtree(resumed / "final")
    assert main([*args, "--out", str(resumed), "--resume"]) == 0
    _close(steps, _metrics(resumed))
    for step in (4, 5):
        assert _trajectories(resumed, step) == _trajectories(one, step)


def _episode(group_id: int, token: int) -> Episode:
    return Episode(Trajectory(task_id="t", group_id=group_id, messages=(), completion=str(token), token_ids=(token,),
                              loss_mask=(1,), logprobs=(0.0,), finish_reason="stop"), None)


def test_rollout_chunks_and_their_seeds_do_not_depend_on_the_world_size():
    """Every rank draws every chunk's seed; rank r generates chunks r, r + W, ...: the union over
    the ranks is the world-size-1 batch, and the run's generator ends in the same state."""
    tasks = [f"task{i}" for i in range(5)]

    def generate(part, version, generator):  # one "sample" per task, drawn from the chunk's generator
        return [_episode(i, int(torch.randint(0, 10**9, (1,), generator=generator))) for i in range(len(part))]

    def run(rank: int, world: int) -> tuple[dict, torch.Tensor]:
        gen = torch.Generator().manual_seed(7)
        phases = ShardedPhases(generate=generate, verify=None, gather=None, generator=gen, chunk=2, rank=rank,
                               world=world)
        eps = phases.generate(tasks, 0)
        return {ep.trajectory.group_id: ep.trajectory.completion for ep in eps}, gen.get_state()

    alone, state = run(0, 1)
    assert sorted(alone) == [0, 1, 2, 3, 4]
    parts = [run(r, 2) for r in range(2)] + [run(r, 3) for r in range(3)]
    assert sorted(parts[0][0]) == [0, 1, 4] and sorted(parts[1][0]) == [2, 3]  # chunks {0,1} {2,3} {4}
    assert {**parts[0][0], **parts[1][0]} == alone
    assert {**parts[2][0], **parts[3][0], **parts[4][0]} == alone
    assert all(torch.equal(s, state) for _, s in parts)


@pytest.mark.parametrize("overrides, key", [
    (["distributed.backend=mpi"], "distributed.backend"),
    (["distributed.rollout_chunk=-1"], "distributed.rollout_chunk"),
    (["distributed.bucket_mb=0"], "distributed.bucket_mb"),
])
def test_bad_distributed_keys_are_named(overrides, key):
    from rlvr.train.grpo import GRPOConfig

    with pytest.raises(ConfigError, match=key):
        load_config(GRPOConfig, None, ["domains=[math.arith]", *overrides])


@pytest.mark.parametrize("overrides, key", [
    ([], "distributed.rollout_chunk"),
    (["distributed.rollout_chunk=2", "asynchronous.enabled=true"], "asynchronous.enabled"),
    (["distributed.rollout_chunk=2", "backend=ray"], "backend"),
])
def test_data_parallel_refuses_what_it_does_not_support(overrides, key, monkeypatch):
    from rlvr.train.grpo import GRPOConfig

    load_config(GRPOConfig, None, ["domains=[math.arith]", *overrides])  # one process: fine
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=f"'{key}'.*2 torchrun processes"):
        load_config(GRPOConfig, None, ["domains=[math.arith]", *overrides])
    assert main(["train", "--model", "m", "--set", "domains=[math.arith]",
                 *[a for o in overrides for a in ("--set", o)]]) == 2


def test_nproc_relaunches_the_command_under_torchrun_without_itself():
    cmd = torchrun_command(2, ["train", "--nproc", "2", "--set", "steps=3", "--nproc=2", "--out", "r"])
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "rlvr.cli",
                       "train", "--set", "steps=3", "--out", "r"]


def test_full_fine_tuning_recipe_parses_and_its_counts_are_right():
    """configs/real_model_full_ddp.yaml resolves; the parameter count its memory comments are
    computed from (Qwen2.5-1.5B's shape on the meta device) is right; 8 ranks get one rollout
    chunk each and every rank gets micro-batches."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlvr.config import from_dict, read_yaml
    from rlvr.train.grpo import GRPOConfig

    cfg = from_dict(GRPOConfig, read_yaml(Path(__file__).resolve().parents[1] / "configs" / "real_model_full_ddp.yaml"))
    assert cfg.optim.master_weights and cfg.algo.gradient_checkpointing and cfg.algo.logits_chunk == 1024
    assert cfg.distributed.backend == "nccl" and cfg.rollout.tasks_per_step // cfg.distributed.rollout_chunk == 8
    samples = cfg.rollout.tasks_per_step * cfg.rollout.samples_per_task
    assert samples // cfg.algo.microbatch_size // 8 == 16  # micro-batches per rank
    shape = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 1543.7


def test_gradient_buckets_keep_order_and_stay_under_the_limit():
    from rlvr.train.distributed import buckets

    sizes = [3, 4, 1, 9, 2, 2, 5]
    tensors = [torch.zeros(n) for n in sizes]
    cut = buckets(tensors, 6)
    assert [t for b in cut for t in b] == tensors  # every tensor once, in order
    assert [[t.numel() for t in b] for b in cut] == [[3], [4, 1], [9], [2, 2], [5]]  # 9 > 6 goes alone

