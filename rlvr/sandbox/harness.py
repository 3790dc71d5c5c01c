"""The harness: the trusted code that runs inside the sandbox, after isolation is in place.

It runs in the sandbox's first process (pid 1 of its pid namespace on the strict backends) and
reports through ``report_fd``, a pipe to the worker. Each report line is ``<nonce> <json>``.

- ``io``: exec the candidate, call ``entry_point`` on each input, report each output as plain data.
  The candidate shares this process, so it could write report lines itself; that gains nothing,
  because the trusted parent compares the outputs with expected values the sandbox never saw.
- ``tests``: fork the candidate into its own process *before* the tests or the nonce are read
  (so neither is in its memory), close the report and trusted pipes there, and serve calls to
  ``entry_point`` over a plain-data pipe. The tests run here, in a process the candidate never
  executed code in, against a stub that rebuilds every return value from plain data. Patching
  builtins, forged result lines, ``sys.exit``/``os._exit`` before the tests and always-equal
  objects all fail the tests instead of passing them.
- ``program``: exec the candidate as ``__main__``; the exit status is the run's.

Only the standard library and ``plaindata`` are used, so the same code also runs as a script in
a fresh interpreter (``python -m rlvr.sandbox.harness``, the exec-path backends and the bench
baseline).
"""

from __future__ import annotations

import builtins
import json
import os
import sys

from rlvr.sandbox import plaindata

# Bytecode caches live nowhere (a path that cannot exist), so a candidate cannot plant a .pyc
# that a later import (of the tests, say) would load instead of the checked source. Only the
# interpreter's and the environment's own modules read their installed caches
# (``read_installed_bytecode``): the host wrote those, and no run can write there.
NO_PYCACHE = "/dev/null/rlvr-no-pycache"

MAX_REPLY = 16 << 20
_EXCEPTIONS = {name: obj for name, obj in vars(builtins).items()
               if isinstance(obj, type) and issubclass(obj, Exception)}


class CandidateGone(RuntimeError):
    """The candidate's process ended (or broke the call protocol) before answering."""


def count_tests(tests: str) -> int:
    """How many tests the trusted side expects: ``check`` counts once, else each ``test_*``."""
    import ast  # here, not at the top: a run on an environment image imports this module fresh

    tree = ast.parse(tests)
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if "check" in names:
        return 1
    return sum(1 for n in names if n.startswith("test_"))


def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Lines:
    """Newline-framed messages over a pipe."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def read(self) -> bytes | None:
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
            if len(self.buf) > MAX_REPLY:
                raise CandidateGone("reply too large")
        line, _, self.buf = self.buf.partition(b"\n")
        return line


def _load_candidate(program: str, name: str) -> dict:
    if "" not in sys.path:
        sys.path.insert(0, "")  # the candidate's own workspace modules (never in the tests' process)
    namespace = {"__name__": name, "__builtins__": builtins}
    exec(compile(program, "solution.py", "exec"), namespace)
    return namespace


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"


def run_io(job: dict, report) -> int:
    try:
        fn = _load_candidate(job["program"], "solution")[job["entry_point"]]
    except BaseException as e:  # noqa: BLE001 - a failed load is a verdict, not a crash
        report({"load_error": _describe(e)})
        return 0
    inputs = plaindata.loads(job["inputs"])
    for i, args in enumerate(inputs):
        try:
            out = {"i": i, "ok": plaindata.encode(fn(*args))}
        except BaseException as e:  # noqa: BLE001
            out = {"i": i, "error": _describe(e)}
        report(out)
    report({"done": len(inputs)})
    return 0


def _serve_candidate(job: dict, requests: int, replies: int) -> None:
    """The candidate's process in a ``tests`` job: answer calls until the pipe closes."""
    lines = _Lines(requests)
    try:
        fn = _load_candidate(job["program"], "solution")[job["entry_point"]]
        load_error = None
    except BaseException as e:  # noqa: BLE001
        fn, load_error = None, _describe(e)
    while (line := lines.read()) is not None:
        if load_error is not None:
            reply = {"error": "load: " + load_error, "type": "RuntimeError"}
        else:
            try:
                call = json.loads(line)
                args, kwargs = plaindata.decode(call["a"]), plaindata.decode(call["k"])
                reply = {"ok": plaindata.encode(fn(*args, **kwargs))}
            except BaseException as e:  # noqa: BLE001
                reply = {"error": _describe(e), "type": type(e).__name__}
        write_all(replies, json.dumps(reply).encode() + b"\n")


def _stub(requests: int, replies: int):
    lines = _Lines(replies)

    def candidate(*args, **kwargs):
        try:
            call = {"a": plaindata.encode(args), "k": plaindata.encode(kwargs)}
            write_all(requests, json.dumps(call).encode() + b"\n")
        except BrokenPipeError:
            raise CandidateGone("the candidate's process has exited") from None
        line = lines.read()
        if line is None:
            raise CandidateGone("the candidate's process has exited")
        try:
            reply = json.loads(line)
        except ValueError:
            raise CandidateGone("malformed reply") from None
        if "ok" in reply:
            return plaindata.decode(reply["ok"])
        exc = _EXCEPTIONS.get(str(reply.get("type")), RuntimeError)
        raise exc(str(reply.get("error", "error"))[:300])

    return candidate


