"""The file tools of ``code.repair``: list, read, write and patch files of the episode's
workspace (the sandbox job's working directory). Standard library only: they run in the sandbox
(tool bodies), as the slot's uid, under their grants (read-only tools see a read-only workspace).

Only regular files are read or written, never through a symlink at the last component
(``O_NOFOLLOW``); files are created mode 0o666 and directories 0o1777 (sticky), as in
``rlvr.sandbox.Workspace``, so a later run under another slot's uid can write them too.
"""

from __future__ import annotations

import os
import stat

OK = "ok"  # what a successful edit answers
MAX_FILE_CHARS = 4000  # a write_file/replace result longer than this is refused (default)
MAX_FILES = 32  # files the workspace may hold (write_file refuses new ones past it; default)
MAX_READ_BYTES = 1 << 20


def _files() -> list[str]:
    out = []
    for dirpath, dirs, names in os.walk("."):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
        for name in names:
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                out.append(os.path.normpath(path))
    return sorted(out)


def list_files() -> str:
    return "\n".join(_files())


def read_file(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ValueError(f"no file {path}") from None
    except OSError as e:  # a symlink, a bad path, ...
        raise ValueError(f"cannot read {path}: {type(e).__name__}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"cannot read {path}: not a file")
        data = f.read(MAX_READ_BYTES)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"cannot read {path}: not text") from None


def replace_once(text: str, old: str, new: str) -> str:
    """``text`` with the one occurrence of ``old`` replaced; ValueError if not exactly one."""
    n = text.count(old) if old else 0
    if n != 1:
        raise ValueError("not found" if n == 0 else f"found {n} times; make old longer")
    return text.replace(old, new, 1)


def _mkdirs(parent: str) -> None:
    parts = [p for p in parent.split("/") if p]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if not os.path.isdir(d) or os.path.islink(d):
            os.mkdir(d, 0o1777)
            os.chmod(d, 0o1777)


def write_file(path: str, content: str, max_chars: int = MAX_FILE_CHARS, max_files: int = MAX_FILES) -> str:
    if len(content) > max_chars:
        raise ValueError(f"content too long (over {max_chars} characters)")
    try:
        if not os.path.lexists(path) and len(_files()) >= max_files:
            raise ValueError(f"too many files (at most {max_files})")
        _mkdirs(os.path.dirname(path))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "w") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"cannot write {path}: not a file")
            f.write(content)
        if os.stat(path, follow_symlinks=False).st_uid == os.getuid():
            os.chmod(path, 0o666)
    except OSError as e:
        raise ValueError(f"cannot write {path}: {e.strerror or type(e).__name__}") from None
    return OK


def replace(path: str, old: str, new: str, max_chars: int = MAX_FILE_CHARS, max_files: int = MAX_FILES) -> str:
    if old == new:
        raise ValueError("old and new are the same; nothing changed")
    try:
        text = replace_once(read_file(path), old, new)
    except ValueError as e:
        if str(e).startswith(("no file", "cannot read")):
            raise
        raise ValueError(f"old text {e} in {path}") from None
    return write_file(path, text, max_chars, max_files)
