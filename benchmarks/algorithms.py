"""Benchmark: the policy-gradient algorithms on the quickstart's GRPO stage, same SFT model, same step budget.

    python benchmarks/algorithms.py [--model runs/qs/sft/final] [--recipe configs/quickstart.yaml]
        [--arms grpo dr_grpo rloo gspo reinforce_pp_baseline cispo ppo_critic] [--steps 100] [--seeds 0 1]
        [--eval-tasks 300] [--eval-seed 99] [--set KEY=VALUE ...] [--json PATH] [--png PATH]
    python benchmarks/algorithms.py --merge A.json B.json [--json PATH] [--png PATH]

Every arm runs the recipe's ``grpo`` block from ``--model`` for ``--steps`` steps with each seed,
with its own overrides (``ARMS``; ``--set`` applies to all), no periodic eval and one checkpoint at
the end. Each arm x seed runs in a fresh process, so its peak RSS (``ru_maxrss`` of that process,
taken when the GRPO run returns; sandbox workers are separate processes and not included) is its
own; the arms alternate in order from seed to seed (reversed on odd seeds), so a machine shared
with other jobs slows them alike on average. Per run: held-out greedy pass@1 per domain on a draw
of the recipe's eval suite with ``--eval-seed`` (``--eval-tasks`` tasks), their mean; wall seconds
of the GRPO run (model load and sandbox start included); seconds per step = the median over steps
of the step's logged phases (``time/wait`` + ``monitor`` + ``advantage`` + ``prepare`` +
``update`` + ``weight_sync``: rollout, verification and update, what a longer run pays per step),
with the rollout and update medians and every logged phase's beside it. Summary per arm: mean, min-max and sample std over seeds.
``--merge`` joins the runs of JSONs written by this script by arm and seed (an arm or a seed run
later, same model, steps and held-out draw) into one JSON and PNG without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grpo_arms as shared

ARMS: dict[str, list[str]] = {
    "grpo": [],  # the default: grpo advantage, ppo_clip (clip-higher 0.2/0.28), token_mean
    "dr_grpo": ["algo.advantage=dr_grpo", "algo.aggregation=seq_mean_token_sum_norm"],
    "rloo": ["algo.advantage=rloo"],
    "gspo": ["algo.policy_loss=gspo", "algo.aggregation=seq_mean_token_mean",
             "algo.clip_low=3e-4", "algo.clip_high=4e-4"],  # the GSPO paper's sequence-ratio ranges
    "reinforce_pp_baseline": ["algo.advantage=reinforce_pp_baseline"],
    "cispo": ["algo.policy_loss=cispo", "algo.clip_low=1.0", "algo.clip_high=0.28"],  # no floor (MiniMax-M1)
    "ppo_critic": ["algo.advantage=gae"],
}
STEP_PHASES = ("wait", "monitor", "advantage", "prepare", "update", "weight_sync")  # the trainer's step timers
RUN_KEYS = ("wall_s", "s_per_step", "s_per_step_wall", "rollout_s", "update_s", "peak_rss_mb")


def step_times(metrics: list[dict]) -> dict:
    """Medians over steps: the whole step (its logged phases), the rollout (generation), the update, and
    each ``time/*`` key as logged (``phases``; ``time/rollout`` and ``time/verify`` are inside ``time/wait``)."""
    def median(key_of) -> float | None:
        values = [v for v in (key_of(m) for m in metrics) if v is not None]
        return statistics.median(values) if values else None

    keys = sorted({k for m in metrics for k in m if k.startswith("time/")})
    return {"s_per_step": median(lambda m: sum(m.get(f"time/{p}", 0.0) for p in STEP_PHASES)),
            "rollout_s": median(lambda m: m.get("time/rollout")),
            "update_s": median(lambda m: m.get("time/update")),
            "phases": {k[5:]: median(lambda m, k=k: m.get(k)) for k in keys}}


def child(spec: dict) -> dict:
    """One arm x seed (or the SFT model's eval, arm ``sft``) in this fresh process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from rlvr.config import read_yaml
    from rlvr.monitor.metrics import read_metrics
    from rlvr.train.grpo import run_grpo

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    recipe = read_yaml(spec["recipe"])
    _, evaluate = shared.held_out(recipe, spec["eval_seed"], spec["eval_tasks"])
    if spec["arm"] == "sft":
        return evaluate(spec["model"])
    cfg = shared.arm_config(recipe, spec["model"], spec["out"], spec["seed"], spec["steps"], spec["overrides"],
                     eval_every=0, checkpoint_every=spec["steps"])
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    run_grpo(cfg, progress=False)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    metrics = read_metrics(cfg.out)
    last = metrics[-10:]
    return {"seed": spec["seed"], "wall_s": wall, "s_per_step_wall": wall / spec["steps"], **step_times(metrics),
            "peak_rss_mb": peak, "rss_before_run_mb": baseline,
            "train_reward_last10": statistics.fmean(m["rollout/reward_mean"] for m in last),
            "response_tokens_last10": statistics.fmean(m["rollout/response_tokens_mean"] for m in last),
            **evaluate(f"{cfg.out}/final")}


def run_child(spec: dict, log: Path, threads: int = 0) -> dict:
    """``child(spec)`` in a fresh interpreter (``threads``: its OMP_NUM_THREADS, 0: torch's default); its
    output goes to ``log``; an error is returned, not raised."""
    log.parent.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = log.with_suffix(".spec.json"), log.with_suffix(".result.json")
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, __file__, "--child", str(spec_path), str(result_path)],
                              stdout=f, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})})
    if proc.returncode or not result_path.exists():
        return {"seed": spec.get("seed"), "error": f"exit {proc.returncode}: " + log.read_text()[-2000:]}
    return json.loads(result_path.read_text())


def code_version() -> dict:
    """The commit the runs used and the files under rlvr/ that differed from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, check=False, cwd=Path(__file__).parents[1]).stdout

    return {"commit": git("rev-parse", "--short", "HEAD").strip(),
            "modified": [line[3:] for line in git("status", "--short", "rlvr").splitlines()]}


def summarize(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for arm, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if ok:
            keys = [k for k in RUN_KEYS if ok[0].get(k) is not None]
            out[arm] = {**shared.pass_summary(ok), **{k: shared.spread([r[k] for r in ok]) for k in keys},
                        "seeds": [r["seed"] for r in ok]}
    return out


def report(out: dict, json_path: str | None, png: str | None) -> None:
    out["summary"] = summarize(out["runs"])
    shared.print_pass_table(out["sft"], out["summary"], {
        "s/step": lambda s: f"{s['s_per_step']['mean']:.2f}±{s['s_per_step']['std']:.2f}",
        "peak MB": lambda s: f"{s['peak_rss_mb']['mean']:.0f}",
        "wall s": lambda s: f"{s['wall_s']['mean']:.0f}"}, width=22)
    failed = {arm: [r["seed"] for r in rs if "error" in r] for arm, rs in out["runs"].items()}
    if any(failed.values()):
        print(f"FAILED runs (arm: seeds): { {a: s for a, s in failed.items() if s} }")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
    if png and out["summary"]:
        plot(out, png)


def merge(paths: list[str]) -> dict:
    """The runs of several JSONs of this script joined by arm and seed (another arm, or more seeds of
    one); refused when their setups differ or an arm has the same seed in two of them."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    runs: dict[str, list[dict]] = {}
    for p, part in zip(paths, parts):
        for key in ("model", "recipe", "steps", "eval_seed", "held_out_tasks", "overrides", "threads"):
            if part.get(key) != first.get(key):
                raise SystemExit(f"--merge: {p} has {key} = {part.get(key)!r}, {paths[0]} has {first.get(key)!r}")
        for arm, rs in part["runs"].items():
            seen = {r["seed"] for r in runs.get(arm, [])}
            if seen & {r["seed"] for r in rs}:
                raise SystemExit(f"--merge: arm {arm} has seeds {sorted(seen & {r['seed'] for r in rs})} "
                                 f"in both {p} and an earlier file")
            runs[arm] = sorted(runs.get(arm, []) + rs, key=lambda r: r["seed"])
    merged = {k: v for k, v in first.items() if k not in ("runs", "summary", "arms", "idle_cpu", "seeds", "code")}
    merged.update({"merged_from": paths, "idle_cpu": {p: part["idle_cpu"] for p, part in zip(paths, parts)},
                   "code": {p: part.get("code") for p, part in zip(paths, parts)},
                   "seeds": sorted({s for part in parts for s in part["seeds"]}),
                   "arms": {a: o for part in parts for a, o in part["arms"].items()}, "runs": runs})
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="runs/qs/sft/final")
    parser.add_argument("--recipe", default="configs/quickstart.yaml")
    parser.add_argument("--out", default="runs/bench/algorithms")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--eval-seed", type=int, default=99)
    parser.add_argument("--eval-tasks", type=int, default=300, help="held-out tasks (0: the recipe's eval.tasks)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of each run (OMP_NUM_THREADS; 0: torch's default, the cores). 1: "
                             "the tiny model gains little from more, and on cores shared with other jobs "
                             "2 threads ran up to 10x slower per step")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override of the grpo block for every arm (e.g. rollout.tasks_per_step=8)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="join these results instead of running")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--png")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(json.loads(Path(args.child[0]).read_text()))
        Path(args.child[1]).write_text(json.dumps(result))
        return
    if args.merge:
        report(merge(args.merge), args.json_path, args.png)
        return

    from rlvr.errors import UserError
    from rlvr.monitor.cpu import idle_cpu

    if not Path(args.model, "config.json").exists():
        raise UserError(f"--model {args.model} is not a model directory; run `rlvr quickstart` (or the recipe) first")
    idle = idle_cpu()
    print(f"idle CPU at start: {idle:.0%}; arms {args.arms}, seeds {args.seeds}, {args.steps} steps", flush=True)
    base = {"recipe": args.recipe, "model": args.model, "eval_seed": args.eval_seed, "eval_tasks": args.eval_tasks,
            "steps": args.steps}
    sft = run_child({**base, "arm": "sft"}, Path(args.out, "sft.log"), args.threads)
    if "error" in sft:
        raise SystemExit(f"the SFT model's held-out eval failed:\n{sft['error']}")
    print(f"SFT: {json.dumps(sft)}", flush=True)
    out = {"idle_cpu": {"start": idle}, "code": code_version(), "steps": args.steps, "seeds": args.seeds, "model": args.model,
           "recipe": args.recipe, "overrides": args.overrides, "threads": args.threads, "eval_seed": args.eval_seed,
           "held_out_tasks": args.eval_tasks, "arms": {a: ARMS[a] for a in args.arms}, "sft": sft,
           "runs": {a: [] for a in args.arms}}
    for i, seed in enumerate(args.seeds):
        for arm in (args.arms if i % 2 == 0 else args.arms[::-1]):
            spec = {**base, "arm": arm, "seed": seed, "out": f"{args.out}/{arm}_s{seed}",
                    "overrides": ARMS[arm] + args.overrides}
            result = run_child(spec, Path(args.out, f"{arm}_s{seed}.log"), args.threads)
            out["runs"][arm].append(result)
            print(f"{arm} seed {seed}: {json.dumps(result)[:600]}", flush=True)
            if args.json_path:  # what has finished so far, in case the rest does not
                Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    out["idle_cpu"]["end"] = idle_cpu()
    print(f"\nidle CPU at start {idle:.0%}, at end {out['idle_cpu']['end']:.0%}; {args.steps} steps; "
          f"seeds {args.seeds}; held-out tasks {args.eval_tasks or 'the recipe'} (seed {args.eval_seed})")
    report(out, args.json_path, args.png)
    if any("error" in r for rs in out["runs"].values() for r in rs):
        sys.exit(1)


def metric_bars(ax, out: dict, arms: list[str], key: str, label: str) -> None:
    s = out["summary"]
    ax.bar(range(len(arms)), [s[a][key]["mean"] for a in arms], yerr=[s[a][key]["std"] for a in arms], capsize=2,
           color=[f"C{j + 1}" for j in range(len(arms))])
    ax.set_xticks(range(len(arms)), arms, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3)


def plot(out: dict, path: str) -> None:
    arms = [a for a in out["runs"] if a in out["summary"]]
    fig, (ax, ax_time, ax_mem) = shared.figure(3, widths=[3, 1, 1], size=(13, 4))
    shared.pass_bars(ax, out, arms)
    ax.set_title(f"{out['steps']} steps, seeds {out['seeds']}, std over seeds", fontsize=9)
    metric_bars(ax_time, out, arms, "s_per_step", "s per step (median)")
    metric_bars(ax_mem, out, arms, "peak_rss_mb", "peak RSS, MB")
    shared.save_figure(fig, path)


if __name__ == "__main__":
    main()
