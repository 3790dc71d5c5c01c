"""Images in object storage (``rlvr.store``): an image travels as one tar under ``images/<key>/``
with the store's manifest (size and SHA-256, written last), so a machine that lacks an image can
fetch it instead of building it, and a fetched image is used only after two checks: the tar matches
the manifest, and the unpacked tree matches the digest its own ``image.json`` records.

The key includes the interpreter's location (an image's ``venv`` links to it), so an image is only
ever fetched onto a machine with the same interpreter at the same path; elsewhere the key differs
and the spec is built there.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

from rlvr.errors import UserError
from rlvr.images import cache
from rlvr.store import RunStore, StoreConfig

TAR = "image.tar"


def _filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's ``tar`` filter (nothing outside the destination, no devices, no setuid), except
    that a symlink may point anywhere: an image's ``venv/bin/python`` links to its interpreter."""
    if member.issym():
        return member
    return tarfile.tar_filter(member, path)


def push(image: cache.Image, store: StoreConfig) -> None:
    """Upload ``image`` (tar of its directory) to ``store`` under ``images/<key>``."""
    remote = RunStore(store)
    if remote.manifest(f"images/{image.key}") is not None:
        return  # content-addressed: already there
    with tempfile.TemporaryDirectory(prefix="rlvr-image-push-") as tmp:
        tar = Path(tmp) / TAR
        with tarfile.open(tar, "w") as out:
            out.add(image.path, arcname=image.key)
        remote.push(f"images/{image.key}", {TAR: tar})


def fetch(key: str, store: StoreConfig, where: Path) -> cache.Image | None:
    """The image ``key`` fetched from ``store`` into ``where`` and verified; None when the store
    has no complete upload of it. A tar or tree that does not match is a one-line error, and
    nothing is left in the cache."""
    remote = RunStore(store)
    if remote.manifest(f"images/{key}") is None:
        return None
    staging = where / ".staging" / f"{key[:16]}-{os.getpid()}-fetch"
    if staging.exists():
        cache.remove(staging)
    staging.mkdir(parents=True)
    try:
        remote.pull(f"images/{key}", staging / "download")  # sizes and SHA-256 checked
        with tarfile.open(staging / "download" / TAR) as tar:
            members = tar.getmembers()
            if any(not (m.name == key or m.name.startswith(key + "/")) for m in members):
                raise UserError(f"store {store.url}: images/{key}: the tar holds paths outside the image")
            tar.extractall(staging / "unpacked", filter=_filter)
        unpacked = staging / "unpacked" / key
        final = where / key
        os.rename(unpacked, final)
    except BaseException:
        cache.remove(staging)
        raise
    cache.remove(staging)
    try:
        image = cache.load(final)  # the tree against the digest it records
    except UserError:
        cache.remove(final)
        raise
    return image
