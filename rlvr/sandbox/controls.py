"""Positive controls for the attack suite: every attack of ``rlvr.sandbox.attacks`` run with its
defence off, judged the way the suite judges it, to show the attack would have worked and that the
judge sees it. A control whose attack comes out "blocked" means the judge (or the attack) is dead.

``CONTROLS`` maps each attack's name to ``control(sb, ctx) -> Outcome``; the defence taken away:

  * network, files, daemons (one program and its judge): the program runs with no sandbox
    (``run_unsandboxed``). ``dns`` aims at a resolver stub this process runs on 127.0.0.2:53 (the
    real resolver is off this host, so only a stub can show a lookup answered); ``read-etc-shadow``
    needs root, as the attack does.
  * the verdict attacks (``sys-exit``, ``os-exit``, ``forge-report``, ``steal-nonce``,
    ``patch-builtins``, ``always-equal``, ``tamper-tests-memory``): a naive harness that runs the
    tests in the candidate's own process, keeps its nonce there and prints its report on a
    descriptor the candidate shares, read by the naive judges (exit status 0 with no report; the
    first report line; the first line carrying the nonce). Each control also shows the plain wrong
    solution failing under that harness, so a pass is the hack's doing.
  * ``tamper-test-file``: the tamper program in a host directory holding the 0444 test file.
  * ``fork-bomb`` and ``memory-20gb``: the same program in the sandbox with the limit raised
    (processes 64 instead of 32, 4 GiB instead of 1 GiB): the host sees more processes, more
    memory than the judge allows. Never unbounded on the host.
  * ``infinite-loop``: no sandbox; SIGTERM (what ``timeout`` sends) does not stop it.
  * ``setsid-grandchild``: no sandbox, killed at 1 s: the grandchild lives on.
  * ``stdout-flood``: no sandbox, its stdout counted: 1 GiB arrives, far over the cap.
  * ``kill-parent``, ``signal-host``, ``ptrace``, ``user-namespace``: no sandbox, under a
    sacrificial ``sh`` parent (``kill(-1)`` and pid 1 are left out): the parent dies, a host
    process of this user dies, processes are traced, a user namespace appears.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rlvr.sandbox import attacks as A
from rlvr.sandbox.attacks import Context, Outcome, run_unsandboxed
from rlvr.sandbox.types import Job, Limits

Control = Callable[..., Outcome]  # (sb, ctx) -> Outcome
CONTROLS: dict[str, Control] = {}


def control(*names: str) -> Callable[[Control], Control]:
    def register(fn: Control) -> Control:
        for name in names:
            CONTROLS[name] = fn
        return fn
    return register


# ---- one program and its judge, no sandbox ------------------------------------------------------

@control("tcp-localhost", "udp-localhost", "unix-socket", "read-host-file", "write-outside",
         "leftover-daemon", "read-project-tree", "read-etc-shadow")
def _program_unsandboxed(sb, ctx: Context, name: str) -> Outcome:
    attack = next(a for a in A.ATTACKS if a.name == name)
    return attack.judge(ctx, run_unsandboxed(attack.program(ctx)))


class _ResolverStub:
    """Answers every DNS query on ``host``:53 (UDP and TCP) with its own header, QR bit set."""

    def __init__(self, host: str = "127.0.0.2"):
        self.host, self._stop = host, threading.Event()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.udp.bind((host, 53))
        self.tcp.bind((host, 53))
        self.tcp.listen(4)
        for s in (self.udp, self.tcp):
            s.settimeout(0.05)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @staticmethod
    def _answer(query: bytes) -> bytes:
        return query[:2] + struct.pack(">H", 0x8180) + query[4:]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.udp.recvfrom(512)
                self.udp.sendto(self._answer(data), peer)
            except OSError:
                pass
            try:
                conn, _ = self.tcp.accept()
                with conn:
                    conn.settimeout(0.5)
                    data = conn.recv(514)[2:]
                    reply = self._answer(data)
                    conn.sendall(struct.pack(">H", len(reply)) + reply)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.udp.close()
        self.tcp.close()


@control("dns")
def _dns(sb, ctx: Context, name: str) -> Outcome:
    stub, resolver = _ResolverStub(), ctx.resolver
    try:
        ctx.resolver = stub.host
        return _program_unsandboxed(sb, ctx, name)
    finally:
        ctx.resolver = resolver
        stub.close()


# ---- the verdict attacks: a naive harness ------------------------------------------------------

NAIVE_HARNESS = r'''
import operator, os
NONCE = __NONCE__
os.dup2(1, 3)  # the report channel: a descriptor the candidate shares
exec(__TESTS__)
exec(__CANDIDATE__)
try:
    check(add)
    passed = 1
except Exception:
    passed = 0
try:
    io = sum(1 for args, want in zip(__INPUTS__, __EXPECTED__) if operator.eq(add(*args), want))
except Exception:
    io = 0
os.write(3, f'{NONCE} {{"passed": {passed}, "io": {io}}}\n'.encode())  # no json.dumps: it may be patched
'''
_REPORT = re.compile(r"^([0-9a-f]{32}) (\{.*\})$", re.M)


def naive_verdict(candidate: str, judge: str, shell_parent: bool = False) -> tuple[bool, str]:
    """Whether the naive harness's ``judge`` passes ``candidate``: ``exit`` (status 0 and no
    report counts as passed), ``first`` (the first report line), ``nonce`` (the first line
    carrying the harness's nonce)."""
    nonce = secrets.token_hex(16)
    r = run_unsandboxed(A.fill_template(NAIVE_HARNESS, NONCE=nonce, TESTS=A.TESTS, CANDIDATE=candidate,
                               INPUTS=A.INPUTS, EXPECTED=A.EXPECTED), timeout=10, shell_parent=shell_parent)
    reports = [(n, json.loads(body)) for n, body in _REPORT.findall(r.stdout)]
    if judge == "exit":
        ok = r.exit_code == 0 and not reports
    else:
        chosen = [rep for n, rep in reports if judge == "first" or n == nonce][:1]
        ok = bool(chosen) and (chosen[0].get("passed") == 1 or chosen[0].get("io") == len(A.EXPECTED))
    return ok, f"{judge} judge: {'PASSED' if ok else 'failed'} (exit {r.exit_code}, {len(reports)} report lines)"


def _verdict_control(programs: list[str], judge: str, shell_parent: bool = False) -> Control:
    def run(sb, ctx: Context, name: str) -> Outcome:
        honest, _ = naive_verdict(A.WRONG_ADD, judge)
        results = [naive_verdict(p, judge, shell_parent) for p in programs]
        worked = not honest and all(ok for ok, _ in results)
        return Outcome(not worked, f"wrong solution alone {'PASSED' if honest else 'failed'}; "
                                   + "; ".join(detail for _, detail in results))
    return run


CONTROLS["sys-exit"] = _verdict_control(A.SYS_EXIT, "exit")
CONTROLS["os-exit"] = _verdict_control(A.OS_EXIT, "exit")
CONTROLS["forge-report"] = _verdict_control(A.FORGE, "first")
CONTROLS["steal-nonce"] = _verdict_control([A.STEAL_PROG + A.WRONG_ADD], "nonce", shell_parent=True)
CONTROLS["patch-builtins"] = _verdict_control([A.BUILTINS_PROG], "nonce")
CONTROLS["always-equal"] = _verdict_control(A.ALWAYS_EQUAL, "nonce")
CONTROLS["tamper-tests-memory"] = _verdict_control([A.TAMPER_MEMORY + A.WRONG_ADD], "nonce")


@control("tamper-test-file")
def _tamper_test_file(sb, ctx: Context, name: str) -> Outcome:
    ws = os.path.join(ctx.host_dir, "control-ws")
    os.mkdir(ws)
    test = os.path.join(ws, "test_sol.py")
    with open(test, "w") as f:
        f.write(A.TEST_FILE)
    os.chmod(test, 0o444)
    r = run_unsandboxed(A.fill_template(A.TAMPER, EVIL="evil") + A.WRONG_ADD, cwd=ws)
    try:
        with open(test) as f:
            unchanged = f.read() == A.TEST_FILE
    except OSError:
        unchanged = False
    return Outcome(unchanged, f"test file {'unchanged' if unchanged else 'CHANGED'}; {A.said(r, 120)}")


# ---- processes and resources -------------------------------------------------------------------

@control("fork-bomb")
def _fork_bomb(sb, ctx: Context, name: str) -> Outcome:
    judged, raised = 32, Limits(wall_s=2, cpu_s=5, processes=64)
    with A.Watch(A.worker_pids(sb), interval=0.05) as w:
        sb.run(Job.run_program(A.FORK_BOMB, limits=raised))
    return Outcome(w.max_alive <= judged + 2, f"limit raised to {raised.processes}: up to {w.max_alive} "
                                              f"processes seen (the judge allows {judged + 2})")


@control("memory-20gb")
def _memory(sb, ctx: Context, name: str) -> Outcome:
    judged = 1024
    r = sb.run(Job.run_program(A.MEMORY_PROG, limits=Limits(wall_s=20, memory_mb=4096)))
    rss_mb = r.max_rss_kb / 1024
    return Outcome(rss_mb <= judged + 32, f"limit raised to 4096 MiB: peak resident {rss_mb:.0f} MiB "
                                          f"(the judge allows {judged + 32}); {A.said(r, 100)}")


@contextmanager
def _popen(program: str, **kw) -> Iterator[subprocess.Popen]:
    p = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.DEVNULL, **kw)
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@control("infinite-loop")
def _loop(sb, ctx: Context, name: str) -> Outcome:
    with _popen(A.LOOP_PROG, stdout=subprocess.PIPE) as p:
        p.stdout.readline()  # "looping": its handlers are set
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(1.0)
        except subprocess.TimeoutExpired:
            return Outcome(False, "still running 1 s after SIGTERM (no wall limit, no SIGKILL)")
    return Outcome(True, f"SIGTERM stopped it (exit {p.returncode})")


