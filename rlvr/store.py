"""Object storage for runs: a run's checkpoints and final model mirrored to any fsspec URL
(``s3://bucket/prefix`` on an S3-compatible store, ``file://``, ``memory://``), so a run started on
one machine resumes on another from the store alone.

Layout under the store URL (one run)::

    checkpoints/step_N/files/...        the checkpoint directory's files, and the run files a resume
                                        needs (metrics.jsonl, alerts.jsonl, config.yaml,
                                        operations.jsonl) as of that step, under run/
    checkpoints/step_N/MANIFEST.json    written last: every file's path, size and SHA-256
    final/files/..., final/MANIFEST.json

Atomicity: an object store has no rename, so a push uploads every file first and the manifest last,
in one PUT; a reader trusts only an entry whose manifest exists and whose files match it. A push
killed half way leaves files without a manifest, which no reader sees and the next push of that
step overwrites. A pull downloads into a temporary directory, checks every size and SHA-256, and
only then renames it into place; a missing or changed file is a one-line error naming it (the
previous checkpoint is tried next).

Credentials and endpoints come from ``store.options`` (fsspec's storage options, e.g.
``{endpoint_url: http://127.0.0.1:9000, key: ..., secret: ...}`` for s3fs) or the usual
environment variables (``AWS_ACCESS_KEY_ID``, ...). ``s3://`` needs the ``s3fs`` extra.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import UserError

MANIFEST = "MANIFEST.json"
RUN_FILES = ("metrics.jsonl", "alerts.jsonl", "config.yaml", "operations.jsonl")
"""The run directory's files a resume reads, pushed with every checkpoint as of its step."""


