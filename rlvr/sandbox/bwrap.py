"""The bubblewrap launcher: a fresh root filesystem per run, for ``command`` jobs (shell tools,
multi-file projects). Python jobs (io, tests, program) of a ``bwrap`` sandbox use the fork-server
isolation of the same worker, which needs no new interpreter.

The worker has already put the run in a fresh pid namespace, set the rlimits and switched to the
slot's non-root uid, so bwrap itself runs unprivileged (started as root, its sandbox uid maps to
root outside and RLIMIT_NPROC stops nothing). The view inside: read-only ``/usr`` and the
interpreter's prefixes, a private ``/tmp``, ``/proc`` of its own pid namespace, a minimal
``/dev``, no network, the workspace read-write at the same path with protected files bound
read-only over it, an empty environment plus what the job sets.
"""

from __future__ import annotations

import os
import shutil


def find() -> str | None:
    return shutil.which("bwrap")


def wrap(bwrap: str, argv: list[str], workdir: str, protected: list[str],
         read_only: list[str], env: dict[str, str], *, workdir_read_only: bool = False) -> list[str]:
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--clearenv", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in read_only:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            cmd += ["--ro-bind", path, path]
    cmd += ["--ro-bind" if workdir_read_only else "--bind", workdir, workdir]
    for rel in protected:
        path = os.path.join(workdir, rel)
        cmd += ["--ro-bind", path, path]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd + ["--chdir", workdir, "--", *argv]
