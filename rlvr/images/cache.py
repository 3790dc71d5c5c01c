"""Where built images live, how one is found and verified, and how old ones are collected.

Layout under the images root (``RLVR_IMAGES``, default ``~/.cache/rlvr/images``)::

    <key>/venv/ files/        the image: read-only (files 0444/0555, directories 0555)
    <key>/image.json          its manifest, written last: key, name, tree digest, size, build time
    <key>/build.log           what the build printed
    names/<name>              the key the newest build of ``name`` gave
    used/<key>                touched on each use (``gc`` removes the least recently used first)
    .staging/                 builds in progress (never used; a crashed one is removed by ``gc``)

An image counts only when its manifest is there and the tree digest it records equals the tree's
(``verify``): a missing, partial or altered image is a one-line ``UserError`` and is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import UserError

MANIFEST = "image.json"
TREE = ("venv", "files")  # what the digest covers


def root() -> Path:
    """The images root (created, world-traversable so the sandbox's uid can read images)."""
    path = Path(os.environ.get("RLVR_IMAGES") or Path.home() / ".cache" / "rlvr" / "images")
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


@dataclass(frozen=True)
class Image:
    key: str
    name: str
    path: Path  # <root>/<key>
    digest: str
    size_bytes: int
    build_s: float
    python: str

    @property
    def python_bin(self) -> str:
        return str(self.path / "venv" / "bin" / "python")


def tree_digest(path: Path) -> tuple[str, int]:
    """SHA-256 over the image tree (``venv/`` and ``files/``): every entry's relative path, type,
    mode, symlink target or content. Returns (hex digest, bytes of file content)."""
    h, size = hashlib.sha256(), 0
    for top in TREE:
        base = path / top
        if not base.exists():
            h.update(f"absent {top}\n".encode())
            continue
        for dirpath, dirs, files in os.walk(base):
            dirs.sort()
            for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, path)
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    h.update(f"L {rel} {os.readlink(full)}\n".encode())
                    continue
                h.update(f"F {rel} {st.st_mode & 0o777:o} ".encode())
                with open(full, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                        size += len(chunk)
                h.update(b"\n")
            h.update(f"D {os.path.relpath(dirpath, path)} {sorted(dirs)}\n".encode())
    return h.hexdigest(), size


_verified: dict[tuple[str, float], Image] = {}


def load(path: Path, *, check: bool = True) -> Image:
    """The image at ``path``, verified against its manifest (once per process and manifest)."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise UserError(f"image {path.name[:12]} at {path} is incomplete (no {MANIFEST}): "
                        "rebuild it with `rlvr envs build SPEC`")
    stamp = (str(path), manifest.stat().st_mtime)
    if check and stamp in _verified:
        return _verified[stamp]
    try:
        m = json.loads(manifest.read_text())
        image = Image(key=m["key"], name=m["name"], path=path, digest=m["digest"],
                      size_bytes=int(m["size_bytes"]), build_s=float(m["build_s"]), python=m["python"])
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"image {path.name[:12]} at {path}: its {MANIFEST} is unreadable ({e}); "
                        "remove it and rebuild") from None
    if image.key != path.name:
        raise UserError(f"image at {path}: its manifest names key {image.key[:12]}, not {path.name[:12]}")
    if check:
        digest, _ = tree_digest(path)
        if digest != image.digest:
            raise UserError(f"image {image.name} ({image.key[:12]}) at {path} is corrupt: its tree digest "
                            f"{digest[:12]} is not the recorded {image.digest[:12]}; never used: "
                            "`rlvr envs gc --remove-corrupt` and rebuild")
        _verified[stamp] = image
    return image


_touched: dict[str, float] = {}
TOUCH_EVERY_S = 60.0  # ``resolve`` runs once per sandbox job: record a use at most this often


def touch_used(image: Image, where: Path | None = None) -> None:
    now = time.time()
    if now - _touched.get(str(image.path), 0.0) < TOUCH_EVERY_S:
        return
    used = (where or image.path.parent) / "used"
    used.mkdir(exist_ok=True)
    (used / image.key).write_text(f"{now}\n")
    _touched[str(image.path)] = now


def last_used(where: Path, key: str) -> float:
    try:
        return float((where / "used" / key).read_text())
    except (OSError, ValueError):
        try:
            return (where / key / MANIFEST).stat().st_mtime
        except OSError:
            return 0.0


def resolve(name_or_key: str, where: Path | None = None) -> Image:
    """The verified image a task names (an image name, or a key); a one-line error otherwise."""
    where = where or root()
    if len(name_or_key) == 64 and all(c in "0123456789abcdef" for c in name_or_key):
        path = where / name_or_key
        if not path.exists():
            raise UserError(f"image {name_or_key[:12]} is not in {where}: build its spec (`rlvr envs build SPEC`)")
    else:
        pointer = where / "names" / name_or_key
        if not pointer.is_file():
            raise UserError(f"image {name_or_key!r} is not built in {where}: `rlvr envs build SPEC` "
                            "(or list its spec under the run's images:)")
        path = where / pointer.read_text().strip()
        if not path.exists():
            raise UserError(f"image {name_or_key!r} points at {path.name[:12]}, which is gone "
                            "(collected?): build its spec again")
    image = load(path)
    touch_used(image, where)
    return image


def images(where: Path | None = None) -> list[Image]:
    """Every complete image under the root (manifest read, not re-verified), newest use first."""
    where = where or root()
    found = []
    for entry in where.iterdir():
        if len(entry.name) == 64 and (entry / MANIFEST).is_file():
            try:
                found.append(load(entry, check=False))
            except UserError:
                continue
    return sorted(found, key=lambda i: -last_used(where, i.key))


def remove(path: Path) -> None:
    """Delete an image tree (made writable first: images are read-only)."""
    for dirpath, dirs, _files in os.walk(path):
        for d in dirs:
            full = os.path.join(dirpath, d)
            if not os.path.islink(full):
                os.chmod(full, 0o755)
    if path.exists():
        os.chmod(path, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def gc(budget_bytes: int, where: Path | None = None, *, keep: tuple[str, ...] = (),
       remove_corrupt: bool = False) -> list[str]:
    """Remove least-recently-used images until the rest fit in ``budget_bytes``; crashed
    builds always; corrupt images too with ``remove_corrupt``. Keys in ``keep`` stay. Returns
    what was removed (keys, and ``staging/...`` for leftovers)."""
    where = where or root()
    removed = []
    staging = where / ".staging"
    if staging.exists():
        for entry in staging.iterdir():
            pid = entry.name.rsplit("-", 1)[-1]
            if not (pid.isdigit() and _alive(int(pid))):
                remove(entry)
                removed.append(f"staging/{entry.name}")
    if remove_corrupt:
        for entry in where.iterdir():
            if len(entry.name) == 64 and entry.is_dir():
                try:
                    load(entry)
                except UserError:
                    remove(entry)
                    removed.append(entry.name)
    kept = images(where)
    total = sum(i.size_bytes for i in kept)
    for image in reversed(kept):  # least recently used first
        if total <= budget_bytes:
            break
        if image.key in keep:
            continue
        remove(image.path)
        (where / "used" / image.key).unlink(missing_ok=True)
        total -= image.size_bytes
        removed.append(image.key)
    names = where / "names"
    if names.exists():  # pointers to removed images go too
        for pointer in names.iterdir():
            if not (where / pointer.read_text().strip() / MANIFEST).is_file():
                pointer.unlink()
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
