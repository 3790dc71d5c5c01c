"""Peak memory and tokens/s of one GRPO update per memory option (fp32, bf16 + checkpointing + chunked logits, LoRA).

    python benchmarks/memory_step.py --json runs/bench/memory_step.json [--size medium|xl] [--rounds 1] [--warmup 1]

``xl`` (0.55B parameters, 32k vocabulary) is about the largest model this 24 GiB machine trains in
fp32; the default is ``medium`` (60M) because on this CPU a bf16 ``Linear`` backward is 30-140x
slower than fp32's (no AMX), so the bf16 variants take minutes per update even there.

Each variant runs in a fresh process (peak RSS = ``ru_maxrss`` of that process, which includes the
Python + torch baseline, reported separately): the model is built at random in its dtype, then
the update's own functions run on a fixed batch (``logprobs_of`` -> PPO-style loss on the policy
tokens -> backward -> ``clip_and_step``), ``--warmup`` untimed updates (default 1) and ``--rounds`` timed
ones (at ``xl`` on this CPU, ``--warmup 0 --batch 1``: a bf16 update there takes minutes). Variants:

    fp32            float32 weights, AdamW in float32, all logits at once, no checkpointing
    bf16_ckpt_chunk bf16 weights + float32 master copies (optim.master_weights), activation
                    checkpointing (algo.gradient_checkpointing), logits in chunks (algo.logits_chunk)
    bf16_states     bf16 weights, bf16 AdamW states (no masters), checkpointing, chunked logits
    lora            float32 base frozen, LoRA r=16 on every linear layer (lora.*), all logits at once

The variants run one after the other (their processes never overlap: each needs most of the
machine's memory at the largest size), in the order above, ``--rounds`` timed updates each.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import idle_cpu, machine_note, print_table, write_json  # noqa: E402

SIZES = {  # Llama shapes with a real vocabulary (the chunked head matters there)
    "medium": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                   intermediate_size=1536, vocab_size=32000),
    "xl": dict(hidden_size=1536, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=4,
               intermediate_size=4096, vocab_size=32000),
}
VARIANTS = ("fp32", "bf16_ckpt_chunk", "bf16_states", "lora")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def child(variant: str, size: str, batch: int, length: int, policy: int, rounds: int, chunk: int, warmup: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.model.lora import LoraConfig, apply_lora
    from rlvr.train.common import OptimConfig, build_optimizer, clip_and_step
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.update import logprobs_of
    from rlvr.train.memory import enable_activation_checkpointing
    from rlvr.types import Batch

    baseline = rss_mb()
    torch.manual_seed(0)
    bf16 = variant.startswith("bf16")
    torch.set_default_dtype(torch.bfloat16 if bf16 else torch.float32)
    model = LlamaForCausalLM(LlamaConfig(**SIZES[size], max_position_embeddings=length, tie_word_embeddings=False))
    torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    if variant == "lora":
        model = apply_lora(model, LoraConfig(enabled=True, r=16, alpha=32)).get_base_model()
    if bf16:
        enable_activation_checkpointing(model)
    algo = AlgoConfig(logits_chunk=chunk if bf16 else 0)
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-5, master_weights=variant == "bf16_ckpt_chunk"), 100)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SIZES[size]["vocab_size"], (batch, length), generator=g)
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, length - policy:] = 1
    b = Batch(input_ids=ids, attention_mask=mask, loss_mask=loss_mask,
              advantages=torch.randn(batch, generator=g), old_logprobs=torch.zeros(batch, length, dtype=torch.float32))
    model.train()
    after_build = rss_mb()
    times = []
    for i in range(warmup + rounds):
        t0 = time.perf_counter()
        lp = logprobs_of(model, b, algo)
        loss = -(lp * b.loss_mask * b.advantages[:, None]).sum() / b.loss_mask.sum()
        loss.backward()
        clip_and_step(model, opt, sched, 1.0)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": variant, "params": params, "trainable": trainable, "baseline_rss_mb": baseline,
            "model_rss_mb": after_build, "peak_rss_mb": peak, "peak_above_baseline_mb": peak - baseline,
            "seconds_per_update": sorted(times)[len(times) // 2], "update_seconds": times,
            "tokens_per_s": batch * length / sorted(times)[len(times) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="medium", choices=sorted(SIZES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--policy", type=int, default=192, help="policy (loss) tokens at the end of each sequence")
    ap.add_argument("--chunk", type=int, default=256, help="algo.logits_chunk of the chunked variants")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed updates first (0 at xl: the first update is timed)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.size, args.batch, args.length, args.policy, args.rounds, args.chunk, args.warmup)))
        return
    idle = idle_cpu()
    print(f"{machine_note()}; idle CPU {idle:.0%}; size {args.size}, {args.batch} x {args.length} tokens "
          f"({args.policy} policy tokens each), {args.warmup} untimed + {args.rounds} timed updates per variant")
    rows = []
    for v in args.variants.split(","):
        cmd = [sys.executable, __file__, "--child", v, "--size", args.size, "--batch", str(args.batch),
               "--length", str(args.length), "--policy", str(args.policy), "--rounds", str(args.rounds),
               "--chunk", str(args.chunk), "--warmup", str(args.warmup)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{v} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  {v}: peak {rows[-1]['peak_rss_mb']:.0f} MB, {rows[-1]['tokens_per_s']:.0f} tokens/s", flush=True)
    base = rows[0]
    for r in rows:
        r["peak_ratio_vs_fp32"] = r["peak_above_baseline_mb"] / base["peak_above_baseline_mb"]
        r["speed_ratio_vs_fp32"] = r["tokens_per_s"] / base["tokens_per_s"]
    print_table(rows, ["variant", "params", "trainable", "peak_rss_mb", "peak_above_baseline_mb",
                       "peak_ratio_vs_fp32", "tokens_per_s", "speed_ratio_vs_fp32"])
    write_json(args.json, {"size": args.size, "batch": args.batch, "length": args.length, "policy": args.policy,
                           "chunk": args.chunk, "rounds": args.rounds, "warmup": args.warmup, "idle_cpu_start": idle,
                           "idle_cpu_end": idle_cpu(), "variants": rows})


if __name__ == "__main__":
    main()
