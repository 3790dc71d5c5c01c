"""The trusted reading of a worker's raw result: the nonce, test counts and plain-data outputs.

Runs in the pool's process, never in the sandbox: a report line counts only with the run's nonce,
and outputs are decoded as plain data (``rlvr.sandbox.plaindata``).
"""

from __future__ import annotations

import json

from rlvr.sandbox import harness, plaindata
from rlvr.sandbox.types import ExecResult, Job


def interpret(job: Job, raw: dict, nonce: str, backend: str) -> ExecResult:
    """The trusted reading of a worker's raw result: nonce, counts and plain-data outputs."""
    result = ExecResult(
        status=raw.get("status", "error"), backend=backend, exit_code=raw.get("exit_code"),
        signal=raw.get("signal"), stdout=raw.get("stdout", ""), stderr=raw.get("stderr", ""),
        output_bytes=raw.get("output_bytes", 0), truncated=raw.get("truncated", False),
        duration_s=raw.get("duration_s", 0.0), cpu_s=raw.get("cpu_s", 0.0),
        max_rss_kb=raw.get("max_rss_kb", 0), tampered=raw.get("tampered", []),
        error=raw.get("error", ""),
    )
    lines, forged = [], 0
    for line in raw.get("report", "").splitlines():
        head, _, body = line.partition(" ")
        if head != nonce:
            forged += 1
            continue
        try:
            lines.append(json.loads(body))
        except ValueError:
            forged += 1
    if job.kind == "io":
        _read_io(job, result, lines, forged)
    elif job.kind == "tests":
        _read_tests(job, result, lines, forged)
    else:
        result.report_ok = result.status == "ok"
    return result


def _read_io(job: Job, result: ExecResult, lines: list[dict], forged: int) -> None:
    n = len(job.inputs)
    outputs: list[dict] = [{"error": "no output"} for _ in range(n)]
    seen, done = set(), False
    for msg in lines:
        if "load_error" in msg:
            outputs = [{"error": "load: " + str(msg["load_error"])} for _ in range(n)]
        elif msg.get("done") == n:
            done = True
        elif isinstance(msg.get("i"), int) and 0 <= msg["i"] < n and msg["i"] not in seen:
            seen.add(msg["i"])
            if "ok" in msg:
                try:
                    outputs[msg["i"]] = {"ok": plaindata.decode(msg["ok"])}
                except plaindata.NotPlainData as e:
                    outputs[msg["i"]] = {"error": str(e)}
            else:
                outputs[msg["i"]] = {"error": str(msg.get("error", "error"))[:300]}
    result.outputs = outputs
    result.report_ok = done and forged == 0 and len(seen) == n


def _read_tests(job: Job, result: ExecResult, lines: list[dict], forged: int) -> None:
    try:
        result.tests_total = harness.count_tests(job.tests)
    except SyntaxError as e:
        result.tests_total, result.error = 0, f"tests do not parse: {e}"
    if len(lines) != 1 or forged:
        result.report_ok = False
        result.tests_passed, result.tests_failed = 0, result.tests_total
        if not lines:
            result.failures = ["no report from the test harness"]
        return
    msg = lines[0]
    passed, failed = msg.get("passed"), msg.get("failed")
    result.report_ok = type(passed) is int and type(failed) is int
    result.tests_passed = passed if result.report_ok else 0
    result.tests_failed = failed if result.report_ok else result.tests_total
    result.failures = [str(f)[:300] for f in msg.get("failures", [])][:20]
