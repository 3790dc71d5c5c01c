"""Does each professional domain's reward teach? GRPO on the reference policy with noise.

    python benchmarks/learnability.py [--domains docs.tables,render.svg,cad.shapes,data.analysis]
        [--levels 1,2,3,4] [--steps 15] [--tasks-per-step 8] [--samples 8] [--eval-tasks 40]
        [--outcome DOMAIN=binary|score ...] [--json PATH]

For each domain, ``rlvr.audit.learnability.run_learnability``: a policy over the domain's noise
arms (the clean reference, and the mistakes a model makes: numbers off or in the wrong scale,
jittered coordinates, an ungrounded or laundered answer) starts with the reference at 5%, and
GRPO updates it from the real verifier's rewards (the outcome the professional recipes train
with: ``score`` for render.svg and cad.shapes, ``binary`` for the others). Reported per domain:
held-out pass@1 before and after (exact for this policy), each arm's held-out pass rate, the arm
probabilities after, rollouts judged and the wall time. Idle CPU at the start is printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, write_json  # noqa: E402

import rlvr.tasks  # noqa: E402,F401
from rlvr.audit.learnability import LearnabilityConfig, run_learnability, summary, to_dict  # noqa: E402

DOMAINS = ("docs.tables", "render.svg", "cad.shapes", "data.analysis")
OUTCOMES = {"render.svg": "score", "cad.shapes": "score"}  # as configs/professional*.yaml train them


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", default=",".join(DOMAINS))
    ap.add_argument("--levels", default="1,2,3,4")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--tasks-per-step", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--eval-tasks", type=int, default=40)
    ap.add_argument("--start", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--outcome", action="append", default=[], metavar="DOMAIN=OUTCOME")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    outcomes = dict(OUTCOMES)
    for item in args.outcome:
        domain, _, outcome = item.partition("=")
        if outcome not in ("binary", "score"):
            ap.error(f"--outcome {item!r}: the outcome must be binary or score")
        outcomes[domain] = outcome
    levels = tuple(int(x) for x in args.levels.split(","))
    print(f"idle CPU at start: {idle_cpu():.0f}%")
    out = {"levels": list(levels), "steps": args.steps, "tasks_per_step": args.tasks_per_step,
           "samples_per_task": args.samples, "start": args.start, "lr": args.lr, "domains": {}}
    for domain in args.domains.split(","):
        t0 = time.perf_counter()
        r = run_learnability(LearnabilityConfig(
            domain, levels=levels, steps=args.steps, tasks_per_step=args.tasks_per_step,
            samples_per_task=args.samples, lr=args.lr, start=args.start, outcome=outcomes.get(domain, "binary"),
            eval_tasks=args.eval_tasks, seed=args.seed))
        wall = time.perf_counter() - t0
        print(f"{summary(r)} in {wall:.0f} s")
        out["domains"][domain] = {**to_dict(r), "wall_s": wall}
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
