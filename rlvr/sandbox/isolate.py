"""How a sandboxed process isolates itself: the per-worker plan and the per-run steps.

A worker builds one ``Plan`` at start-up (what this machine allows, which uid to become, which
paths stay readable). Each run's first process calls ``enter`` right after the fork, in this
order: new session, die with the worker, rlimits, workspace as cwd, close every inherited fd
but the run's pipes, drop to the slot's non-root uid (or drop capabilities inside a user
namespace), die with the worker again (the uid change disarmed it) unless it is already gone,
landlock (read-only system, one writable workspace, no TCP, scoped signals), seccomp.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import sys

from rlvr.sandbox import kernel

SYSTEM_READ_ONLY = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache",
                    "/etc/localtime", "/etc/alternatives", "/dev/urandom", "/dev/zero"]


class Plan:
    """(A plain class: ``dataclasses`` would pull ``inspect`` and friends into every worker.)"""

    def __init__(self, backend: str, uid: int | None = None, drop_caps: bool = False,
                 pid_namespace: bool = False, landlock_abi: int = 0,
                 seccomp_bpf: bytes | None = None, read_only: list[str] | None = None,
                 runs_root: str | None = None):
        self.backend = backend  # forkserver | forkserver-userns | bwrap | weak
        self.uid = uid  # switch to this uid/gid (root-started workers)
        self.drop_caps = drop_caps  # inside a user namespace: keep the uid, lose capabilities
        self.pid_namespace = pid_namespace  # each run is pid 1 of a fresh pid namespace
        self.landlock_abi = landlock_abi
        self.seccomp_bpf = seccomp_bpf  # compiled once, by the pool
        self.read_only = read_only or []
        self.read_write = ["/dev/null"]
        self.runs_root = runs_root  # fresh workspaces live under here ...
        self.runs_ruleset: int | None = None  # ... and this ruleset (built once) covers them


def python_paths() -> list[str]:
    """Where the interpreter and its packages live (readable by sandboxed code).

    Not the directory rlvr itself is in: a checkout also holds run directories (tasks, hidden
    tests, checkpoints) that model-written code must not read. Workers import rlvr before any
    run, so the runs never need its files.
    """
    packages = {p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)}
    env = os.path.dirname(os.path.dirname(sys.executable))  # a venv (its pyvenv.cfg, bin/)
    venv = {env} if os.path.exists(os.path.join(env, "pyvenv.cfg")) else set()
    return sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, *packages, *venv})


def set_limits(limits: dict) -> None:
    mb = 1 << 20
    cpu = int(limits["cpu_s"])
    for res, soft, hard in (
        # soft = hard: the kernel's SIGKILL at the hard limit. A run's first process is the
        # init of its pid namespace, which never gets a default-action SIGXCPU (the soft
        # limit's signal), so with hard = soft + 1 it spun a second longer than cpu_s.
        (resource.RLIMIT_CPU, cpu, cpu),
        (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
        (resource.RLIMIT_NPROC, limits["processes"], limits["processes"]),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mb, limits["file_size_mb"] * mb),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(res, (soft, hard))


def parent_gone(parent_fd: int) -> bool:
    """Whether nobody reads ``parent_fd`` (a pipe's write end whose reader is the parent)
    any more: the parent has exited. (``getppid`` cannot tell: it is 0 for a pid namespace's
    pid 1.)"""
    poller = select.poll()
    poller.register(parent_fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def die_with_parent(parent_fd: int | None = None, parent_pid: int | None = None) -> None:
    """Arm SIGKILL on the parent's death, then make sure the parent did not die before that.

    The kernel clears the parent-death signal on a uid change, so a run re-arms it after its
    setuid; were the parent already gone, nothing would ever deliver it: exit now."""
    if not kernel.LINUX:
        return
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
    if (parent_fd is not None and parent_gone(parent_fd)) or \
            (parent_pid is not None and os.getppid() != parent_pid):
        os.kill(os.getpid(), signal.SIGKILL)


def enter(plan: Plan, workdir: str, limits: dict, keep_fds: list[int],
          landlock: bool = True, filter_syscalls: bool = True,
          parent_fd: int | None = None, read_only: bool = False,
          extra_read: list[str] | None = None) -> None:
    """Isolate the calling (freshly forked) process. Raises if any step fails: never run
    untrusted code half-isolated. ``parent_fd``: a pipe write end that only the parent reads
    (for ``die_with_parent``). ``read_only``: the workspace too is read-only (landlock).
    ``extra_read``: more read-only paths for this run only (its environment image)."""
    os.setsid()
    if kernel.LINUX:
        kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.chdir(workdir)
    keep = set(keep_fds) | ({plan.runs_ruleset} if plan.runs_ruleset is not None else set())
    low = 3
    for fd in sorted(keep):  # close_range(2) around the fds we keep
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 1 << 20)
    set_limits(limits)  # NPROC is checked against the uid we are about to become
    if plan.uid is not None:
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
    elif plan.drop_caps:
        kernel.drop_capabilities()
    die_with_parent(parent_fd)  # the uid change cleared it; before seccomp, landlock, the run
    if landlock and plan.landlock_abi:
        readable = plan.read_only + list(extra_read or ())
        if read_only:
            kernel.landlock_restrict(readable + [workdir], plan.read_write, plan.landlock_abi)
        elif not extra_read and plan.runs_ruleset is not None and _is_under(workdir, plan.runs_root):
            kernel.landlock_apply(plan.runs_ruleset)
        else:
            kernel.landlock_restrict(readable, [workdir, *plan.read_write], plan.landlock_abi)
    elif kernel.LINUX:
        kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
    if plan.runs_ruleset is not None:
        os.close(plan.runs_ruleset)
    if filter_syscalls and plan.seccomp_bpf is not None:
        kernel.seccomp_load_bpf(plan.seccomp_bpf)


def _is_under(path: str, root: str | None) -> bool:
    return root is not None and os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def seccomp_program(backend: str) -> bytes | None:
    """The compiled filter for a backend; built by the pool, so workers never load libseccomp
    (which would make every fork of them slower)."""
    from rlvr.sandbox import seccomp

    if not seccomp.available():
        return None
    return seccomp.compile_bpf(seccomp.build_filter(deny_fork=backend == "weak"))


def build_plan(backend: str, uid: int | None, runs_root: str, bpf: bytes | None) -> Plan:
    """The isolation this worker applies to each run, given the backend it was started for."""
    abi = kernel.landlock_abi()
    strict = backend in ("forkserver", "forkserver-userns", "bwrap")
    plan = Plan(
        backend=backend,
        uid=uid if backend in ("forkserver", "bwrap") else None,
        drop_caps=backend == "forkserver-userns",
        pid_namespace=strict,
        landlock_abi=abi,
        seccomp_bpf=bpf,
        read_only=SYSTEM_READ_ONLY + python_paths(),
        runs_root=runs_root,
    )
    if abi and plan.uid is not None:
        # Shared by every run of this worker: safe only where the runs root is not writable by
        # the run's uid (root-owned, 0711), so a run can write nothing but its own workspace.
        plan.runs_ruleset = kernel.landlock_ruleset(plan.read_only, [runs_root, *plan.read_write],
                                                    abi)
    return plan


def expose_paths(paths: list[str]) -> None:
    """In this (private) mount namespace, make ``paths`` reachable for any uid.

    An interpreter under a mode-700 home (``/root/.pyenv``) cannot be read by the sandbox uid.
    For each closed ancestor, mount a world-traversable tmpfs over it holding only the needed
    paths, bind-mounted back from detached copies. Everything else there disappears from view.
    """
    closed: dict[str, list[str]] = {}
    for path in paths:
        parts = os.path.abspath(path).split(os.sep)[1:]
        for i in range(1, len(parts)):
            ancestor = os.sep + os.path.join(*parts[:i])
            if not os.stat(ancestor).st_mode & 0o001:
                closed.setdefault(ancestor, []).append(path)
                break
    for ancestor, inside in closed.items():
        inside = [p for p in inside if not any(p != q and p.startswith(q + os.sep) for q in inside)]
        trees = [(p, kernel.open_tree_clone(p)) for p in sorted(set(inside))]
        kernel.mount("tmpfs", ancestor, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV,
                     "mode=755,size=64k")
        for p, fd in trees:
            os.makedirs(p, mode=0o755, exist_ok=True)
            kernel.move_mount(fd, p)
            os.close(fd)


SOCKET_DIRS = ("/run", "/var/run")


def hide_socket_dirs(keep: list[str]) -> None:
    """In this (private) mount namespace, cover the directories where host daemons keep their
    sockets with an empty read-only tmpfs (a second layer under seccomp's socket ban). A
    directory holding one of ``keep`` (the interpreter, the workspaces) stays visible."""
    for path in SOCKET_DIRS:
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        if any(_is_under(k, path) or os.path.realpath(k) == os.path.realpath(path) for k in keep):
            continue
        kernel.mount("tmpfs", path, "tmpfs",
                     kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_RDONLY, "mode=755,size=4k")
