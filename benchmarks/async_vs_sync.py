"""Benchmark: asynchronous vs synchronous GRPO, steps per minute and the learning curve.

    python benchmarks/async_vs_sync.py [--steps 20] [--repeats 3] [--json PATH]

Workload: a tiny random Llama (the test suite's size) learns to answer with digits
(``bench.digits``; reward = fraction of digit characters), 8 tasks x 8 samples per step, 16
new tokens. Verification is made to take as long as generation: the verifier's batch call
(``check_many``) waits ``delay`` seconds, calibrated at the start to the measured median
generation time of one step's batch. That wait is wall time that needs none of this process's
CPU, standing in for a remote sandbox or a test suite waiting on I/O; it is a sleep, not a
sandbox run (a real sandbox's subprocesses would also take CPU from a 2-core machine).

Both sides run the same config over the same number of steps (so the same number of samples),
alternately (sync, async, sync, ...) so they see the same machine state; async uses
``asynchronous.max_staleness=1, queue_size=1``. Reported per side: steps per minute of the whole
``run_grpo`` call (setup, rollout, verification, updates, final save), median over repeats; the
ratio async / sync (target >= 1.3); the reward curve against samples (mean over repeats, plotted
to a PNG next to the JSON, left) and against the samples the generating policy had been trained on
(right: async's rollout reward at step s comes from a policy up to k = 1 update older, so its
left-hand curve lags by up to one step by construction); the final reward (mean of the last 5
steps) and the mean reward over the whole curve.

Torch runs with 1 intra-op thread on both sides (``--threads``): on this shared 2-core machine
the default 2 threads made the synchronous side several times slower (threads of one op waiting
for a descheduled sibling), which would have flattered async for the wrong reason.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine_note, print_table, write_json  # noqa: E402

TARGET_RATIO = 1.3
DELAY = {"seconds": 0.0}


class DigitsDomain:
    name = "bench.digits"
    version = "v1"
    levels = (1,)

    def generate(self, split, level, index, seed):
        from rlvr.tasks.base import seeded_rng
        from rlvr.types import Spec, Task

        rng = seeded_rng(seed, self.name, split, index)
        return Task(id=f"{self.name}/v1/{split}/{level}/{index:06d}", domain=self.name, level=level,
                    prompt=({"role": "user", "content": "Write digits."},), spec=Spec(kind="bench.digits"),
                    key=f"{split}:{index}:{rng.randrange(10**6)}", reference="123")

    def corpus(self, seed, n_docs):
        return ["123"] * n_docs


class SlowDigitsVerifier:
    """Score = fraction of digit characters; the batch takes DELAY seconds (I/O-like wait)."""

    name = "bench.digits"

    def check(self, task, completion):
        from rlvr.types import Verdict

        score = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return Verdict(passed=score == 1.0, score=score, reason="ok" if score == 1.0 else "mismatch")

    def check_many(self, pairs):
        time.sleep(DELAY["seconds"])
        return [self.check(t, c) for t, c in pairs]


def build_model(path: Path, hidden: int) -> None:
    import rlvr.tasks  # noqa: F401
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 200) + DOMAINS.get("math.word").corpus(0, 200)
    tokenizer = train_tokenizer(docs, vocab_size=320)
    cfg = TinyModelConfig(hidden_size=hidden, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=2 * hidden)
    save_model_dir(path, build_tiny_model(cfg, tokenizer, seed=0), tokenizer)


def config(model_dir: Path, out: Path, steps: int, asynchronous: bool, seed: int, new_tokens: int = 16):
    from rlvr.config import load_config
    from rlvr.train.grpo import GRPOConfig

    overrides = [
        f"model={model_dir}", f"out={out}", f"seed={seed}", "domains=[bench.digits]", "levels=[1]",
        "train_tasks=64", "rollout.tasks_per_step=8", "rollout.samples_per_task=8", f"rollout.max_new_tokens={new_tokens}",
        "reward.outcome=score", "optim.lr=1e-2", "optim.warmup_steps=0", f"steps={steps}",
        f"checkpoint_every={steps}", "save_trajectories_every=100000",
        f"asynchronous.enabled={str(asynchronous).lower()}", "asynchronous.max_staleness=1",
        "asynchronous.queue_size=1",
    ]
    return load_config(GRPOConfig, None, overrides)


def calibrate(model_dir: Path, tmp: Path, new_tokens: int) -> float:
    """Median seconds to generate one step's batch (what verification is then made to take)."""
    from rlvr.train.grpo import setup
    from rlvr.train.sources import rollout

    run = setup(config(model_dir, tmp / "calibrate", 1, False, 0, new_tokens), resume=False)
    times = []
    for _ in range(5):
        tasks = run.pool.next(run.cfg.rollout.tasks_per_step)
        t0 = time.perf_counter()
        rollout(run, tasks, policy_version=0)
        times.append(time.perf_counter() - t0)
    run.logger.close()
    return statistics.median(times[1:])


