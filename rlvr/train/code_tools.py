"""What the monitor's code detectors need from the sandbox and the code verifier
(``rlvr.monitor.detectors.CodeTools``), assembled here, above both: the monitor package imports
neither (the sandbox's benchmarks import ``rlvr.monitor.cpu``)."""

from __future__ import annotations

import math
from typing import Any

from rlvr.monitor.detectors import CodeTools
from rlvr.sandbox import plaindata
from rlvr.sandbox.types import Job, Limits
from rlvr.types import Task
from rlvr.verifiers.code import DEFAULT_TIMEOUT, MAX_CODE_IN_DETAILS, current_sandbox


def run_examples(items: list[tuple[Task, str, list[tuple[tuple, Any]]]]) -> list[bool]:
    """Whether each program returns every expected example output (type-strict, as the code
    verifier compares), run in the code verifier's sandbox under its task's time limit."""
    jobs = []
    for task, program, examples in items:
        timeout = float(task.spec.payload.get("timeout", DEFAULT_TIMEOUT))
        jobs.append(Job.io(program, task.spec.payload["entry_point"], [a for a, _ in examples],
                           limits=Limits(wall_s=timeout, cpu_s=max(1, math.ceil(timeout))), task_id=task.id))
    results = current_sandbox().map(jobs)
    return [r.status == "ok" and r.report_ok and not r.tampered and r.compare([w for _, w in ex]) == len(ex)
            for r, (_, _, ex) in zip(results, items)]


def code_tools() -> CodeTools:
    return CodeTools(decode=plaindata.decode, run_examples=run_examples, max_code=MAX_CODE_IN_DETAILS)
