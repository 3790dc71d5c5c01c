"""Forward + backward of one GRPO update, training-forward variants side by side in one process.

    python benchmarks/update_variants.py [--size small|medium] [--bf16] [--pairs 10] [--json PATH]

The batch is one real rollout of the TRL benchmark's workload (``grpo_step_vs_trl.py``: 8
``math.arith`` prompts x 8 samples x at most 32 new tokens, the same random model), collated as
the trainer does. Each variant runs ``micro_loss`` + ``backward`` on it (gradients zeroed after),
and the variants alternate ``--pairs`` times after a warm-up call each (the compile happens
there). Variants (``--variants``, comma-separated):

- ``eager``: the default training forward (packed, shared prompts);
- ``compiled``: with ``algo.compile`` (compiled decoder layers);
- ``unshared``: packing without shared prompts (``algo.share_prompts=false``);
- ``padded``: no packing (``algo.packing=false``);
- ``rows``, ``compiled_rows``: the row layout (rows of a few sequences under a dense block-diagonal
  mask), which models without per-sequence attention use, instead of the flat layout
  (``rlvr.train.sequence_attention``).

Prints the median seconds per variant, useful forward + backward FLOPs per second (counted as in
``grpo_step_vs_trl.py``, for the default layout: the other layouts' extra work is not counted,
so their rate reads lower), its fraction of the GEMM rate (measured before and after) and the
speed ratio to the first variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from common import (
    bench_model,
    bench_tokenizer,
    machine_note,
    matmul_rate,
    print_table,
    write_json,
)
from grpo_step_vs_trl import RlvrSide, digit_reward, shared_copies, useful_flops

VARIANTS = {
    "eager": {},
    "compiled": {"compile": True},
    "unshared": {"share_prompts": False},
    "padded": {"packing": False},
    "rows": {},
    "compiled_rows": {"compile": True},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=["small", "medium"])
    ap.add_argument("--bf16", action="store_true", help="algo.precision=bf16 (rates against the bf16 GEMM rate)")
    ap.add_argument("--variants", default="eager,compiled")
    ap.add_argument("--pairs", type=int, default=10, help="alternation rounds")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if a.threads:
        torch.set_num_threads(a.threads)
    import rlvr.tasks  # noqa: F401
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.tasks.base import generate_tasks
    from rlvr.train import grpo, sequence_attention, sources, update
    from rlvr.types import Scored, Verdict

    tmp = Path(tempfile.mkdtemp(prefix="update_variants_"))
    tok = bench_tokenizer()
    model_dir = str(save_model_dir(tmp / "model", bench_model(a.size, tok), tok))
    tasks = generate_tasks(["math.arith"], "train", 8, seed=0)
    precision = "bf16" if a.bf16 else "model"
    side = RlvrSide(model_dir, str(tmp / "run"), tasks, 0, precision=precision)
    run, cfg = side.run, side.cfg
    episodes = sources.rollout(run, tasks, policy_version=0)
    scored = [Scored(tasks[e.trajectory.group_id], e.trajectory, Verdict(passed=False, score=r, reason="ok"), r)
              for e in episodes for r in [digit_reward(e.trajectory.completion)]]
    prepared = grpo.prepare(run, grpo.select_samples(scored, cfg), cfg)
    prepared, _ = grpo.compute_advantages(prepared, cfg)
    kept, batch = prepared.kept, prepared.batch
    model = run.model.train()
    totals = {"num_tokens": float(batch.loss_mask.sum()), "num_seqs": float(len(kept)), "max_tokens": 32}
    lens, comp = batch.attention_mask.sum(1).tolist(), batch.loss_mask.sum(1).long().tolist()
    flops = useful_flops(model, lens, comp, shared_copies(batch, model))

    def fwd_bwd(name: str) -> float:
        algo = dataclasses.replace(cfg.algo, **VARIANTS[name])
        supported = sequence_attention.supported
        if name.endswith("rows"):
            sequence_attention.supported = lambda model, longest: False
        try:
            t0 = time.perf_counter()
            loss, _ = update.micro_loss(model, batch, algo, totals)
            loss.backward()
            seconds = time.perf_counter() - t0
        finally:
            sequence_attention.supported = supported
        model.zero_grad(set_to_none=True)
        return seconds

    warm = {n: fwd_bwd(n) for n in names}  # first call: allocator, compile
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    rates = [matmul_rate(dtype=dtype)]
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.pairs):
        for n in names[r % len(names):] + names[: r % len(names)]:
            times[n].append(fwd_bwd(n))
    rates.append(matmul_rate(dtype=dtype))
    rate = statistics.median(rates)
    base = statistics.median(times[names[0]])
    rows = []
    for n in names:
        med = statistics.median(times[n])
        rows.append({"variant": n, "seconds": med, "first call s": warm[n], "fwd+bwd GF/s": flops / med / 1e9,
                     "of matmul": f"{flops / med / 1e9 / rate:.0%}", f"vs {names[0]}": f"{base / med:.3f}x"})
    print(f"{a.size} model, {len(kept)} sequences, {'bf16' if a.bf16 else 'fp32'}; {machine_note()}")
    print_table(rows, ["variant", "seconds", "first call s", "fwd+bwd GF/s", "of matmul", f"vs {names[0]}"])
    print(f"{'bf16' if a.bf16 else 'fp32'} matmul rate {rate:.0f} GFLOP/s (before {rates[0]:.0f}, after {rates[1]:.0f}); "
          f"medians of {a.pairs} alternating rounds")
    write_json(a.json, {"size": a.size, "bf16": a.bf16, "rows": rows, "times": times, "matmul_rates": rates,
                        "useful_flops": flops, "machine": machine_note()})


if __name__ == "__main__":
    main()
