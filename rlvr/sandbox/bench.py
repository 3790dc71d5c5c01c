"""``rlvr sandbox bench``: verified executions per second, the pool against a fresh interpreter.

Both sides run the same verified execution: a candidate function plus a HumanEval-style
``check(candidate)`` with five asserts (a ``tests`` job: the candidate in its own process, the
tests in another, the verdict read here), or the same function on five hidden inputs compared
here (an ``io`` job). The baseline starts a fresh ``python3`` per execution with the same harness
and rlimits but no other isolation, which is what most RL frameworks do. Both sides use the same
concurrency (one in flight per core by default) and alternate in rounds within one run, so
background load hits both; medians over rounds are reported.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rlvr.sandbox import harness, isolate, plaindata
from rlvr.sandbox.pool import Sandbox, interpret
from rlvr.sandbox.types import ExecResult, Job, Limits

PROGRAM = '''
def running_max(xs):
    out, best = [], None
    for x in xs:
        best = x if best is None or x > best else best
        out.append(best)
    return out
'''
TESTS = '''
def check(candidate):
    assert candidate([1, 3, 2]) == [1, 3, 3]
    assert candidate([]) == []
    assert candidate([5, 4, 6, 1]) == [5, 5, 6, 6]
    assert candidate([-1, -2]) == [-1, -1]
    assert candidate([2, 2, 9, 0, 9]) == [2, 2, 9, 9, 9]
'''
INPUTS = [([1, 3, 2],), ([],), ([5, 4, 6, 1],), ([-1, -2],), ([2, 2, 9, 0, 9],)]
EXPECTED = [[1, 3, 3], [], [5, 5, 6, 6], [-1, -1], [2, 2, 9, 9, 9]]


def make_job(kind: str) -> Job:
    limits = Limits(wall_s=10.0)
    if kind == "tests":
        return Job.with_tests(PROGRAM, TESTS, "running_max", limits=limits)
    return Job.io(PROGRAM, "running_max", INPUTS, limits=limits)


def verified(job: Job, result: ExecResult) -> bool:
    return result.passed if job.kind == "tests" else result.compare(EXPECTED) == len(EXPECTED)


def run_fresh_interpreter(job: Job, python: str = sys.executable) -> ExecResult:
    """The baseline: one fresh interpreter per execution, same harness, rlimits only."""
    import secrets

    nonce = secrets.token_hex(16)
    t0 = time.perf_counter()
    job_r, job_w = os.pipe()
    tr_r, tr_w = os.pipe()
    rep_r, rep_w = os.pipe()
    os.write(job_w, json.dumps(job.untrusted_part()).encode())
    os.write(tr_w, json.dumps({"nonce": nonce, "tests": job.tests}).encode())
    os.close(job_w)
    os.close(tr_w)
    limits = job.limits.to_dict()

    def preexec() -> None:
        isolate.set_limits({**limits, "processes": resource.getrlimit(resource.RLIMIT_NPROC)[1]})

    from rlvr.sandbox.worker import harness_argv

    argv = [python, *harness_argv((job_r, tr_r, rep_w))[1:]]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=preexec, pass_fds=(job_r, tr_r, rep_w),
                            start_new_session=True)
    for fd in (job_r, tr_r, rep_w):
        os.close(fd)
    reader = threading.Thread(target=lambda: setattr(reader, "data", harness._read_all(rep_r)))
    reader.start()
    try:
        out, err = proc.communicate(timeout=job.limits.wall_s)
        status = "ok"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        status = "timeout"
    reader.join()
    os.close(rep_r)
    raw = {"status": status, "exit_code": proc.returncode, "stdout": out.decode(errors="replace"),
           "stderr": err.decode(errors="replace"), "report": reader.data.decode(errors="replace"),
           "duration_s": time.perf_counter() - t0}
    return interpret(job, raw, nonce, "fresh-python")


def _measure(fn, jobs: list[Job], concurrency: int) -> dict:
    latencies: list[float] = []
    ok = 0

    def one(job: Job):
        t = time.perf_counter()
        result = fn(job)
        latencies.append(time.perf_counter() - t)
        return verified(job, result)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        ok = sum(ex.map(one, jobs))
    wall = time.perf_counter() - t0
    return {"execs": len(jobs), "verified": ok, "wall_s": wall, "latencies": latencies}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_bench(n: int = 200, rounds: int = 3, workers: int | None = None, kind: str = "tests",
              baseline_python: str = sys.executable, backend: str = "auto") -> dict:
    workers = workers or os.cpu_count() or 1
    job = make_job(kind)
    sides: dict[str, list[dict]] = {"pool": [], "baseline": []}
    with Sandbox(workers=workers, backend=backend) as sb:
        sb.map([job] * workers * 2)  # warm-up
        n_base = max(20, n // 5)  # the baseline is slower; fewer runs keep the rounds balanced
        for _ in range(rounds):
            sides["pool"].append(_measure(sb.run, [job] * n, workers))
            sides["baseline"].append(_measure(lambda j: run_fresh_interpreter(j, baseline_python),
                                              [job] * n_base, workers))
        name = sb.name
    report: dict = {"kind": kind, "workers": workers, "rounds": rounds, "backend": name,
                    "baseline_label": f"fresh {baseline_python} + rlimits",
                    "loadavg_before": os.getloadavg(), "cpu_count": os.cpu_count()}
    for side, runs in sides.items():
        lat = [x for r in runs for x in r["latencies"]]
        report[side] = {
            "execs_per_s": statistics.median(r["execs"] / r["wall_s"] for r in runs),
            "p50_ms": 1e3 * _pct(lat, 0.5), "p99_ms": 1e3 * _pct(lat, 0.99),
            "verified": sum(r["verified"] for r in runs), "execs": sum(r["execs"] for r in runs),
        }
    report["ratio"] = report["pool"]["execs_per_s"] / report["baseline"]["execs_per_s"]
    report["loadavg_after"] = os.getloadavg()
    return report


def format_report(r: dict) -> str:
    lines = [f"sandbox bench: {r['kind']} jobs, {r['workers']} in flight, {r['rounds']} alternating "
             f"rounds, load average before {r['loadavg_before'][0]:.2f} on {r['cpu_count']} cores",
             f"{'side':<56} {'execs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'verified':>10}"]
    for side, label in (("pool", f"rlvr {r['backend']} pool"), ("baseline", r["baseline_label"])):
        s = r[side]
        lines.append(f"{label:<56} {s['execs_per_s']:>9.1f} {s['p50_ms']:>8.1f} {s['p99_ms']:>8.1f}"
                     f" {s['verified']:>4}/{s['execs']:<5}")
    lines.append(f"throughput ratio pool/baseline: {r['ratio']:.1f}x "
                 f"(target >= 5x; pool p50 target <= 15 ms)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="rlvr sandbox bench", description=__doc__)
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


def add_arguments(p) -> None:
    p.add_argument("--n", type=int, default=200, help="executions per round for the pool")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--kind", choices=["tests", "io", "both"], default="both")
    p.add_argument("--backend", default="auto")
    p.add_argument("--baseline-python", default=sys.executable)
    p.add_argument("--json", dest="json_path", help="also write the numbers here")


def run_from_args(args) -> int:
    kinds = ["tests", "io"] if args.kind == "both" else [args.kind]
    reports = []
    for kind in kinds:
        r = run_bench(args.n, args.rounds, args.workers, kind, args.baseline_python, args.backend)
        print(format_report(r))
        reports.append(r)
    if args.json_path:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        with open(args.json_path, "w") as f:
            json.dump(reports, f, indent=2)
        print(f"wrote {args.json_path}")
    return 0


__all__ = ["format_report", "main", "plaindata", "run_bench"]
