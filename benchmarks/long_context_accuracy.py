"""Held-out accuracy against prompt length, per KV-cache option and per RoPE scaling.

    python benchmarks/long_context_accuracy.py --model DIR [--levels 1 2 3 4] [--tasks 40]
        [--options full int8 sink_window] [--rope none linear:2 linear:4 yarn:4 dynamic:4]
        [--device cpu] [--json PATH]

For a model directory (any causal LM that rlvr's engine runs; typically a GRPO run's ``final/``
after a length curriculum over ``long_ctx.needle``): greedy pass@1 on ``--tasks`` held-out tasks of
``--domain`` (default ``long_ctx.needle``) at each level (L1 ~1k ... L6 ~32k tokens), with its 95%
Wilson interval, the same tasks in every cell (one draw per level):

- **per KV option** (``--options``): ``full``, ``int8`` (full-precision window ``--kv-window``)
  and ``sink_window`` (``--kv-sinks`` sinks + ``--kv-window``), each with chunked prefill
  (``--prefill-chunk``), through ``rlvr.eval.evaluate`` with ``eval.kv_cache`` and friends. The
  cost of compression is an option's pass@1 minus ``full``'s at the same level, in points.
- **per RoPE scaling** (``--rope``): the model loaded with ``model_load.rope_scaling``
  (``linear:F``, ``yarn:F``, ``dynamic:F``; ``none`` = as trained, the ``full`` rows), evaluated
  with the full cache. Each level's mean prompt length over the model's trained length
  (``--trained-tokens``, default ``max_position_embeddings`` as saved) is printed, so the levels
  at 2-4x of it can be read off.

A 32k level takes tens of CPU minutes: each cell is printed and written to ``--json`` (marked
``"partial": true`` until the last) as soon as it is measured, so a run cut short keeps its cells.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_note, print_table, write_json  # noqa: E402

OPTIONS = ("full", "int8", "sink_window")
ROPE_TYPES = ("linear", "yarn", "dynamic")


def parse_rope(spec: str) -> dict | None:
    """``none`` -> None; ``TYPE:FACTOR`` -> {"type": TYPE, "factor": FACTOR}."""
    if spec == "none":
        return None
    kind, _, factor = spec.partition(":")
    if kind not in ROPE_TYPES or not factor:
        raise SystemExit(f"--rope {spec!r}: expected none or TYPE:FACTOR with TYPE one of {', '.join(ROPE_TYPES)}")
    return {"type": kind, "factor": float(factor)}


def cell(model, tokenizer, tasks, args, option: str) -> dict:
    from rlvr.eval.evaluate import EvalConfig, evaluate

    cfg = EvalConfig(domains=[args.domain], tasks=len(tasks), max_new_tokens=args.max_new_tokens,
                     batch_size=args.batch_size, prefill_chunk=args.prefill_chunk, kv_cache=option,
                     kv_window=args.kv_window, kv_sinks=args.kv_sinks)
    start = time.perf_counter()
    overall = evaluate(model, tokenizer, tasks, cfg)["overall"]
    result = {"pass@1": round(100 * overall["pass@1"], 1), "ci95": [round(100 * x, 1) for x in overall["pass@1_ci95"]],
              "tasks": overall["n_tasks"], "seconds": round(time.perf_counter() - start, 1)}
    print(f"level {tasks[0].level} {option}: {result}", flush=True)  # a long level runs for minutes
    return result


def prompt_tokens(tokenizer, tasks) -> int:
    from rlvr.model.tokenizer import encode_chat_prompt

    return round(sum(len(encode_chat_prompt(tokenizer, list(t.prompt))) for t in tasks) / len(tasks))


def run(args) -> dict:
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer
    from rlvr.tasks.base import generate_tasks

    model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    trained = args.trained_tokens or int(model.config.max_position_embeddings)
    tasks = {level: generate_tasks([args.domain], "eval", args.tasks, args.seed, levels=[level]) for level in args.levels}
    lengths = {level: prompt_tokens(tokenizer, ts) for level, ts in tasks.items()}
    rows: list[dict] = []

    def result() -> dict:
        return {"model": str(args.model), "domain": args.domain, "trained_positions": trained, "rows": rows,
                "settings": {k: getattr(args, k) for k in ("tasks", "seed", "prefill_chunk", "kv_window", "kv_sinks",
                                                           "max_new_tokens")}}

    def add(row: dict) -> None:  # a long level runs for minutes: each cell is in --json as soon as it is measured
        rows.append(row)
        full = {r["level"]: r["pass@1"] for r in rows if r["option"] == "full"}
        for r in rows:  # the cost of compression, once the level's full-cache cell is in
            if r["kind"] == "kv" and r["level"] in full:
                r["cost_points"] = round(r["pass@1"] - full[r["level"]], 1)
        if args.json_path:
            Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_path).write_text(json.dumps({**result(), "partial": True}, indent=2) + "\n")

    for level in args.levels:
        for option in args.options:
            add({"kind": "kv", "option": option, "level": level, "prompt_tokens": lengths[level],
                 "x_trained": round(lengths[level] / trained, 2), **cell(model, tokenizer, tasks[level], args, option)})
    for spec in args.rope:
        scaling = parse_rope(spec)
        if scaling is None:
            continue
        scaled, tok = load_model_and_tokenizer(args.model, device=args.device, options=ModelLoadConfig(rope_scaling=scaling))
        for level in args.levels:
            add({"kind": "rope", "option": spec, "level": level, "prompt_tokens": lengths[level],
                 "x_trained": round(lengths[level] / trained, 2), **cell(scaled, tok, tasks[level], args, "full")})
    return result()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a model directory (a run's final/)")
    parser.add_argument("--domain", default="long_ctx.needle")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--tasks", type=int, default=40, help="held-out tasks per level")
    parser.add_argument("--options", nargs="+", default=list(OPTIONS), choices=OPTIONS)
    parser.add_argument("--rope", nargs="*", default=["none"], help="none | linear:F | yarn:F | dynamic:F")
    parser.add_argument("--trained-tokens", type=int, default=0,
                        help="the longest sequence the model was trained on (default: max_position_embeddings)")
    parser.add_argument("--prefill-chunk", type=int, default=1024)
    parser.add_argument("--kv-window", type=int, default=1024)
    parser.add_argument("--kv-sinks", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    for spec in args.rope:
        parse_rope(spec)
    result = run(args)
    print_table(result["rows"], ["kind", "option", "level", "prompt_tokens", "x_trained", "pass@1", "ci95",
                                 "cost_points"])
    print(f"trained positions {result['trained_positions']}; " + machine_note())
    write_json(args.json_path, result)
    return result


if __name__ == "__main__":
    main()
