"""Atomic, resumable checkpoints and final model directories inside a run directory.

Layout: ``run_dir/checkpoints/step_N/`` holds a Hugging Face model directory (safetensors weights,
config, tokenizer), ``trainer_state.pt`` (whatever the trainer needs to resume: optimizer and
scheduler state dicts, RNG states, data and curriculum state, metrics), what the trainer's ``extra``
writer adds (PPO's critic: ``critic/``), a ``MANIFEST.json`` (every other file's size and SHA-256)
and a ``COMPLETE`` marker.

Atomicity: everything is written into a temporary sibling directory (``.tmp-...``), each file
hashed and fsynced into the manifest, the marker last, and the directory is then renamed into
place. A crash leaves at most a temp directory, which ``latest_checkpoint`` ignores and
``prune_checkpoints`` removes, never a ``step_N`` that looks complete but is not.
``save_model_dir`` does the same for ``run_dir/final``.

Integrity: ``latest_checkpoint`` checks the newest complete checkpoint against its manifest (a file
missing, truncated or changed since it was written) and, when it fails, prints one line naming the
checkpoint and the file and falls back to the previous one. A checkpoint written before manifests
existed (a marker, no manifest) is trusted as it is.

What it does not do: decide when to checkpoint or what goes into the trainer state (the trainer
does), or load models (``rlvr/model/load.py``; a checkpoint directory is a normal model dir).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import sys
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rlvr.faults import fault_point

CHECKPOINTS = "checkpoints"
MARKER = "COMPLETE"
MANIFEST = "MANIFEST.json"
TRAINER_STATE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    """Flush a directory entry (the rename) to disk; best effort where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished ``tmp`` directory to ``final``, replacing an existing ``final``.

    A directory cannot be atomically swapped over a non-empty one, so an existing ``final`` is
    first renamed aside; between the two renames a reader may briefly see no ``final``, but it never
    sees a partial one.
    """
    old = None
    if final.exists():
        old = final.with_name(f"{_TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _save_hf(directory: Path, model: Any, tokenizer: Any) -> None:
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def save_checkpoint(run_dir: str | Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any],
                    extra: Callable[[Path], None] | None = None) -> Path:
    """Write ``run_dir/checkpoints/step_{step}/`` atomically and return its path.

    ``state`` is saved with ``torch.save`` as ``trainer_state.pt``; re-saving a step replaces it.
    ``extra`` (optional) writes more into the directory before the marker, so it is part of the
    same atomic checkpoint (the PPO critic's ``critic/``).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    parent = Path(run_dir) / CHECKPOINTS
    parent.mkdir(parents=True, exist_ok=True)
    final = parent / f"step_{step}"
    tmp = parent / f"{_TMP_PREFIX}step_{step}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _save_hf(tmp, model, tokenizer)
        fault_point("checkpoint")
        fault_point("checkpoint_mid_file", before=lambda: _write_half(tmp / TRAINER_STATE, state))
        torch.save(state, tmp / TRAINER_STATE)
        if extra is not None:
            extra(tmp)
        write_manifest(tmp)
        with open(tmp / MARKER, "w") as f:  # written last: its presence means all else is there
            f.write(f"{step}\n")
            f.flush()
            os.fsync(f.fileno())
        fault_point("checkpoint_publish")
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_half(path: Path, state: dict[str, Any]) -> None:
    """The first half of ``state``'s file, as a write cut short leaves it (fault injection)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    with open(path, "wb") as f:
        f.write(buf.getvalue()[: buf.tell() // 2])
        f.flush()
        os.fsync(f.fileno())


def _complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, sorted by step."""
    parent = Path(run_dir) / CHECKPOINTS
    if not parent.is_dir():
        return []
    found = []
    for d in parent.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / MARKER).is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


def _file_digest(path: Path, sync: bool = False) -> str:
    """SHA-256 of a file, read in 1 MiB blocks; ``sync``: fsync it too (a file just written)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
        if sync:
            os.fsync(f.fileno())
    return h.hexdigest()


def write_manifest(directory: Path) -> None:
    """``MANIFEST.json``: the size and SHA-256 of every file under ``directory`` (sub-directories
    included), each fsynced; the marker and the manifest itself excluded."""
    files = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": _file_digest(p, sync=True)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name not in (MARKER, MANIFEST)}
    with open(directory / MANIFEST, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def checkpoint_problem(ckpt_dir: str | Path) -> str | None:
    """What is wrong with a complete checkpoint against its manifest (the first problem, one
    line), or None when every listed file is there with its size and SHA-256."""
    ckpt = Path(ckpt_dir)
    manifest = ckpt / MANIFEST
    if not manifest.is_file():
        return None  # written before manifests: nothing to check against
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    for name, want in files.items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, {want['bytes']} were written"
        if _file_digest(path) != want["sha256"]:
            return f"{name} changed since it was written (SHA-256 differs)"
    return None


def has_checkpoint(run_dir: str | Path, step: int) -> bool:
    """Whether the complete checkpoint of ``step`` exists (its marker; not read or verified)."""
    return (Path(run_dir) / CHECKPOINTS / f"step_{step}" / MARKER).is_file()


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step whose files match its manifest, or None.
    A damaged one is skipped with one line on stderr naming it; the previous one is used."""
    for _, path in reversed(_complete_checkpoints(run_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        print(f"rlvr: checkpoint {path} is damaged ({problem}); using the one before it", file=sys.stderr)
    return None


def load_trainer_state(ckpt_dir: str | Path) -> dict[str, Any]:
    """The ``state`` dict passed to ``save_checkpoint`` (our own file, so full unpickling is fine)."""
    return torch.load(Path(ckpt_dir) / TRAINER_STATE, map_location="cpu", weights_only=False)


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints, and leftover temp directories.

    Returns the removed paths. Incomplete ``step_N`` directories (no marker; never written by
    ``save_checkpoint``) are left alone for the user to inspect.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    parent = Path(run_dir) / CHECKPOINTS
    removed = [d for _, d in _complete_checkpoints(run_dir)[:-keep]]
    if parent.is_dir():
        removed += [d for d in parent.iterdir() if d.name.startswith(_TMP_PREFIX) and d.is_dir()]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return removed


def save_model_dir(directory: str | Path, model: Any, tokenizer: Any,
                   extra: Callable[[Path], None] | None = None) -> Path:
    """``save_pretrained`` model and tokenizer into ``directory`` atomically, replacing it if present;
    ``extra`` writes more into it before it is published (a reward model's head)."""
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{_TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        _save_hf(tmp, model, tokenizer)
        if extra is not None:
            extra(tmp)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def rng_state() -> dict[str, Any]:
    """Snapshot of the python ``random``, numpy and torch (CPU and CUDA) global RNGs."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a snapshot taken by ``rng_state``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
