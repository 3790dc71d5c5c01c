"""Verification with hostile programs: a batch in which some programs sleep past the wall limit.

    python benchmarks/sandbox_hostile.py [--n 1000] [--sleepers 150] [--wall 2] [--workers 2]
                                         [--max-slots 64] [--rounds 3] [--fixed] [--json PATH]

Verifies ``n`` candidate programs for small io-style code tasks (the function shapes of
``code_verify.py``, 5 hidden inputs each) with ``CodeVerifier.check_many`` (one ``Sandbox.map``)
on the strict backend, with a task timeout (wall limit) of ``--wall`` seconds. Two batches:

- ``with sleepers``: ``--sleepers`` of the programs (spread evenly through the batch) call
  ``time.sleep(3600)``, so each holds its run until the wall limit kills it;
- ``without sleepers``: the same batch with those programs replaced by correct ones (same tasks,
  same count).

Both sides run alternately, ``--rounds`` times each, each on a fresh pool of ``--workers``
pre-warmed slots and ``--max-slots`` in all (default: ``sandbox.max_slots``'s, 64), so the
sleepers' side pays for the extra slots it starts. Reported: medians, every trial, the verdicts (every sleeper must time out, every other
program must pass), peak slots, idle CPU before and during. The acceptance bound is
``with < without + 3 x wall``. ``--fixed`` adds one trial of the old behaviour for contrast: the
pool capped at one slot per worker (``max_slots = workers``), with sleepers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from code_verify import _pct, make_function, timed  # benchmarks/ is on sys.path

from rlvr.monitor.cpu import idle_cpu
from rlvr.sandbox import Sandbox, choose, plaindata
from rlvr.sandbox.config import SandboxConfig
from rlvr.types import Spec, Task
from rlvr.verifiers.code import CodeVerifier, use_sandbox


def make_cases(n: int, sleepers: int, wall: float, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    sleeping = {round(k * n / sleepers) for k in range(sleepers)} if sleepers else set()
    cases = []
    for i in range(n):
        params, expr, inputs = make_function(rng)
        reference = f"def solve({params}):\n    return {expr}\n"
        namespace: dict = {}
        exec(compile(reference, "reference.py", "exec"), namespace)  # noqa: S102 - our own reference
        expected = [namespace["solve"](*args) for args in inputs]
        task = Task(id=f"bench.hostile/v1/train/1/{i:06d}", domain="bench.hostile", level=1,
                    prompt=({"role": "user", "content": "Write solve."},),
                    spec=Spec("code", {"entry_point": "solve", "inputs": plaindata.encode(inputs),
                                       "expected": plaindata.encode(expected), "timeout": wall}))
        sleeper = f"import time\ndef solve({params}):\n    time.sleep(3600)\n"
        cases.append({"task": task, "reference": reference, "sleeper": sleeper,
                      "sleeps": i in sleeping})
    return cases


def run_side(cases: list[dict], with_sleepers: bool, workers: int, max_slots: int) -> dict:
    pairs = [(c["task"], f"```python\n{c['sleeper'] if with_sleepers and c['sleeps'] else c['reference']}```\n")
             for c in cases]
    verifier = CodeVerifier()
    with Sandbox(workers=workers, max_slots=max_slots) as sandbox:
        previous = use_sandbox(sandbox)
        try:
            verifier.check_many(pairs[:10])  # warm
            verdicts, wall, idle = timed(lambda: verifier.check_many(pairs))
        finally:
            use_sandbox(previous)
        peak = sandbox.peak_slots
    sleepers = [v for c, v in zip(cases, verdicts) if with_sleepers and c["sleeps"]]
    others = [v for c, v in zip(cases, verdicts) if not (with_sleepers and c["sleeps"])]
    return {"wall_s": wall, "idle_cpu_during": idle, "peak_slots": peak,
            "sleepers": len(sleepers), "sleepers_timed_out": sum(v.reason == "timeout" for v in sleepers),
            "others": len(others), "others_passed": sum(v.passed for v in others),
            "other_failures": [v.reason for v in others if not v.passed][:5]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--n", type=int, default=1000, help="programs per batch (default 1000)")
    parser.add_argument("--sleepers", type=int, default=150, help="sleeping programs (default 150)")
    parser.add_argument("--wall", type=float, default=2.0, help="task timeout, s (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="pre-warmed slots (default 2)")
    parser.add_argument("--max-slots", type=int, default=SandboxConfig().max_slots,
                        help="slots in all (default: sandbox.max_slots's default)")
    parser.add_argument("--rounds", type=int, default=3, help="trials per side (default 3)")
    parser.add_argument("--fixed", action="store_true",
                        help="also one trial with max_slots = workers (the old fixed pool)")
    args = parser.parse_args(argv)
    backend = choose("auto")
    if not backend.strict:  # the weak backend has no process tree to time out and no uids
        print(f"needs a strict sandbox backend; this machine has only: {backend.describe()}")
        return 2

    idle_before = idle_cpu()
    cases = make_cases(args.n, args.sleepers, args.wall)
    trials: dict[str, list[dict]] = {"with sleepers": [], "without sleepers": []}
    for _ in range(args.rounds):  # alternated, so both sides see the same background load
        trials["with sleepers"].append(run_side(cases, True, args.workers, args.max_slots))
        trials["without sleepers"].append(run_side(cases, False, args.workers, args.max_slots))
    fixed = run_side(cases, True, args.workers, args.workers) if args.fixed else None

    med = {side: statistics.median(t["wall_s"] for t in ts) for side, ts in trials.items()}
    bound = med["without sleepers"] + 3 * args.wall
    correct = all(t["others_passed"] == t["others"] and t["sleepers_timed_out"] == t["sleepers"]
                  for ts in trials.values() for t in ts)
    print(f"hostile verification: {args.n} programs, {args.sleepers} sleepers, wall {args.wall:g} s, "
          f"backend {backend.name}, {args.workers} workers, {os.cpu_count()} cores, "
          f"idle CPU before {_pct(idle_before)}")
    print(f"{'':20} {'median s':>9} {'trials s':>22} {'peak slots':>10} {'timeouts':>9} {'passed':>9} {'idle':>6}")
    rows = [(side, med[side], ts) for side, ts in trials.items()]
    if fixed:
        rows.append((f"fixed pool ({args.workers} slots)", fixed["wall_s"], [fixed]))
    for name, median, ts in rows:
        t, walls = ts[-1], " ".join(f"{x['wall_s']:.2f}" for x in ts)
        print(f"{name:20} {median:9.2f} {walls:>22} "
              f"{max(x['peak_slots'] for x in ts):10d} {t['sleepers_timed_out']:>4}/{t['sleepers']:<4} "
              f"{t['others_passed']:>4}/{t['others']:<4} {_pct(statistics.median(x['idle_cpu_during'] or 0 for x in ts)):>6}")
    ok = med["with sleepers"] < bound
    print(f"with - without = {med['with sleepers'] - med['without sleepers']:.2f} s "
          f"(bound: < 3 x wall = {3 * args.wall:g} s): {'PASS' if ok else 'FAIL'}; "
          f"ratio {med['with sleepers'] / med['without sleepers']:.2f}x; every verdict as expected: {correct}")
    result = {"benchmark": "sandbox_hostile", "n": args.n, "sleepers": args.sleepers,
              "sleepers_replaced_by": "correct programs (same tasks)", "wall_s": args.wall,
              "backend": backend.name, "workers": args.workers, "cpu_count": os.cpu_count(),
              "idle_cpu_before": idle_before, "idle_cpu_after": idle_cpu(), "trials": trials,
              "median_s": med, "bound_s": bound, "within_bound": ok, "verdicts_as_expected": correct,
              "fixed_pool_with_sleepers": fixed}
    print(f"idle CPU after {_pct(result['idle_cpu_after'])}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if ok and correct else 1


if __name__ == "__main__":
    sys.exit(main())
