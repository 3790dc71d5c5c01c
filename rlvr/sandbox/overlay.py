"""A copy-on-write workspace over a read-only tree, put back in about a millisecond at any size.

    with OverlayWorkspace([tree]) as ws:          # tree: a repository checked out at a commit
        sb.run(Job.command([...], workdir=ws.path))   # the run edits ws.path freely
        ws.restore()                                # the next episode starts from the tree again

The tree (one or more read-only lower layers) is never written: an overlayfs mount at ``path``
puts a fresh, empty upper directory on tmpfs over it, and every write of a run lands there.
``restore`` lazily unmounts, deletes the upper and work directories (only what the episode
changed) and mounts again: no copy of the tree and no walk over it, so a 50,000-file repository
restores as fast as a 50-file one (``benchmarks/repo_workspace.py``). ``close`` unmounts and
removes everything but the tree.

Overlays are mounted under ``overlay_root()``, a directory bind-mounted onto itself and marked
shared; sandbox workers (root backends) hold their mount namespace as a *slave* of it, so a
workspace mounted after the pool started is visible to the runs, while nothing a worker mounts
propagates back. Mounting needs root here (``available()``): elsewhere ``open_workspace`` falls
back to ``Workspace``, which holds the tree in memory and restores by walking it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rlvr.sandbox import kernel

ROOT = "/dev/shm/rlvr-overlays"


def available() -> bool:
    return kernel.LINUX and os.geteuid() == 0 and os.path.isdir("/dev/shm")


def _is_mountpoint(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


def overlay_root() -> str | None:
    """The shared mount point overlays are mounted under (made once); None where overlays are
    not available. Call before sandbox workers start: they see mounts under it from then on."""
    if not available():
        return None
    os.makedirs(ROOT, mode=0o711, exist_ok=True)
    os.chmod(ROOT, 0o711)
    if not _is_mountpoint(ROOT):
        kernel.mount(ROOT, ROOT, None, kernel.MS_BIND)
        kernel.mount(None, ROOT, None, kernel.MS_SHARED)
    return ROOT


class OverlayWorkspace:
    """``lowers``: read-only trees, the top one first (overlayfs ``lowerdir`` order)."""

    def __init__(self, lowers: list[str | Path]) -> None:
        root = overlay_root()
        if root is None:
            raise OSError("overlay workspaces need root on Linux (rlvr.sandbox.overlay.available)")
        self.lowers = [str(Path(p).resolve()) for p in lowers]
        self.dir = tempfile.mkdtemp(prefix="ws-", dir=root)
        os.chmod(self.dir, 0o711)
        self.path = os.path.join(self.dir, "merged")
        os.mkdir(self.path)
        self._mounted = False
        self._mount()

    def _mount(self) -> None:
        upper, work = os.path.join(self.dir, "upper"), os.path.join(self.dir, "work")
        os.mkdir(upper)
        os.chmod(upper, 0o777)  # the merged root: the sandbox's uid may add, remove and rename
        os.mkdir(work, 0o700)
        options = f"lowerdir={':'.join(self.lowers)},upperdir={upper},workdir={work}"
        kernel.mount("overlay", self.path, "overlay", kernel.MS_NOSUID | kernel.MS_NODEV, options)
        self._mounted = True

    def _discard(self) -> None:
        if self._mounted:
            kernel.umount(self.path, kernel.MNT_DETACH)
            self._mounted = False
        for name in ("upper", "work"):
            shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)

    def restore(self) -> None:
        """Back to the lower trees exactly: whatever the runs wrote, deleted or renamed is gone."""
        self._discard()
        self._mount()

    def changed(self) -> list[str]:
        """Paths the episode wrote or deleted (the upper layer's entries), relative, sorted."""
        upper = os.path.join(self.dir, "upper")
        out = []
        for dirpath, dirs, files in os.walk(upper):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
                out.append(os.path.relpath(os.path.join(dirpath, name), upper))
        return sorted(out)

    def close(self) -> None:
        if self.dir and os.path.isdir(self.dir):
            self._discard()
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = ""

    def __enter__(self) -> OverlayWorkspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
