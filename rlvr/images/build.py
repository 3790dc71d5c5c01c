"""Build an ``ImageSpec`` into a cached, content-addressed, read-only root with ``uv``.

``uv venv --relocatable`` makes the environment on the chosen interpreter (found, never downloaded),
``uv pip install --require-hashes`` installs the lock (every package pinned and hashed, byte code
compiled), the spec's files are written and its setup command run; then the tree is made read-only,
its digest computed and the manifest written, and the staging directory is renamed into place in one
step. A build that fails or is killed leaves only a staging directory, which is never used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import UserError
from rlvr.images import cache
from rlvr.images.spec import ImageSpec
from rlvr.store import StoreConfig

MIN_FREE_BYTES = 256 << 20  # refused below this much free space (or 3x the local wheels)
SETUP_TIMEOUT_S = 600
IDENTITY = ("import json, platform, sys, sysconfig; print(json.dumps({'implementation': "
            "sys.implementation.name, 'version': platform.python_version(), 'platform': "
            "sysconfig.get_platform(), 'libc': '-'.join(platform.libc_ver()), 'prefix': sys.base_prefix}))")


@dataclass(frozen=True)
class Built:
    image: cache.Image
    cached: bool  # not built here: found in the cache or fetched from a store
    seconds: float
    source: str = "cache"  # cache | store | built


def uv_bin() -> str:
    try:
        import uv
    except ImportError:
        raise UserError("building environment images needs uv: pip install 'rlvr[uv]'") from None
    return uv.find_uv_bin()


def interpreter(spec: ImageSpec) -> tuple[str, dict[str, str]]:
    """The interpreter the image runs on, and what identifies it (part of the key)."""
    if spec.python:
        found = subprocess.run([uv_bin(), "python", "find", "--no-python-downloads", spec.python],
                               capture_output=True, text=True)
        if found.returncode != 0 or not found.stdout.strip():
            raise UserError(f"{spec.source or spec.name}: python: no installed interpreter matches "
                            f"{spec.python!r} (images never download one): {found.stderr.strip()[:200]}")
        python = found.stdout.strip()
    else:
        python = getattr(sys, "_base_executable", sys.executable)
    out = subprocess.run([python, "-I", "-c", IDENTITY], capture_output=True, text=True, check=True)
    identity = json.loads(out.stdout)
    prefix = identity["prefix"]  # in the key: an image's venv links to its interpreter by path
    readable = (sys.base_prefix, "/usr")
    if not any(os.path.realpath(prefix).startswith(os.path.realpath(r)) for r in readable):
        raise UserError(f"{spec.source or spec.name}: python: {python} lives under {prefix}, which the "
                        f"sandbox cannot read; use the host's interpreter or one under /usr")
    return python, identity


def build(spec: ImageSpec, where: Path | None = None, *, min_free_bytes: int = MIN_FREE_BYTES,
          store: StoreConfig | None = None) -> Built:
    """The image of ``spec``: found in the cache (verified), fetched from ``store`` (verified), or
    built now (and pushed to ``store``)."""
    t0 = time.perf_counter()
    where = where or cache.root()
    python, identity = interpreter(spec)
    key = spec.key(identity)
    final = where / key
    if final.exists():
        image = cache.load(final)  # a corrupt one raises: never used, never silently rebuilt over
        _name(where, spec.name, key)
        cache.touch_used(image, where)
        return Built(image, cached=True, seconds=time.perf_counter() - t0)
    if store is not None and store.enabled:
        from rlvr.images import remote

        fetched = remote.fetch(key, store, where)
        if fetched is not None:
            _name(where, spec.name, key)
            cache.touch_used(fetched, where)
            return Built(fetched, cached=True, seconds=time.perf_counter() - t0, source="store")
    _check_space(spec, where, min_free_bytes)
    staging = where / ".staging" / f"{key[:16]}-{os.getpid()}"
    if staging.exists():
        cache.remove(staging)
    staging.mkdir(parents=True)
    log = staging / "build.log"
    try:
        _populate(spec, python, staging, where, log)
        for top in cache.TREE:
            _read_only(staging / top)
        digest, size = cache.tree_digest(staging)
        manifest = {"key": key, "name": spec.name, "digest": digest, "size_bytes": size,
                    "build_s": round(time.perf_counter() - t0, 3), "python": identity["version"],
                    "interpreter": identity, "spec": spec.source, "requirements": list(spec.requirements),
                    "built_at": time.time()}
        (staging / cache.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            os.rename(staging, final)
        except OSError:  # another build of the same key finished first: use it
            if not (final / cache.MANIFEST).is_file():
                raise
            cache.remove(staging)
    except BaseException:
        if staging.exists():
            if log.exists():
                shutil.copyfile(log, _failed_log(where, spec))
            cache.remove(staging)
        raise
    image = cache.load(final)
    _name(where, spec.name, key)
    cache.touch_used(image, where)
    if store is not None and store.enabled:
        from rlvr.images import remote

        remote.push(image, store)
    return Built(image, cached=False, seconds=time.perf_counter() - t0, source="built")


def _populate(spec: ImageSpec, python: str, staging: Path, where: Path, log: Path) -> None:
    uv = uv_bin()
    venv = staging / "venv"
    uv_cache = ["--cache-dir", str(where / ".uv-cache")]
    _run([uv, "venv", "-q", "--relocatable", "--no-python-downloads", "--python", python, *uv_cache,
          str(venv)], log, spec, "uv venv")
    for junk in (".lock", ".gitignore", "CACHEDIR.TAG"):
        (venv / junk).unlink(missing_ok=True)
    if spec.requirements:
        lock = staging / "requirements.lock"
        lock.write_text(spec.lock_text())
        source = (["--no-index", "--find-links", spec.find_links] if spec.find_links else []) + \
                 (["--index-url", spec.index_url] if spec.index_url else [])
        _run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--require-hashes",
              "--compile-bytecode", "--no-python-downloads", *uv_cache, *source, "-r", str(lock)],
             log, spec, "uv pip install")
        lock.unlink()
    files = staging / "files"
    files.mkdir()
    for rel, text in spec.files.items():
        path = files / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if spec.setup:
        env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(venv),
               "HOME": str(files), "LANG": "C.UTF-8"}
        _run(["/bin/sh", "-c", spec.setup], log, spec, "setup", cwd=files, env=env, timeout=SETUP_TIMEOUT_S)


def _run(argv: list[str], log: Path, spec: ImageSpec, step: str, **kw) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, **kw)
        except subprocess.TimeoutExpired:
            raise UserError(f"image {spec.name}: {step} ran past {kw.get('timeout')} s") from None
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or [""]
        raise UserError(f"image {spec.name}: {step} failed (exit {proc.returncode}): {tail[0][:300]} "
                        f"(build log: {_failed_log(log.parent.parent.parent, spec)})")


def _failed_log(where: Path, spec: ImageSpec) -> Path:
    (where / "failed-builds").mkdir(exist_ok=True)
    return where / "failed-builds" / f"{spec.name}.log"


def _read_only(top: Path) -> None:
    if not top.exists():
        return
    for dirpath, dirs, files in os.walk(top):
        for name in files:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                continue
            mode = os.stat(full).st_mode
            os.chmod(full, 0o555 if mode & 0o111 else 0o444)
        for name in dirs:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o555)
    os.chmod(top, 0o555)


def _check_space(spec: ImageSpec, where: Path, min_free: int) -> None:
    need = min_free
    if spec.find_links and os.path.isdir(spec.find_links):
        wheels = sum(e.stat().st_size for e in os.scandir(spec.find_links) if e.is_file())
        need = max(need, 3 * wheels)
    free = shutil.disk_usage(where).free
    if free < need:
        raise UserError(f"image {spec.name}: {free >> 20} MiB free under {where}, a build needs "
                        f"{need >> 20} MiB: `rlvr envs gc --budget SIZE` frees space")


def _name(where: Path, name: str, key: str) -> None:
    from rlvr.atomic import write_text_atomic

    (where / "names").mkdir(exist_ok=True)
    write_text_atomic(where / "names" / name, key + "\n")