@control("setsid-grandchild")
def _grandchild(sb, ctx: Context, name: str) -> Outcome:
    marker = ctx.marker + "-grandchild"
    r = run_unsandboxed(A.fill_template(A.GRANDCHILD_PROG, MARKER=marker), timeout=1.0)
    left = A.still_alive(lambda: A.marker_pids(marker), grace=1.0)
    A.sweep(marker)
    return Outcome(not left, f"run {r.status} after {r.duration_s:.1f}s; {len(left)} grandchild(ren) alive after")


@control("stdout-flood")
def _flood(sb, ctx: Context, name: str) -> Outcome:
    cap = Limits().output_kb * 1024 + 4096 + 256
    got = 0
    with _popen(A.fill_template(A.FLOOD_PROG, STREAM="stdout"), stdout=subprocess.PIPE) as p:
        while chunk := p.stdout.read1(1 << 20):
            got += len(chunk)
    return Outcome(got <= cap, f"{got >> 20} MiB reached the reader (the judge's cap: {cap} bytes)")


@control("kill-parent")
def _kill_parent(sb, ctx: Context, name: str) -> Outcome:
    r = run_unsandboxed(A.fill_template(A.KILL_PROG, TARGETS=[]), timeout=5, shell_parent=True)
    return Outcome(r.signal != signal.SIGKILL, f"its parent (a sh) {'was KILLED' if r.signal == 9 else 'lived'}")


