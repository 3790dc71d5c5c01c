"""Benchmark: the quickstart end to end — wall seconds per stage and held-out pass@1, SFT vs GRPO.

    python benchmarks/quickstart_stages.py [--out runs/bench/quickstart] [--json PATH] [--set k=v ...]

The baseline is the SFT model, measured in the same run on the same held-out tasks (600 with the quickstart's defaults); the
ratio is GRPO pass@1 / SFT pass@1. Pretraining is forced (no cache) so its time is measured, with
its FLOP rate: 3 x (``model_flops_per_token`` + attention at half the sequence, causal) x the
tokens it trained on, over its seconds, as a share of this machine's GEMM rate (``matmul_rate``,
measured before and after the run; the median of the two) in fp32 and, when pretraining runs in
bf16 (``pretrain.precision``, the quickstart's default where the CPU multiplies bf16 natively), in
bf16 too.
Prints a table and the idle CPU seen at the start (other load slows a run several-fold).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import attention_flops, matmul_rate, model_flops_per_token  # noqa: E402


def pretrain_gflops(cfg, model_dir: Path, seconds: float) -> float:
    """The pretraining stage's useful FLOP rate (module docstring)."""
    from rlvr.model.load import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(model_dir))
    pre = cfg.pretrain
    per_token = 3 * (model_flops_per_token(model) + attention_flops(model, pre.seq_len / 2))
    return per_token * pre.steps * pre.batch_size * pre.seq_len / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench/quickstart")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from rlvr.config import load_config
    from rlvr.monitor.cpu import idle_cpu
    from rlvr.train.quickstart import QuickstartConfig, run_quickstart

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    idle = idle_cpu()
    import torch

    rates, bf16_rates = [matmul_rate()], [matmul_rate(dtype=torch.bfloat16)]
    shutil.rmtree(Path(args.out) / "pretrain", ignore_errors=True)  # measure pretraining too
    cfg = load_config(QuickstartConfig, None, args.overrides + [f"out={args.out}"])
    start = time.perf_counter()
    report = run_quickstart(cfg)
    wall = time.perf_counter() - start
    rates.append(matmul_rate())
    bf16_rates.append(matmul_rate(dtype=torch.bfloat16))
    gemm, bf16_gemm = statistics.median(rates), statistics.median(bf16_rates)
    pretrain_rate = pretrain_gflops(cfg, Path(args.out) / "pretrain" / "final", report["stage_seconds"]["pretrain"])

    rows = [(stage, f"{sec:.1f}") for stage, sec in report["stage_seconds"].items()]
    print("\nstage              seconds")
    for stage, sec in rows:
        print(f"{stage:<18} {sec:>7}")
    print(f"{'total (wall)':<18} {wall:>7.1f}")
    print(f"pretraining ({cfg.pretrain.precision}, compile {cfg.pretrain.compile}): {pretrain_rate:.1f} GFLOP/s = "
          f"{100 * pretrain_rate / gemm:.0f}% of the fp32 GEMM rate ({', '.join(f'{r:.0f}' for r in rates)} GFLOP/s "
          f"before, after), {100 * pretrain_rate / bf16_gemm:.0f}% of the bf16 one "
          f"({', '.join(f'{r:.0f}' for r in bf16_rates)})")
    o = report["overall"]
    ratio = o["rl_pass@1"] / o["sft_pass@1"] if o["sft_pass@1"] else float("inf")
    print(f"\nheld-out pass@1 ({report['eval']['tasks']} tasks, greedy)")
    print(f"{'domain':<12} {'SFT':>7} {'GRPO':>7} {'points':>7}")
    for d, r in report["domains"].items():
        print(f"{d:<12} {100 * r['sft_pass@1']:>6.1f}% {100 * r['rl_pass@1']:>6.1f}% {r['delta_points']:>+7.1f}")
    print(f"{'all':<12} {100 * o['sft_pass@1']:>6.1f}% {100 * o['rl_pass@1']:>6.1f}% {o['delta_points']:>+7.1f}")
    print(f"GRPO / SFT pass@1 ratio: {ratio:.2f}   idle CPU at start: {100 * idle:.0f}%")
    result = {"stage_seconds": report["stage_seconds"], "wall_seconds": round(wall, 1), "idle_cpu": idle,
              "gemm_gflops": rates, "bf16_gemm_gflops": bf16_rates, "pretrain_gflops": round(pretrain_rate, 1),
              "pretrain_precision": cfg.pretrain.precision, "pretrain_compile": cfg.pretrain.compile,
              "pretrain_share_of_gemm": round(pretrain_rate / gemm, 3),
              "pretrain_share_of_bf16_gemm": round(pretrain_rate / bf16_gemm, 3),
              "overall": o, "domains": report["domains"], "rl_over_sft_ratio": ratio,
              "overrides": args.overrides}
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
