"""The long-context keys composed in one GRPO run: prompts of 1-2k tokens from the long_ctx levels
on a tiny model whose RoPE range is extended from config, chunked prefill, a bounded KV cache and
the update's memory plan; the run trains, logs truncation per level and the rollout/trainer gap."""

from __future__ import annotations

import math

import torch
from safetensors.torch import load_file

from rlvr.config import load_config
from rlvr.monitor.metrics import read_metrics
from rlvr.train import grpo


def test_a_grpo_run_on_long_prompts_composes_the_long_context_keys(tiny_model_dir, tmp_path):
    (tmp_path / "fns.py").write_text(
        "def variety(prompts, completions, **kw):\n"
        "    return [len(set(c)) / 8 for c in completions]\n")
    out = tmp_path / "run"
    cfg = load_config(grpo.GRPOConfig, None, [
        f"model={tiny_model_dir}", f"out={out}", "steps=2", "domains=[long_ctx.needle]", "levels=[1, 2]",
        "train_tasks=8", "rollout.tasks_per_step=2", "rollout.samples_per_task=3", "rollout.max_new_tokens=4",
        "rollout.prefill_chunk=256", "rollout.kv_cache=sink_window", "rollout.kv_sinks=4", "rollout.kv_window=128",
        "algo.memory_budget_mb=64", "model_load.rope_scaling={type: linear, factor: 32}", "optim.lr=1e-2",
        f"reward.sources=[{{kind: verifier, weight: 0}}, {{kind: python, function: '{tmp_path / 'fns.py'}:variety'}}]",
        "checkpoint_every=1"])
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.model.tokenizer import encode_chat_prompt
    from rlvr.tasks.base import generate_tasks

    _, tok = load_model_and_tokenizer(tiny_model_dir)
    lengths = [len(encode_chat_prompt(tok, list(t.prompt))) for t in generate_tasks(["long_ctx.needle"], "train", 8,
                                                                                      seed=0, levels=[1, 2])]
    assert min(lengths) > 1000 and max(lengths) < 8000  # past the model's own 256 positions, inside 32 x 256
    grpo.run_grpo(cfg, progress=False)
    steps = read_metrics(out)
    assert [m["step"] for m in steps] == [1, 2]
    trained = [m for m in steps if "train/grad_norm" in m]
    assert trained, "no step trained"
    for m in trained:
        assert m["train/memory_plan_fits"] == 1.0 and m["train/memory_plan_microbatch_tokens"] >= 1000
        assert math.isfinite(m["rollout/logprob_mismatch_kl"])
    levels = {k for m in steps for k in m if k.startswith("rollout/truncated_frac/level_")}
    assert levels <= {"rollout/truncated_frac/level_1", "rollout/truncated_frac/level_2"} and levels
    before = load_file(f"{tiny_model_dir}/model.safetensors")
    after = load_file(str(out / "final" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
