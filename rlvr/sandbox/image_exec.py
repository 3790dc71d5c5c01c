"""Running a job on an environment image's interpreter (``Job.image``, ``rlvr.images``).

A run on an image cannot be a fork of the worker (the worker is the host's interpreter with the
host's packages in memory). Two ways, the first preferred:

- **warm**: the worker starts, inside its own namespaces, a second worker on the image's interpreter
  (``worker._WarmWorker``: the same code, stdlib-only) and relays the image's jobs to it; its runs
  fork from a warm interpreter whose path holds only the image's packages (a few ms a run);
- **exec**: where no warm worker can run (the weak backend, or one that failed to start), after
  isolation the run's first process execs the image's ``python``: for ``command`` jobs in place of
  the host's ``python``, for ``io``/``tests``/``program`` jobs running the harness
  (``harness.exec_main``) on the job, trusted and report fds (a fresh interpreter: ~12 ms more).

The worker modules are stdlib-only; the pool copies them once, byte-compiled, into
``<images root>/.harness/<digest>/`` (read-only), since the rlvr checkout itself is not readable
inside the sandbox. Besides the system, a run on an image may read the image (and, on the exec path,
that copy): other images stay unreadable.
"""

from __future__ import annotations

import hashlib
import os

HARNESS_FILES = ("harness.py", "plaindata.py", "kernel.py", "worker.py", "isolate.py", "bwrap.py", "image_exec.py")
HERE = os.path.dirname(os.path.abspath(__file__))


def harness_copy(images_root: str) -> str:
    """The read-only copy of the harness modules under ``images_root`` (made on first use)."""
    sources = {}
    for name in HARNESS_FILES:
        with open(os.path.join(HERE, name), "rb") as f:
            sources[name] = f.read()
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + s for n, s in sorted(sources.items()))).hexdigest()
    final = os.path.join(images_root, ".harness", digest[:16])
    if os.path.isdir(final):
        return final
    staging = f"{final}.{os.getpid()}"
    package = os.path.join(staging, "rlvr", "sandbox")
    os.makedirs(package, exist_ok=True)
    for path, data in [(os.path.join(staging, "rlvr", "__init__.py"), b""),
                       (os.path.join(package, "__init__.py"), b""),
                       *((os.path.join(package, n), s) for n, s in sources.items())]:
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o444)
    import compileall  # byte code for the host's interpreter version (5 ms less a run on it)

    compileall.compile_dir(staging, quiet=1)
    for dirpath, _dirs, files in os.walk(staging):
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o444)
    for dirpath, _dirs, _files in sorted(os.walk(staging), key=lambda w: -len(w[0])):
        os.chmod(dirpath, 0o555)
    try:
        os.rename(staging, final)
    except OSError:  # another pool made it first
        for dirpath, _dirs, _files in os.walk(staging):
            os.chmod(dirpath, 0o755)
        import shutil
        shutil.rmtree(staging, ignore_errors=True)
    return final


def python_of(image: str) -> str:
    return os.path.join(image, "venv", "bin", "python")


def harness_argv(image: str, harness_dir: str, fds: tuple[int, int, int]) -> list[str]:
    """The image's interpreter running the harness copy on (job, trusted, report) fds."""
    boot = (f"import sys; sys.path.insert(0, {harness_dir!r}); from rlvr.sandbox.harness import "
            "exec_main; exec_main(sys.argv[1:])")
    return [python_of(image), "-I", "-c", boot, *map(str, fds)]
