"""Long context: peak memory and tokens/s of a training step and of generation at 1k-32k tokens.

    python benchmarks/long_context.py --json PATH [--lengths 1024 4096 16384 32768] [--parts generate train]

Every measurement runs in a fresh process (peak RSS = that process's ``ru_maxrss``; the Python +
torch + model baseline, measured in the same process before the work, is subtracted), one at a
time, with ``MALLOC_MMAP_THRESHOLD_=65536``: glibc then maps every block of 64 KiB or more on its
own and returns it when freed, so the peak is what was live at once (with the default, dynamic
threshold, freed tensors stay in the heap and single cells moved by +-100 MB), on ``MODEL``: a random 2-layer Llama with a real 32k vocabulary (so the LM head's
[tokens, vocabulary] logits matter, as they do for real models) and RoPE positions up to the
longest length.

- ``train``: one GRPO-style update on one sequence of L tokens (the last quarter policy tokens):
  ``update.logprobs_of`` -> policy-gradient loss -> backward -> AdamW step, with ``plain`` (all
  logits at once, no checkpointing), ``chunk`` (``algo.logits_chunk`` = 1024), ``ckpt``
  (``algo.gradient_checkpointing``) and ``chunk_ckpt`` (both). Reported: the peak above the
  baseline, the share of it that the estimate of ``rlvr.train.memory_plan`` attributes to
  activations and logits, and tokens/s.
- ``generate``: the rollout engine (fast decoder) on one prompt of L tokens, then 32 new tokens
  (greedy): prefill tokens/s (the state's ``prefill``) and decode tokens/s (its 32 decode
  ``step`` calls), each the faster of two calls after an untimed short one, the peak above the baseline and the KV cache's bytes at the end (``DecodeState.kv_bytes``),
  for ``plain``, ``chunked_prefill`` (1024-token chunks), ``int8`` (chunked, full-precision window
  256) and ``sink_window`` (chunked, 4 sinks + a 1024-token window).

The slope between 4k and 32k (peak at 32k / peak at 4k) is printed per option: a bounded option
stays near 1, the plain path grows with L (linearly, or worse for the logits).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import idle_cpu, machine_note, print_table, write_json  # noqa: E402

MODEL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=384, vocab_size=32000, tie_word_embeddings=False)
TRAIN_VARIANTS = {"plain": dict(logits_chunk=0, ckpt=False), "chunk": dict(logits_chunk=1024, ckpt=False),
                  "ckpt": dict(logits_chunk=0, ckpt=True), "chunk_ckpt": dict(logits_chunk=1024, ckpt=True)}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def build_model(length: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**MODEL, max_position_embeddings=length + 64,
                                        attn_implementation="sdpa"))


def train_child(variant: str, length: int) -> dict:
    import torch

    from rlvr.train.common import OptimConfig, build_optimizer, clip_and_step
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.memory import enable_activation_checkpointing
    from rlvr.train.memory_plan import estimate_bytes
    from rlvr.train.update import logprobs_of
    from rlvr.types import Batch

    v = TRAIN_VARIANTS[variant]
    model = build_model(length)
    if v["ckpt"]:
        enable_activation_checkpointing(model)
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-5), 10)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, MODEL["vocab_size"], (1, length), generator=g)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, length - length // 4:] = 1
    b = Batch(input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=loss_mask,
              advantages=torch.ones(1), old_logprobs=torch.zeros(1, length))
    model.train()
    baseline = rss_mb()
    t0 = time.perf_counter()
    lp = logprobs_of(model, b, AlgoConfig(logits_chunk=v["logits_chunk"]))
    loss = -(lp * b.loss_mask).sum() / b.loss_mask.sum()
    loss.backward()
    clip_and_step(model, opt, sched, 1.0)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    est = estimate_bytes(model.config, tokens=length, policy_tokens=length // 4,
                         logits_chunk=v["logits_chunk"], checkpointing=v["ckpt"])
    return {"part": "train", "option": variant, "length": length, "peak_above_baseline_mb": round(peak - baseline, 1),
            "estimate_mb": round(est["total"] / 2**20, 1),
            "activations_mb": round(est["activations"] / 2**20, 1), "logits_mb": round(est["logits"] / 2**20, 1),
            "tokens_per_s": round(length / seconds, 1), "seconds": round(seconds, 2)}


GENERATE_OPTIONS = {"plain": dict(), "chunked_prefill": dict(prefill_chunk=1024),
                    "int8": dict(prefill_chunk=1024, kv_cache="int8", kv_window=256),
                    "sink_window": dict(prefill_chunk=1024, kv_cache="sink_window", kv_sinks=4, kv_window=1024)}
NEW_TOKENS = 32


def generate_child(option: str, length: int) -> dict:
    import torch

    from rlvr.rollout import decoder
    from rlvr.rollout.engine import SamplingParams, generate

    model = build_model(length + NEW_TOKENS).eval()
    states = []
    start = decoder.FastLlama.start

    def recording_start(self, *a, **kw):  # the call's DecodeState, to read its cache size after
        states.append(start(self, *a, **kw))
        return states[-1]

    decoder.FastLlama.start = recording_start
    prompt = torch.randint(3, MODEL["vocab_size"], (length,), generator=torch.Generator().manual_seed(1)).tolist()

    def run(new: int, tokens: list[int]) -> dict:
        params = SamplingParams(max_new_tokens=new, temperature=0.0, n=1, stop_token_ids=(), **GENERATE_OPTIONS[option])
        out = generate(model, [tokens], params, pad_token_id=0, backend="fast")
        assert len(out[0].token_ids) == new
        return dict(timed)

    timed = {"prefill": 0.0, "step": 0.0}
    run(2, prompt[:64])  # first-call costs (allocator, weight formats), not timed
    cls = type(states[-1])  # the state class of this option: time its prefill and its decode steps
    for name in ("prefill", "step"):
        def timer(self, *a, _f=getattr(cls, name), _n=name, **kw):
            t0 = time.perf_counter()
            try:
                return _f(self, *a, **kw)
            finally:
                timed[_n] += time.perf_counter() - t0
        setattr(cls, name, timer)
    baseline = rss_mb()
    runs = []
    for _ in range(2):
        timed.update(prefill=0.0, step=0.0)
        runs.append(run(NEW_TOKENS + 1, prompt))
    prefill = min(r["prefill"] for r in runs)
    decode = min(r["step"] for r in runs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"part": "generate", "option": option, "length": length,
            "peak_above_baseline_mb": round(peak - baseline, 1), "kv_mb": round(states[-1].kv_bytes() / 2**20, 2),
            "prefill_tokens_per_s": round(length / prefill, 1),
            "decode_tokens_per_s": round(NEW_TOKENS / decode, 1)}


def run_child(kind: str, option: str, length: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, option, str(length)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # (module docstring)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        return {"part": kind, "option": option, "length": length, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def slopes(rows: list[dict]) -> dict:
    """Peak at the longest length over the peak at 4k (or the shortest above 1k), per part and option."""
    out = {}
    for part, option in {(r["part"], r["option"]) for r in rows if "error" not in r}:
        by_len = {r["length"]: r["peak_above_baseline_mb"] for r in rows
                  if r["part"] == part and r["option"] == option and "error" not in r}
        lens = sorted(by_len)
        lo = next((n for n in lens if n >= 4096), lens[0])
        if lens[-1] > lo and by_len[lo] > 0:
            out[f"{part}/{option}"] = {"from": lo, "to": lens[-1], "ratio": round(by_len[lens[-1]] / by_len[lo], 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--parts", nargs="+", default=["generate", "train"], choices=["generate", "train"])
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, option, length = args.child
        child = train_child if kind == "train" else generate_child
        print(json.dumps(child(option, int(length))))
        return
    idle = idle_cpu()
    rows = []
    if "generate" in args.parts:
        rows += [run_child("generate", option, n) for n in args.lengths for option in GENERATE_OPTIONS]
        print_table([r for r in rows if r["part"] == "generate"],
                    ["part", "option", "length", "peak_above_baseline_mb", "kv_mb", "prefill_tokens_per_s",
                     "decode_tokens_per_s", "error"])
    if "train" in args.parts:
        rows += [run_child("train", option, n) for n in args.lengths for option in TRAIN_VARIANTS]
        print_table([r for r in rows if r["part"] == "train"],
                    ["part", "option", "length", "peak_above_baseline_mb", "estimate_mb", "activations_mb",
                     "logits_mb", "tokens_per_s", "error"])
    s = slopes(rows)
    for k, v in sorted(s.items()):
        print(f"{k}: peak {v['from']} -> {v['to']} tokens x{v['ratio']}")
    print(machine_note() + f"; idle CPU at start {idle:.0f}%")
    write_json(args.json_path, {"rows": rows, "slopes": s, "model": MODEL, "idle_cpu": idle})


if __name__ == "__main__":
    main()
