"""``rlvr sandbox bench``: verified executions per second, the pool against a fresh interpreter.

Both sides run the same verified execution: a candidate function plus a HumanEval-style
``check(candidate)`` with five asserts (a ``tests`` job: the candidate in its own process, the
tests in another, the verdict read here), or the same function on five hidden inputs compared
here (an ``io`` job). The baseline starts a fresh ``python3`` per execution with the same harness
and rlimits but no other isolation, which is what most RL frameworks do. Throughput streams jobs in
(``Sandbox.map`` over one worker per core; the baseline runs one process per core at a time);
latency is measured one execution at a time. Both sides alternate in rounds within one run, so
background load hits both; throughput is the median over rounds.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rlvr.monitor.cpu import idle_cpu
from rlvr.sandbox import harness, plaindata
from rlvr.sandbox.pool import Sandbox
from rlvr.sandbox.verdict import interpret
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


def _prlimit(limits: Limits) -> list[str]:
    """util-linux ``prlimit`` sets the rlimits and execs (thread-safe, unlike preexec_fn)."""
    mb = 1 << 20
    return ["prlimit", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}", f"--as={limits.memory_mb * mb}",
            f"--fsize={limits.file_size_mb * mb}", f"--nofile={limits.open_files}", "--core=0",
            "--"]


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
    from rlvr.sandbox.worker import harness_argv

    argv = [*_prlimit(job.limits), python, *harness_argv((job_r, tr_r, rep_w))[1:]]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(job_r, tr_r, rep_w),
                            start_new_session=True)
    for fd in (job_r, tr_r, rep_w):
        os.close(fd)
    reader = threading.Thread(target=lambda: setattr(reader, "data", harness.read_all(rep_r)))
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


def _throughput(fn_many, jobs: list[Job]) -> dict:
    t0 = time.perf_counter()
    results = fn_many(jobs)
    wall = time.perf_counter() - t0
    return {"execs": len(jobs), "wall_s": wall,
            "verified": sum(verified(j, r) for j, r in zip(jobs, results))}


def _latencies(fn_one, jobs: list[Job]) -> list[float]:
    out = []
    for job in jobs:
        t = time.perf_counter()
        fn_one(job)
        out.append(time.perf_counter() - t)
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def default_baselines() -> list[str]:
    """The interpreter rlvr runs on, and Debian's system python3 (faster start-up) if present."""
    pythons = [sys.executable]
    if os.path.exists("/usr/bin/python3") and \
            os.path.realpath("/usr/bin/python3") != os.path.realpath(sys.executable):
        pythons.append("/usr/bin/python3")
    return pythons


def run_bench(n: int = 200, rounds: int = 3, workers: int | None = None, kind: str = "tests",
              baselines: list[str] | None = None, backend: str = "auto",
              attacks: bool = False) -> dict:
    """Both sides in alternating rounds; with ``attacks``, the same pool then faces the attack
    suite, so the numbers are those of a configuration that blocks every attack."""
    workers = workers or os.cpu_count() or 1
    baselines = baselines or default_baselines()
    job = make_job(kind)
    idle = idle_cpu()
    runs: dict[str, list[dict]] = {"pool": [], **{b: [] for b in baselines}}
    lats: dict[str, list[float]] = {k: [] for k in runs}
    with Sandbox(workers=workers, backend=backend) as sb:
        sb.map([job] * workers * 4)  # warm-up
        n_base = max(20, n // 6)  # the baselines are slower; fewer runs keep the rounds balanced
        for _ in range(rounds):
            # throughput: stream jobs in (the pool's map; the baseline one process per core)
            runs["pool"].append(_throughput(sb.map, [job] * n))
            for python in baselines:
                def many(js, p=python):
                    with ThreadPoolExecutor(workers) as ex:
                        return list(ex.map(lambda j: run_fresh_interpreter(j, p), js))
                runs[python].append(_throughput(many, [job] * n_base))
            # latency: one execution at a time
            lats["pool"] += _latencies(sb.run, [job] * (n // 4))
            for python in baselines:
                lats[python] += _latencies(lambda j, p=python: run_fresh_interpreter(j, p),
                                           [job] * (n_base // 4))
        name = sb.name
        blocked = None
        if attacks:
            from rlvr.sandbox.attacks import run_suite

            outcomes = run_suite(sb)
            blocked = [sum(o.blocked for _, o in outcomes), len(outcomes),
                       [a.name for a, o in outcomes if not o.blocked]]
    sides = []
    for side, rs in runs.items():
        lat = lats[side]
        sides.append({
            "side": f"rlvr {name} pool" if side == "pool" else f"fresh {side} + rlimits",
            "execs_per_s": statistics.median(r["execs"] / r["wall_s"] for r in rs),
            "p50_ms": 1e3 * _pct(lat, 0.5), "p99_ms": 1e3 * _pct(lat, 0.99),
            "verified": sum(r["verified"] for r in rs), "execs": sum(r["execs"] for r in rs),
        })
    pool = sides[0]["execs_per_s"]
    for s in sides:
        s["pool_ratio"] = pool / s["execs_per_s"]
    return {"kind": kind, "workers": workers, "rounds": rounds, "backend": name,
            "cpu_count": os.cpu_count(), "idle_cpu_before": idle, "sides": sides,
            "attacks_blocked": blocked}


def format_report(r: dict) -> str:
    idle = "unknown" if math.isnan(r["idle_cpu_before"]) else f"{100 * r['idle_cpu_before']:.0f}%"
    title = (f"sandbox bench: {r['kind']} jobs; throughput with {r['workers']} workers (pool) or "
             f"{r['workers']} processes at a time (baseline), latency one at a time; "
             f"{r['rounds']} alternating rounds; CPU idle before: {idle} of {r['cpu_count']} cores")
    header = (f"{'side':<44} {'execs/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'verified':>9} "
              f"{'pool is':>8}")
    lines = [title, header]
    for s in r["sides"]:
        lines.append(f"{s['side']:<44} {s['execs_per_s']:>8.1f} {s['p50_ms']:>7.1f} "
                     f"{s['p99_ms']:>7.1f} {s['verified']:>4}/{s['execs']:<4} "
                     f"{s['pool_ratio']:>7.1f}x")
    if r.get("attacks_blocked"):
        ok, total, failed = r["attacks_blocked"]
        lines.append(f"attack suite on the same pool: {ok}/{total} blocked"
                     + (f" (NOT blocked: {', '.join(failed)})" if failed else ""))
    lines.append("targets: pool >= 5x a fresh interpreter's throughput, pool p50 <= 15 ms")
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
    p.add_argument("--baseline-python", action="append", dest="baselines",
                   help="interpreter(s) for the baseline (default: rlvr's and /usr/bin/python3)")
    p.add_argument("--no-attacks", dest="attacks", action="store_false",
                   help="skip running the attack suite on the benchmarked pool")
    p.add_argument("--json", dest="json_path", help="also write the numbers here")


def run_from_args(args) -> int:
    kinds = ["tests", "io"] if args.kind == "both" else [args.kind]
    reports = []
    for kind in kinds:
        r = run_bench(args.n, args.rounds, args.workers, kind, args.baselines, args.backend,
                      attacks=args.attacks and kind == kinds[0])
        print(format_report(r))
        reports.append(r)
    if args.json_path:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        with open(args.json_path, "w") as f:
            json.dump(reports, f, indent=2)
        print(f"wrote {args.json_path}")
    return 0


__all__ = ["format_report", "main", "plaindata", "run_bench"]
