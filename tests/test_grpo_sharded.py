"""Sharded GRPO (``distributed.shard``: FSDP2 over 2 torchrun ranks, gloo on CPU) trains what one
plain process trains, full weights and LoRA, and its DCP checkpoint resumes in one plain process
(docs/distributed.md, "Sharded training (FSDP2)").

Micro-batches of 3 rows out of mini-batches of 8: 3 micro-batches, so rank 1 runs one fewer and
joins the sharded forward and backward with a zero-weighted one."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError
from tests.test_distributed import _metrics, _train_args, _trajectories

ROOT = Path(__file__).resolve().parents[1]


def _args(tmp: Path, model: str, *extra: str) -> list[str]:
    """test_distributed's run with micro-batches of 3 rows (a later --set wins) and ``extra``."""
    return [*_train_args(tmp, model), *[a for s in ("algo.microbatch_size=3", *extra) for a in ("--set", s)]]


def _two_sharded(args: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "rlvr.cli", *args, "--set", "distributed.shard=true", "--out", str(out)],
                          env=env, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _same_run(one: Path, two: Path, steps=range(1, 6), rel: float = 1e-4) -> None:
    """The same trajectories at every step and the same metrics within ``rel`` (the gradients are
    summed in another order: a reduce-scatter of the ranks' halves)."""
    for step in steps:  # the same samples, completions and rewards in the same order
        assert _trajectories(two, step) == _trajectories(one, step)
    a, b = ([r for r in _metrics(run) if r["step"] in steps] for run in (one, two))
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y), f"step {x['step']}: keys differ"
        differ = {k: (x[k], y[k]) for k in x if not math.isclose(x[k], y[k], rel_tol=rel, abs_tol=1e-6)}
        assert not differ, f"step {x['step']}: {differ}"


def test_two_sharded_ranks_train_what_one_process_does_and_resume_in_one(tiny_model_dir, tmp_path):
    """With a KL reference (a loaded model) and a critic (unsharded, all-reduced; its state in the
    checkpoint beside the shards)."""
    args = _args(tmp_path, tiny_model_dir, "algo.kl_coef=0.05", "algo.advantage=gae")
    two, one, resumed = tmp_path / "two", tmp_path / "one", tmp_path / "resumed"
    _two_sharded(args, two)
    assert main([*args, "--out", str(one)]) == 0
    steps = _metrics(one)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert all(r["train/samples"] > 0 and "train/skipped" not in r for r in steps)  # every step trained
    assert all(r["train/kl"] != 0 and "critic/value_loss" in r for r in steps[1:])
    _same_run(one, two)
    assert "microbatch_size: 3" in (two / "config.yaml").read_text()  # 3 micro-batches: rank 1 pads
    ckpt = two / "checkpoints" / "step_3"
    assert (ckpt / "dcp").is_dir() and not (ckpt / "model.safetensors").exists()  # every rank wrote its shards
    w1, w2 = load_file(one / "final" / "model.safetensors"), load_file(two / "final" / "model.safetensors")
    assert sorted(w1) == sorted(w2) and all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-6) for k in w1)

    # the sharded step-3 checkpoint, resumed by one plain process, trains steps 4-5 the same
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_5")
    shutil.rmtree(resumed / "final")
    assert main([*args, "--out", str(resumed), "--resume"]) == 0
    _same_run(one, resumed)
    w3 = load_file(resumed / "final" / "model.safetensors")
    assert all(torch.allclose(w1[k], w3[k], rtol=1e-4, atol=1e-6) for k in w1)


def test_two_sharded_ranks_train_a_lora_adapter_as_one_process(tiny_model_dir, tmp_path, capsys):
    """With a KL reference: the plain copy's adapters off."""
    lora = ["lora.enabled=true", "lora.r=4", "lora.save=adapter", "algo.kl_coef=0.05"]
    args = _args(tmp_path, tiny_model_dir, *lora)
    two, one = tmp_path / "two", tmp_path / "one"
    _two_sharded(args, two)
    assert main([*args, "--out", str(one)]) == 0
    assert all("train/skipped" not in r and r["train/grad_norm"] > 0 for r in _metrics(one))
    _same_run(one, two)
    a1 = load_file(one / "final" / "adapter_model.safetensors")
    a2 = load_file(two / "final" / "adapter_model.safetensors")
    assert sorted(a1) == sorted(a2) and all(torch.allclose(a1[k], a2[k], rtol=1e-4, atol=1e-6) for k in a1)
    # a LoRA run's sharded checkpoint does not resume as full weights
    assert main([*_args(tmp_path, tiny_model_dir), "--out", str(two), "--resume"]) == 2
    assert "is a LoRA run's (adapters on a frozen base) sharded checkpoint: resume it with lora.enabled=true" in \
        capsys.readouterr().err


def test_sharding_needs_torchrun_eager_layers_and_a_whole_head(monkeypatch):
    from rlvr.train.grpo import GRPOConfig

    with pytest.raises(ConfigError, match="'distributed.shard' does not work with one process"):
        load_config(GRPOConfig, None, ["domains=[math.arith]", "distributed.shard=true"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    load_config(GRPOConfig, None, ["domains=[math.arith]", "distributed.shard=true", "distributed.rollout_chunk=2"])
    for key, value in (("algo.compile", "true"), ("algo.logits_chunk", "64")):
        with pytest.raises(ConfigError, match=f"'{key}'.*distributed.shard"):
            load_config(GRPOConfig, None, ["domains=[math.arith]", "distributed.shard=true", f"{key}={value}",
                                           "distributed.rollout_chunk=2"])
