"""A directory for multi-step environments, put back to its snapshot in about a millisecond.

    with Workspace.create({"src/app.py": code, "tests/test_app.py": tests}) as ws:
        for episode in episodes:
            ws.write("src/app.py", agent_edit)                    # trusted edits
            sb.run(Job.command(["python", "-m", "pytest", "-q"], workdir=ws.path,
                               protected=("tests/test_app.py",)))  # untrusted code edits too
            ws.diff()                                             # {"added": [...], ...}
            ws.restore()                                          # back to the snapshot

Design. The snapshot lives in this process's memory, not in a pristine copy on disk (no second
tree to keep out of the sandbox's reach, and restoring a file is one write): for each directory
its mode and owner, for each regular file its bytes, mode and owner. Next to it is a manifest of
the workspace as it was right after the last ``create``/``snapshot``/``restore``: for each file
``(inode, size, mtime, ctime, mode, uid, gid, nlink)``. ``restore`` walks the tree with
``scandir`` on directory fds (one ``fstatat(AT_SYMLINK_NOFOLLOW)`` per entry) and keeps an entry
only if it is what the snapshot wants *and* its stat equals the manifest exactly. Anything else
is removed and the snapshot's version written back as a fresh inode; entries the snapshot lacks
are removed, missing ones are recreated, directory modes and owners are reset. Then the manifest
is refreshed. ``ctime`` is what makes this sound: any write, truncate, chmod, chown, link,
rename or ``utime`` sets it to the current time, and nothing but a clock change (root only) can
set it back, so a file edited in place with its size and mtime forged still differs. Since
Linux 6.13 (multigrain timestamps, tmpfs and ext4) a ctime that has been read by a stat is
replaced by a fine-grained one at the next change. Without them a change inside the same
clock tick as the manifest could keep the ctime; there (probed once per filesystem) files
whose ctime is within two ticks of the manifest are "racy" and get their content compared
too, as git does for its index.
``snapshot`` re-reads only files whose stat changed since the manifest was taken.

Cost (``benchmarks/sandbox_snapshot.py``: 50 files of ~1.2 KB in 9 directories on tmpfs, a
2-core VM where a syscall costs 1-3 us): a restore is one walk, about 0.6 ms, plus about 30 us
per entry it rewrites: 0.6 ms when one file changed, 2.2 ms when all 50 did, against 7 ms for
``rmtree`` + ``copytree``. ``snapshot`` costs a walk plus a read per changed file. Memory: one
copy of the snapshot's bytes.

What it guarantees:

- After ``restore()`` the directory holds exactly the snapshot's regular files (same bytes,
  mode and, when run as root, owner) and directories (mode, owner), nothing else: no symlinks,
  fifos, sockets, devices, extra files or directories, whatever the sandboxed code did while
  nothing else ran in the workspace (on the strict backends every process of a run is dead when
  the run returns). Files are kept only if they are provably untouched, the rest is rewritten.
- The trusted side (``create``, ``read``, ``write``, ``delete``, ``diff``, ``snapshot``,
  ``restore``, ``close``; root here) never follows a symlink: every path is resolved component
  by component from a directory fd held since ``create`` (``openat`` with ``O_NOFOLLOW``,
  ``O_DIRECTORY``), absolute paths and ``..`` are refused, files are opened only after
  ``lstat`` says they are regular (never a fifo or device) and ``write`` replaces a non-regular
  or hard-linked entry instead of writing through it. Walks keep at most 32 parent directory fds
  open and, deeper, go back up with ``..`` checked against the inode they came from, so a tree
  of any depth is removed. No setuid/setgid bit is ever written.
- Only regular files and directories are part of a snapshot; anything else found by
  ``snapshot()`` is left out (and removed by the next ``restore()``).

Permissions: the workspace and its directories are ``0o1777`` (the sandbox's per-slot uid can
add files, and cannot remove or rename ours), files ``0o644`` owned by the caller, or ``0o666``
with ``writable=True`` so the sandboxed code can edit them in place (tools that replace files by
renaming still cannot). Pass tests as ``Job(protected=...)`` (hash-checked by the worker), or
write them with ``mode=0o444`` (then the sandbox can neither edit nor remove them). The default
location is ``/dev/shm/rlvr-sandbox/ws`` (``rlvr-sandbox-<uid>`` if another user owns that); a
``root`` of your own must be traversable by the sandbox's uid. ``close()``, the ``with`` block,
garbage collection or interpreter exit removes the directory.

Not guaranteed: anything while untrusted code runs concurrently with these calls (the weak
backend leaves no pid namespace to kill stragglers), a wall clock stepped backwards between a
manifest and a change, and the disk space sandboxed code fills. Not thread-safe: one caller at
a time per ``Workspace``.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from rlvr.sandbox.harness import write_all

if TYPE_CHECKING:
    from typing_extensions import Self

DIR_MODE = 0o1777
FILE_MODE = 0o644
WRITABLE_FILE_MODE = 0o666
COARSE_CLOCK = 5  # CLOCK_REALTIME_COARSE: the clock ctime comes from without multigrain stamps
MAX_DEPTH = 256  # snapshot/list/diff refuse deeper trees (restore/close remove any depth)
_HOLD = 32  # walks keep this many levels of parent directory fds open

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_Key = tuple  # (ino, size, mtime_ns, ctime_ns, mode, uid, gid, nlink)


class _File(NamedTuple):
    data: bytes
    mode: int
    uid: int
    gid: int


class _Dir(NamedTuple):
    mode: int
    uid: int
    gid: int


_Node = _File | _Dir


class Workspace:
    """A directory on tmpfs with a snapshot to restore. Build it with ``Workspace.create``."""

    def __init__(self, path: str, fd: int, file_mode: int, racy_ns: int):
        self._path, self._fd, self._file_mode = path, fd, file_mode
        self._racy_ns = racy_ns  # 0: ctime is fine-grained after a stat, nothing is racy
        self._euid, self._egid = os.geteuid(), os.getegid()
        self._dirs: dict[str, _Dir] = {}  # dir rel ("" = the root) -> its mode and owner
        self._tree: dict[str, dict[str, _Node]] = {}  # dir rel -> name -> what belongs there
        self._manifest: dict[str, _Key] = {}  # file rel -> stat key after the last walk
        self._racy: set[str] = set()
        self._finalizer = weakref.finalize(self, _cleanup, path, fd, os.getpid())

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def create(cls, files: dict[str, str | bytes], root: str | None = None, *,
               writable: bool = False) -> Workspace:
        """Write ``files`` (relative path -> text or bytes) into a new directory under ``root``
        and take the initial snapshot. ``writable``: files 0o666 instead of 0o644."""
        euid, egid = os.geteuid(), os.getegid()
        mode = WRITABLE_FILE_MODE if writable else FILE_MODE
        dirs: dict[str, _Dir] = {"": _Dir(DIR_MODE, euid, egid)}
        tree: dict[str, dict[str, _Node]] = {"": {}}
        for rel, content in files.items():
            parts = _split(rel)
            data = content.encode() if isinstance(content, str) else bytes(content)
            d = ""
            for part in parts[:-1]:
                sub = f"{d}/{part}" if d else part
                node = tree[d].get(part)
                if node is None:
                    tree[d][part] = dirs[sub] = _Dir(DIR_MODE, euid, egid)
                    tree[sub] = {}
                elif isinstance(node, _File):
                    raise ValueError(f"{rel!r}: {sub!r} is also a file")
                d = sub
            if parts[-1] in tree[d]:
                raise ValueError(f"{rel!r} is also a directory")
            tree[d][parts[-1]] = _File(data, mode, euid, egid)
        base = _base_dir(root)
        racy_ns = _racy_window(base)
        path = tempfile.mkdtemp(prefix="ws-", dir=base)
        fd = os.open(path, _DIR)
        ws = cls(path, fd, mode, racy_ns)
        ws._dirs, ws._tree = dirs, tree
        try:
            ws.restore()
        except BaseException:
            ws.close()
            raise
        return ws

    @property
    def path(self) -> str:
        return self._path

    def __repr__(self) -> str:
        state = "open" if self._finalizer.alive else "closed"
        return f"Workspace({self._path!r}, {state})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the directory and everything in it. Idempotent."""
        self._finalizer()
        self._tree, self._dirs, self._manifest = {}, {}, {}

    # -- trusted file access ---------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes:
        parent, name = self._open_parent(rel)
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            _require_regular(st, rel)
            return _read_at(parent, name)[0]
        finally:
            os.close(parent)

    def read(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def write(self, rel: str, content: str | bytes, mode: int | None = None) -> None:
        """Write a regular file, creating parent directories (0o1777). An existing regular file
        keeps its inode, mode and owner unless ``mode`` is given; a symlink, fifo or other
        non-regular entry there (or a file with other hard links) is replaced, never written
        through. New files get the workspace's file mode."""
        data = content.encode() if isinstance(content, str) else bytes(content)
        parent, name = self._open_parent(rel, create=True)
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, f"{rel!r} is a directory")
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                f = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                            dir_fd=parent)
                try:
                    fst = os.fstat(f)
                    if stat.S_ISREG(fst.st_mode) and fst.st_ino == st.st_ino and fst.st_nlink == 1:
                        os.ftruncate(f, 0)
                        write_all(f, data)
                        if mode is not None:
                            os.fchmod(f, mode & 0o777)
                        return
                finally:
                    os.close(f)
            if st is not None:
                os.unlink(name, dir_fd=parent)
            f = os.open(name, _CREATE, 0o600, dir_fd=parent)
            try:
                os.fchmod(f, (self._file_mode if mode is None else mode) & 0o777)
                write_all(f, data)
            finally:
                os.close(f)
        finally:
            os.close(parent)

    def delete(self, rel: str) -> None:
        """Remove a file, symlink or other entry, or a directory with everything under it."""
        parent, name = self._open_parent(rel)
        try:
            _remove_at(parent, name, os.stat(name, dir_fd=parent, follow_symlinks=False))
        finally:
            os.close(parent)

    def list(self) -> list[str]:
        """Sorted relative paths of the regular files in the workspace now."""
        out: list[str] = []

        def visit(fd: int, rel: str, dst: os.stat_result) -> list[str]:
            _check_depth(rel)
            prefix, subdirs = _prefix(rel), []
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.name)
                    elif e.is_file(follow_symlinks=False):
                        out.append(prefix + e.name)
            return subdirs

        self._check_open()
        _walk(self._fd, visit)
        return sorted(out)

    # -- snapshot / restore ----------------------------------------------------------------

    def snapshot(self) -> None:
        """Make the current state the snapshot (regular files and directories only). Re-reads
        only the files whose stat changed since the last snapshot/restore."""
        self._check_open()
        t0 = time.time_ns()
        dirs: dict[str, _Dir] = {}
        tree: dict[str, dict[str, _Node]] = {}
        manifest: dict[str, _Key] = {}
        racy: set[str] = set()

        def visit(fd: int, rel: str, dst: os.stat_result) -> list[str]:
            _check_depth(rel)
            if rel == "":
                dirs[""] = _dir_of(dst)
            old, children, prefix, subdirs = self._tree.get(rel, {}), {}, _prefix(rel), []
            tree[rel] = children
            with os.scandir(fd) as it:
                entries = [(e.name, e.stat(follow_symlinks=False)) for e in it]
            for name, st in entries:
                crel = prefix + name
                if stat.S_ISDIR(st.st_mode):
                    children[name] = dirs[crel] = _dir_of(st)
                    subdirs.append(name)
                elif stat.S_ISREG(st.st_mode):
                    key, prev = _key(st), old.get(name)
                    if (type(prev) is _File and self._manifest.get(crel) == key
                            and crel not in self._racy):
                        data = prev.data
                    else:
                        data, key = _read_at(fd, name)
                    rec = children[name] = _File(data, key[4] & 0o777, key[5], key[6])
                    if stat.S_IMODE(key[4]) == rec.mode:  # else restore rewrites it without
                        manifest[crel] = key              # its setuid/setgid/sticky bits
                        if self._racy_ns and key[3] >= t0 - self._racy_ns:
                            racy.add(crel)
            return subdirs

        _walk(self._fd, visit)
        self._dirs, self._tree, self._manifest, self._racy = dirs, tree, manifest, racy

    def restore(self) -> int:
        """Make the directory equal to the snapshot. Returns how many entries it had to fix
        (removed, rewritten or recreated, a directory's mode/owner reset); 0: untouched."""
        self._check_open()
        t0 = time.time_ns()
        racy: set[str] = set()
        created: set[str] = set()  # directories made here: counted once, when made
        fixed = [0]

        def visit(fd: int, rel: str, dst: os.stat_result) -> list[str]:
            if self._fix_dir(fd, dst, self._dirs[rel]) and rel not in created:
                fixed[0] += 1
            expected, prefix = self._tree[rel], _prefix(rel)
            keep: set[str] = set()
            subdirs: list[str] = []
            with os.scandir(fd) as it:
                entries = [(e.name, e.stat(follow_symlinks=False)) for e in it]
            for name, st in entries:
                want = expected.get(name)
                if type(want) is _File and stat.S_ISREG(st.st_mode):
                    crel, key = prefix + name, _key(st)
                    if self._manifest.get(crel) == key and (
                            crel not in self._racy or _holds(fd, name, want.data, key)):
                        keep.add(name)
                        if self._racy_ns and key[3] >= t0 - self._racy_ns:
                            racy.add(crel)
                        continue
                elif type(want) is _Dir and stat.S_ISDIR(st.st_mode):
                    keep.add(name)
                    subdirs.append(name)
                    continue
                _remove_at(fd, name, st)
                fixed[0] += name not in expected  # else counted once, when recreated below
            for name, want in expected.items():
                if name in keep:
                    continue
                if type(want) is _File:
                    crel = prefix + name
                    key = self._manifest[crel] = self._create_file(fd, name, want)
                    if self._racy_ns and key[3] >= t0 - self._racy_ns:
                        racy.add(crel)
                else:
                    os.mkdir(name, 0o700, dir_fd=fd)  # mode and owner: set when visited
                    created.add(prefix + name)
                    subdirs.append(name)
                fixed[0] += 1
            return subdirs

        _walk(self._fd, visit)
        self._racy = racy
        return fixed[0]

    def diff(self) -> dict[str, list[str]]:
        """What changed since the snapshot: ``{"added", "modified", "deleted"}`` -> sorted
        relative paths of files (and of symlinks, fifos, ... which count as files here).
        Modified: other bytes, mode or type. Empty directories are not reported."""
        self._check_open()
        added: list[str] = []
        modified: list[str] = []
        present: set[str] = set()

        def visit(fd: int, rel: str, dst: os.stat_result) -> list[str]:
            _check_depth(rel)
            expected, prefix, subdirs = self._tree.get(rel, {}), _prefix(rel), []
            with os.scandir(fd) as it:
                entries = [(e.name, e.stat(follow_symlinks=False)) for e in it]
            for name, st in entries:
                crel, want = prefix + name, expected.get(name)
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(name)
                    continue
                if type(want) is not _File:
                    added.append(crel)
                    continue
                present.add(crel)
                if not stat.S_ISREG(st.st_mode):
                    modified.append(crel)
                    continue
                key = _key(st)
                if self._manifest.get(crel) == key and crel not in self._racy:
                    continue
                if stat.S_IMODE(st.st_mode) != want.mode or not _holds(fd, name, want.data):
                    modified.append(crel)
            return subdirs

        _walk(self._fd, visit)
        deleted = [rel for rel in self._snapshot_files() if rel not in present]
        return {"added": sorted(added), "modified": sorted(modified), "deleted": sorted(deleted)}

    # -- internals -------------------------------------------------------------------------

    def _snapshot_files(self) -> list[str]:
        return [_prefix(d) + name for d, children in self._tree.items()
                for name, node in children.items() if type(node) is _File]

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise ValueError("workspace is closed")

    def _open_parent(self, rel: str, create: bool = False) -> tuple[int, str]:
        """An fd of ``rel``'s directory, walked to one component at a time without following
        symlinks (``create``: missing directories are made, 0o1777), and the last name."""
        self._check_open()
        parts = _split(rel)
        fd = os.open(".", _DIR, dir_fd=self._fd)
        try:
            for part in parts[:-1]:
                try:
                    sub = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o700, dir_fd=fd)
                    sub = os.open(part, _DIR, dir_fd=fd)
                    os.fchmod(sub, DIR_MODE)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise NotADirectoryError(
                            errno.ENOTDIR, f"{rel!r}: {part!r} is not a directory "
                            "(symlinks are never followed)") from None
                    raise
                os.close(fd)
                fd = sub
            return fd, parts[-1]
        except BaseException:
            os.close(fd)
            raise

    def _fix_dir(self, fd: int, st: os.stat_result, want: _Dir) -> bool:
        """Reset a directory's owner (as root) and mode; whether anything was off."""
        chown = self._euid == 0 and (st.st_uid, st.st_gid) != (want.uid, want.gid)
        if chown:
            os.fchown(fd, want.uid, want.gid)
        if chown or stat.S_IMODE(st.st_mode) != want.mode:
            os.fchmod(fd, want.mode)  # after fchown, which may clear setgid
            return True
        return False

    def _create_file(self, fd: int, name: str, want: _File) -> _Key:
        f = os.open(name, _CREATE, 0o600, dir_fd=fd)
        try:
            if self._euid == 0 and (want.uid, want.gid) != (self._euid, self._egid):
                os.fchown(f, want.uid, want.gid)
            os.fchmod(f, want.mode)
            write_all(f, want.data)
            return _key(os.fstat(f))
        finally:
            os.close(f)


