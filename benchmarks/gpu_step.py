"""The GPU check of issue 6 in one command: the engine and a GRPO step on CUDA in bf16, a larger model.

    python benchmarks/gpu_step.py [--size large] [--json PATH]          # on a machine with a GPU
    python benchmarks/gpu_step.py --device cpu --size small --steps 2    # the same code path, CPU smoke

On a randomly initialised benchmark Llama (``benchmarks/common.py``: ``large`` is about 150M
parameters; ``--size`` also takes ``small`` and ``medium``):

1. **Rollout throughput**: ``--prompts`` chat prompts x ``--samples`` samples x exactly
   ``--new-tokens`` new tokens at temperature 1. Sides, alternated over ``--rounds``:
   ``hf_generate_bf16`` (``model.generate`` on a bf16 copy), ``rlvr_bf16_weights`` (rlvr's engine
   on that bf16 copy) and ``rlvr_bf16_gemms`` (rlvr's engine with ``precision="bf16"`` on the fp32
   model: how GRPO's rollouts run with ``rollout.precision=bf16``; CUDA graphs on, the default).
   Tokens/s, ratio to ``hf_generate_bf16`` and model-FLOP utilisation: ``model_flops_per_token x
   tokens/s`` over the device's bf16 GEMM rate (``matmul_rate`` of an n x n x n bf16 GEMM, n =
   8192 on a GPU, 256 on a CPU), measured before and after in the same run.
2. **GRPO step**: ``rlvr.train.grpo`` on ``device``, ``rollout.precision`` and ``algo.precision``
   bf16 (fp32 master weights, AdamW), ``--tasks`` prompts x ``--samples`` samples x at most
   ``--new-tokens`` tokens, the digit-share reward of ``grpo_step_vs_trl.py``; ``--compile`` adds
   ``algo.compile``. Phases (generate, score, forward, backward, optimizer) with the GPU
   synchronised at every edge, and forward + backward useful FLOPs (``useful_flops``) per second
   over the bf16 GEMM rate. The first ``--warmup`` steps (CUDA graph capture, compile) are not
   counted.

Prints both tables and the device; ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from common import (
    MODEL_SIZES,
    bench_model,
    bench_tokenizer,
    matmul_rate,
    model_flops_per_token,
    num_params,
    print_table,
    write_json,
)
from grpo_step_vs_trl import PHASES, RlvrSide


def device_note(device: torch.device) -> str:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"{p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"cpu ({torch.get_num_threads()} threads), torch {torch.__version__}"


def bf16_rate(device: torch.device) -> float:
    n = 8192 if device.type == "cuda" else 256  # bf16 GEMMs on this CPU run at ~0.7 GFLOP/s: 1024 took 26 s
    return matmul_rate(n, dtype=torch.bfloat16, device=device.type)


def prompts_of(tokenizer, n: int) -> list[list[int]]:
    import rlvr.tasks  # noqa: F401
    from rlvr.model.tokenizer import encode_chat_prompt
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(["math.arith", "math.word", "code.gen"], "eval", n, seed=0)
    return [list(encode_chat_prompt(tokenizer, list(t.prompt))) for t in tasks]


def rollout_sides(model, tokenizer, prompts, samples: int, new_tokens: int):
    import copy

    from rlvr.rollout.engine import SamplingParams, generate

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for k, p in enumerate(prompts):
        ids[k, width - len(p):], mask[k, width - len(p):] = torch.tensor(p), 1
    ids, mask = ids.to(device), mask.to(device)
    total = len(prompts) * samples * new_tokens

    def hf_generate_bf16(seed: int) -> int:
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = bf16.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                top_p=1.0, num_return_sequences=samples, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, pad_token_id=pad)
        assert out.shape == (len(prompts) * samples, width + new_tokens), out.shape
        return total

    def engine(m, precision: str):
        params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, n=samples,
                                stop_token_ids=(), precision=precision)

        def run(seed: int) -> int:
            out = generate(m, prompts, params, generator=torch.Generator().manual_seed(seed), pad_token_id=pad)
            assert sum(len(c.token_ids) for c in out) == total
            return total
        return run

    return {"hf_generate_bf16": hf_generate_bf16, "rlvr_bf16_weights": engine(bf16, "model"),
            "rlvr_bf16_gemms": engine(model, "bf16")}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(sides: dict, rounds: int, device: torch.device) -> tuple[dict[str, list[float]], dict]:
    """Each side ``run(seed)`` once per round, the order rotated each round, the GPU synchronised
    around each: (seconds per side, each side's last result)."""
    times: dict[str, list[float]] = {n: [] for n in sides}
    last: dict = {}
    names = list(sides)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            sync(device)
            t0 = time.perf_counter()
            last[name] = sides[name](r + 1)
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return times, last


def measure_rollout(model, tokenizer, a, device) -> tuple[list[dict], dict]:
    sides = rollout_sides(model, tokenizer, prompts_of(tokenizer, a.prompts), a.samples, a.new_tokens)
    for run in sides.values():  # warm-up: allocator, CUDA graph capture
        run(0)
    rates = [bf16_rate(device)]
    times, tokens = alternate(sides, a.rounds, device)
    names = list(sides)
    rates.append(bf16_rate(device))
    rate = statistics.median(rates)
    flops = model_flops_per_token(model)
    rows = []
    base = tokens["hf_generate_bf16"] / statistics.median(times["hf_generate_bf16"])
    for name in names:
        tps = tokens[name] / statistics.median(times[name])
        rows.append({"side": name, "tokens/s": tps, "vs hf_generate_bf16": f"{tps / base:.2f}x",
                     "MFU": f"{flops * tps / 1e9 / rate:.1%}", "seconds": statistics.median(times[name])})
    return rows, {"bf16_gemm_gflops": rates}


def measure_grpo(model_dir: str, a, device) -> tuple[dict, dict]:
    import rlvr.tasks  # noqa: F401
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(["math.arith"], "train", a.tasks, seed=0)
    side = RlvrSide(model_dir, tempfile.mkdtemp(prefix="gpu_grpo_"), tasks, 0, precision="bf16",
                    compile=a.compile, device=str(device), samples=a.samples, max_new_tokens=a.new_tokens)
    for _ in range(a.warmup):
        side.step()
    rates = [bf16_rate(device)]
    steps = [side.step() for _ in range(a.steps)]
    rates.append(bf16_rate(device))
    rate = statistics.median(rates)
    phases = {p: statistics.median(s[1].get(p, 0.0) for s in steps) for p in PHASES[:-1]}
    fb = statistics.median(s[2] / (s[1]["forward"] + s[1]["backward"]) / 1e9 for s in steps)
    row = {"s/step": statistics.median(s[0] for s in steps), **phases, "fwd+bwd GF/s": fb,
           "fwd+bwd MFU": f"{fb / rate:.1%}"}
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return row, {"bf16_gemm_gflops": rates, "steps": [s[0] for s in steps], "peak_memory_gib": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="large", choices=list(MODEL_SIZES))
    ap.add_argument("--prompts", type=int, default=32, help="rollout: chat prompts")
    ap.add_argument("--tasks", type=int, default=16, help="GRPO: prompts per step")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="rollout: alternation rounds")
    ap.add_argument("--steps", type=int, default=3, help="GRPO: counted steps")
    ap.add_argument("--warmup", type=int, default=2, help="GRPO: uncounted first steps")
    ap.add_argument("--compile", action="store_true", help="GRPO with algo.compile")
    ap.add_argument("--skip-rollout", action="store_true")
    ap.add_argument("--skip-grpo", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run on a GPU machine, or --device cpu --size small for the CPU smoke run")
    from rlvr.model.checkpoint import save_model_dir

    tok = bench_tokenizer()
    model = bench_model(a.size, tok).to(device).eval()
    params = num_params(model)
    print(f"{a.size} model: {params / 1e6:.1f}M parameters; {device_note(device)}", flush=True)
    out = {"size": a.size, "params": params, "device": device_note(device), "args": vars(a)}
    if not a.skip_rollout:
        rows, extra = measure_rollout(model, tok, a, device)
        print(f"\nrollout: {a.prompts} prompts x {a.samples} samples x {a.new_tokens} new tokens, "
              f"bf16 GEMM rate {statistics.median(extra['bf16_gemm_gflops']):.0f} GFLOP/s")
        print_table(rows, ["side", "tokens/s", "vs hf_generate_bf16", "MFU", "seconds"])
        out["rollout"] = {"rows": rows, **extra}
    if not a.skip_grpo:
        model_dir = str(save_model_dir(Path(tempfile.mkdtemp(prefix="gpu_model_")) / "model", model.cpu(), tok))
        del model
        row, extra = measure_grpo(model_dir, a, device)
        print(f"\nGRPO step: {a.tasks} prompts x {a.samples} samples x <= {a.new_tokens} tokens, bf16 "
              f"{'(compiled layers) ' * a.compile}on {device}; median of {a.steps} steps after {a.warmup}")
        print_table([row], ["s/step", *PHASES[:-1], "fwd+bwd GF/s", "fwd+bwd MFU"])
        out["grpo"] = {**row, **extra}
    write_json(a.json, out)


if __name__ == "__main__":
    main()
