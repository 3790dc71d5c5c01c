"""A pre-warmed sandbox worker: one long-lived process per slot that forks once per run.

Started by ``pool.Sandbox`` with a minimal environment and a JSON config in ``argv[1]``. It sets
itself up once (child subreaper; on the strict backends a private mount and network namespace,
with no interface but a downed loopback; the slot's uid), then loops: read a job from fd 0, run
it, write the result to fd 1. Frames are a 4-byte big-endian length plus JSON.

Per run the worker forks the run's first process into a fresh pid namespace (it is pid 1, so
when it exits or is killed the kernel kills everything it left behind), collects stdout, stderr
and the harness report with caps, enforces the wall-clock limit, reaps, checks protected files'
hashes and removes the workspace. The trusted part of a job (the tests and the nonce) is never
parsed here: it is copied from the request pipe into the run's pipe and the buffer is zeroed,
so a later run's fork of this worker cannot find it in memory.
"""

from __future__ import annotations

import collections
import fcntl
import gc
import hashlib
import json
import os
import select
import shutil
import signal
import struct
import sys
import time
import traceback

from rlvr.sandbox import bwrap, harness, image_exec, isolate, kernel
from rlvr.sandbox.harness import NO_PYCACHE, read_installed_bytecode

F_SETPIPE_SZ = 1031
REPORT_MAX = 16 << 20
SETUP_FAILED = "rlvr.sandbox: setup failed"
MAX_WARM = 2  # warm image workers a worker keeps (the least recently used one is closed)
# Imported once here so runs get them for free; kept lean, since every page of the worker is
# page-table work in each fork.
PRELOAD = ("math", "itertools", "functools", "collections", "heapq", "bisect", "re", "string",
           "operator", "copy")


# ---- framing -------------------------------------------------------------------------------

def read_exact(fd: int, n: int, into: bytearray | None = None) -> bytearray:
    buf = into if into is not None else bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = os.readv(fd, [view[got:n]])
        if k == 0:
            raise EOFError("request pipe closed")
        got += k
    return buf


def read_frame(fd: int) -> bytearray:
    (n,) = struct.unpack(">I", read_exact(fd, 4))
    return read_exact(fd, n)


def write_frame(fd: int, payload: bytes) -> None:
    harness.write_all(fd, struct.pack(">I", len(payload)) + payload)


# ---- output capture ------------------------------------------------------------------------

