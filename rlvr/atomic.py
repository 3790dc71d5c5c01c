"""Files a crash never leaves half-written: ``write_text_atomic`` writes a temporary sibling,
fsyncs it and renames it over the target, so a reader sees the old file or the new one, whole.

For the JSON and JSONL a user keeps (``report.json``, ``eval/*.json``, pair files, the metrics
log when a resume cuts it back). Directories are published the same way by
``rlvr.model.checkpoint`` (checkpoints, ``final/``).
"""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) in one rename; the parent directory is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