def run_tests(job: dict, trusted_fd: int, report_fd: int, report_factory, after_fork) -> int:
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    after_fork()
    if pid == 0:  # the candidate: nothing trusted is in this memory yet
        code = 0
        try:
            for fd in (trusted_fd, report_fd, req_w, rep_r):
                os.close(fd)
            _serve_candidate(job, req_r, rep_w)
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(req_r)
    os.close(rep_w)
    _no_dumping()
    trusted = json.loads(read_all(trusted_fd))
    report = report_factory(trusted["nonce"])
    candidate = _stub(req_w, rep_r)
    namespace = {"__name__": "tests", "__builtins__": builtins, job["entry_point"]: candidate,
                 "candidate": candidate}
    passed, failures = 0, []
    try:
        exec(compile(trusted["tests"], "tests.py", "exec"), namespace)
        if callable(namespace.get("check")):
            tests = [("check", lambda: namespace["check"](candidate))]
        else:
            tests = [(k, v) for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    except BaseException as e:  # noqa: BLE001
        tests, failures = [], [f"<load>: {_describe(e)}"]
    for name, test in tests:
        try:
            test()
            passed += 1
        except BaseException as e:  # noqa: BLE001 - SystemExit from a test is a failure too
            failures.append(f"{name}: {_describe(e)}")
    report({"passed": passed, "failed": len(failures), "failures": failures[:20]})
    os.close(req_w)
    return 0


def run_program(job: dict) -> int:
    sys.argv = ["main.py"]
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        exec(compile(job["program"], "main.py", "exec"),
             {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _no_dumping() -> None:
    """Keep same-uid processes out of this one's memory (ptrace, /proc/<pid>/mem)."""
    try:
        from rlvr.sandbox import kernel
        if kernel.LINUX:
            kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    except OSError:
        pass


def main(job: dict, trusted_fd: int, report_fd: int, after_fork=lambda: None) -> int:
    """Run one job in this (already isolated) process; returns the exit status to use.

    ``after_fork`` runs in both processes of a ``tests`` job right after the split (the weak
    backend installs its no-new-processes seccomp filter there, after the one fork it allows).
    """
    write = os.write  # captured before any candidate code runs

    def report_factory(nonce: str):
        def report(obj) -> None:
            data = (nonce + " " + json.dumps(obj) + "\n").encode()
            view = memoryview(data)
            while view:
                view = view[write(report_fd, view):]
        return report

    if job["kind"] == "tests":
        return run_tests(job, trusted_fd, report_fd, report_factory, after_fork)
    trusted = json.loads(read_all(trusted_fd))
    os.close(trusted_fd)
    if job["kind"] == "io":
        return run_io(job, report_factory(trusted["nonce"]))
    if job["kind"] == "program":
        return run_program(job)
    raise ValueError(f"harness cannot run job kind {job['kind']!r}")


def read_installed_bytecode(ws: str) -> None:
    """Imports of modules under the worker's own import path (the standard library, the
    environment's packages, rlvr: files the host wrote and no run can) read their
    ``__pycache__`` again; every other source, the workspace's above all, keeps the cache path
    ``NO_PYCACHE``, so it is compiled and never read from a cache. Without this a run importing
    numpy compiled it from source (0.45 s a job). An entry holding the workspace, or inside it,
    is left out (it would let a run's own files in)."""
    import _frozen_importlib_external as bootstrap

    ws = os.path.join(os.path.abspath(ws), "")
    entries = {os.path.join(os.path.abspath(p), "") for p in sys.path if p and os.path.isabs(p)}
    roots = tuple(p for p in entries if p != os.sep and not ws.startswith(p) and not p.startswith(ws))
    compiled = bootstrap.cache_from_source

    def cache_from_source(path, debug_override=None, *, optimization=None):
        if not os.path.abspath(path).startswith(roots):
            return compiled(path, debug_override, optimization=optimization)
        sys.pycache_prefix = None
        try:
            return compiled(path, debug_override, optimization=optimization)
        finally:
            sys.pycache_prefix = NO_PYCACHE

    bootstrap.cache_from_source = cache_from_source


def flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)


def exec_main(argv: list[str]) -> None:
    """The exec path: a fresh interpreter (an environment image's, or the bench baseline's) runs
    the job on fds ``argv`` = job, trusted, report (default 3 4 5), already isolated by its parent.
    Workspace sources never read a byte-code cache; the interpreter's own modules do."""
    job_fd, trusted_fd, report_fd = (int(x) for x in (argv[:3] or (3, 4, 5)))
    sys.pycache_prefix = NO_PYCACHE
    read_installed_bytecode(os.getcwd())
    run_pid = os.getpid()

    def after_fork() -> None:  # the tests job's candidate process dies with the tests' process
        if os.getpid() != run_pid:
            try:
                from rlvr.sandbox import kernel
                import signal
                if kernel.LINUX:
                    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
                    if os.getppid() != run_pid:
                        os._exit(70)
            except OSError:
                pass

    code = 70
    try:
        code = main(json.loads(read_all(job_fd)), trusted_fd=trusted_fd, report_fd=report_fd,
                    after_fork=after_fork)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    flush_and_exit(code)


if __name__ == "__main__":
    exec_main(sys.argv[1:])
