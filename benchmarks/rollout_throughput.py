"""Benchmark: rollout generation throughput, rlvr's engine vs transformers ``model.generate``.

    python benchmarks/rollout_throughput.py [--rounds 5] [--size small] [--json PATH] [--threads N]

The workload is a GRPO rollout batch: 8 chat prompts (held-out math and code tasks, different
lengths, left-padded) x 8 samples = 64 completions of exactly 32 new tokens each (no early stop on
any side), sampled at temperature 1 without top-k/top-p, on the randomly initialised benchmark
Llama (``benchmarks/common.py``; ``small`` = 2.68M parameters). Sides, measured in the same
process and alternated every round (the order rotates so none always runs first):

- ``hf_generate``: ``model.generate(do_sample=True, num_return_sequences=8, max_new_tokens=32,
  min_new_tokens=32, top_k=0)`` on the left-padded prompts (the baseline);
- ``rlvr_fast``: ``rlvr.rollout.engine.generate`` with its own decoder (``backend="fast"``);
- ``rlvr_hf_forward``: the same engine running the Hugging Face forward (``backend="hf"``),
  the engine before the fast decoder, for reference;
- bf16 (unless ``--no-bf16``): ``hf_generate_bf16`` = ``model.generate`` on a bfloat16 copy of
  the model (how a user runs transformers in bf16), and ``rlvr_fast_bf16`` = the engine with
  ``SamplingParams(precision="bf16")`` on the fp32 model (bf16 GEMMs, the rest fp32).

Reports the median generated tokens/s per side, the ratio to ``hf_generate`` (fp32) and to the
``model.generate`` of the same precision, the per-round ratios to ``hf_generate`` (median and
range: each round runs every side once, back to back), and the fraction of the machine's matmul rate in the
side's GEMM dtype (``model_flops_per_token x tokens/s / matmul_rate()``, the fp32 and bf16 rates
measured before and after in the same run), with the idle CPU at the start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (  # noqa: E402
    bench_model,
    bench_tokenizer,
    idle_cpu,
    machine_note,
    matmul_rate,
    model_flops_per_token,
    num_params,
    print_table,
    spread,
    write_json,
)

PROMPTS, SAMPLES, NEW_TOKENS = 8, 8, 32


def bench_prompts(tokenizer) -> list[list[int]]:
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.model.tokenizer import encode_chat_prompt
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(["math.arith", "math.word", "code.gen"], "eval", PROMPTS, seed=0)
    return [list(encode_chat_prompt(tokenizer, list(t.prompt))) for t in tasks]


def make_sides(model, tokenizer, prompts, bf16: bool = False):
    import copy
    import dataclasses

    import torch

    from rlvr.rollout.engine import SamplingParams, generate

    pad = tokenizer.pad_token_id
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for k, p in enumerate(prompts):
        ids[k, width - len(p):], mask[k, width - len(p):] = torch.tensor(p), 1
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, top_p=1.0, n=SAMPLES, stop_token_ids=())

    def hf(m):
        def hf_generate(seed: int) -> int:
            return _hf_generate(m, ids, mask, pad, width, seed)
        return hf_generate

    def engine(backend: str, precision: str = "model"):
        p = dataclasses.replace(params, precision=precision)

        def run(seed: int) -> int:
            g = torch.Generator().manual_seed(seed)
            out = generate(model, prompts, p, generator=g, pad_token_id=pad, backend=backend)
            assert len(out) == PROMPTS * SAMPLES and all(len(c.token_ids) == NEW_TOKENS for c in out)
            return sum(len(c.token_ids) for c in out)
        return run

    sides = {"hf_generate": hf(model), "rlvr_fast": engine("fast"), "rlvr_hf_forward": engine("hf")}
    if bf16:
        sides.update(hf_generate_bf16=hf(copy.deepcopy(model).to(torch.bfloat16)),
                     rlvr_fast_bf16=engine("fast", "bf16"))
    return sides


def _hf_generate(model, ids, mask, pad: int, width: int, seed: int) -> int:
    import torch

    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            num_return_sequences=SAMPLES, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
            pad_token_id=pad,
        )
    new = out.shape[1] - width
    assert out.shape[0] == PROMPTS * SAMPLES and new == NEW_TOKENS, out.shape
    return out.shape[0] * new


def measure(size: str, rounds: int, tokenizer, bf16: bool = False) -> tuple[list[dict], dict]:
    import torch

    model = bench_model(size, tokenizer).eval()
    prompts = bench_prompts(tokenizer)
    sides = make_sides(model, tokenizer, prompts, bf16)
    names = list(sides)
    for name in names:  # warm-up (allocator, first-call costs), not timed
        sides[name](0)
    rate_before = matmul_rate()
    bf16_before = matmul_rate(dtype=torch.bfloat16) if bf16 else None
    times: dict[str, list[float]] = {n: [] for n in names}
    tokens = {}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            tokens[name] = sides[name](r + 1)
            times[name].append(time.perf_counter() - t0)
    rate_after = matmul_rate()
    bf16_after = matmul_rate(dtype=torch.bfloat16) if bf16 else None
    rates = {"fp32": statistics.median([rate_before, rate_after]) * 1e9}
    if bf16:
        rates["bf16"] = statistics.median([bf16_before, bf16_after]) * 1e9
    flops = model_flops_per_token(model)
    tps = {name: tokens[name] / statistics.median(times[name]) for name in names}
    rows = []
    for name in names:
        precision = "bf16" if name.endswith("_bf16") else "fp32"
        same = "hf_generate_bf16" if precision == "bf16" else "hf_generate"
        rows.append({
            "size": size, "side": name, "gemm": precision, "tokens_per_s": round(tps[name], 1),
            "median_s": round(statistics.median(times[name]), 4),
            "ratio_vs_hf_generate": round(tps[name] / tps["hf_generate"], 2),
            "ratio_vs_same_precision": round(tps[name] / tps[same], 2),
            "round_ratios_vs_hf_generate": spread(round_ratios(times, tokens, name)),
            "matmul_fraction": round(flops * tps[name] / rates[precision], 4),
        })
    meta = {"size": size, "params": num_params(model), "flops_per_token": flops,
            "prompt_lengths": [len(p) for p in prompts], "rounds": rounds,
            "matmul_gflops_before": round(rate_before, 1), "matmul_gflops_after": round(rate_after, 1),
            "bf16_matmul_gflops_before": bf16_before and round(bf16_before, 1),
            "bf16_matmul_gflops_after": bf16_after and round(bf16_after, 1),
            "times_s": {n: [round(t, 4) for t in ts] for n, ts in times.items()}}
    return rows, meta


def round_ratios(times: dict[str, list[float]], tokens: dict[str, int], name: str) -> list[float]:
    """Per round, ``name``'s tokens/s over ``hf_generate``'s: the two ran back to back, so a
    slowdown of the machine that lasts a round moves both (the paired view of the same runs)."""
    base = tokens["hf_generate"]
    return [(tokens[name] / t) / (base / b) for t, b in zip(times[name], times["hf_generate"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", action="append", choices=["small", "medium", "large"],
                        help="model size(s); default small")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false",
                        help="skip the bf16 sides (for CPUs without bf16 GEMMs)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    idle = idle_cpu()
    note = machine_note()
    tokenizer = bench_tokenizer()
    rows, metas = [], []
    for size in args.size or ["small"]:
        r, m = measure(size, args.rounds, tokenizer, args.bf16)
        rows += r
        metas.append(m)
    print(f"\nrollout throughput: {PROMPTS} prompts x {SAMPLES} samples x {NEW_TOKENS} new tokens, "
          f"temperature 1; median of {args.rounds} rounds")
    print_table(rows, ["size", "side", "gemm", "tokens_per_s", "median_s", "ratio_vs_hf_generate",
                       "ratio_vs_same_precision", "round_ratios_vs_hf_generate", "matmul_fraction"])
    print("round_ratios_vs_hf_generate: median [min-max] over rounds of the side's speed over "
          "hf_generate's in the same round")
    for m in metas:
        bf = (f", bf16 {m['bf16_matmul_gflops_before']:.0f} -> {m['bf16_matmul_gflops_after']:.0f}"
              if m["bf16_matmul_gflops_before"] else "")
        print(f"{m['size']}: {m['params'] / 1e6:.2f}M params, matmul rate fp32 {m['matmul_gflops_before']:.0f} -> "
              f"{m['matmul_gflops_after']:.0f}{bf} GFLOP/s (before -> after)")
    print(f"machine: {note}; idle CPU at start {idle:.0%}")
    write_json(args.json_path, {"benchmark": "rollout_throughput", "rows": rows, "meta": metas,
                                "idle_cpu": idle, "machine": note, "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()
