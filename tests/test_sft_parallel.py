"""SFT under torchrun (2 gloo processes on CPU): data parallel, sharded (FSDP2), sequence parallel
and both together train what one process trains; a sharded 2-rank checkpoint resumes in one plain
process (docs/distributed.md). One torchrun runs the four layouts one after another (a driver that
joins the process group once and calls ``rlvr sft`` four times), to pay the start-up once."""

from __future__ import annotations

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

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.model.load import load_model_and_tokenizer
from rlvr.monitor.metrics import read_metrics
from rlvr.train.distributed import Group
from rlvr.train.sft import SFTConfig, run_sft
from rlvr.train.sft_parallel import Layout, check_parallel, prepare

ROOT = Path(__file__).resolve().parents[1]
REL, ABS = 1e-4, 1e-6  # the ranks' sums are added in another order than one process's
LORA = ["lora.enabled=true", "lora.r=4", "optim.lr=5e-2"]
MASTERS = ["model_load.dtype=bfloat16", "optim.master_weights=true"]
LAYOUTS = {"data_parallel": [], "shard": ["shard=true"], "sequence_parallel": ["sequence_parallel=true"],
           "sequence_parallel_shard": ["sequence_parallel=true", "shard=true"],
           "shard_lora": ["shard=true", *LORA], "shard_masters": ["shard=true", *MASTERS]}
# what one process runs to compare a layout with (the layout's settings without the parallel keys)
REFERENCE = {"shard_lora": "one_lora", "shard_masters": "one_masters"}
ONE = {"one": [], "one_lora": LORA, "one_masters": MASTERS}
# bf16: the forward rounds differently when the ranks' partial sums are added in another order
TOLERANCE = {"shard_masters": (2e-2, 1e-3)}
WEIGHTS_TOLERANCE = {"shard_lora": (1e-4, 5e-4), "shard_masters": (1.6e-2, 1e-3, 0.01)}


def _args(model: str, out: Path, sets: list[str] = ()) -> list[str]:
    """3 steps of 5 rows (3 + 2 per rank in data parallel), checkpoints at steps 2 and 3."""
    sets = ["train_tasks=24", "steps=3", "batch_size=5", "log_every=1", "checkpoint_every=2", "optim.lr=1e-2",
            "optim.warmup_steps=0", *sets]
    return ["sft", "--model", model, "--out", str(out), *[a for s in sets for a in ("--set", s)]]


