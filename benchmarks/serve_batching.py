"""Benchmark: continuous batching against one request at a time, in process (no HTTP).

    python benchmarks/serve_batching.py [--model DIR] [--requests 16] [--tokens 64] [--rounds 2]

``rlvr serve``'s two scheduling modes on the same model (``rlvr/serve/batcher.py``): every
request is submitted at once (distinct prompts of 9-16 tokens, sampled at temperature 1 with its
own seed, ``--tokens`` new tokens each, EOS ignored), to ``batching="none"`` (one row) and to
``batching="continuous"`` (``--max-batch`` rows). Prints tokens/s and decode steps per mode and
round, as JSON. Without ``--model`` it uses the tests' tiny shape (hidden 32, 2 layers, random
weights; throughput does not depend on what the weights say).
"""

from __future__ import annotations

import argparse
import json
import time


def tiny_model():
    import rlvr.tasks  # noqa: F401  (registers the domains whose corpus trains the tokenizer)
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 200) + DOMAINS.get("math.word").corpus(0, 200)
    tokenizer = train_tokenizer(docs, vocab_size=320)
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64)
    return build_tiny_model(cfg, tokenizer, seed=0), tokenizer


def run(model, tokenizer, mode: str, max_batch: int, requests: int, tokens: int) -> dict:
    from rlvr.serve.batcher import Batcher
    from rlvr.serve.types import GenRequest

    vocab = len(tokenizer)
    prompts = [[(11 + 7 * i + 13 * j) % vocab for j in range(9 + i % 8)] for i in range(requests)]
    engine = Batcher(model, tokenizer, max_batch=max_batch, max_waiting=requests, batching=mode)
    try:
        start = time.perf_counter()
        handles = [engine.submit(GenRequest(p, tokens, temperature=1.0, seed=i, stop_token_ids=()))
                   for i, p in enumerate(prompts)]
        n = sum(len(list(h.iter_sync(timeout=600))) for h in handles)
        seconds = time.perf_counter() - start
        return {"mode": mode, "tokens": n, "seconds": round(seconds, 3), "tokens_per_s": round(n / seconds),
                "decode_steps": engine.stats()["steps"]}
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: the tests' tiny shape, random weights)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.model:
        from rlvr.model.load import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(args.model)
    else:
        model, tokenizer = tiny_model()
    results = [run(model, tokenizer, mode, 1 if mode == "none" else args.max_batch, args.requests, args.tokens)
               for _ in range(args.rounds) for mode in ("none", "continuous")]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
