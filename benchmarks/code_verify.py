"""Code verification throughput: ``CodeVerifier.check_many`` (batched) vs one ``check`` at a time.

    python benchmarks/code_verify.py [--n 1000] [--workers 2] [--json PATH]

Verifies ``n`` candidate programs for small io-style code tasks (four function shapes, 5 hidden
inputs each) on the strict sandbox backend. The candidates are a mix: 85% correct, 10% wrong
(off by one), 3% runtime error (every call raises), 1% syntax error (caught before the sandbox),
1% infinite loop (killed at the task's 1 s timeout). Every verdict's reason is checked against
the kind of candidate.

The "test run" baseline is the same work done in-process with no isolation: compile and exec the
task's reference solution, call it on the hidden inputs and compare. Overhead per program is
(wall per program - in-process test time per program). Rows:

- ``check_many``: all n in one call (every sandbox job submitted at once, ``Sandbox.map``);
- ``check_many, no timeouts``: the same without the infinite loops, whose 1 s each otherwise
  dominates (10 loops x 1 s over 2 workers = about 5 s of wall time);
- ``check one at a time``: the same n through ``check``, one program after another.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

from rlvr.sandbox import choose, plaindata
from rlvr.monitor.cpu import idle_cpu
from rlvr.sandbox.config import SandboxConfig, close_shared_sandbox, shared_sandbox
from rlvr.types import Spec, Task
from rlvr.verifiers.code import CodeVerifier, use_sandbox

MIX = (("correct", 0.85, "ok"), ("wrong", 0.10, "wrong_answer"), ("runtime_error", 0.03, "runtime_error"),
       ("syntax_error", 0.01, "syntax_error"), ("infinite_loop", 0.01, "timeout"))
TIMEOUT_S = 1.0
N_INPUTS = 5


def make_function(rng: random.Random) -> tuple[str, str, list[tuple]]:
    """(params, return expression, hidden inputs) of one small function."""
    k = rng.randint(2, 9)
    shape = rng.randrange(4)
    if shape == 0:
        return "x", f"x + {k}", [(rng.randint(-50, 50),) for _ in range(N_INPUTS)]
    if shape == 1:
        return "a, b", f"a * b + {k}", [(rng.randint(0, 12), rng.randint(0, 12)) for _ in range(N_INPUTS)]
    if shape == 2:
        return "x", f"x - {k} if x > {k} else {k}", [(rng.randint(0, 20),) for _ in range(N_INPUTS)]
    return "xs", f"sum(1 for v in xs if v > {k})", [([rng.randint(0, 12) for _ in range(rng.randint(0, 8))],)
                                                  for _ in range(N_INPUTS)]


def make_cases(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    kinds = [kind for kind, share, _ in MIX for _ in range(round(share * n))]
    kinds = (kinds + ["correct"] * n)[:n]
    rng.shuffle(kinds)
    cases = []
    for i, kind in enumerate(kinds):
        params, expr, inputs = make_function(rng)
        reference = f"def solve({params}):\n    return {expr}\n"
        namespace: dict = {}
        exec(compile(reference, "reference.py", "exec"), namespace)  # noqa: S102 - our own reference
        expected = [namespace["solve"](*args) for args in inputs]
        candidate = {
            "correct": reference,
            "wrong": f"def solve({params}):\n    return ({expr}) + 1\n",
            "runtime_error": f"def solve({params}):\n    return ({expr}) // 0\n",
            "syntax_error": f"def solve({params})\n    return {expr}\n",
            "infinite_loop": f"def solve({params}):\n    while True:\n        pass\n",
        }[kind]
        task = Task(id=f"bench.code/v1/train/1/{i:06d}", domain="bench.code", level=1,
                    prompt=({"role": "user", "content": "Write solve."},),
                    spec=Spec("code", {"entry_point": "solve", "inputs": plaindata.encode(inputs),
                                       "expected": plaindata.encode(expected), "timeout": TIMEOUT_S}))
        cases.append({"kind": kind, "task": task, "completion": f"```python\n{candidate}```\n",
                      "reference": reference, "inputs": inputs, "expected": expected})
    return cases


def in_process_seconds(cases: list[dict]) -> float:
    """Compile, exec and call each case's reference on its hidden inputs, compare: no isolation."""
    t0 = time.perf_counter()
    for case in cases:
        namespace: dict = {}
        exec(compile(case["reference"], "reference.py", "exec"), namespace)  # noqa: S102 - trusted
        fn = namespace["solve"]
        outputs = [fn(*args) for args in case["inputs"]]
        assert all(plaindata.same(o, e) for o, e in zip(outputs, case["expected"]))
    return time.perf_counter() - t0