DRIVER = textwrap.dedent('''
    import json, sys
    import torch.distributed as dist
    from rlvr.cli import main

    dist.init_process_group("gloo")  # once: every run below finds it open and leaves it open
    for argv in json.loads(sys.argv[1]):
        assert main(argv) == 0, argv
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    import json

    tmp = tmp_path_factory.mktemp("sft_parallel")
    out = {name: tmp / name for name in LAYOUTS}
    (tmp / "driver.py").write_text(DRIVER)
    argvs = [_args(tiny_model_dir, out[name], sets) for name, sets in LAYOUTS.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(tmp / "driver.py"), json.dumps(argvs)], env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("model: ") == len(LAYOUTS)  # rank 0 reports, rank 1 does not
    for name, sets in ONE.items():
        out[name] = tmp / name
        assert main(_args(tiny_model_dir, out[name], sets)) == 0
    return out


def _close(a: list[dict], b: list[dict], rel: float = REL, abs_: float = ABS) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        differ = {k: (x[k], y[k]) for k in x if not math.isclose(x[k], y[k], rel_tol=rel, abs_tol=abs_)}
        assert not differ, f"step {x['step']}: {differ}"


def _same_weights(a: Path, b: Path, rtol: float = 1e-4, atol: float = 5e-5, outliers: float = 0.0) -> None:
    """Within 5e-5 (the updates are ~1e-2 per step: AdamW scales the few near-zero gradients'
    rounding differences up to a few 1e-6, measured up to 1e-5). LoRA at lr 5e-2 moves the merged
    weights by ~0.4, its rounding differences by up to 2e-4. In bf16 the forward's rounding
    differs between layouts and AdamW turns a near-zero gradient's rounding into a whole step of
    either sign: ``outliers`` is the share of elements allowed off (measured 0.2%: 1-10 in 1-2k)."""
    w1, w2 = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert w1.keys() == w2.keys()
    assert all(w1[k].dtype == w2[k].dtype for k in w1)
    off = sum(int((~torch.isclose(w1[k].float(), w2[k].float(), rtol=rtol, atol=atol)).sum()) for k in w1)
    assert off <= outliers * sum(w.numel() for w in w1.values()), off


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_processes_train_what_one_does(runs, tiny_model_dir, layout):
    """LoRA sharded: against one process's LoRA run (final/ merged); bf16 with master weights
    sharded: against one process's bf16 model with float32 masters (FSDP2's mixed precision)."""
    one, two = runs[REFERENCE.get(layout, "one")], runs[layout]
    rel, atol = TOLERANCE.get(layout, (REL, ABS))
    steps = read_metrics(one)
    _close(steps, read_metrics(two), rel, atol)
    if layout != "shard_lora":  # (rank-4 adapters: 3 steps move the loss less than the batches differ)
        assert steps[0]["train/loss"] > steps[2]["train/loss"]  # it trained (no warm-up)
    _same_weights(one, two, *WEIGHTS_TOLERANCE.get(layout, (1e-4, 5e-5)))
    start = load_file(Path(tiny_model_dir) / "model.safetensors")
    final = load_file(two / "final" / "model.safetensors")
    assert max((start[k] - final[k].float()).abs().max().item() for k in start) > 1e-3  # the weights moved
    # only rank 0 wrote the run directory: no rank's files beside it
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    sharded = "shard=true" in LAYOUTS[layout]
    for step in (2, 3):
        ckpt = two / "checkpoints" / f"step_{step}"
        assert (ckpt / "COMPLETE").is_file()
        assert (ckpt / "dcp").is_dir() == sharded  # DCP shards, else a Hugging Face directory
        assert (ckpt / "model.safetensors").is_file() != sharded
    if sharded:
        assert sorted(p.name for p in (two / "checkpoints" / "step_3" / "dcp").glob("*.distcp")) == [
            "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its shards
    model, _ = load_model_and_tokenizer(str(two / "final"))  # final/ is a plain model directory
    assert model.config.num_hidden_layers == 2
    if layout == "shard_masters":  # the sharded weights are the float32 masters of a bf16 model
        from torch.distributed.checkpoint import FileSystemReader

        meta = FileSystemReader(str(two / "checkpoints" / "step_3" / "dcp")).read_metadata().state_dict_metadata
        weights = {k: m.properties.dtype for k, m in meta.items() if k.startswith("model.") and k.endswith("weight")}
        assert weights and set(weights.values()) == {torch.float32}
        assert load_file(two / "final" / "model.safetensors")["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_a_sharded_two_rank_checkpoint_resumes_in_one_process(runs, tiny_model_dir, tmp_path):
    """The 2-rank sharded run's step-2 checkpoint (weights and AdamW state in DCP, the data order
    and RNGs beside) continues in one plain process (no sft.shard): step 3 as one process's."""
    resumed = tmp_path / "resumed"
    shutil.copytree(runs["shard"], resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_3")
    shutil.rmtree(resumed / "final")
    assert main([*_args(tiny_model_dir, resumed), "--resume"]) == 0
    _close(read_metrics(runs["one"]), read_metrics(resumed))
    _same_weights(runs["one"], resumed)
    assert (resumed / "checkpoints" / "step_3" / "model.safetensors").is_file()  # one process: HF again


def _cfg(model: str, tmp: Path, *sets: str) -> SFTConfig:
    return load_config(SFTConfig, None, [f"model={model}", f"out={tmp}/run", "train_tasks=8", "steps=1", *sets])


def test_a_sharded_lora_checkpoint_resumes_only_as_lora(runs, tiny_model_dir, tmp_path, capsys):
    """The 2-rank sharded LoRA run's step-2 checkpoint continues in one process with LoRA (step 3
    as one process's LoRA run); without lora.enabled it is refused, naming the key."""
    for lora, name in ((False, "refused"), (True, "resumed")):
        resumed = tmp_path / name
        shutil.copytree(runs["shard_lora"], resumed)
        shutil.rmtree(resumed / "checkpoints" / "step_3")
        shutil.rmtree(resumed / "final")
        args = [*_args(tiny_model_dir, resumed, LORA if lora else ["optim.lr=5e-2"]), "--resume"]
        if not lora:
            assert main(args) == 2
            assert "a LoRA run's (adapters on a frozen base) sharded checkpoint: resume it with lora.enabled=true" in (
                capsys.readouterr().err)
            continue
        assert main(args) == 0
        _close(read_metrics(runs["one_lora"]), read_metrics(resumed))
        _same_weights(runs["one_lora"], resumed, *WEIGHTS_TOLERANCE["shard_lora"])


def test_refused_layouts_name_the_key(tiny_model_dir, tmp_path):
    for key in ("shard", "sequence_parallel"):  # one plain process: refused before anything is written
        with pytest.raises(ConfigError, match=f"sft.{key} needs several processes: run under torchrun"):
            run_sft(_cfg(tiny_model_dir, tmp_path, f"{key}=true"), progress=False)
        assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="sft.batch_size=1 is smaller than the 2 processes"):
        check_parallel(_cfg(tiny_model_dir, tmp_path, "batch_size=1"), Group(0, 2, 0))
    check_parallel(_cfg(tiny_model_dir, tmp_path, "batch_size=1", "sequence_parallel=true"), Group(0, 2, 0))
    model, _ = load_model_and_tokenizer(tiny_model_dir)  # 2 heads: they do not divide among 3 ranks
    with pytest.raises(ConfigError, match="sft.sequence_parallel: .*num_attention_heads=2"):
        prepare(model, Layout(Group(0, 3, 0), sequence_parallel=True))


def test_a_sharded_checkpoint_with_float32_masters_resumes_only_sharded(runs, tiny_model_dir, tmp_path, capsys):
    resumed = tmp_path / "resumed"
    shutil.copytree(runs["shard_masters"], resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_3")
    assert main([*_args(tiny_model_dir, resumed, MASTERS), "--resume"]) == 2
    assert "with float32 masters (optim.master_weights): resume it with sft.shard=true" in capsys.readouterr().err