@control("signal-host")
def _signal_host(sb, ctx: Context, name: str) -> Outcome:
    victim = ctx.victim()
    r = run_unsandboxed(A.fill_template(A.SIGNAL_PROG, VICTIM=victim.pid, MINUS_ONE=False), timeout=5)
    time.sleep(0.05)
    alive = victim.poll() is None
    ctx.release(victim)
    return Outcome(alive, f"host process {victim.pid} {'unaffected' if alive else 'KILLED'}; {A.said(r, 80)}")


@control("ptrace")
def _ptrace(sb, ctx: Context, name: str) -> Outcome:
    victim = ctx.victim()
    marker = ctx.marker + "-ptrace"  # in the command line of its forked children too: they are found and killed
    with A.Watch([os.getpid()], extra=[victim.pid]) as w:
        run_unsandboxed(A.fill_template(A.PTRACE_PROG, VICTIM=victim.pid) + f"\n# {marker}\n", timeout=1.5,
                        shell_parent=True)
    ctx.release(victim)
    A.sweep(marker)  # a child its tracer left stopped would stay stopped forever
    return Outcome(not w.tracers, f"traced processes seen from the host: {len(w.tracers)}")


@control("user-namespace")
def _userns(sb, ctx: Context, name: str) -> Outcome:
    base = A.namespace_of(os.getpid(), "user")
    with A.Watch([os.getpid()]) as w:
        run_unsandboxed(A.USERNS_PROG, timeout=5)
    new = w.user_ns - {base}
    return Outcome(not new, f"new user namespaces seen from the host: {len(new)}")


def run_control(sb, ctx: Context, name: str) -> Outcome:
    """The control of attack ``name`` (KeyError for an attack without one)."""
    return CONTROLS[name](sb, ctx, name)