def by_version(curve: list[float], versions: list[float]) -> dict[int, float]:
    """Rollout reward by the version of the policy that generated it (mean over its batches)."""
    out: dict[int, list[float]] = {}
    for r, v in zip(curve, versions):
        out.setdefault(int(v), []).append(r)
    return {v: statistics.mean(rs) for v, rs in sorted(out.items())}


def plot(curves: dict[str, list[list[float]]], versions: dict[str, list[list[float]]], samples_per_step: int,
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for mode, runs in curves.items():
        color = "C0" if mode == "sync" else "C1"
        steps = len(runs[0])
        mean = [statistics.mean(r[i] for r in runs) for i in range(steps)]
        x = [(i + 1) * samples_per_step for i in range(steps)]
        for r in runs:
            axes[0].plot(x, r, alpha=0.2, color=color)
        axes[0].plot(x, mean, label=f"{mode} (mean of {len(runs)})", color=color)
        for r, v in zip(runs, versions[mode]):
            bv = by_version(r, v)
            axes[1].plot([k * samples_per_step for k in bv], list(bv.values()), alpha=0.35, color=color,
                         label=mode if r is runs[0] else None)
    axes[0].set_xlabel("samples consumed by the trainer")
    axes[0].set_ylabel("rollout reward (mean)")
    axes[0].set_title("reward vs samples (async's batches come from a policy up to 1 update older)")
    axes[1].set_xlabel("samples the generating policy was trained on")
    axes[1].set_title("reward vs generating policy")
    for ax in axes:
        ax.legend()
        ax.title.set_fontsize(9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=32, help="model width (2 layers)")
    parser.add_argument("--new-tokens", type=int, default=48, help="rollout.max_new_tokens")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, both sides (default 1: see docs/async.md)")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--plot", help="PNG path (default: next to --json, else runs/bench/async_vs_sync.png)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import rlvr.verifiers  # noqa: F401
    from rlvr.monitor.metrics import read_metrics
    from rlvr.tasks.base import DOMAINS
    from rlvr.train.grpo import run_grpo
    from rlvr.verifiers.base import VERIFIERS

    if "bench.digits" not in DOMAINS:
        DOMAINS.register("bench.digits")(DigitsDomain())
        VERIFIERS.register("bench.digits")(SlowDigitsVerifier())

    note_before = machine_note()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        build_model(tmp / "model", args.hidden)
        gen_s = calibrate(tmp / "model", tmp, args.new_tokens)
        DELAY["seconds"] = gen_s
        print(f"generation of one step's batch: {gen_s:.3f} s; verification made to take the same")
        walls: dict[str, list[float]] = {"sync": [], "async": []}
        curves: dict[str, list[list[float]]] = {"sync": [], "async": []}
        versions: dict[str, list[list[float]]] = {"sync": [], "async": []}
        phases: dict[str, list[dict]] = {"sync": [], "async": []}
        for rep in range(args.repeats):
            for mode in ("sync", "async") if rep % 2 == 0 else ("async", "sync"):
                out = tmp / f"{mode}_{rep}"
                t0 = time.perf_counter()
                run_grpo(config(tmp / "model", out, args.steps, mode == "async", rep, args.new_tokens), progress=False)
                walls[mode].append(time.perf_counter() - t0)
                rows = read_metrics(out)
                curves[mode].append([r["rollout/reward_mean"] for r in rows])
                versions[mode].append([r.get("async/policy_version", r["step"] - 1) for r in rows])
                phases[mode].append({k: statistics.mean(r.get(k, 0.0) for r in rows)
                                     for k in ("time/rollout", "time/verify", "time/update", "time/wait")})
                print(f"  {mode:5s} repeat {rep}: {walls[mode][-1]:.1f} s, "
                      f"{args.steps / walls[mode][-1] * 60:.1f} steps/min, "
                      f"final reward {statistics.mean(curves[mode][-1][-5:]):.3f}")

    samples_per_step = 8 * 8
    rows, result = [], {}
    for mode in ("sync", "async"):
        spm = [args.steps / w * 60 for w in walls[mode]]
        final = [statistics.mean(c[-5:]) for c in curves[mode]]
        mean_reward = [statistics.mean(c) for c in curves[mode]]  # area under the curve / steps
        ph = {k: statistics.median(p[k] for p in phases[mode]) for k in phases[mode][0]}
        rows.append({"mode": mode, "runs": len(spm), "steps/min (median)": statistics.median(spm),
                     "min": min(spm), "max": max(spm), "final reward": statistics.mean(final),
                     "mean reward": statistics.mean(mean_reward),
                     "rollout s/step": ph["time/rollout"], "verify s/step": ph["time/verify"],
                     "wait s/step": ph["time/wait"], "update s/step": ph["time/update"]})
        result[mode] = {"steps_per_min": spm, "steps_per_min_median": statistics.median(spm),
                        "final_reward": final, "final_reward_mean": statistics.mean(final),
                        "curve_mean_reward": statistics.mean(mean_reward), "policy_versions": versions[mode],
                        "reward_curves": curves[mode], "phase_seconds_per_step": ph}
    ratio = result["async"]["steps_per_min_median"] / result["sync"]["steps_per_min_median"]
    reward_diff = result["async"]["final_reward_mean"] - result["sync"]["final_reward_mean"]
    print()
    print_table(rows, ["mode", "runs", "steps/min (median)", "min", "max", "final reward", "mean reward", "rollout s/step",
                       "verify s/step", "wait s/step", "update s/step"])
    print(f"\nasync / sync steps per minute: {ratio:.2f}x (target >= {TARGET_RATIO}x: "
          f"{'met' if ratio >= TARGET_RATIO else 'NOT met'})")
    print(f"final reward (last 5 steps, mean over repeats): async - sync = {reward_diff:+.3f} "
          f"over the same {args.steps * samples_per_step} samples")
    note_after = machine_note()
    print(f"machine: {note_before} (start); {note_after} (end)")

    png = Path(args.plot) if args.plot else (Path(args.json_path).with_suffix(".png") if args.json_path
                                              else Path("runs/bench/async_vs_sync.png"))
    plot(curves, versions, samples_per_step, png)
    write_json(args.json_path, {
        "benchmark": "async_vs_sync", "steps": args.steps, "repeats": args.repeats, "torch_threads": args.threads,
        "model_hidden": args.hidden, "max_new_tokens": args.new_tokens,
        "samples_per_step": samples_per_step, "generation_seconds": gen_s, "verify_delay_seconds": gen_s,
        "sync": result["sync"], "async": result["async"], "steps_per_min_ratio": ratio,
        "target_ratio": TARGET_RATIO, "final_reward_async_minus_sync": reward_diff,
        "curve_mean_reward_async_minus_sync": result["async"]["curve_mean_reward"] - result["sync"]["curve_mean_reward"],
        "plot": str(png),
        "machine_start": note_before, "machine_end": note_after,
    })


if __name__ == "__main__":
    main()
