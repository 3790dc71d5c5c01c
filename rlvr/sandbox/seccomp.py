"""The seccomp filter every sandboxed process runs under (built with libseccomp via pyseccomp).

Default allow, with a deny list of the syscalls untrusted code never needs and that widen the
kernel attack surface or escape the other layers: ``socket`` (only unnamed AF_UNIX socketpairs
remain), ptrace and
cross-process memory access, mounts, new namespaces, BPF, io_uring, keyrings, modules, kexec,
reboot, swap, userfaultfd, perf. ``clone3`` answers ENOSYS so libc falls back to ``clone``,
whose flags can be inspected. ``deny_fork`` (the weak backend, which has no pid namespace to
tear a process tree down) also refuses every new process; threads still work.
"""

from __future__ import annotations

import errno
import os

from rlvr.sandbox import kernel

try:  # Linux with libseccomp; absent elsewhere
    import pyseccomp as _sc
except (ImportError, RuntimeError, OSError):  # pragma: no cover - depends on the platform
    _sc = None

AF_UNIX = 1
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
    "chroot", "unshare", "setns", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key",
    "request_key", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "open_tree", "move_mount", "fsopen", "fsmount", "fsconfig",
    "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at", "personality",
    "acct", "quotactl", "lookup_dcookie", "syslog", "vhangup",
)


def available() -> bool:
    return kernel.LINUX and _sc is not None


def build_filter(deny_fork: bool = False):
    """A loadable ``pyseccomp.SyscallFilter``; build once, ``load()`` in each child."""
    f = _sc.SyscallFilter(_sc.ALLOW)
    for name in DENIED:
        try:
            f.add_rule(_sc.ERRNO(errno.EPERM), name)
        except (ValueError, OSError, RuntimeError):  # syscall unknown on this architecture
            pass
    # No sockets at all: a unix socket at a path (a host daemon's) is reachable by connect(),
    # which landlock does not govern. Unnamed socketpairs between the run's processes stay.
    f.add_rule(_sc.ERRNO(errno.EACCES), "socket")
    f.add_rule(_sc.ERRNO(errno.EACCES), "socketpair", _sc.Arg(0, _sc.NE, AF_UNIX))
    f.add_rule(_sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in kernel.NAMESPACE_FLAGS:
        f.add_rule(_sc.ERRNO(errno.EPERM), "clone", _sc.Arg(0, _sc.MASKED_EQ, flag, flag))
    if deny_fork:
        for name in ("fork", "vfork"):
            try:
                f.add_rule(_sc.ERRNO(errno.EAGAIN), name)
            except (ValueError, OSError, RuntimeError):
                pass
        f.add_rule(_sc.ERRNO(errno.EAGAIN), "clone",
                   _sc.Arg(0, _sc.MASKED_EQ, kernel.CLONE_THREAD, 0))
    return f


def compile_bpf(filt) -> bytes:
    """The filter as raw BPF, so each run installs it with one prctl (``kernel.seccomp_load_bpf``)."""
    fd = os.memfd_create("rlvr-seccomp")
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            filt.export_bpf(f)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
