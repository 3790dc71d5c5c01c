"""``rlvr.atomic.write_text_atomic``: a reader sees the old file or the new one, whole; a write that
fails (a full disk, a kill between write and rename) leaves the old file and no debris."""

from __future__ import annotations

import errno
import os

import pytest

from rlvr.atomic import write_text_atomic


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "eval" / "rl.json"
    write_text_atomic(path, '{"old": 1}')
    assert path.read_text() == '{"old": 1}'

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, '{"new": 2}' * 1000)
    monkeypatch.undo()
    assert path.read_text() == '{"old": 1}' and sorted(p.name for p in path.parent.iterdir()) == ["rl.json"]
    write_text_atomic(path, '{"new": 2}')
    assert path.read_text() == '{"new": 2}'