@dataclass
class StoreConfig:
    url: str = ""
    """Where the run's checkpoints and final model are mirrored (s3://bucket/prefix, file://...,
    memory://...); empty: the local run directory only. ``--resume`` in a directory without a
    checkpoint pulls the newest complete one from here."""
    options: dict[str, Any] = field(default_factory=dict)
    """fsspec storage options (s3fs: endpoint_url, key, secret, client_kwargs, ...)."""

    @property
    def enabled(self) -> bool:
        return bool(self.url)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class RunStore:
    """One run's mirror at ``cfg.url``."""

    def __init__(self, cfg: StoreConfig) -> None:
        import fsspec

        if cfg.url.startswith(("s3://", "s3a://")):
            try:
                import s3fs  # noqa: F401  (the s3 protocol's implementation)
            except ImportError:
                raise UserError(f"store.url {cfg.url}: s3:// needs the s3fs extra (pip install 'rlvr[s3fs]')") from None
        try:
            self.fs, self.root = fsspec.core.url_to_fs(cfg.url, **cfg.options)
        except (ValueError, ImportError, TypeError) as e:
            raise UserError(f"store.url {cfg.url}: {e}") from None
        self.root = self.root.rstrip("/")
        self.url = cfg.url

    # ------------------------------------------------------------------ push

    def push(self, name: str, files: dict[str, Path]) -> dict:
        """Upload ``files`` (store-relative path -> local file) under ``name``, the manifest last."""
        base = f"{self.root}/{name}"
        entries = {}
        try:
            self.fs.makedirs(base, exist_ok=True)  # local and memory filesystems need parents; S3 has none
            for rel, local in sorted(files.items()):
                target = f"{base}/files/{rel}"
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                self.fs.put_file(str(local), target)
                entries[rel] = {"bytes": local.stat().st_size, "sha256": _sha256(local)}
            manifest = {"name": name, "files": entries}
            with self.fs.open(f"{base}/{MANIFEST}", "w") as f:
                f.write(json.dumps(manifest, indent=1))
        except OSError as e:
            raise UserError(f"store {self.url}: could not write {name} ({e})") from None
        return manifest

    def push_checkpoint(self, ckpt: Path, run_dir: Path, keep: int) -> None:
        """The checkpoint directory ``ckpt`` and the run files as of now, then the oldest complete
        checkpoints beyond ``keep`` removed (manifest first, so none is seen half deleted)."""
        files = {f"checkpoint/{p.relative_to(ckpt)}": p for p in sorted(ckpt.rglob("*")) if p.is_file()}
        files.update({f"run/{n}": run_dir / n for n in RUN_FILES if (run_dir / n).is_file()})
        self.push(f"checkpoints/{ckpt.name}", files)
        for _, name in self.checkpoints()[:-keep] if keep > 0 else []:
            self.remove(f"checkpoints/{name}")

    def push_dir(self, name: str, local: Path) -> None:
        """Every file under ``local`` as ``name`` (the final model)."""
        self.push(name, {str(p.relative_to(local)): p for p in sorted(local.rglob("*")) if p.is_file()})

    def remove(self, name: str) -> None:
        base = f"{self.root}/{name}"
        if self.fs.exists(f"{base}/{MANIFEST}"):
            self.fs.rm(f"{base}/{MANIFEST}")
        if self.fs.exists(base):
            self.fs.rm(base, recursive=True)

    # ------------------------------------------------------------------ read

    def manifest(self, name: str) -> dict | None:
        path = f"{self.root}/{name}/{MANIFEST}"
        try:
            with self.fs.open(path, "r") as f:
                data = json.loads(f.read())
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None

    def checkpoints(self) -> list[tuple[int, str]]:
        """(step, name) of every checkpoint with a manifest, oldest first."""
        try:
            found = self.fs.glob(f"{self.root}/checkpoints/step_*/{MANIFEST}")
        except FileNotFoundError:
            return []
        out = []
        for path in found:
            name = path.rstrip("/").split("/")[-2]
            if name.removeprefix("step_").isdigit():
                out.append((int(name.removeprefix("step_")), name))
        return sorted(out)

    def pull(self, name: str, dest: Path) -> dict:
        """Download ``name`` into ``dest`` (created), every file checked against the manifest."""
        manifest = self.manifest(name)
        if manifest is None:
            raise UserError(f"store {self.url}: {name} has no manifest (not a complete upload)")
        tmp = dest.with_name(f".pull-{dest.name}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        try:
            for rel, meta in manifest["files"].items():
                local = tmp / rel
                local.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self.fs.get_file(f"{self.root}/{name}/files/{rel}", str(local))
                except (FileNotFoundError, OSError) as e:
                    raise UserError(f"store {self.url}: {name}/{rel} is missing ({e})") from None
                if local.stat().st_size != meta["bytes"] or _sha256(local) != meta["sha256"]:
                    raise UserError(f"store {self.url}: {name}/{rel} does not match its manifest (changed or "
                                    f"truncated since it was written)")
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return manifest

    def restore_latest(self, run_dir: Path) -> int | None:
        """The newest checkpoint that pulls cleanly into ``run_dir`` (its checkpoint directory under
        ``checkpoints/`` and the run files beside it); its step, or None when the store has none. A
        broken one is reported in one line and the one before it tried."""
        for step, name in reversed(self.checkpoints()):
            staging = run_dir / f".store-{name}"
            try:
                self.pull(f"checkpoints/{name}", staging)
            except UserError as e:
                print(f"store: skipping {name}: {e}")
                continue
            (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            target = run_dir / "checkpoints" / name
            if target.exists():
                shutil.rmtree(target)
            (staging / "checkpoint").rename(target)
            for n in RUN_FILES:
                if (staging / "run" / n).is_file():
                    (staging / "run" / n).replace(run_dir / n)
            shutil.rmtree(staging, ignore_errors=True)
            return step
        return None


# ---------------------------------------------------------------------- what a trainer calls


def pull_if_missing(cfg: StoreConfig, run_dir: Path, resume: bool) -> None:
    """``--resume`` in a directory with no checkpoint of its own: the newest complete one from the
    store (with the run files), so the run continues where another machine left it."""
    from rlvr.model.checkpoint import latest_checkpoint

    if not (resume and cfg.enabled) or latest_checkpoint(run_dir) is not None:
        return
    pulled = RunStore(cfg).restore_latest(run_dir)
    print(f"store: resuming from {cfg.url} step {pulled}" if pulled is not None
          else f"store: {cfg.url} has no complete checkpoint; starting fresh")


def mirror_checkpoint(cfg: StoreConfig, ckpt: Path, run_dir: Path, keep: int) -> None:
    """The checkpoint just written locally, to the store (files first, manifest last)."""
    if cfg.enabled:
        RunStore(cfg).push_checkpoint(ckpt, run_dir, keep=keep)


def mirror_final(cfg: StoreConfig, final: Path) -> None:
    """The final model directory, to the store as ``final``."""
    if cfg.enabled:
        RunStore(cfg).push_dir("final", final)
