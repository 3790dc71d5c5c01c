"""The sandbox as callers see it: a pool of pre-warmed workers behind a bounded queue.

    with Sandbox(workers=2) as sb:
        result = sb.run(Job.io(program, "add", [(1, 2), (3, 4)]))
        result.compare([3, 7])            # -> 2, computed here from plain data
        results = sb.map(jobs)            # batched, concurrent, in order

``submit`` returns a future and blocks while the queue is full (backpressure), so a rollout can
stream verification work in as fast as the workers take it. Each worker has its own slot (a
non-root uid on the strict root backend, allocated with a lock file so two pools on one machine
never share one) and one thread that started it and serves it. The nonce and the trusted verdict
live here.

Slots are elastic, with CPU accounting: ``workers`` slots are pre-warmed and are also the CPU
budget (at most that many runs compute at once, so an honest CPU-bound run keeps a core and is
not timed out by contention). While jobs wait, a governor samples the busy runs' CPU time from
``/proc``; a run that is not computing (sleeping, blocked) gives its share back and, when no
slot is free, an extra slot is started (up to ``max_slots``), so a batch does not queue behind
programs that only wait for their wall limit. A run that starts computing again takes its share
back; extra slots idle for ``idle_s`` retire.
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
import time
import warnings

from rlvr.errors import UserError
from rlvr.faults import fault_point
from rlvr.sandbox import detect, isolate
from rlvr import oplog
from rlvr.sandbox.audit import AuditLog, code_hash
from rlvr.sandbox.cpu_use import cpu_ticks, run_members
from rlvr.sandbox.types import ExecResult, Job
from rlvr.sandbox.verdict import interpret

UID_BASE, UID_COUNT = 61000, 1000
IDLE_S = 30.0  # an extra slot idle this long retires
RETRY_S = 5.0  # after an extra slot failed to start, the pool waits this long to try again
TICK_S = 0.005  # how often, while work waits, the runs holding CPU shares are looked at
SCAN_EVERY = 4  # ticks between finding the share holders' processes (x5 without slot uids)
WINDOW_S = 0.03  # the shortest window a run's CPU use is judged over (from its fork, at first)
WAITING_BELOW = 0.2  # a run using less of a core than this over a period is waiting ...
COMPUTING_ABOVE = 0.5  # ... and one using more than this is computing
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
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


def _uids_in_use() -> set[int]:
    """The real uids of every process on this machine (``/proc/*/status``)."""
    uids = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return uids
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        uids.add(int(line.split()[1]))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return uids


def _images_config() -> dict[str, str]:
    """Where environment images live and the harness copy they run (``image_exec``); empty
    (jobs with an image are refused) where the images root cannot be made."""
    from rlvr.images.cache import root
    from rlvr.sandbox.image_exec import harness_copy

    try:
        where = str(root())
        return {"images": where, "harness": harness_copy(where)}
    except OSError:
        return {}


def _overlays_ready() -> None:
    """Overlay workspaces (``overlay``) mounted after the workers start reach them only under a
    shared mount point that exists before they do."""
    from rlvr.sandbox import overlay

    try:
        overlay.overlay_root()
    except OSError as e:
        warnings.warn(f"sandbox: overlay workspaces unavailable ({e})", stacklevel=3)


class _SlotLock:
    """An exclusive claim on one sandbox uid, held for the pool's life."""

    def __init__(self) -> None:
        lock_dir = os.path.join(tempfile.gettempdir(), "rlvr-sandbox-uids")
        os.makedirs(lock_dir, exist_ok=True)
        busy = _uids_in_use()
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            if uid in busy:  # a process of a pool that died (or of an older rlvr) still has it
                continue
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
    def __init__(self, backend: detect.Backend, slot: int, python: str, bpf: bytes | None,
                 images: dict[str, str]):
        self.lock = _SlotLock() if backend.name in ("forkserver", "bwrap") else None
        tag = str(self.lock.uid) if self.lock else f"{os.getpid()}-{slot}"
        self.base = os.path.join(_shm_root(), tag)
        cfg = {"backend": backend.name, "uid": self.lock.uid if self.lock else None,
               "owner": os.getpid(),
               "base": self.base, "bwrap": backend.caps.bwrap,
               "seccomp_bpf": bpf.hex() if bpf else None, **images}
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

    def call(self, untrusted: dict, trusted: bytes, started=None) -> dict:
        """Run one job; ``started(pid)`` hears the run's first process as soon as it exists."""
        a = json.dumps({"job": untrusted}).encode()
        self.proc.stdin.write(struct.pack(">I", len(a)) + a + struct.pack(">I", len(trusted)) + trusted)
        self.proc.stdin.flush()
        while True:
            frame = self._read()
            if "started" not in frame:
                return frame
            if started is not None:
                started(frame["started"])

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


class _Slot:
    """One execution slot: a worker process, the thread that started it and serves it, and
    what the CPU accounting knows about its current run."""

    def __init__(self, index: int, extra: bool):
        self.index, self.extra = index, extra
        self.worker: _WorkerProcess | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.busy = self.token = False  # running a job; counted against the CPU budget
        self.run_id = 0  # bumped per job, so a CPU sample never spans two runs
        self.run_pid: int | None = None  # the run's first process (reported by the worker)
        self.sample: tuple[int, int, float] | None = None  # (run_id, ticks, time)
        self.members: set[int] = set()  # the run's processes at the last full scan
        self.quiet = 0  # consecutive looks with none of them runnable
        self.held = False  # took its share back this run: only CPU time gives it away again


class Sandbox:
    def __init__(self, workers: int | None = None, backend: str = "auto", *,
                 allow_weak: bool = False, audit_path: str | None = None,
                 queue_size: int | None = None, python: str | None = None,
                 max_slots: int | None = None, idle_s: float = IDLE_S):
        """``workers`` pre-warmed slots (default one per core, at most 8) are also the CPU
        budget: at most that many runs use CPU at once. ``max_slots`` caps the slots in all
        (default, or below ``workers``: ``workers``, a fixed pool as before; ``sandbox.max_slots``
        defaults to 64): while jobs wait, a run that is not using CPU (sleeping, blocked) gives
        its share of the budget back and an extra slot is started for the waiting work. Extra
        slots idle for ``idle_s`` retire."""
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
        self._images = _images_config()
        _overlays_ready()
        self.cpu_slots = n
        self.max_slots = max(n, max_slots or n)
        self._idle_s = idle_s
        self._by_uid = self.backend.name in ("forkserver", "bwrap")  # one uid per slot
        self._cv = threading.Condition()
        self._slots: list[_Slot] = []
        self._cpu_free = n  # CPU budget left: a run holds one unit unless it is seen waiting
        self._idle = self._starting = self._token_waiters = self._next = 0
        self._closed = False
        self.worker_restarts = 0  # workers lost mid-run and replaced (each run retried once)
        self._grow_after = 0.0  # after an extra slot failed to start, no new ones until then
        self.peak_slots = 0
        for _ in range(n):
            self._add_slot(extra=False)
        for slot in list(self._slots):
            slot.ready.wait()
        failed = [s.error for s in self._slots if s.error is not None]
        if failed or len(self._slots) < n:
            self.close()
            raise failed[0] if failed else UserError("sandbox workers failed to start")
        self._governor = None
        if self.max_slots > n:
            self._governor = threading.Thread(target=self._govern, daemon=True,
                                              name="sandbox-governor")
            self._governor.start()

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def _workers(self) -> list[_WorkerProcess]:
        """The live slots' worker processes, in slot order."""
        with self._cv:
            return [s.worker for s in self._slots if s.worker is not None]

    @property
    def slots(self) -> int:
        with self._cv:
            return len(self._slots)

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

    # -- slots --

    def _add_slot(self, extra: bool) -> None:
        """(Caller holds ``_cv`` or is the constructor.) The slot's own thread starts its worker:
        a worker's parent-death signal fires when the thread that started it ends, so that
        thread must live exactly as long as the worker."""
        slot = _Slot(self._next, extra)
        self._next += 1
        self._slots.append(slot)
        self._starting += extra
        self.peak_slots = max(self.peak_slots, len(self._slots))
        threading.Thread(target=self._slot_main, args=(slot,), daemon=True,
                         name=f"sandbox-{slot.index}").start()

    def _slot_main(self, slot: _Slot) -> None:
        try:
            slot.worker = _WorkerProcess(self.backend, slot.index, self._python, self._bpf, self._images)
        except BaseException as e:  # noqa: BLE001 - the constructor (or nobody) reports it
            slot.error = e
        with self._cv:
            self._starting -= slot.extra
            if slot.error is not None:
                self._slots.remove(slot)
                if slot.extra:  # (no free uid, say): the pool works on with what it has
                    self._grow_after = time.monotonic() + RETRY_S
            self._cv.notify_all()
        slot.ready.set()
        if slot.error is not None:
            return
        try:
            self._dispatch(slot)
        finally:
            try:
                slot.worker.close()
            finally:
                with self._cv:
                    self._slots.remove(slot)
                    self._cv.notify_all()

    def _dispatch(self, slot: _Slot) -> None:
        while True:
            with self._cv:
                self._idle += 1
            try:
                item = self._queue.get(timeout=self._idle_s if slot.extra else None)
            except queue.Empty:
                item = None  # an extra slot nobody needed for a while: retire
            finally:
                with self._cv:
                    self._idle -= 1
            if item is None:
                return
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            self._take_cpu(slot)
            try:
                fut.set_result(self._execute(slot, job))
            except BaseException as e:  # noqa: BLE001 - the caller gets it
                fut.set_exception(e)
            finally:
                self._release(slot)

    def _take_cpu(self, slot: _Slot) -> None:
        with self._cv:
            self._token_waiters += 1
            while self._cpu_free <= 0:
                self._cv.wait()
            self._token_waiters -= 1
            self._cpu_free -= 1
            slot.token = slot.busy = True
            slot.run_id += 1
            slot.run_pid = slot.sample = None
            slot.members, slot.quiet, slot.held = set(), 0, False

    def _release(self, slot: _Slot) -> None:
        with self._cv:
            self._cpu_free += slot.token
            slot.token = slot.busy = False
            slot.run_pid = slot.sample = None
            self._cv.notify_all()

    def _execute(self, slot: _Slot, job: Job) -> ExecResult:
        nonce = secrets.token_hex(16)
        trusted = json.dumps({"nonce": nonce, "tests": job.tests}).encode()

        def started(pid: int) -> None:  # a fresh process has used no CPU yet: the baseline
            slot.run_pid, slot.sample = pid, (slot.run_id, 0, time.monotonic())
            fault_point("sandbox_run", victim=lambda: slot.worker.proc.pid)

        for attempt in (1, 2):  # a worker lost mid-run (killed, OOM) is the host's fault: run it once more
            try:
                raw = slot.worker.call(job.untrusted_part(), trusted, started)
                break
            except (EOFError, BrokenPipeError, OSError) as e:
                self._restart(slot)
                self.worker_restarts += 1
                raw = {"status": "error", "error": f"sandbox worker died twice: {e}"}
        result = interpret(job, raw, nonce, self.backend.name)
        if self.audit:
            self.audit.write(job, result)
        oplog.write("sandbox_exec", task=job.task_id, kind=job.kind, code_sha256=code_hash(job), status=result.status,
                    seconds=round(result.duration_s, 5))
        return result

    def _restart(self, slot: _Slot) -> None:
        try:
            slot.worker.close()
        except Exception:  # noqa: BLE001
            pass
        slot.worker = _WorkerProcess(self.backend, slot.index, self._python, self._bpf, self._images)

    # -- CPU accounting --

    def _govern(self) -> None:
        """While work waits: runs seen not using CPU give their share of the budget back (and
        take it again when they compute), and while budget is left and no slot is free, extra
        slots are started, up to ``max_slots``. Every ``TICK_S`` the runs holding a share are
        looked at (their known processes' states: twice in a row none runnable gives it back);
        every ``SCAN_EVERY`` ticks their processes are found and their CPU time over the window
        decides, and every ``5 * SCAN_EVERY`` ticks that of the runs without a share (which
        take one back if they compute)."""
        tick = 0
        scan_every = SCAN_EVERY if self._by_uid else 5 * SCAN_EVERY  # a full /proc scan there
        while not self._closed:
            time.sleep(TICK_S)
            tick += 1
            full = tick % scan_every == 0
            everyone = tick % (5 * scan_every) == 0  # the runs without a share: less often
            with self._cv:
                if not (self._queue.qsize() > 0 or self._token_waiters > 0):
                    continue
                busy = [s for s in self._slots if s.busy and s.worker is not None
                        and (everyone or (full and s.token)
                             or (s.token and not s.held and s.run_pid))]
                watched = [(s, s.run_id, (s.worker.proc.pid, s.run_pid, s.worker.info.get("uid")),
                            s.members) for s in busy]
            if full:
                found = run_members([w[2] for w in watched], self._by_uid)
            else:
                found = [members | {run} for (_, _, (_, run, _), members) in watched]
            stats = [cpu_ticks(m) for m in found]
            now = time.monotonic()
            with self._cv:
                for (s, run_id, _, _), members, (t, runnable) in zip(watched, found, stats):
                    if s.busy and s.run_id == run_id:
                        self._judge(s, members if full else None, t, runnable, now)
                wanted = min(self._cpu_free - self._starting,
                             self._queue.qsize() - self._idle - self._starting,
                             self.max_slots - len(self._slots))
                if self._closed or now < self._grow_after:
                    wanted = 0
                for _ in range(wanted):
                    self._add_slot(extra=True)
                self._cv.notify_all()

    def _judge(self, s: _Slot, members: set[int] | None, t: int, runnable: bool,
               now: float) -> None:
        """(Holding ``_cv``.) Update one busy slot's share from a look at its run's processes:
        ``members`` (all of them) on a full scan, None on a quick look."""
        s.quiet = 0 if runnable else s.quiet + 1
        if members is None:  # quick: only ever gives a share back, once per run
            if s.token and not s.held and s.quiet >= 2:
                s.token, self._cpu_free = False, self._cpu_free + 1
            return
        s.members = members
        if s.sample is None or now - s.sample[2] < WINDOW_S:
            s.sample = s.sample or (s.run_id, t, now)
            return
        rate = (t - s.sample[1]) / CLK_TCK / (now - s.sample[2])
        # (a runnable process is computing even if others' load starved it)
        if s.token and rate < WAITING_BELOW and not runnable:
            s.token, self._cpu_free = False, self._cpu_free + 1
        elif not s.token and rate > COMPUTING_ABOVE:
            s.token, self._cpu_free, s.held = True, self._cpu_free - 1, True
        s.sample = (s.run_id, t, now)

    def close(self) -> None:
        if self._closed:
            return
        with self._cv:
            self._closed = True
            threads = len(self._slots)
        for _ in range(threads):
            self._queue.put(None)
        with self._cv:
            while self._slots:
                self._cv.wait(timeout=0.5)
        if self.audit:
            self.audit.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
