"""The sandbox as callers see it: a pool of pre-warmed workers behind a bounded queue.

    with Sandbox(workers=2) as sb:
        result = sb.run(Job.io(program, "add", [(1, 2), (3, 4)]))
        result.compare([3, 7])            # -> 2, computed here from plain data
        results = sb.map(jobs)            # batched, concurrent, in order

``submit`` returns a future and blocks while the queue is full (backpressure), so a rollout can
stream verification work in as fast as the workers take it. Each worker has its own slot (a
non-root uid on the strict root backend, allocated with a lock file so two pools on one machine
never share one) and one dispatcher thread. The nonce and the trusted verdict live here.
"""

from __future__ import annotations

import concurrent.futures as cf
import fcntl
import json
import os
import queue
import secrets
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import warnings

from rlvr.errors import UserError
from rlvr.sandbox import detect, harness, isolate, plaindata
from rlvr.sandbox.audit import AuditLog
from rlvr.sandbox.types import ExecResult, Job

UID_BASE, UID_COUNT = 61000, 1000
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
              "PYTHONDONTWRITEBYTECODE": "1"}


def _shm_root() -> str:
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    uid = os.geteuid()
    path = os.path.join(root, "rlvr-sandbox" if uid == 0 else f"rlvr-sandbox-{uid}")
    try:
        os.mkdir(path, 0o711 if uid == 0 else 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)  # in a world-writable directory: must be ours, and not a symlink
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise UserError(f"{path} exists but is not a directory owned by uid {uid}; remove it")
    os.chmod(path, 0o711 if uid == 0 else 0o700)
    return path


class _SlotLock:
    """An exclusive claim on one sandbox uid, held for the pool's life."""

    def __init__(self) -> None:
        lock_dir = os.path.join(tempfile.gettempdir(), "rlvr-sandbox-uids")
        os.makedirs(lock_dir, exist_ok=True)
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            f = open(os.path.join(lock_dir, f"{uid}.lock"), "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            self.uid, self._file = uid, f
            return
        raise UserError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_COUNT - 1}")

    def release(self) -> None:
        self._file.close()


class _WorkerProcess:
    def __init__(self, backend: detect.Backend, slot: int, python: str, bpf: bytes | None):
        self.lock = _SlotLock() if backend.name in ("forkserver", "bwrap") else None
        tag = str(self.lock.uid) if self.lock else f"{os.getpid()}-{slot}"
        self.base = os.path.join(_shm_root(), tag)
        cfg = {"backend": backend.name, "uid": self.lock.uid if self.lock else None,
               "base": self.base, "bwrap": backend.caps.bwrap,
               "seccomp_bpf": bpf.hex() if bpf else None}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # -S: no site processing (its .pth finders and their imports would make every fork of
        # the worker slower); the package directories are put on sys.path by hand instead, so
        # runs can still import installed packages.
        paths = [root, *(p for p in sys.path if p.endswith("-packages"))]
        boot = (f"import sys; sys.path[:0] = {paths!r}; "
                "from rlvr.sandbox.worker import main; main()")
        self.proc = subprocess.Popen([python, "-I", "-S", "-c", boot, json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=WORKER_ENV, close_fds=True, bufsize=0)
        hello = self._read()
        if not hello.get("ready"):
            self.close()
            raise UserError(f"sandbox worker failed to start ({backend.name}): "
                            f"{hello.get('error', '').strip().splitlines()[-1:]}")
        self.info = hello

    def _read(self) -> dict:
        head = self._read_exact(4)
        return json.loads(self._read_exact(struct.unpack(">I", head)[0]))

    def _read_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.proc.stdout.read(n - len(buf))
            if not chunk:
                raise EOFError("sandbox worker exited")
            buf += chunk
        return buf

    def call(self, untrusted: dict, trusted: bytes) -> dict:
        a = json.dumps({"job": untrusted}).encode()
        self.proc.stdin.write(struct.pack(">I", len(a)) + a + struct.pack(">I", len(trusted)) + trusted)
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)
        if self.lock:
            self.lock.release()


class Sandbox:
    def __init__(self, workers: int | None = None, backend: str = "auto", *,
                 allow_weak: bool = False, audit_path: str | None = None,
                 queue_size: int | None = None, python: str | None = None):
        self.backend = detect.choose(backend)
        if not self.backend.strict:
            message = ("sandbox: only the weak backend is available here; it does not "
                       + "; ".join(self.backend.missing))
            if not allow_weak:
                raise UserError(message + ". Run as root or enable user namespaces, or pass "
                                "allow_weak (sandbox.allow_weak=true) to accept the risk.")
            warnings.warn(message, stacklevel=2)
        n = workers or min(os.cpu_count() or 1, 8)
        self.audit = AuditLog(audit_path) if audit_path else None
        self._python = python or sys.executable
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size or 4 * n)
        self._bpf = isolate.seccomp_program(self.backend.name)
        self._workers = [_WorkerProcess(self.backend, i, self._python, self._bpf)
                         for i in range(n)]
        self._threads = [threading.Thread(target=self._dispatch, args=(i,), daemon=True,
                                          name=f"sandbox-{i}") for i in range(n)]
        self._closed = False
        for t in self._threads:
            t.start()

    @property
    def name(self) -> str:
        return self.backend.name

    def submit(self, job: Job) -> cf.Future:
        if self._closed:
            raise RuntimeError("sandbox is closed")
        fut: cf.Future = cf.Future()
        self._queue.put((job, fut))  # blocks while the queue is full
        return fut

    def run(self, job: Job) -> ExecResult:
        return self.submit(job).result()

    def map(self, jobs) -> list[ExecResult]:
        futures = [self.submit(j) for j in jobs]
        return [f.result() for f in futures]

    def _dispatch(self, i: int) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self._execute(i, job))
            except BaseException as e:  # noqa: BLE001 - the caller gets it
                fut.set_exception(e)

    def _execute(self, i: int, job: Job) -> ExecResult:
        nonce = secrets.token_hex(16)
        trusted = json.dumps({"nonce": nonce, "tests": job.tests}).encode()
        try:
            raw = self._workers[i].call(job.untrusted_part(), trusted)
        except (EOFError, BrokenPipeError, OSError) as e:
            self._restart(i)
            raw = {"status": "error", "error": f"sandbox worker died: {e}"}
        result = interpret(job, raw, nonce, self.backend.name)
        if self.audit:
            self.audit.write(job, result)
        return result

    def _restart(self, i: int) -> None:
        try:
            self._workers[i].close()
        except Exception:  # noqa: BLE001
            pass
        self._workers[i] = _WorkerProcess(self.backend, i, self._python, self._bpf)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        for w in self._workers:
            w.close()
        if self.audit:
            self.audit.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
