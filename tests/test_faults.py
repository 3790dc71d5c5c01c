"""The fault-injection matrix (``benchmarks/faults.py``): a job in a child process stopped by SIGKILL
at a named point, by a full disk, or with its newest checkpoint damaged, then resumed, finishes
with every step's metrics equal to an uninterrupted run's and no record lost. A few rows in the
default tier, the whole matrix in the slow one."""

from __future__ import annotations

import pytest

from benchmarks.faults import QUICK, ROWS, run_matrix
from rlvr.faults import _parse


def _check(results: list[dict]) -> None:
    for r in results:
        assert r["stopped_as_expected"], r
        assert r["records_lost"] == 0, r
        assert r["recovered"] and r["equal"], r


def test_a_few_faults_recover_to_the_uninterrupted_metrics(tmp_path):
    _check(run_matrix(QUICK, tmp_path))


@pytest.mark.slow
def test_the_whole_fault_matrix_recovers(tmp_path):
    _check(run_matrix([r.name for r in ROWS], tmp_path))


def test_a_point_that_names_another_process_kills_that_one(monkeypatch):
    import os
    import signal
    import subprocess
    import sys

    import rlvr.faults as faults

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(faults, "_FAULT", ("sandbox_run", 2, "kill"))
    monkeypatch.setattr(faults, "_passed", faults.Counter())
    assert faults.armed("sandbox_run") and not faults.armed("actor_chunk")
    faults.fault_point("sandbox_run", victim=lambda: victim.pid)  # the first pass: not its turn
    assert victim.poll() is None
    faults.fault_point("sandbox_run", victim=lambda: victim.pid)  # this process lives on
    assert victim.wait(timeout=10) == -signal.SIGKILL and os.getpid()


def test_a_bad_fault_spec_names_the_points_and_actions():
    assert _parse("") is None and _parse("checkpoint@3:kill") == ("checkpoint", 3, "kill")
    assert _parse("rollout:enospc") == ("rollout", 1, "enospc")
    for bad in ("nowhere:kill", "rollout:explode", "rollout@x:kill"):
        with pytest.raises(ValueError, match="POINT\\[@N\\]:ACTION"):
            _parse(bad)
