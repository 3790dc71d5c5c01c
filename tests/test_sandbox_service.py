"""The sandbox as a service: runs die with the process that owns the pool, runs that only wait do
not hold the CPU slots (elastic slots with CPU accounting), CPU-bound runs are not oversubscribed
into false timeouts, and spinners are killed by their CPU limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from rlvr.sandbox import Job, Limits, Sandbox, attacks, detect

ROOT = Path(__file__).resolve().parents[1]
SLEEPER = "import time\ndef f(x):\n    while True:\n        time.sleep(0.05)\n"
FAST = "def f(x):\n    return x * 3 + 1\n"
SPINNER = "def f(x):\n    while True:\n        pass\n"
WORK = "def f(n):\n    s = 0\n    for i in range(n):\n        s += i * i % 7\n    return s\n"


def _available(name: str) -> bool:
    try:
        detect.choose(name)
    except Exception:  # noqa: BLE001 - not on this machine
        return False
    return True


BACKEND_PARAMS = [pytest.param(name, marks=pytest.mark.skipif(not _available(name),
                                                               reason=f"no {name} backend here"))
                  for name in ("forkserver", "forkserver-userns", "bwrap", "weak")]


# The owner: opens a pool, starts one run that sleeps in a loop in two processes (one where the
# backend refuses new processes), each carrying a marker in its command line, then waits.
OWNER = textwrap.dedent('''
    import sys, time
    from rlvr.sandbox import Job, Limits, Sandbox
    backend, marker, wall = sys.argv[1], sys.argv[2], float(sys.argv[3])
    loop = "import os, time\\ntry:\\n    os.fork()\\nexcept OSError:\\n    pass\\nwhile True:\\n    time.sleep(0.05)\\n"
    sb = Sandbox(workers=1, backend=backend, allow_weak=True)
    if backend == "bwrap":  # command jobs are the ones bubblewrap runs
        job = Job.command(["python3", "-c", loop, marker], limits=Limits(wall_s=wall))
    else:
        prog = f"import os, sys\\nos.execv(sys.executable, [sys.executable, '-c', {loop!r}, {marker!r}])\\n"
        job = Job.run_program(prog, limits=Limits(wall_s=wall))
    sb.submit(job)
    print("submitted", flush=True)
    time.sleep(120)
''')


def _wait_for(fn, timeout: float, every: float = 0.02):
    deadline = time.monotonic() + timeout
    while not (found := fn()) and time.monotonic() < deadline:
        time.sleep(every)
    return found


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_runs_die_with_the_pools_owner(backend):
    wall = 3.0
    marker = f"rlvr-owner-test-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, backend, marker, str(wall)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        expected = 1 if backend == "weak" else 2  # the weak backend refuses the fork
        runs = lambda: [p for p in attacks.marker_pids(marker) if p != owner.pid]
        seen = _wait_for(lambda: len(runs()) >= expected, timeout=20)
        assert seen, f"the run never started: {owner.stderr.read1().decode()[-2000:] if owner.poll() is not None else ''}"
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        killed = time.monotonic()
        left = _wait_for(lambda: not attacks.marker_pids(marker), timeout=wall + 1.5)
        took = time.monotonic() - killed
        assert left, (f"{backend}: {attacks.marker_pids(marker)} still alive {took:.1f}s after "
                      f"the pool's owner was killed (wall limit {wall}s)")
        assert took <= wall + 1.5
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        attacks.sweep(marker)


@pytest.fixture(scope="module")
def strict_backend():
    if not detect.choose("auto").strict:
        pytest.skip("no strict sandbox backend here")


def _io(program: str, arg, limits: Limits) -> Job:
    return Job.io(program, "f", [(arg,)], limits=limits)


def test_sleepers_do_not_block_a_batch(strict_backend):
    limits = Limits(wall_s=1.0, cpu_s=1)
    fast = [_io(FAST, i, limits) for i in range(60)]
    with Sandbox(workers=2, max_slots=16) as sb:
        sb.map(fast[:4])  # warm
        t0 = time.perf_counter()
        sb.map(fast)
        fast_only = time.perf_counter() - t0
        # six sleepers interleaved with the same sixty fast jobs: on two fixed slots they would
        # hold both for three wall limits
        jobs = list(fast)
        for k in range(6):
            jobs.insert(k * 11, _io(SLEEPER, 0, limits))
        t0 = time.perf_counter()
        results = sb.map(jobs)
        mixed = time.perf_counter() - t0
    sleepers = [r for j, r in zip(jobs, results) if j.program == SLEEPER]
    quick = [(j, r) for j, r in zip(jobs, results) if j.program == FAST]
    assert [r.status for r in sleepers] == ["timeout"] * 6
    assert all(r.status == "ok" and r.compare([j.inputs[0][0] * 3 + 1]) == 1 for j, r in quick)
    assert mixed < fast_only + limits.wall_s + 1.0, (mixed, fast_only)


def _calibrate(seconds: float) -> tuple[int, int]:
    """(n, f(n)) where WORK's f(n) takes about ``seconds`` in this interpreter."""
    namespace: dict = {}
    exec(WORK, namespace)  # noqa: S102 - our own program
    n = 20_000
    while True:
        t0 = time.perf_counter()
        namespace["f"](n)
        took = time.perf_counter() - t0
        if took > 0.05:
            n = int(n * seconds / took)
            return n, namespace["f"](n)
        n *= 4


