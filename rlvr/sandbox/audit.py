"""The audit log: one JSON line per execution, appended as results arrive (thread-safe)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

from rlvr.sandbox.types import ExecResult, Job


def code_hash(job: Job) -> str:
    text = job.program if job.kind != "command" else "\0".join(job.argv)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record(job: Job, result: ExecResult) -> dict:
    rec = {
        "time": round(time.time(), 3), "task_id": job.task_id, "kind": job.kind,
        "code_sha256": code_hash(job), "backend": result.backend, "limits": job.limits.to_dict(),
        "status": result.status, "exit_code": result.exit_code, "signal": result.signal,
        "duration_s": round(result.duration_s, 5), "cpu_s": round(result.cpu_s, 5),
        "max_rss_kb": result.max_rss_kb, "output_bytes": result.output_bytes,
        "report_ok": result.report_ok, "tampered": result.tampered,
    }
    if job.kind == "tests":
        rec.update(tests_total=result.tests_total, tests_passed=result.tests_passed,
                   passed=result.passed)
    if job.kind == "io":
        rec["outputs"] = len(result.outputs or [])
    if result.error:
        rec["error"] = result.error[:500]
    return rec


class AuditLog:
    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, job: Job, result: ExecResult) -> None:
        line = json.dumps(record(job, result)) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_audit(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
