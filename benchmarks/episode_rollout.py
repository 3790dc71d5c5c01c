"""Benchmark: multi-turn episode rollouts with and without reusing each turn's KV cache.

    python benchmarks/episode_rollout.py [--model DIR] [--tasks 16] [--samples 8] [--rounds 3]
                                         [--threads N] [--json PATH]

The workload is one GRPO step of the agentic recipe (``configs/agentic.yaml``): 16 train tasks
(``code.repair`` and ``tool.use``, levels 1-4) x 8 episodes, at most 6 turns of 96 tokens,
320 policy tokens and 1,024 tokens of context per episode, temperature 1, the tools running in
the sandbox. Sides, alternated every round (the order rotates), the same generator seed on both:

- ``reuse``: ``collect_episodes(reuse_cache=True)`` (the default): a turn starts from the K/V the
  episode's earlier turns computed and runs only its new tokens;
- ``rerun``: ``reuse_cache=False``: every turn runs the whole conversation again (the engine
  before prefix reuse).

Both sides sample the same tokens (up to float rounding of near-ties; the benchmark reports how
many episodes are identical). ``--model`` takes a trained policy (e.g. the agentic recipe's SFT
model), whose episodes look like real ones; without it the model is the embedded default's
architecture with random weights, whose turns are ended by a band of stop tokens (ids 40-99,
about 12% of the vocabulary, so a turn is ~8 tokens; a random model rarely samples EOS). Reports
the median seconds per batch, the generation share, the ratio, and the idle CPU at the start.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, machine_note, print_table, write_json  # noqa: E402

ENV = dict(max_turns=6, turn_tokens=96, max_tokens=320, max_context=1024)


def load(model_dir: str | None):
    """(model, tokenizer, stop ids) for the run."""
    from rlvr.model.load import load_model_and_tokenizer

    if model_dir:
        model, tok = load_model_and_tokenizer(model_dir)
        return model, tok, (tok.eos_token_id,)
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    texts = [doc for d in ("code.repair", "tool.use") for doc in DOMAINS.get(d).corpus(0, 300)]
    tok = train_tokenizer(texts, vocab_size=512)
    model = build_tiny_model(TinyModelConfig(max_positions=1024), tok, seed=0)
    return model, tok, (tok.eos_token_id, *range(40, 100))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a Hugging Face causal LM directory (default: random weights)")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    import torch

    from rlvr.envs.base import EnvConfig
    from rlvr.rollout.engine import SamplingParams
    from rlvr.rollout.episodes import EnvPool, collect_episodes
    from rlvr.sandbox.config import SandboxConfig, shared_sandbox
    from rlvr.tasks.base import generate_tasks

    if args.threads:
        torch.set_num_threads(args.threads)
    idle = idle_cpu()
    model, tok, stops = load(args.model)
    tasks = generate_tasks(["code.repair", "tool.use"], "train", args.tasks, seed=0, levels=[1, 2, 3, 4])
    sandbox = shared_sandbox(SandboxConfig(allow_weak=True), tempfile.mkdtemp(prefix="rlvr-bench-"))
    pool = EnvPool(EnvConfig(**ENV), sandbox)
    params = SamplingParams(n=args.samples, temperature=1.0, stop_token_ids=stops)

    def run(reuse: bool):
        t0 = time.perf_counter()
        eps = collect_episodes(model, tok, tasks, params, pool, generator=torch.Generator().manual_seed(0),
                               reuse_cache=reuse)
        wall = time.perf_counter() - t0
        gen = sum(e.trajectory.timings["generate_s"] for e in eps)
        return wall, gen, [e.trajectory for e in eps]

    run(True)  # warm-up: workspaces created, allocator warm
    sides = {"reuse": True, "rerun": False}
    walls: dict[str, list[float]] = {s: [] for s in sides}
    gens: dict[str, list[float]] = {s: [] for s in sides}
    trajs: dict[str, list] = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            wall, gen, t = run(sides[side])
            walls[side].append(wall)
            gens[side].append(gen)
            trajs.setdefault(side, t)
            print(f"round {r + 1}: {side:5s} {wall:.2f} s (generate {gen:.2f} s)", flush=True)
    pool.close()

    same = sum(a.token_ids == b.token_ids for a, b in zip(trajs["reuse"], trajs["rerun"]))
    eps = trajs["reuse"]
    tokens = sum(len(t.token_ids) for t in eps)
    turns = sum(t.episode.turns for t in eps)
    med = {s: statistics.median(walls[s]) for s in sides}
    rows = [{"side": s, "s/batch": med[s], "generate s": statistics.median(gens[s]),
             "vs rerun": med["rerun"] / med[s]} for s in sides]
    print(f"\n{len(eps)} episodes ({args.tasks} tasks x {args.samples}), {turns} turns, "
          f"{tokens / len(eps):.0f} tokens per episode on average; {same}/{len(eps)} episodes identical "
          f"on both sides; model {args.model or 'random weights (default architecture)'}; "
          f"idle CPU at start {idle:.0%}; {machine_note()}")
    print_table(rows, ["side", "s/batch", "generate s", "vs rerun"])
    write_json(args.json_path, {
        "model": args.model or "random", "tasks": args.tasks, "samples": args.samples, "rounds": args.rounds,
        "env": ENV, "episodes": len(eps), "turns": turns, "tokens_per_episode": tokens / len(eps),
        "identical_episodes": same, "idle_cpu_at_start": idle, "machine": machine_note(),
        "walls_s": walls, "generate_s": gens, "median_s": med, "speedup": med["rerun"] / med["reuse"],
    })


if __name__ == "__main__":
    main()