def _cpu_times() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)
    except (OSError, ValueError, IndexError):
        return None


def timed(fn) -> tuple[list, float, float | None]:
    """Result, wall seconds, and the idle CPU fraction while ``fn`` ran."""
    before = _cpu_times()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    after = _cpu_times()
    idle = None
    if before and after and after[1] > before[1]:
        idle = (after[0] - before[0]) / (after[1] - before[1])
    return out, wall, idle


def row(name: str, cases: list[dict], verdicts, wall: float, idle: float | None, test_s: float) -> dict:
    n = len(cases)
    expected = {kind: reason for kind, _, reason in MIX}
    wrong = [(c["kind"], v.reason) for c, v in zip(cases, verdicts) if v.reason != expected[c["kind"]]]
    return {"name": name, "programs": n, "wall_s": wall, "programs_per_s": n / wall,
            "wall_ms_per_program": 1000 * wall / n, "test_ms_per_program": 1000 * test_s / n,
            "overhead_ms_per_program": 1000 * (wall - test_s) / n, "idle_cpu_during": idle,
            "unexpected_verdicts": len(wrong), "unexpected_examples": wrong[:5],
            "reasons": dict(Counter(v.reason for v in verdicts))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="candidate programs (default 1000)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)

    backend = choose("auto")
    if not backend.strict:
        print(f"no strict sandbox backend here ({backend.describe()}); this benchmark needs one")
        return 2
    idle_before = idle_cpu()
    cases = make_cases(args.n, args.seed)
    no_loops = [c for c in cases if c["kind"] != "infinite_loop"]
    test_all = min(in_process_seconds(cases) for _ in range(3))
    test_no_loops = min(in_process_seconds(no_loops) for _ in range(3))

    verifier = CodeVerifier()
    sandbox = shared_sandbox(SandboxConfig(workers=args.workers, audit=False))
    use_sandbox(sandbox)
    try:
        verifier.check_many([(c["task"], c["completion"]) for c in no_loops[:20]])  # warm-up
        pairs = [(c["task"], c["completion"]) for c in cases]
        rows = []
        verdicts, wall, idle = timed(lambda: verifier.check_many(pairs))
        rows.append(row("check_many", cases, verdicts, wall, idle, test_all))
        batched = verdicts
        verdicts, wall, idle = timed(lambda: verifier.check_many([(c["task"], c["completion"]) for c in no_loops]))
        rows.append(row("check_many, no timeouts", no_loops, verdicts, wall, idle, test_no_loops))
        verdicts, wall, idle = timed(lambda: [verifier.check(t, c) for t, c in pairs])
        rows.append(row("check one at a time", cases, verdicts, wall, idle, test_all))
        same = all((a.passed, a.score, a.reason) == (b.passed, b.score, b.reason)
                   for a, b in zip(batched, verdicts))
    finally:
        use_sandbox(None)
        close_shared_sandbox()

    mix = dict(Counter(c["kind"] for c in cases))
    print(f"code verification: {args.n} programs {mix}, backend {sandbox.name}, "
          f"{args.workers} workers, {os.cpu_count()} cores, idle CPU before {_pct(idle_before)}")
    header = f"{'':26} {'wall s':>8} {'prog/s':>8} {'ms/prog':>8} {'test ms':>8} {'overhead ms':>12} {'idle':>6} {'bad':>4}"
    print(header)
    for r in rows:
        print(f"{r['name']:26} {r['wall_s']:8.2f} {r['programs_per_s']:8.1f} {r['wall_ms_per_program']:8.3f} "
              f"{r['test_ms_per_program']:8.4f} {r['overhead_ms_per_program']:12.3f} "
              f"{_pct(r['idle_cpu_during']):>6} {r['unexpected_verdicts']:4d}")
    speedup = rows[2]["wall_s"] / rows[0]["wall_s"]
    print(f"batched speedup over one at a time: {speedup:.2f}x; batched verdicts == one-at-a-time: {same}")
    result = {"benchmark": "code_verify", "n": args.n, "mix": mix, "backend": sandbox.name,
              "workers": args.workers, "cpu_count": os.cpu_count(), "idle_cpu_before": idle_before,
              "timeout_s": TIMEOUT_S, "rows": rows, "batched_speedup": speedup,
              "batched_equals_one_at_a_time": same}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    bad = sum(r["unexpected_verdicts"] for r in rows)
    return 0 if bad == 0 and same else 1


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


if __name__ == "__main__":
    sys.exit(main())