# ---- helpers --------------------------------------------------------------------------------

def _base_dir(root: str | None) -> str:
    if root is not None:
        os.makedirs(root, exist_ok=True)
        return root
    top = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    euid = os.geteuid()
    mode = 0o711 if euid == 0 else 0o700  # the sandbox uid only passes through
    path = _own_dir(os.path.join(top, "rlvr-sandbox"), mode)
    if path is None:  # another user's (root ran a sandbox here before): one of our own
        path = _own_dir(os.path.join(top, f"rlvr-sandbox-{euid}"), mode)
    ws = _own_dir(os.path.join(path, "ws"), mode) if path else None
    if ws is None:
        raise PermissionError(errno.EPERM, f"no directory of this user for workspaces under "
                              f"{top} (something else holds the name); pass root=")
    return ws


def _own_dir(path: str, mode: int) -> str | None:
    """``path`` as a directory of this user with ``mode``; None if it is someone else's or
    not a directory (a world-writable parent like /dev/shm lets anyone take the name)."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


_RACY_WINDOWS: dict[int, int] = {}


def _racy_window(directory: str) -> int:
    """How recent (ns) a ctime must be, when a manifest is taken, for a later change to
    possibly keep it: 0 where ctime is fine-grained once queried (multigrain timestamps: tmpfs
    and ext4 from Linux 6.13), else two ticks of the coarse clock. Probed once per filesystem:
    stat, write, stat again, five times; a coarse clock shows the same ctime (almost) always."""
    dev = os.stat(directory).st_dev
    if dev not in _RACY_WINDOWS:
        try:
            tick = int(time.clock_getres(COARSE_CLOCK) * 1e9)
        except OSError:
            tick = 10_000_000
        window = max(2 * tick, 2_000_000)
        fd, probe = tempfile.mkstemp(prefix=".ctime-probe-", dir=directory)
        try:
            for _ in range(5):
                before = os.fstat(fd).st_ctime_ns
                os.write(fd, b"x")
                if os.fstat(fd).st_ctime_ns == before:
                    break
            else:
                window = 0
        finally:
            os.close(fd)
            os.unlink(probe)
        _RACY_WINDOWS[dev] = window
    return _RACY_WINDOWS[dev]


def _split(rel: str) -> list[str]:
    """The components of a workspace-relative path; refuses absolute paths and ``..``."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise ValueError(f"not a workspace path: {rel!r}")
    if rel.startswith("/"):
        raise ValueError(f"absolute path refused (paths are relative to the workspace): {rel!r}")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path escapes or is not normalized ('', '.', '..'): {rel!r}")
    return parts