class Capture:
    """Keep the first ``head`` bytes and the last ``tail`` bytes of a stream; count the rest."""

    def __init__(self, head: int, tail: int = 4096):
        self.head, self.tail_max = bytearray(), tail
        self.head_max, self.tail = head, collections.deque()
        self.tail_len = self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_max:
            self.tail.append(data)
            self.tail_len += len(data)
            while self.tail_len - len(self.tail[0]) >= self.tail_max:
                self.tail_len -= len(self.tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(self.tail_len, self.tail_max)

    def text(self) -> str:
        out = bytes(self.head)
        if self.tail:
            tail = b"".join(self.tail)[-self.tail_max:]
            if self.truncated:
                out += f"\n...[{self.total - len(self.head) - len(tail)} bytes cut]...\n".encode()
            out += tail
        return out.decode("utf-8", "replace")


# ---- the worker ----------------------------------------------------------------------------

class Worker:
    def __init__(self, cfg: dict, req: int, resp: int):
        self.cfg, self.req, self.resp = cfg, req, resp
        self.backend = cfg["backend"]
        self.base = cfg["base"]
        self.counter = 0
        self.own_pidns = None
        self.warm: dict[str, _WarmWorker] = {}  # image directory -> its warm worker
        self.warm_failed: set[str] = set()
        self._setup()

    def _setup(self) -> None:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        uid = self.cfg.get("uid")
        if kernel.LINUX:
            kernel.prctl(kernel.PR_SET_CHILD_SUBREAPER, 1)
            kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
            if self.cfg.get("owner") and os.getppid() != self.cfg["owner"]:
                raise SystemExit("the pool that started this worker is gone")  # died meanwhile
        # Environment images (and the harness copy they run) must be reachable; which of them
        # a run may read is decided per run (``isolate.enter(extra_read=...)``).
        reachable = isolate.python_paths() + ([self.cfg["images"]] if self.cfg.get("images") else [])
        if self.backend in ("forkserver", "bwrap"):
            kernel.unshare(kernel.CLONE_NEWNS | kernel.CLONE_NEWNET)
            # A slave, not private: overlay workspaces mounted later under the shared
            # ``overlay.ROOT`` still appear here; nothing mounted here propagates back.
            kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_SLAVE)
            isolate.expose_paths(reachable)
            isolate.hide_socket_dirs([self.base, *reachable])
        elif self.backend == "forkserver-userns":
            real_uid, real_gid = os.getuid(), os.getgid()
            kernel.unshare(kernel.CLONE_NEWUSER | kernel.CLONE_NEWNS | kernel.CLONE_NEWNET)
            kernel.write_id_maps(0, real_uid, 0, real_gid)
            kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
            isolate.hide_socket_dirs([self.base, *reachable])
        os.makedirs(self.base, mode=0o711, exist_ok=True)
        bpf = bytes.fromhex(self.cfg["seccomp_bpf"]) if self.cfg.get("seccomp_bpf") else None
        self.plan = isolate.build_plan(self.backend, uid, self.base, bpf)
        if self.backend != "weak" and not (self.plan.seccomp_bpf and self.plan.landlock_abi):
            raise RuntimeError(f"backend {self.backend} needs seccomp and landlock: "
                               f"seccomp={bool(self.plan.seccomp_bpf)} "
                               f"landlock_abi={self.plan.landlock_abi}")
        if self.plan.pid_namespace and self.backend != "forkserver-userns":
            self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        for name in PRELOAD:
            __import__(name)
        gc.freeze()  # keep the preloaded heap out of the runs' collections (fewer copied pages)

    # -- workspace --

    def _workspace(self, job: dict) -> tuple[str, bool]:
        if job.get("workdir"):
            return job["workdir"], False
        self.counter += 1
        ws = os.path.join(self.base, f"run-{self.counter}")
        if os.path.lexists(ws):
            _remove_tree(ws)
        os.mkdir(ws)
        os.chmod(ws, 0o1777)  # sticky: the candidate may add files, not remove protected ones
        uid = self.plan.uid
        for rel, content in job.get("files", {}).items():
            path = _inside(ws, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            data = content.encode() if isinstance(content, str) else bytes(content)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if rel in job.get("protected", []):
                os.chmod(path, 0o444)
            elif uid is not None:
                os.chown(path, uid, uid)
        for dirpath, _dirs, _files in os.walk(ws):
            os.chmod(dirpath, 0o1777)
        return ws, True

    # -- one run --

    def run(self, job: dict, trusted: bytearray) -> dict:
        if job.get("image"):
            warm = self._warm(job["image"])
            if warm is not None:
                try:
                    return warm.call(job, trusted, self.resp)
                except _WarmGone as e:  # lost before the run started: the exec path below runs it
                    self._drop_warm(warm)
                    if e.started:
                        return {"status": "error", "error": "the image's worker died mid-run", "duration_s": 0.0}
        t0 = time.perf_counter()
        limits = job["limits"]
        try:
            ws, fresh = self._workspace(job)
            hashes = {p: _hash(_inside(ws, p)) for p in job.get("protected", [])}
        except (OSError, ValueError) as e:
            return {"status": "error", "error": f"workspace: {e}", "duration_s": 0.0}
        pipes = {name: os.pipe() for name in ("out", "err", "rep", "trusted", "stdin")}
        try:
            _fill(pipes["trusted"], trusted)
            _fill(pipes["stdin"], job.get("stdin", "").encode())
        except OSError as e:
            for r, w in pipes.values():
                _close(r, w)
            return {"status": "error", "error": f"input too large: {e}", "duration_s": 0.0}
        finally:
            trusted[:] = bytes(len(trusted))
        if self.own_pidns is not None:
            kernel.unshare(kernel.CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            self._child(job, ws, pipes)  # never returns
        if self.own_pidns is not None:
            kernel.setns(self.own_pidns, kernel.CLONE_NEWPID)
        write_frame(self.resp, json.dumps({"started": pid}).encode())  # for CPU accounting
        for name, (r, w) in pipes.items():
            os.close(w)
            if name in ("trusted", "stdin"):
                os.close(r)
        out = self._collect(pid, pipes, limits, t0)
        out["tampered"] = [p for p, h in hashes.items() if _hash(_inside(ws, p)) != h]
        if fresh:
            _remove_tree(ws)
        _reap_orphans()
        out["duration_s"] = time.perf_counter() - t0
        return out

    # -- environment images: a warm worker on the image's interpreter --

    def _warm(self, image: str) -> _WarmWorker | None:
        """The warm worker of ``image`` (started on first use, at most ``MAX_WARM`` kept); None
        where it cannot start: the run then execs the image's interpreter (``_exec_harness``)."""
        real = os.path.realpath(image)
        if not self.cfg.get("harness") or os.path.dirname(real) != self.cfg.get("images") or self.backend == "weak":
            return None
        if real in self.warm:
            self.warm[real] = self.warm.pop(real)  # most recently used last
            return self.warm[real]
        if real in self.warm_failed:
            return None
        try:
            worker = _WarmWorker(real, {**self.cfg, "base": os.path.join(self.base, "img-" + os.path.basename(real)[:16]),
                                        "owner": os.getpid()})
        except (OSError, EOFError, ValueError, RuntimeError):
            self.warm_failed.add(real)
            return None
        self.warm[real] = worker
        while len(self.warm) > MAX_WARM:
            self._drop_warm(next(iter(self.warm.values())))
        return worker

    def _drop_warm(self, worker: _WarmWorker) -> None:
        self.warm.pop(worker.image, None)
        worker.close()

    def _child(self, job: dict, ws: str, pipes: dict) -> None:
        code = 70
        use_bwrap = self.backend == "bwrap" and job["kind"] == "command"
        image = job.get("image") or ""
        job_fd = None
        try:
            for name, (r, w) in pipes.items():  # the worker's ends, never the run's
                os.close(w if name in ("trusted", "stdin") else r)
            os.dup2(pipes["stdin"][0], 0)
            os.dup2(pipes["out"][1], 1)
            os.dup2(pipes["err"][1], 2)
            if self.plan.pid_namespace and self.own_pidns is None:
                _relay_into_new_pid_namespace(parent_fd=1)
            keep = [pipes["rep"][1], pipes["trusted"][0]]
            # The weak backend forbids new processes, so a tests job filters after its split.
            split_first = not self.plan.pid_namespace and job["kind"] == "tests"
            extra = []
            if image:
                if split_first:
                    raise RuntimeError("a tests job on an environment image needs a strict backend")
                image = os.path.realpath(image)
                if not self.cfg.get("harness") or os.path.dirname(image) != self.cfg["images"]:
                    raise RuntimeError(f"image {image} is not under this pool's images root")
                extra = [image, self.cfg["harness"]]
                if job["kind"] != "command":  # the job, for the image's harness to read
                    job_fd = os.memfd_create("rlvr-job")
                    harness.write_all(job_fd, json.dumps(job).encode())
                    os.lseek(job_fd, 0, os.SEEK_SET)
                    keep.append(job_fd)
            isolate.enter(self.plan, ws, job["limits"], keep, landlock=not use_bwrap,
                          filter_syscalls=not (use_bwrap or split_first), parent_fd=1,
                          read_only=bool(job.get("read_only")), extra_read=extra)
        except BaseException:  # noqa: BLE001 - never run untrusted code half-isolated
            os.write(2, f"{SETUP_FAILED}: {traceback.format_exc()}".encode())
            harness.flush_and_exit(70)
        try:
            if job["kind"] == "command":
                self._exec(job, ws, use_bwrap, extra)
            if image:
                self._exec_harness(job, ws, image, (job_fd, pipes["trusted"][0], pipes["rep"][1]))
            os.environ.update({"HOME": ws, "TMPDIR": ws, **job.get("env", {})})
            sys.pycache_prefix = NO_PYCACHE
            read_installed_bytecode(ws)
            run_pid = os.getpid()

            def after_fork() -> None:  # in the tests job's two processes, after its split
                if os.getpid() != run_pid:  # the candidate's process dies with the run
                    isolate.die_with_parent(parent_pid=run_pid)
                if split_first and self.plan.seccomp_bpf:
                    kernel.seccomp_load_bpf(self.plan.seccomp_bpf)
            code = harness.main(job, trusted_fd=pipes["trusted"][0], report_fd=pipes["rep"][1],
                                after_fork=after_fork)
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        harness.flush_and_exit(code)

    def _exec(self, job: dict, ws: str, use_bwrap: bool, extra_read: list[str]) -> None:
        # Everything the run's process calls is imported by the worker beforehand: after the
        # switch to the slot uid the rlvr checkout may not be readable.
        image = job.get("image") or ""
        bin_dirs = (os.path.join(image, "venv", "bin") + ":") if image else ""
        env = {"PATH": f"{bin_dirs}/usr/local/bin:/usr/bin:/bin", "HOME": ws, "TMPDIR": ws,
               "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONPYCACHEPREFIX": NO_PYCACHE, **job.get("env", {})}
        argv = list(job["argv"])
        if argv and argv[0] in ("python", "python3"):
            # the image's interpreter, or the one rlvr runs on, with its packages
            argv[0] = image_exec.python_of(image) if image else sys.executable
        if use_bwrap:
            argv = bwrap.wrap(self.cfg["bwrap"], argv, ws, job.get("protected", []),
                              isolate.SYSTEM_READ_ONLY + isolate.python_paths() + extra_read, env,
                              workdir_read_only=bool(job.get("read_only")))
            env = {}
        path = shutil.which(argv[0], path=env.get("PATH", "/usr/bin:/bin")) or argv[0]
        os.execve(path, argv, env)

    def _exec_harness(self, job: dict, ws: str, image: str, fds: tuple[int, int, int]) -> None:
        """An io/tests/program job on an image: its interpreter runs the harness copy."""
        for fd in fds:
            os.set_inheritable(fd, True)
        env = {"PATH": f"{os.path.join(image, 'venv', 'bin')}:/usr/local/bin:/usr/bin:/bin", "HOME": ws,
               "TMPDIR": ws, "LANG": "C.UTF-8", **job.get("env", {})}
        argv = image_exec.harness_argv(image, self.cfg["harness"], fds)
        os.execve(argv[0], argv, env)

    def _collect(self, pid: int, pipes: dict, limits: dict, t0: float) -> dict:
        """Read the run's output until it exits, times out or writes too much; reap it."""
        keep = limits["output_kb"] * 1024
        caps = {pipes["out"][0]: Capture(keep), pipes["err"][0]: Capture(keep),
                pipes["rep"][0]: Capture(REPORT_MAX, tail=0)}
        pidfd = _pidfd(pid)
        status, exited_at = self._drain(pid, pidfd, caps, pipes, t0 + float(limits["wall_s"]),
                                        limits["output_kill_mb"] << 20)
        if status != "ok" or exited_at is None:
            _kill(pid)
        if not self.plan.pid_namespace:
            _killpg(pid)
        _, wstatus, usage = os.wait4(pid, 0)
        for fd in list(caps) + ([pidfd] if pidfd is not None else []):
            os.close(fd)
        return _result(status, wstatus, usage, caps[pipes["out"][0]], caps[pipes["err"][0]], caps[pipes["rep"][0]])

    def _drain(self, pid: int, pidfd: int | None, caps: dict, pipes: dict, deadline: float,
               kill_at: int) -> tuple[str, float | None]:
        """Poll the pipes (and the pidfd) into ``caps``: (status, when the process exited or None)."""
        poller = select.poll()
        for fd in caps:
            poller.register(fd, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        open_fds, status, exited_at = set(caps), "ok", None
        while open_fds:
            now = time.perf_counter()
            if now >= deadline:
                status = "timeout"
                break
            if exited_at is not None and now - exited_at > 0.2:
                break  # the run's process is gone and something it left still holds a pipe
            wait = deadline - now if exited_at is None else 0.05
            for fd, _ev in poller.poll(max(1, int(wait * 1000))):
                if fd == pidfd:
                    poller.unregister(pidfd)
                    exited_at = time.perf_counter()
                    if not self.plan.pid_namespace:
                        _killpg(pid)
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                caps[fd].add(data)
                shown = caps[pipes["out"][0]].total + caps[pipes["err"][0]].total
                if shown > kill_at or caps[pipes["rep"][0]].total > REPORT_MAX:
                    status = "output_limit"
                    open_fds.clear()
                    break
        return status, exited_at

    def serve(self) -> None:
        while True:
            try:
                header = json.loads(read_frame(self.req))
                trusted = read_frame(self.req)
            except EOFError:
                return
            try:
                result = self.run(header["job"], trusted)
            except Exception as e:  # noqa: BLE001 - report, keep serving
                result = {"status": "error", "error": f"worker: {type(e).__name__}: {e}",
                          "duration_s": 0.0}
            write_frame(self.resp, json.dumps(result).encode())


class _WarmGone(Exception):
    def __init__(self, started: bool) -> None:
        super().__init__("the image's warm worker is gone")
        self.started = started


class _WarmWorker:
    """A worker like this one, running on an environment image's interpreter (this module and the
    ones it imports are stdlib-only; they come from the pool's harness copy), started inside this
    worker's namespaces: image runs fork from it in a few milliseconds instead of starting a fresh
    interpreter each. Only that image's environment is on its path and readable to its runs."""

    def __init__(self, image: str, cfg: dict) -> None:
        self.image = image
        lib = os.path.join(image, "venv", "lib")
        site = [os.path.join(lib, d, "site-packages") for d in sorted(os.listdir(lib)) if d.startswith("python")]
        boot = (f"import sys; sys.path[:0] = {[cfg['harness'], *site]!r}; "
                "from rlvr.sandbox.worker import main; main()")
        argv = [image_exec.python_of(image), "-I", "-S", "-c", boot, json.dumps(cfg)]
        req_r, self.req = os.pipe()
        self.resp, resp_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.dup2(req_r, 0)
                os.dup2(resp_w, 1)
                os.closerange(3, 1 << 16)
                os.execve(argv[0], argv, {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
            finally:
                os._exit(70)
        os.close(req_r)
        os.close(resp_w)
        hello = json.loads(read_frame(self.resp))
        if not hello.get("ready"):
            self.close()
            raise RuntimeError(f"image worker failed to start: {hello.get('error', '')[-300:]}")

    def call(self, job: dict, trusted: bytearray, resp: int) -> dict:
        """Run ``job`` there (as a plain job: the image is its own interpreter), relaying its
        ``started`` frame to ``resp``; the trusted bytes are zeroed here once sent."""
        started = False
        try:
            write_frame(self.req, json.dumps({"job": {**job, "image": ""}}).encode())
            write_frame(self.req, bytes(trusted))
        except OSError:
            raise _WarmGone(started) from None
        finally:
            trusted[:] = bytes(len(trusted))
        while True:
            try:
                frame = json.loads(read_frame(self.resp))
            except (EOFError, OSError, ValueError):
                raise _WarmGone(started) from None
            if "started" in frame:
                started = True
                write_frame(resp, json.dumps(frame).encode())
                continue
            return frame

    def close(self) -> None:
        for fd in (self.req, self.resp):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def harness_argv(fds: tuple[int, int, int] = (3, 4, 5)) -> list[str]:
    """A fresh interpreter running the harness on (job, trusted, report) fds."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    boot = (f"import sys; sys.path.insert(0, {root!r}); import runpy; "
            "runpy.run_module('rlvr.sandbox.harness', run_name='__main__')")
    return [sys.executable, "-I", "-c", boot, *map(str, fds)]


# ---- helpers -------------------------------------------------------------------------------

def _inside(ws: str, rel: str) -> str:
    path = os.path.normpath(os.path.join(ws, rel))
    if os.path.isabs(rel) or not path.startswith(ws.rstrip(os.sep) + os.sep):
        raise ValueError(f"path escapes the workspace: {rel!r}")
    return path


def _hash(path: str) -> str | None:
    """sha256 of a protected file; None (so: tampered) if it is gone or reached via a symlink."""
    if os.path.realpath(path) != path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _fill(pipe: tuple[int, int], data) -> None:
    _, w = pipe
    if len(data) > 60_000:
        fcntl.fcntl(w, F_SETPIPE_SZ, min(1 << 20, len(data) + 4096))
    if data:
        harness.write_all(w, bytes(data) if isinstance(data, bytearray) else data)


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _relay_into_new_pid_namespace(parent_fd: int) -> None:
    """Without setns rights (user-namespace workers): fork once more so the run is pid 1. The
    relay dies with the worker, and the run (which re-arms after isolating) with the relay."""
    isolate.die_with_parent(parent_fd)
    kernel.unshare(kernel.CLONE_NEWPID)
    pid = os.fork()
    if pid == 0:
        isolate.die_with_parent(parent_fd)
        return
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + 9)


def _result(status: str, wstatus: int, usage, out_cap: Capture, err_cap: Capture, rep_cap: Capture) -> dict:
    """The worker's reply for one reaped run."""
    stderr = err_cap.text()
    exit_code = os.waitstatus_to_exitcode(wstatus)
    result = {
        "status": status, "exit_code": exit_code if exit_code >= 0 else None,
        "signal": -exit_code if exit_code < 0 else None,
        "stdout": out_cap.text(), "stderr": stderr,
        "output_bytes": out_cap.total + err_cap.total,
        "truncated": out_cap.truncated or err_cap.truncated,
        "report": bytes(rep_cap.head).decode("utf-8", "replace"),
        "cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_kb": usage.ru_maxrss, "error": "",
    }
    if status == "ok" and exit_code == 70 and stderr.startswith(SETUP_FAILED):
        result.update(status="error", error=stderr.splitlines()[0])
    elif status == "ok" and exit_code < 0:
        result["status"] = "killed"
    return result


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_orphans() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _remove_tree(path: str) -> None:
    def fix(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o700)
        func(p)
    shutil.rmtree(path, onerror=fix)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    req, resp = os.dup(0), os.dup(1)
    try:
        worker = Worker(cfg, req, resp)
    except BaseException:  # noqa: BLE001 - tell the pool why, then stop
        write_frame(resp, json.dumps({"ready": False, "error": traceback.format_exc()}).encode())
        sys.exit(1)
    write_frame(worker.resp, json.dumps({"ready": True, "backend": worker.backend,
                                         "landlock_abi": worker.plan.landlock_abi,
                                         "seccomp": worker.plan.seccomp_bpf is not None,
                                         "uid": worker.plan.uid}).encode())
    worker.serve()


if __name__ == "__main__":
    main()
