"""Benchmark: the fast mode's engine-level speedups, each against the normal engine in one run.

    python benchmarks/fast_decode.py [--json PATH] [--rounds 3] [--k 2 4] [--tasks 400]
                                     [--target DIR] [--draft DIR] [--threads N] [--serve-requests 4]

Models: the target is the quickstart's GRPO policy, the draft a 1-layer model distilled from it
(``benchmarks/serve_models.py``, made on first use, ~5 minutes). Sides are alternated within
each round (the order rotates); medians over rounds; the idle CPU is noted at the start.

1. ``speculative``: greedy decoding of held-out prompts (math.arith, math.word, code.gen; up to
   64 tokens, stop at EOS). ``target``: ``engine.generate`` on the target alone (rlvr's fast
   decoder); ``spec_kK``: ``speculative_generate`` with the draft proposing K tokens. Batch 16 (16
   prompts together) and batch 1 (4 prompts, one at a time). The tokens of every speculative side
   are asserted identical to the target's; the draft's acceptance rate is recorded.
2. ``int8``: tokens/s of the int8 target (``model/quantize.py``) on rlvr's fast decoder and on
   the Hugging Face forward against the fp32 target on the fast decoder (batch 16, 64 tokens),
   and held-out greedy pass@1 of fp32, int8 (per-channel weight scales, the default), int8 with
   per-tensor weight scales and PyTorch's dynamic int8 (one activation scale per input tensor,
   ``torch_dynamic_int8``) on ``--tasks`` math tasks (``rlvr.eval.evaluate``, the eval split,
   batches of 256; the engine runs rlvr's int8 on the fast decoder).
   ``int8_gemm``: one decoder GEMM (``[h, 3h]``, as a fused q/k/v) through ``rollout/gemm.py``'s
   ``lin``: oneDNN-packed fp32 against ``Int8Matrix`` (per-token int8 activations), hidden size
   128 / 512 / 1024, 16 rows (a decode step) and 512 rows (a prefill); median of 200 calls.
3. ``prefix``: 16 requests one at a time, each a ~100-token shared system prompt + its own
   question, 16 new tokens (greedy). ``no_cache``: ``engine.generate``; ``cache``:
   ``prefix_cache.cached_generate`` with a cache that one earlier request warmed. Tokens run
   through the prefill counted per request; outputs asserted identical.
4. ``serve``: in-process load, no HTTP: 16 client threads, each sending ``--serve-requests``
   greedy requests one after another (the system prompt + its own question, 32 new tokens) to the
   normal engine (``serve/batcher.py``, continuous batching), the fast mode without a draft (the
   same engine with the prefix cache; and with int8 weights too) and ``FastEngine`` with the draft
   (waves); tokens/s over the wall time, p50/p99 request latency, and how many requests' tokens
   equal the normal engine's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, machine_note, print_table, write_json
from serve_models import SYSTEM, distil_draft, target_dir, task_prompts


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def alternate(sides: dict, rounds: int) -> dict[str, list[tuple[float, object]]]:
    """Run every side once per round, rotating the order; (seconds, result) per side per round."""
    names = list(sides)
    res: dict[str, list] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append(timed(sides[n]))
    return res


def bench_speculative(target, draft, tok, ks: list[int], rounds: int) -> dict:
    from rlvr.rollout.engine import SamplingParams, generate
    from rlvr.rollout.speculative import SpecStats, speculative_generate

    pad = tok.pad_token_id
    params = SamplingParams(max_new_tokens=64, temperature=0.0)
    prompts = task_prompts(tok, "eval", 16, seed=1)
    stats = {k: SpecStats() for k in ks}
    rows = []
    for batch in (16, 1):
        ps = prompts if batch == 16 else prompts[:4]

        def run(fn, ps=ps, batch=batch):
            return lambda: [c for i in range(0, len(ps), batch) for c in fn(ps[i:i + batch])]

        sides = {"target": run(lambda b: generate(target, b, params, pad_token_id=pad))}
        for k in ks:
            sides[f"spec_k{k}"] = run(lambda b, k=k: speculative_generate(target, draft, b, params, k=k,
                                                                          pad_token_id=pad, stats=stats[k]))
        res = alternate(sides, rounds)
        ref = [c.token_ids for c in res["target"][0][1]]
        base = None
        for name, runs in res.items():
            for _, out in runs:
                assert [c.token_ids for c in out] == ref, f"{name}: tokens differ from the target's greedy decode"
            n_tok = sum(len(t) for t in ref)
            tps = n_tok / statistics.median(s for s, _ in runs)
            base = base or tps
            k = int(name[6:]) if name.startswith("spec") else None
            rows.append({"section": "speculative", "batch": batch, "side": name, "tokens": n_tok,
                         "tokens_per_s": tps, "vs_target": tps / base,
                         "acceptance": round(stats[k].acceptance_rate, 3) if k else None,
                         "identical": True})
    return {"rows": rows}


def bench_int8(target, tok, rounds: int, tasks: int) -> dict:
    import rlvr.tasks  # noqa: F401
    from rlvr.eval.evaluate import EvalConfig, evaluate
    from rlvr.model.quantize import quantize_int8, weight_bytes
    from rlvr.rollout.engine import SamplingParams, generate
    from rlvr.tasks.base import generate_tasks

    q = quantize_int8(target)
    pad = tok.pad_token_id
    params = SamplingParams(max_new_tokens=64, temperature=0.0, stop_token_ids=())  # 64 tokens per row, all sides
    prompts = task_prompts(tok, "eval", 16, seed=2)
    sides = {"fp32_fast": lambda: generate(target, prompts, params, pad_token_id=pad),
             "int8_fast": lambda: generate(q, prompts, params, pad_token_id=pad, backend="fast"),
             "int8_hf": lambda: generate(q, prompts, params, pad_token_id=pad, backend="hf")}
    res = alternate(sides, rounds)
    rows = []
    for name, runs in res.items():
        n_tok = sum(len(c.token_ids) for c in runs[0][1])
        rows.append({"section": "int8", "batch": 16, "side": name, "tokens": n_tok,
                     "tokens_per_s": n_tok / statistics.median(s for s, _ in runs)})
    for r in rows:
        r["vs_fp32_fast"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    domains = ["math.arith", "math.word"]
    ts = generate_tasks(domains, "eval", tasks, seed=1234)
    cfg = EvalConfig(domains=domains, tasks=tasks)
    acc = {}
    for name, m in (("fp32", target), ("int8", q), ("int8_per_tensor", quantize_int8(target, per_channel=False)),
                    ("torch_dynamic_int8", torch_dynamic_int8(target))):
        secs, rep = timed(lambda m=m: evaluate(m, tok, ts, cfg))
        acc[name] = {"pass@1": rep["overall"]["pass@1"], "ci95": rep["overall"]["pass@1_ci95"],
                     "by_domain": {d: v["pass@1"] for d, v in rep["by_domain"].items()}, "seconds": round(secs, 1)}
    return {"rows": rows, "pass@1": acc, "tasks": len(ts),
            "weight_bytes": {"fp32": weight_bytes(target), "int8": weight_bytes(q)},
            "pass@1_change_points": round(100 * (acc["int8"]["pass@1"] - acc["fp32"]["pass@1"]), 2)}


def bench_int8_gemm(repeats: int = 200) -> dict:
    import torch
    from torch import nn

    from rlvr.model.quantize import Int8Linear
    from rlvr.rollout.gemm import WeightFormat, int8_fused, lin

    rows = []
    for h in (128, 512, 1024):
        layer = nn.Linear(h, 3 * h, bias=False)
        fp32 = WeightFormat(torch.device("cpu"), torch.float32, None, 3 * h * h).matrix(layer.weight)
        int8 = int8_fused(Int8Linear(layer))
        for n in (16, 512):
            x = torch.randn(n, h)
            with torch.inference_mode():
                t = {name: statistics.median(timed(lambda w=w: lin(x, w))[0] for _ in range(repeats))
                     for name, w in (("fp32", fp32), ("int8", int8))}
            rows.append({"section": "int8_gemm", "batch": n, "side": f"h{h}", "fp32_us": 1e6 * t["fp32"],
                         "int8_us": 1e6 * t["int8"], "int8_vs_fp32": t["int8"] / t["fp32"]})
    return {"rows": rows}


def torch_dynamic_int8(model):
    """PyTorch's own dynamic int8 (``quantize_dynamic``, per-channel weights, one activation scale
    per input tensor; the Hugging Face forward runs it): the reference arm of the pass@1 check."""
    import copy
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from rlvr.model.quantize import int8_layers

    q = copy.deepcopy(model).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.ao.quantization's deprecation notice)
        quantize_dynamic(q, dict.fromkeys(int8_layers(model), per_channel_dynamic_qconfig), dtype=torch.qint8,
                         inplace=True)
    return q


def bench_prefix(target, tok, rounds: int) -> dict:
    from rlvr.model.tokenizer import encode_chat_prompt
    from rlvr.rollout.engine import SamplingParams, generate
    from rlvr.rollout.prefix_cache import PrefixCache, cached_generate
    from rlvr.tasks.base import generate_tasks

    pad = tok.pad_token_id
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    tasks = generate_tasks(["math.arith", "math.word"], "eval", 17, seed=3)
    prompts = [list(encode_chat_prompt(tok, [{"role": "system", "content": SYSTEM}, *t.prompt])) for t in tasks]
    warm, reqs = prompts[0], prompts[1:]
    cache = PrefixCache()
    cached_generate(target, [warm], params, cache, pad_token_id=pad)
    hits0, reused0 = cache.hits, cache.tokens_reused
    sides = {"no_cache": lambda: [generate(target, [p], params, pad_token_id=pad)[0] for p in reqs],
             "cache": lambda: [cached_generate(target, [p], params, cache, pad_token_id=pad)[0] for p in reqs]}
    res = alternate(sides, rounds)
    ref = [c.token_ids for c in res["no_cache"][0][1]]
    assert all([c.token_ids for c in out] == ref for _, out in res["cache"]), "cached outputs differ"
    n_tok = sum(len(t) for t in ref)
    prompt_tokens = sum(len(p) for p in reqs)
    reused = (cache.tokens_reused - reused0) / rounds
    rows = []
    for name, runs in res.items():
        secs = statistics.median(s for s, _ in runs)
        pre = prompt_tokens - (reused if name == "cache" else 0)
        rows.append({"section": "prefix", "batch": 1, "side": name, "tokens": n_tok, "tokens_per_s": n_tok / secs,
                     "ms_per_request": 1000 * secs / len(reqs), "prefilled_per_request": pre / len(reqs)})
    rows[1]["vs_no_cache"] = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    return {"rows": rows, "prompt_tokens_per_request": prompt_tokens / len(reqs),
            "hits": cache.hits - hits0, "requests": len(reqs) * rounds}


def bench_serve(target, draft, tok, k: int, requests_per_client: int, clients: int = 16) -> dict:
    """In-process load (no HTTP): ``clients`` threads, each sending ``requests_per_client``
    greedy requests one after another (system prompt + its own question, 32 new tokens), to the
    normal engine (continuous batching), the fast mode without a draft (prefix cache, then int8
    too) and ``FastEngine`` with the draft."""
    import threading

    from rlvr.model.tokenizer import encode_chat_prompt
    from rlvr.serve.batcher import Batcher
    from rlvr.serve.fast import FastEngine
    from rlvr.serve.types import GenRequest
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(["math.arith", "math.word"], "eval", clients * requests_per_client, seed=4)
    prompts = [list(encode_chat_prompt(tok, [{"role": "system", "content": SYSTEM}, *t.prompt])) for t in tasks]
    cache = 256 << 20
    engines = {"normal_continuous": lambda: Batcher(target, tok, max_batch=clients),
               "fast_prefix": lambda: Batcher(target, tok, max_batch=clients, prefix_cache_bytes=cache),
               "fast_prefix_int8": lambda: Batcher(target, tok, max_batch=clients, prefix_cache_bytes=cache,
                                                   quantize="int8"),
               f"fast_spec_k{k}": lambda: FastEngine(target, tok, draft=draft, spec_tokens=k, max_batch=clients)}
    rows, outputs = [], {}
    for name, make in engines.items():
        engine = make()
        lat: list[float] = []
        toks = [None] * len(prompts)

        def client(c, engine=engine, lat=lat, toks=toks):
            for j in range(requests_per_client):
                i = c * requests_per_client + j
                t0 = time.perf_counter()
                ev = list(engine.submit(GenRequest(prompts[i], max_tokens=32, temperature=0.0)).iter_sync(timeout=300))
                lat.append(time.perf_counter() - t0)
                toks[i] = [e.token_id for e in ev if e.token_id is not None]

        try:
            t0 = time.perf_counter()
            threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            st = engine.stats()
        finally:
            engine.close()
        outputs[name] = toks
        n = sum(len(t) for t in toks)
        lat.sort()
        rows.append({"section": "serve", "batch": clients, "side": name, "tokens": n, "tokens_per_s": n / wall,
                     "p50_s": lat[len(lat) // 2], "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
                     "acceptance": st.get("spec_acceptance_rate"), "prefix_hits": st.get("prefix_cache_hits")})
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["vs_normal"] = r["tokens_per_s"] / base
    same = {name: sum(a == b for a, b in zip(out, outputs["normal_continuous"])) for name, out in outputs.items()}
    return {"rows": rows, "requests": len(prompts), "identical_to_normal": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tasks", type=int, default=400, help="held-out math tasks for the int8 pass@1")
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None, help="default: distil one into runs/bench/draft")
    ap.add_argument("--only", nargs="+", default=["speculative", "int8", "int8_gemm", "prefix", "serve"])
    ap.add_argument("--serve-requests", type=int, default=4, help="requests per client (16 clients)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    from transformers import AutoTokenizer

    from rlvr.model.load import load_model

    idle = idle_cpu()
    note = machine_note()
    tdir = Path(a.target) if a.target else target_dir()
    ddir = Path(a.draft) if a.draft else distil_draft(tdir, "runs/bench/draft")
    tok = AutoTokenizer.from_pretrained(tdir)
    target, draft = load_model(tdir), load_model(ddir)
    out = {"machine": note, "idle_cpu_at_start": idle, "target": str(tdir), "draft": str(ddir),
           "target_params": sum(p.numel() for p in target.parameters()),
           "draft_params": sum(p.numel() for p in draft.parameters())}
    rows = []
    if "speculative" in a.only:
        out["speculative"] = bench_speculative(target, draft, tok, a.k, a.rounds)
        rows += out["speculative"]["rows"]
    if "int8" in a.only:
        out["int8"] = bench_int8(target, tok, a.rounds, a.tasks)
        rows += out["int8"]["rows"]
    if "int8_gemm" in a.only:
        out["int8_gemm"] = bench_int8_gemm()
    if "prefix" in a.only:
        out["prefix"] = bench_prefix(target, tok, a.rounds)
        rows += out["prefix"]["rows"]
    if "serve" in a.only:
        out["serve"] = bench_serve(target, draft, tok, max(a.k), a.serve_requests)
        rows += out["serve"]["rows"]
    print(note)
    print_table(rows, ["section", "batch", "side", "tokens", "tokens_per_s", "vs_target", "acceptance",
                       "vs_fp32_fast", "ms_per_request", "prefilled_per_request", "vs_no_cache", "p50_s", "p99_s",
                       "vs_normal"])
    if "int8_gemm" in out:
        print_table(out["int8_gemm"]["rows"], ["section", "batch", "side", "fp32_us", "int8_us", "int8_vs_fp32"])
    if "int8" in out:
        print("pass@1:", {k: round(v["pass@1"], 4) for k, v in out["int8"]["pass@1"].items()},
              "change (points):", out["int8"]["pass@1_change_points"], "on", out["int8"]["tasks"], "tasks")
    out["idle_cpu_at_end"] = idle_cpu()
    write_json(a.json, out)


if __name__ == "__main__":
    main()
