"""The GPU check of issue 33 in one command: real-size shapes, the engines side by side, LoRA and full GRPO steps.

    python benchmarks/gpu_real_model.py --json PATH                         # on a machine with a GPU
    python benchmarks/gpu_real_model.py --device cpu --shape tiny --tasks 2 --new-tokens 16   # CPU smoke

Models are random-weight configs of real shapes (no hub here): ``llama1b`` is Llama-3.2-1B's
(hidden 2048, 16 layers, 32 query / 8 KV heads, MLP 8192, vocabulary 128,256, tied: 1.24B
parameters), ``qwen05b`` Qwen2.5-0.5B's (the ``configs/real_model_lora.yaml`` recipe's model:
494M). rlvr's 512-token tokenizer drives them (ids past it decode to nothing), so rewards are
all 0: the GRPO steps run with ``drop_zero_variance: false`` (every sample goes through the
forward, backward and optimizer; the advantages are 0, the work is not).

1. **Engines** on ``--engine-shape`` in bf16: ``--prompts`` chat prompts x ``--samples`` x
   exactly ``--new-tokens`` tokens at T = 1, sides alternated over ``--rounds``:
   ``hf_generate`` (``model.generate``), ``rlvr`` (rlvr's engine) and ``vllm`` when vLLM is
   importable (else the row says why not). Tokens/s, and the log-prob mismatch of each engine's
   sampling log-probs against the trainer's forward (``sequence_logprobs``) on its own samples:
   mean |delta| and ``logprob_mismatch_kl``.
2. **GRPO steps** (``rlvr.train.grpo.run_grpo``, ``--steps`` steps, the first not counted),
   peak GPU memory (``torch.cuda.max_memory_allocated``) and seconds per step:
   ``lora`` (bf16 base, r = 16 on all linear layers, KL against the adapters-off model) and
   ``full`` (bf16 weights + fp32 master weights, activation checkpointing, logits in chunks of
   1024, no KL) on ``--grpo-shape``; ``recipe`` runs ``configs/real_model_lora.yaml``'s settings
   on ``qwen05b`` (16 tasks x 8 samples x <= 512 tokens, micro-batches of 4) for its memory line.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from common import bench_tokenizer, print_table, write_json
from gpu_step import alternate, device_note, prompts_of

SHAPES = {
    "llama1b": ("llama", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                              intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                              rope_theta=500000.0, max_position_embeddings=4096)),
    "qwen05b": ("qwen2", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                              intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                              rope_theta=1000000.0, max_position_embeddings=4096)),
    "tiny": ("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=128, vocab_size=1000, tie_word_embeddings=True,
                           max_position_embeddings=1024)),
}


def build_model_dir(shape: str, tokenizer, device: torch.device, root: Path) -> Path:
    """A random-weight bf16 model of ``shape`` with the tokenizer's special ids, saved as a HF directory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.model.checkpoint import save_model_dir

    kind, dims = SHAPES[shape]
    config = AutoConfig.for_model(kind, **dims, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    path = save_model_dir(root / shape, model, tokenizer)
    del model
    return Path(path)


def engine_sides(model, tokenizer, prompts, samples: int, new_tokens: int, model_dir: Path):
    """name -> run(seed) returning (tokens, prompt+completion id lists, their sampling log-probs)."""
    from rlvr.rollout.engine import SamplingParams, generate

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for k, p in enumerate(prompts):
        ids[k, width - len(p):], mask[k, width - len(p):] = torch.tensor(p), 1
    ids, mask = ids.to(device), mask.to(device)

    def hf_generate(seed: int):
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, num_return_sequences=samples, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, pad_token_id=pad, output_scores=True,
                                 return_dict_in_generate=True)
        seqs = out.sequences[:, width:]
        lp = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
        chosen = lp.gather(-1, seqs.unsqueeze(-1)).squeeze(-1)
        rows = [prompts[k // samples] + seqs[k].tolist() for k in range(seqs.shape[0])]
        return seqs.numel(), rows, chosen.cpu().tolist()

    def rlvr_engine(seed: int):
        params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, n=samples,
                                stop_token_ids=(), precision="model")
        out = generate(model, prompts, params, generator=torch.Generator().manual_seed(seed), pad_token_id=pad)
        rows = [prompts[k // samples] + list(c.token_ids) for k, c in enumerate(out)]
        return sum(len(c.token_ids) for c in out), rows, [list(c.logprobs) for c in out]

    sides = {"hf_generate": hf_generate, "rlvr": rlvr_engine}
    try:
        import vllm
    except ImportError as e:
        return sides, f"vllm not importable here ({e})"
    llm = vllm.LLM(model=str(model_dir), dtype="bfloat16", gpu_memory_utilization=0.3, seed=0)

    def vllm_engine(seed: int):
        sp = vllm.SamplingParams(n=samples, temperature=1.0, top_p=1.0, max_tokens=new_tokens,
                                 min_tokens=new_tokens, ignore_eos=True, logprobs=0, seed=seed)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        rows, lps, n = [], [], 0
        for p, o in zip(prompts, outs):
            for c in o.outputs:
                rows.append(p + list(c.token_ids))
                lps.append([step[t].logprob for t, step in zip(c.token_ids, c.logprobs)])
                n += len(c.token_ids)
        return n, rows, lps

    sides["vllm"] = vllm_engine
    return sides, None


def mismatch(model, rows: list[list[int]], lps: list[list[float]], pad: int) -> dict:
    """Each engine's sampling log-probs against the trainer's forward of the same tokens."""
    from rlvr.model.logprobs import sequence_logprobs
    from rlvr.rollout.async_rollout import logprob_mismatch_kl

    device = next(model.parameters()).device
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    behaviour = torch.zeros((len(rows), width), dtype=torch.float32)
    for k, (r, lp) in enumerate(zip(rows, lps)):
        ids[k, : len(r)], attn[k, : len(r)] = torch.tensor(r), 1
        mask[k, len(r) - len(lp): len(r)] = 1
        behaviour[k, len(r) - len(lp): len(r)] = torch.tensor(lp)
    with torch.no_grad():
        trainer = torch.cat([sequence_logprobs(model, ids[i: i + 16].to(device), attn[i: i + 16].to(device)).float().cpu()
                             for i in range(0, len(rows), 16)])
    delta = (trainer - behaviour).abs() * mask
    return {"mean_abs_delta": float(delta.sum() / mask.sum()), "max_abs_delta": float(delta.max()),
            "mismatch_kl": float(logprob_mismatch_kl(trainer, behaviour, mask))}


def measure_engines(model_dir: Path, tokenizer, a, device) -> tuple[list[dict], str | None]:
    from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(model_dir), device=device, options=ModelLoadConfig(dtype="bfloat16"))
    model.eval()
    prompts = prompts_of(tokenizer, a.prompts)
    sides, why_not = engine_sides(model, tokenizer, prompts, a.samples, a.new_tokens, model_dir)
    for run in sides.values():  # warm-up: allocator, CUDA graphs, vLLM's compile
        run(0)
    times, last = alternate(sides, a.rounds, device)
    names = list(sides)
    base = last["hf_generate"][0] / statistics.median(times["hf_generate"])
    rows = []
    for name in names:
        tokens, seqs, lps = last[name]
        tps = tokens / statistics.median(times[name])
        rows.append({"engine": name, "tokens/s": tps, "vs hf_generate": tps / base,
                     "seconds": times[name], **mismatch(model, seqs, lps, tokenizer.pad_token_id)})
    if why_not:
        rows.append({"engine": "vllm", "tokens/s": None, "note": why_not})
    del model, sides
    return rows, why_not


def grpo_variant(name: str, shape: str, model_dir: Path, a, device, out_root: Path) -> dict:
    import rlvr.train.grpo as grpo
    from rlvr.model.load import ModelLoadConfig
    from rlvr.model.lora import LoraConfig
    from rlvr.train.common import OptimConfig

    recipe = name == "recipe"
    tasks, samples, tokens, micro = (16, 8, 512, 4) if recipe else (a.tasks, a.samples, a.new_tokens, a.micro)
    lora = name in ("lora", "recipe")
    cfg = grpo.GRPOConfig(
        model=str(model_dir), out=str(out_root / name), seed=0, device=str(device), domains=["math.arith"],
        train_tasks=tasks * a.steps, steps=a.steps, model_load=ModelLoadConfig(dtype="bfloat16"),
        rollout=grpo.RolloutConfig(tasks_per_step=tasks, samples_per_task=samples, max_new_tokens=tokens,
                                   temperature=1.0, batch_size=tasks * samples, precision="model"),
        algo=grpo.AlgoConfig(drop_zero_variance=False, microbatch_size=micro, precision="model",
                             kl_coef=0.001 if lora else 0.0, gradient_checkpointing=not lora,
                             logits_chunk=0 if lora else 1024),
        optim=OptimConfig(lr=1e-5, warmup_steps=0, master_weights=not lora),
        lora=LoraConfig(enabled=lora, r=16, alpha=32, target_modules=["all-linear"]),
        checkpoint_every=10_000, save_trajectories_every=10_000)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    grpo.run_grpo(cfg, progress=False)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    steps = [json.loads(line) for line in (out_root / name / "metrics.jsonl").read_text().splitlines()]
    phases = ("time/wait", "time/monitor", "time/advantage", "time/prepare", "time/update", "time/weight_sync")  # the loop's own timers
    per_step = [sum(s.get(k, 0.0) for k in phases) for s in steps]
    counted = per_step[1:] or per_step
    return {"variant": name, "shape": shape, "tasks x samples": f"{tasks}x{samples}",
            "max_new_tokens": tokens, "s/step": statistics.median(counted), "step_seconds": per_step,
            "peak_gib": peak, "wall_s": wall,
            "response_tokens_mean": steps[-1].get("rollout/response_tokens_mean"),
            "logprob_mismatch_kl": steps[-1].get("rollout/logprob_mismatch_kl"),
            "update_s": statistics.median(s.get("time/update", 0.0) for s in steps[1:] or steps),
            "rollout_s": statistics.median(s.get("time/wait", 0.0) for s in steps[1:] or steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default=None, help="one shape for every part (e.g. tiny for the CPU smoke run)")
    ap.add_argument("--engine-shape", default="llama1b", choices=sorted(SHAPES))
    ap.add_argument("--grpo-shape", default="llama1b", choices=sorted(SHAPES))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8, help="GRPO: tasks per step")
    ap.add_argument("--micro", type=int, default=16, help="GRPO: micro-batch (sequences)")
    ap.add_argument("--steps", type=int, default=3, help="GRPO steps per variant (the first not counted)")
    ap.add_argument("--variants", default="lora,full,recipe")
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    unknown = set(a.variants.split(",")) - {"lora", "full", "recipe", ""}
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; allowed: lora, full, recipe")
    if a.shape:
        a.engine_shape = a.grpo_shape = a.shape
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run on a GPU machine, or --device cpu --shape tiny for the CPU smoke run")
    root = Path(tempfile.mkdtemp(prefix="gpu_real_"))
    tok = bench_tokenizer()
    print(device_note(device), flush=True)
    out: dict = {"device": device_note(device), "args": vars(a)}
    dirs: dict[str, Path] = {}

    def model_dir(shape: str) -> Path:
        if shape not in dirs:
            dirs[shape] = build_model_dir(shape, tok, device, root)
        return dirs[shape]

    if not a.skip_engines:
        rows, why_not = measure_engines(model_dir(a.engine_shape), tok, a, device)
        print(f"\nengines on {a.engine_shape} (bf16): {a.prompts} prompts x {a.samples} samples x {a.new_tokens} tokens")
        print_table(rows, ["engine", "tokens/s", "vs hf_generate", "mean_abs_delta", "max_abs_delta", "mismatch_kl"])
        out["engines"] = {"shape": a.engine_shape, "rows": rows, "vllm": why_not or "ran"}
        write_json(a.json, out)
    results = []
    for v in [v for v in a.variants.split(",") if v]:
        shape = "qwen05b" if v == "recipe" and not a.shape else a.grpo_shape
        try:
            results.append(grpo_variant(v, shape, model_dir(shape), a, device, root / "runs"))
        except Exception as e:  # keep the other variants' numbers; the row says what failed
            results.append({"variant": v, "error": f"{type(e).__name__}: {e}"[:2000]})
        print(f"  {results[-1]}", flush=True)
        out["grpo"] = results
        write_json(a.json, out)
    print_table([r for r in results if "error" not in r],
                ["variant", "shape", "tasks x samples", "max_new_tokens", "s/step", "rollout_s", "update_s", "peak_gib"])


if __name__ == "__main__":
    main()
