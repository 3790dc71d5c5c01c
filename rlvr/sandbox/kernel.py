"""Thin ctypes wrappers over the Linux isolation syscalls the sandbox uses.

Namespaces (unshare/setns), prctl, mounts (detached-tree trick for making one path visible),
landlock (ABI 1-7: filesystem, TCP, scoping) and capability dropping. Every function raises
``OSError`` with the real errno. Nothing here imports outside the standard library, so a
sandbox worker stays small and forks fast. On other platforms ``LINUX`` is False and nothing
here may be called.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

LINUX = sys.platform.startswith("linux")

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
                   CLONE_NEWPID, CLONE_NEWNET)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 2
AT_FDCWD = -100

# x86_64 and aarch64 share the numbers of these newer syscalls (the "generic" table).
_SYS = {"open_tree": 428, "move_mount": 429, "landlock_create_ruleset": 444,
        "landlock_add_rule": 445, "landlock_restrict_self": 446}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}

_libc = ctypes.CDLL(None, use_errno=True) if LINUX else None


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(name: str, *args) -> int:
    return _check(_libc.syscall(ctypes.c_long(_SYS[name]), *args), name)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def prctl(option: int, arg2: int = 0) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl")


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0,
          data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def open_tree_clone(path: str) -> int:
    """A detached, recursive copy of the mount tree at ``path`` (an fd), for ``move_mount``."""
    OPEN_TREE_CLONE, AT_RECURSIVE, O_CLOEXEC = 1, 0x8000, 0o2000000
    return _syscall("open_tree", ctypes.c_int(AT_FDCWD), path.encode(),
                    ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | O_CLOEXEC))


def move_mount(tree_fd: int, target: str) -> None:
    MOVE_MOUNT_F_EMPTY_PATH = 4
    _syscall("move_mount", ctypes.c_int(tree_fd), b"", ctypes.c_int(AT_FDCWD), target.encode(),
             ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH))


def write_id_maps(uid_inside: int, uid_outside: int, gid_inside: int, gid_outside: int) -> None:
    """Map one uid/gid into a fresh user namespace (what an unprivileged process may map)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid_inside} {uid_outside} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid_inside} {gid_outside} 1")


def drop_capabilities() -> None:
    """Empty the bounding, effective, permitted and inheritable capability sets."""
    for cap in range(64):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError as e:
            if e.errno == errno.EINVAL:  # past the last capability this kernel knows
                break
            raise

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    nr = _SYS_CAPSET.get(os.uname().machine)
    if nr is None:
        raise OSError(errno.ENOSYS, "capset: unknown architecture")
    _check(_libc.syscall(ctypes.c_long(nr), ctypes.byref(header), data), "capset")


# ---- landlock ------------------------------------------------------------------------------

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's landlock ABI version, 0 when landlock is absent or disabled."""
    if not LINUX:
        return 0
    LANDLOCK_CREATE_RULESET_VERSION = 1
    r = _libc.syscall(ctypes.c_long(_SYS["landlock_create_ruleset"]), None, ctypes.c_size_t(0),
                      ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(r), 0)


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def landlock_restrict(read_only: list[str], read_write: list[str], abi: int) -> None:
    """Restrict this process (and its future children) to the given paths (see ``landlock_ruleset``)."""
    ruleset = landlock_ruleset(read_only, read_write, abi)
    try:
        landlock_apply(ruleset)
    finally:
        os.close(ruleset)


def landlock_apply(ruleset: int) -> None:
    """Enforce a ruleset on this process; rulesets are reusable, so a worker builds one once."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _syscall("landlock_restrict_self", ctypes.c_int(ruleset), ctypes.c_uint32(0))


def landlock_ruleset(read_only: list[str], read_write: list[str], abi: int,
                     deny_tcp: bool = True, scope: bool = True) -> int:
    """A ruleset fd allowing only the given paths.

    Everything not listed is denied for every handled right: no reads, writes or executions
    elsewhere. With ABI >= 4 all TCP bind/connect is denied; with ABI >= 6 signals and abstract
    unix sockets cannot reach processes outside this domain. Paths that do not exist are skipped.
    Rules attach to the inodes the paths name now.
    """
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4 and deny_tcp:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6 and scope:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    ruleset = _syscall("landlock_create_ruleset", ctypes.byref(attr), ctypes.c_size_t(size),
                       ctypes.c_uint32(0))
    try:
        for paths, rights in ((read_only, READ_ONLY), (read_write, handled)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    allowed = rights & handled
                    if not os.path.isdir(path):
                        allowed &= FILE_RIGHTS
                    rule = _PathBeneathAttr(allowed, fd)
                    _syscall("landlock_add_rule", ctypes.c_int(ruleset), ctypes.c_int(1),
                             ctypes.byref(rule), ctypes.c_uint32(0))
                finally:
                    os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_load_bpf(program: bytes) -> None:
    """Install a compiled classic-BPF seccomp program (8 bytes per instruction)."""
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(_libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                       ctypes.byref(prog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


# ---- probes --------------------------------------------------------------------------------

def probe_in_child(fn) -> bool:
    """Run ``fn()`` in a forked child; True when it returned without raising."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            code = 0
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def can_unshare(flags: int) -> bool:
    return LINUX and probe_in_child(lambda: unshare(flags))