def test_cpu_bound_runs_next_to_sleepers_are_not_oversubscribed(strict_backend):
    # Sixteen runs of ~0.25 s of arithmetic each, on two cores, behind four sleepers: the
    # sleepers make the pool grow, but only two runs may compute at once, so none of the sixteen
    # gets less than a core and none reaches its 1.5 s wall limit (all at once would take ~2 s).
    n, value = _calibrate(0.25)
    limits = Limits(wall_s=1.5, cpu_s=2)
    jobs = [_io(SLEEPER, 0, limits) for _ in range(4)] + [_io(WORK, n, limits) for _ in range(16)]
    with Sandbox(workers=2, max_slots=24) as sb:
        results = sb.map(jobs)
        grew = sb.peak_slots
    assert [r.status for r in results[:4]] == ["timeout"] * 4
    work = results[4:]
    assert [r.status for r in work] == ["ok"] * 16, [(r.status, round(r.duration_s, 2)) for r in work]
    assert all(r.compare([value]) == 1 for r in work)
    assert grew > 2  # the sleepers did not hold the only slots


def test_spinners_are_killed_by_cpu_time_under_contention(strict_backend):
    # Three spinners and three sleepers on two CPU slots: each spinner ends at its 1 s CPU limit,
    # long before its wall limit, and the sleepers at theirs.
    spin = Limits(wall_s=5.0, cpu_s=1)
    nap = Limits(wall_s=1.5, cpu_s=1)
    jobs = [_io(SPINNER, 0, spin) for _ in range(3)] + [_io(SLEEPER, 0, nap) for _ in range(3)]
    with Sandbox(workers=2, max_slots=8) as sb:
        results = sb.map(jobs)
    for r in results[:3]:  # "killed" (by the CPU limit's signal), not "timeout" (the wall)
        assert r.status == "killed" and r.signal in (signal.SIGXCPU, signal.SIGKILL), r.status
        assert 0.9 <= r.cpu_s <= 1.3, r.cpu_s
    assert [r.status for r in results[3:]] == ["timeout"] * 3


def test_pool_works_on_when_extra_slots_cannot_start(strict_backend, monkeypatch):
    # No free uid for an extra slot, say: the jobs still run on the pre-warmed slots, and the
    # pool does not retry the start on every accounting tick.
    from rlvr.errors import UserError
    from rlvr.sandbox import pool

    calls = []

    def refuse(*args, **kwargs):
        calls.append(1)
        raise UserError("no free sandbox uid")

    limits = Limits(wall_s=0.5, cpu_s=1)
    with Sandbox(workers=2, max_slots=8) as sb:
        monkeypatch.setattr(pool, "_WorkerProcess", refuse)
        jobs = [_io(SLEEPER, 0, limits) for _ in range(2)] + [_io(FAST, i, limits) for i in range(6)]
        results = sb.map(jobs)
        monkeypatch.undo()
    assert [r.status for r in results[:2]] == ["timeout"] * 2
    assert [r.compare([i * 3 + 1]) for i, r in enumerate(results[2:])] == [1] * 6
    assert calls, "the sleepers gave their CPU shares back, so the pool must have tried an extra slot"
    # the failed start pauses growth for pool.RETRY_S (5 s), longer than this batch: a retry on
    # every 5 ms accounting tick would have made about a hundred attempts
    assert len(calls) <= 4, f"{len(calls)} attempts to start an extra slot"