def _prefix(rel: str) -> str:
    return rel + "/" if rel else ""


def _check_depth(rel: str) -> None:
    if rel.count("/") >= MAX_DEPTH:
        raise ValueError(f"workspace is deeper than {MAX_DEPTH} directories at {rel[:200]!r}...")


def _key(st: os.stat_result) -> _Key:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid,
            st.st_gid, st.st_nlink)


def _dir_of(st: os.stat_result) -> _Dir:
    return _Dir(stat.S_IMODE(st.st_mode) & 0o1777, st.st_uid, st.st_gid)


def _require_regular(st: os.stat_result, rel: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"{rel!r} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{rel!r} is not a regular file (symlink, fifo, ...)")


def _read_at(fd: int, name: str) -> tuple[bytes, _Key]:
    """Contents and stat key of a regular file (``name`` in directory ``fd``), not following
    a symlink and never blocking on a fifo."""
    f = os.open(name, _READ, dir_fd=fd)
    try:
        st = os.fstat(f)
        _require_regular(st, name)
        chunks, size = [], st.st_size + 1
        while True:
            chunk = os.read(f, max(size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), _key(st)
    finally:
        os.close(f)


def _holds(fd: int, name: str, data: bytes, key: _Key | None = None) -> bool:
    """Whether ``name`` is a regular file holding exactly ``data`` (and, given ``key``, is
    still that inode with that stat)."""
    try:
        got, got_key = _read_at(fd, name)
    except OSError:
        return False
    return got == data and (key is None or got_key == key)


def _open_dir(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:
        if os.geteuid() == 0:
            raise
        _chmod_dir_nofollow(dir_fd, name, 0o700)  # our own directory, chmod'ed 000 by the run
        return os.open(name, _DIR, dir_fd=dir_fd)


def _chmod_dir_nofollow(dir_fd: int, name: str, mode: int) -> None:
    p = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISDIR(os.fstat(p).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, name)
        os.chmod(f"/proc/self/fd/{p}", mode)  # the inode the O_PATH fd holds, no lookup
    finally:
        os.close(p)


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class _Frame:
    __slots__ = ("fd", "ident", "name", "pending", "rel")

    def __init__(self, rel: str, name: str, st: os.stat_result):
        self.rel, self.name, self.pending = rel, name, []
        self.ident, self.fd = (st.st_dev, st.st_ino), -1


def _walk(root_fd: int, visit: Callable[[int, str, os.stat_result], list[str]],
          leave: Callable[[int, str], None] | None = None, track: bool = True) -> None:
    """Depth-first over the directory ``root_fd``: ``visit(fd, rel, fstat)`` for each
    directory (the root first, rel ""), which returns the names of its subdirectories to
    enter; after one is done, ``leave(parent_fd, name)``. Entered with ``O_NOFOLLOW``. The
    parents' fds stay open for the first ``_HOLD`` levels; deeper, only the current one is,
    and the walk goes back up through ``..`` checked against the directory it came from, so
    any depth is fine. ``track=False`` passes rel "" (no quadratic paths in deep trees)."""
    fd = os.open(".", _DIR, dir_fd=root_fd)
    frames: list[_Frame] = []
    try:
        st = os.fstat(fd)
        frames.append(_Frame("", "", st))
        frames[0].pending = visit(fd, "", st)
        while frames:
            top = frames[-1]
            if top.pending:
                name = top.pending.pop()
                sub = _open_dir(fd, name)
                if len(frames) < _HOLD:
                    top.fd = fd
                else:
                    os.close(fd)
                fd = sub
                st = os.fstat(fd)
                rel = _prefix(top.rel) + name if track else ""
                frame = _Frame(rel, name, st)
                frames.append(frame)
                frame.pending = visit(fd, rel, st)
                continue
            frames.pop()
            if not frames:
                break
            parent = frames[-1]
            if parent.fd >= 0:
                os.close(fd)
                fd, parent.fd = parent.fd, -1
            else:
                up = os.open("..", _DIR, dir_fd=fd)
                os.close(fd)
                fd = up
                if _ident(fd) != parent.ident:
                    raise RuntimeError("workspace changed during a walk ('..' moved)")
            if leave is not None:
                leave(fd, top.name)
    finally:
        os.close(fd)
        for frame in frames:
            if frame.fd >= 0:
                os.close(frame.fd)


def _clear(fd: int, _rel: str, st: os.stat_result) -> list[str]:
    """Unlink everything in ``fd`` but subdirectories; return those."""
    if os.geteuid() != 0 and st.st_uid == os.geteuid() and st.st_mode & 0o700 != 0o700:
        os.fchmod(fd, 0o700)  # not root: our own directory, chmod'ed by the run
    with os.scandir(fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    subdirs = []
    for name, is_dir in entries:
        if is_dir:
            subdirs.append(name)
        else:
            os.unlink(name, dir_fd=fd)
    return subdirs


def _rmdir_at(fd: int, name: str) -> None:
    os.rmdir(name, dir_fd=fd)


def _rmtree_at(dir_fd: int, name: str) -> None:
    sub = _open_dir(dir_fd, name)
    try:
        _walk(sub, _clear, leave=_rmdir_at, track=False)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dir_fd)


def _remove_at(dir_fd: int, name: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        _rmtree_at(dir_fd, name)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _cleanup(path: str, fd: int, owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked child exiting: the workspace is its parent's
        return
    try:
        parent = os.open(os.path.dirname(path), _DIR)
        try:
            name = os.path.basename(path)
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == _ident(fd):
                _rmtree_at(parent, name)
        finally:
            os.close(parent)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)
