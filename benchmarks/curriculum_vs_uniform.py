"""Benchmark: the curriculum scheduler against uniform sampling, same SFT model, same step budget;
and the curriculum with asynchronous rollouts against the synchronous one.

    python benchmarks/curriculum_vs_uniform.py --model runs/quickstart/sft/final [--recipe configs/quickstart.yaml]
        [--arms uniform curriculum curriculum_async] [--steps 150] [--seeds 0 1 2] [--json PATH] [--png PATH]
        [--set grpo.k=v ...] [--curriculum-set k=v ...]

Every arm runs the recipe's ``grpo`` block from ``--model`` for ``--steps`` steps with each seed
(the order of the arms reverses from seed to seed); ``uniform`` is the plain task pool,
``curriculum`` adds ``curriculum.enabled=true`` (stages + filtering with dynamic sampling +
recycling + seesaw control from a periodic eval every ``--eval-every`` steps, which every arm runs
so all pay for it), ``curriculum_async`` adds ``asynchronous.enabled=true`` to that (the scheduler
learns from each batch as the trainer consumes it, its draws up to ``max_staleness`` + the queue
behind). Each final model, and the SFT model once, is evaluated greedily on a held-out draw of the
recipe's eval suite with ``--eval-seed`` (not the periodic eval's seed). Reported per arm: held-out
pass@1 per domain, the mean over domains and the overall, with mean and spread (min-max, sample
std) over seeds; wall seconds; the mean staleness of the trained batches (asynchronous arms); and
the rollouts spent on zero-variance groups, in step
equivalents (groups without signal / tasks_per_step, summed over the run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.grpo_arms import (
    arm_config,
    figure,
    held_out,
    pass_bars,
    pass_summary,
    print_pass_table,
    save_figure,
    spread,
)

ARMS = {  # arm -> the overrides it adds to the grpo block
    "uniform": [],
    "curriculum": ["curriculum.enabled=true"],
    "curriculum_async": ["curriculum.enabled=true", "asynchronous.enabled=true"],
}


def waste(metrics: list[dict], tasks_per_step: int) -> dict:
    """Zero-variance groups over the run: dropped (uniform) or drawn and refilled (curriculum)."""
    groups = wasted = 0.0
    for m in metrics:
        if "curriculum/groups_drawn" in m:
            drawn = m["curriculum/groups_drawn"]
            groups += drawn
            wasted += drawn * m["curriculum/zero_variance_frac"]
        elif "rollout/kept_frac" in m:
            groups += tasks_per_step
            wasted += tasks_per_step * (1.0 - m["rollout/kept_frac"])
    return {"groups_drawn": groups, "zero_variance_groups": wasted,
            "zero_variance_step_equivalents": wasted / tasks_per_step,
            "steps_without_update": sum(1 for m in metrics if m.get("train/skipped"))}


def staleness(metrics: list[dict]) -> dict:
    """Asynchronous arms: how many updates old the trained batches were (mean, and the share > 0)."""
    ages = [m["async/staleness"] for m in metrics if "async/staleness" in m]
    if not ages:
        return {}
    return {"staleness_mean": sum(ages) / len(ages), "stale_share": sum(a > 0 for a in ages) / len(ages)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="runs/quickstart/sft/final")
    parser.add_argument("--recipe", default="configs/quickstart.yaml")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["uniform", "curriculum"],
                        help="arms to run; the first is the one the others are compared with")
    parser.add_argument("--out", default="runs/bench/curriculum")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-seed", type=int, default=99)
    parser.add_argument("--eval-tasks", type=int, help="held-out tasks (default: the recipe's eval.tasks)")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--png")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override of the grpo block, both arms (e.g. rollout.tasks_per_step=8)")
    parser.add_argument("--curriculum-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override for the curriculum arms only (e.g. curriculum.weights={math:2,code.gen:1})")
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from rlvr.config import read_yaml
    from rlvr.errors import UserError
    from rlvr.monitor.cpu import idle_cpu
    from rlvr.monitor.metrics import read_metrics
    from rlvr.train.grpo import run_grpo

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if not Path(args.model, "config.json").exists():
        raise UserError(f"--model {args.model} is not a model directory; run `rlvr quickstart` (or the recipe) first")
    recipe = read_yaml(args.recipe)
    idle = idle_cpu()
    held_out_tasks, held_out_eval = held_out(recipe, args.eval_seed, args.eval_tasks)

    sft = held_out_eval(args.model)
    print(f"SFT: {json.dumps(sft)}", flush=True)
    runs: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for i, seed in enumerate(args.seeds):
        for arm in (args.arms if i % 2 == 0 else args.arms[::-1]):
            extra = args.overrides + ARMS[arm] + (args.curriculum_set if arm.startswith("curriculum") else [])
            cfg = arm_config(recipe, args.model, f"{args.out}/{arm}_s{seed}", seed, args.steps, extra,
                             eval_every=args.eval_every, checkpoint_every=args.steps,
                             eval={**recipe.get("eval", {}), "tasks": 150})  # the periodic eval (seesaw)
            start = time.perf_counter()
            run_grpo(cfg, progress=False)
            wall = time.perf_counter() - start
            metrics = read_metrics(cfg.out)
            result = {"seed": seed, "wall_s": wall, **held_out_eval(f"{cfg.out}/final"),
                      **waste(metrics, cfg.rollout.tasks_per_step), **staleness(metrics)}
            runs[arm].append(result)
            print(f"{arm} seed {seed}: {json.dumps(result)}", flush=True)

    summary = {arm: {**pass_summary(rs), "wall_s": spread([r["wall_s"] for r in rs]),
                     "zero_variance_step_equivalents": spread([r["zero_variance_step_equivalents"] for r in rs]),
                     **({"staleness_mean": spread([r["staleness_mean"] for r in rs])} if "staleness_mean" in rs[0] else {})}
               for arm, rs in runs.items()}
    print(f"\nidle CPU at start: {idle:.0%}   steps: {args.steps}   seeds: {args.seeds}   "
          f"held-out tasks: {len(held_out_tasks)}")
    print_pass_table(sft, summary, {"wall s": lambda s: f"{s['wall_s']['mean']:.0f}",
                                    "0-var steps": lambda s: f"{s['zero_variance_step_equivalents']['mean']:.1f}",
                                    "staleness": lambda s: f"{s['staleness_mean']['mean']:.2f}" if "staleness_mean" in s else "-"},
                     width=max(12, 2 + max(map(len, args.arms))))
    base = args.arms[0]
    diffs = {f"{arm}_minus_{base}": [c["domain_mean"] - u["domain_mean"] for c, u in zip(runs[arm], runs[base])]
             for arm in args.arms[1:]}
    for name, diff in diffs.items():
        print(f"{name}, domain-mean pass@1 per seed (points): {[round(100 * d, 1) for d in diff]}")
    out = {"idle_cpu": idle, "steps": args.steps, "seeds": args.seeds, "model": args.model, "recipe": args.recipe,
           "arms": args.arms, "held_out_tasks": len(held_out_tasks), "eval_seed": args.eval_seed, "sft": sft,
           "runs": runs, "summary": summary, **diffs}
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(out, indent=2))
    if args.png:
        plot(out, args.png)


def plot(out: dict, path: str) -> None:
    fig, ax = figure()
    pass_bars(ax, out, out["arms"])
    save_figure(fig, path)


if __name__ == "__main__":
    main()
