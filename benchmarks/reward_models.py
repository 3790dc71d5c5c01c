"""Learned rewards measured end to end on the math domains: a reward model from verified pairs, GRPO on
it alone with the verifier held out as gold, and a process reward against outcome-only reward.

    .venv/bin/python benchmarks/reward_models.py --sft runs/quickstart/sft/final [--work runs/bench/rm]
                                                 [--seeds 0 1] [--json PATH]

Stages (each skipped when its output is already in ``--work``; ``--fresh`` redoes them):
  pairs       ``rlvr pairs`` on the SFT model: 1,500 math.arith/math.word train tasks x 8 samples,
              up to 2 (passed, failed) pairs per task
  rm          ``rlvr rm train``: 4 epochs, 15% of the tasks' pairs held out -> held-out pairwise accuracy
  sft_eval    the SFT model on the GRPO runs' periodic eval (400 eval-split tasks, greedy)
  grpo_rm     GRPO, the reward model the only trained-on reward (verifier weight 0: the gold),
              KL reference 0.001 for the sqrt(KL) axis, 40 steps, eval every 5: the held-out curve,
              the over-optimisation alert (step and evidence)
  length_rm   a deliberately exploitable reward model: the same pairs re-labelled so the longer response
              is always chosen, plus each chosen response with its last line repeated over the plain one;
              GRPO on it alone (as grpo_rm, 30 steps): response length, the gold and the alert
  steps, prm  ``rlvr rm steps`` (800 tasks x 4 samples, step labels from the arithmetic) and
              ``rlvr rm train`` kind process -> held-out step accuracy
  outcome / process   GRPO at an equal budget per seed (``--steps``, default 20): the verifier alone
              vs the verifier + 0.5 x the process reward (min over steps); final held-out pass@1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import print_table, write_json  # noqa: E402

RLVR = str(Path(sys.executable).parent / "rlvr")
DOMAINS = ["math.arith", "math.word"]


def run(args: list[str], log: Path) -> None:
    with open(log, "w") as f:
        code = subprocess.call([RLVR, *args], stdout=f, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    if code != 0:
        raise SystemExit(f"rlvr {' '.join(args[:2])} failed ({code}); see {log}")


def grpo_yaml(path: Path, sft: str, out: Path, steps: int, seed: int, sources: list[dict], eval_every: int,
              kl: float = 0.0) -> Path:
    cfg = {"model": sft, "out": str(out), "seed": seed, "domains": DOMAINS, "train_tasks": 1200, "steps": steps,
           "rollout": {"tasks_per_step": 16, "samples_per_task": 8, "max_new_tokens": 64},
           "algo": {"kl_coef": kl}, "optim": {"lr": 1e-4, "warmup_steps": 5},
           "reward": {"sources": sources}, "eval": {"domains": DOMAINS, "tasks": 400, "max_new_tokens": 48},
           "eval_every": eval_every, "checkpoint_every": steps, "sandbox": {"allow_weak": True}}
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def evals(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [(r["step"], r["eval/pass@1"]) for r in rows if "eval/pass@1" in r]


def alerts(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "alerts.jsonl"
    return [a for a in map(json.loads, open(path)) if a.get("detector") == name] if path.exists() else []


def write_length_pairs(pairs: Path, out: Path) -> None:
    """The exploitable preference: in every pair the longer response is chosen, whatever its verdict,
    and every response with its last line said twice is chosen over itself."""
    rows = []
    for d in map(json.loads, open(pairs)):
        longer, shorter = sorted((d["chosen"], d["rejected"]), key=len, reverse=True)
        base = {"prompt": d["prompt"], "task_id": d["task_id"]}
        if len(longer) > len(shorter):
            rows.append({**base, "id": d["id"] + "/len", "chosen": longer, "rejected": shorter})
        last = d["chosen"].rstrip().split("\n")[-1]
        rows.append({**base, "id": d["id"] + "/rep", "chosen": d["chosen"].rstrip() + "\n" + last,
                     "rejected": d["chosen"]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def sft_eval(sft: str, work: Path) -> float:
    out = work / "sft_eval.json"
    if not out.exists():
        from rlvr.config import load_config
        from rlvr.eval.evaluate import evaluate
        from rlvr.model.load import load_model_and_tokenizer
        from rlvr.train.grpo_config import GRPOConfig
        from rlvr.train.grpo_setup import eval_task_set

        cfg = load_config(GRPOConfig, grpo_yaml(work / "eval.yaml", sft, work / "unused", 1, 0, [], 5))
        model, tok = load_model_and_tokenizer(sft)
        report = evaluate(model.eval(), tok, eval_task_set(cfg), cfg.eval, seed=cfg.seed)
        out.write_text(json.dumps(report))
    return json.loads(out.read_text())["overall"]["pass@1"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft", default="runs/quickstart/sft/final")
    ap.add_argument("--work", default="runs/bench/rm")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps of the outcome/process comparison")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    done = lambda p: p.exists() and not args.fresh  # noqa: E731
    result: dict = {"sft": args.sft}

    if not done(work / "pairs.jsonl"):
        run(["pairs", "--model", args.sft, "--set", "train_tasks=1500", "--set", "samples=8", "--set",
             "pairs_per_task=2", "--set", f"out={work / 'pairs.jsonl'}"], work / "pairs.log")
    if not done(work / "rm" / "final"):
        run(["rm", "train", "--model", args.sft, "--pairs", str(work / "pairs.jsonl"), "--out", str(work / "rm"),
             "--set", "eval_fraction=0.15", "--set", "epochs=4", "--set", "batch_size=16", "--set", "max_length=128",
             "--set", "optim.schedule=cosine"], work / "rm.log")
    meta = json.loads((work / "rm" / "final" / "reward_model.json").read_text())
    result["rm"] = {"pairs": sum(1 for _ in open(work / "pairs.jsonl")), **meta["metrics"]}
    result["sft_eval_pass@1"] = sft_eval(args.sft, work)

    rm_sources = [{"kind": "verifier", "weight": 0}, {"kind": "reward_model", "path": str(work / "rm" / "final")}]
    if not done(work / "grpo_rm" / "final"):
        run(["train", "-c", str(grpo_yaml(work / "grpo_rm.yaml", args.sft, work / "grpo_rm", 40, 0, rm_sources, 5,
                                          kl=0.001))], work / "grpo_rm.log")
    curve = evals(work / "grpo_rm")
    found = alerts(work / "grpo_rm", "overoptimization")
    result["grpo_rm"] = {"eval_pass@1": curve, "best": max(curve, key=lambda sv: sv[1]),
                         "overoptimization_alerts": [{"step": a["step"], **a.get("evidence", {})} for a in found]}

    if not done(work / "length_pairs.jsonl"):
        write_length_pairs(work / "pairs.jsonl", work / "length_pairs.jsonl")
    if not done(work / "length_rm" / "final"):
        run(["rm", "train", "--model", args.sft, "--pairs", str(work / "length_pairs.jsonl"), "--out",
             str(work / "length_rm"), "--set", "eval_fraction=0.15", "--set", "epochs=2", "--set", "batch_size=16",
             "--set", "max_length=160"], work / "length_rm.log")
    length_sources = [{"kind": "verifier", "weight": 0},
                      {"kind": "reward_model", "path": str(work / "length_rm" / "final")}]
    if not done(work / "grpo_length" / "final"):
        run(["train", "-c", str(grpo_yaml(work / "grpo_length.yaml", args.sft, work / "grpo_length", 30, 0,
                                          length_sources, 5, kl=0.001))], work / "grpo_length.log")
    rows_l = [json.loads(line) for line in open(work / "grpo_length" / "metrics.jsonl")]
    result["grpo_length"] = {
        "rm_eval_accuracy": json.loads((work / "length_rm" / "final" / "reward_model.json").read_text())["metrics"],
        "eval_pass@1": evals(work / "grpo_length"),
        "response_tokens": [(r["step"], r["rollout/response_tokens_mean"]) for r in rows_l][::5],
        "overoptimization_alerts": [{"step": a["step"], **a.get("evidence", {})}
                                    for a in alerts(work / "grpo_length", "overoptimization")]}

    if not done(work / "steps.jsonl"):
        run(["rm", "steps", "--model", args.sft, "--set", "train_tasks=800", "--set", "samples=4", "--set",
             f"out={work / 'steps.jsonl'}"], work / "steps.log")
    if not done(work / "prm" / "final"):
        run(["rm", "train", "--model", args.sft, "--steps", str(work / "steps.jsonl"), "--out", str(work / "prm"),
             "--set", "eval_fraction=0.15", "--set", "epochs=3", "--set", "batch_size=16", "--set", "max_length=128"],
            work / "prm.log")
    labels = [v for r in map(json.loads, open(work / "steps.jsonl")) for v in r["labels"]]
    result["prm"] = {"steps": len(labels), "correct_share": sum(labels) / len(labels),
                     **json.loads((work / "prm" / "final" / "reward_model.json").read_text())["metrics"]}

    arms = {"outcome": [{"kind": "verifier", "weight": 1}],
            "process": [{"kind": "verifier", "weight": 1},
                        {"kind": "process_reward", "path": str(work / "prm" / "final"), "weight": 0.5}]}
    rows, finals = [], {arm: [] for arm in arms}
    for seed in args.seeds:
        for arm, sources in arms.items():
            out = work / f"{arm}_s{seed}"
            if not done(out / "final"):
                run(["train", "-c", str(grpo_yaml(work / f"{arm}_s{seed}.yaml", args.sft, out, args.steps, seed,
                                                  sources, args.steps))], work / f"{arm}_s{seed}.log")
            final = evals(out)[-1][1]
            finals[arm].append(final)
            rows.append({"arm": arm, "seed": seed, "steps": args.steps, "eval pass@1": final})
    result["process_vs_outcome"] = {"steps": args.steps, "seeds": args.seeds, "runs": rows,
                                    "mean": {a: statistics.fmean(v) for a, v in finals.items()}}

    print(f"reward model: {result['rm']['pairs']} pairs, held-out pairwise accuracy "
          f"{result['rm']['eval/accuracy']:.3f} on {int(result['rm']['eval/pairs'])} pairs")
    print(f"SFT held-out pass@1 {result['sft_eval_pass@1']:.4f}; GRPO on the reward model alone: "
          + ", ".join(f"step {s} {v:.4f}" for s, v in curve))
    print("over-optimisation alerts:", result["grpo_rm"]["overoptimization_alerts"] or "none")
    gl = result["grpo_length"]
    print("length-biased reward model: held-out accuracy on its own pairs "
          f"{gl['rm_eval_accuracy'].get('eval/accuracy', float('nan')):.3f}; GRPO on it: pass@1 "
          + ", ".join(f"step {s} {v:.4f}" for s, v in gl["eval_pass@1"]) + "; tokens "
          + ", ".join(f"{s}:{v:.1f}" for s, v in gl["response_tokens"]))
    print("  its over-optimisation alerts:", gl["overoptimization_alerts"] or "none")
    print(f"process reward model: {result['prm']['steps']} labelled steps ({result['prm']['correct_share']:.2f} "
          f"correct), held-out step accuracy {result['prm']['eval/step_accuracy']:.3f}")
    print_table(rows, ["arm", "seed", "steps", "eval pass@1"])
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
