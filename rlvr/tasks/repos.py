"""Repositories as environments: a git repository at a commit, checked out once into a cached,
read-only tree that every episode's workspace is layered over (``rlvr.sandbox.overlay``).

``checkout(git_dir, commit)`` extracts the commit (``git archive``) into
``<images root>/repos/trees/<commit>/``: one tree per repository at a commit, shared by every task
and episode on it. Files are 0666 and directories 0777 so that the sandbox's uid can edit, add,
remove and rename in the *overlay* over the tree (an overlay copies a file up with its mode); the
tree itself is out of every run's reach (landlock allows only the run's workspace and the system). A tree counts only
when its manifest (``<commit>.json``: file count, digest) exists and, once per process, its digest
matches: a partial or altered checkout is extracted again.

``vendored(name)`` is a git repository made from a repository vendored under
``rlvr/tasks/repo_data/<name>/``: the vendored tree as the base commit, and one commit per injected
bug of ``bugs.json``, each on its own branch, all with fixed authors and dates, so the commits (and
the task ids that name them) are the same on every machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from rlvr.errors import UserError

DATA = Path(__file__).resolve().parent / "repo_data"
GIT_ENV = {"GIT_AUTHOR_NAME": "rlvr", "GIT_AUTHOR_EMAIL": "rlvr@localhost", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
           "GIT_COMMITTER_NAME": "rlvr", "GIT_COMMITTER_EMAIL": "rlvr@localhost",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
           "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def repos_root() -> Path:
    from rlvr.images.cache import root

    path = root() / "repos"
    path.mkdir(exist_ok=True)
    return path


def git(*args: str, cwd: str | Path, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, input=input, capture_output=True)
    if proc.returncode != 0:
        raise UserError(f"git {' '.join(args[:3])} in {cwd}: {proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout.decode()


@functools.lru_cache(maxsize=1)
def bugs() -> dict:
    return json.loads((DATA / "bugs.json").read_text())


def _content_hash(name: str) -> str:
    h = hashlib.sha256((DATA / "bugs.json").read_bytes())
    base = DATA / name
    for path in sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def vendored(name: str) -> tuple[Path, dict[str, str]]:
    """The git repository of vendored repository ``name`` (made once per content) and the commit
    of each bug id (``"base"``: the vendored tree)."""
    if name not in bugs():
        raise UserError(f"no vendored repository {name!r}; there are {', '.join(sorted(bugs()))}")
    git_dir = repos_root() / f"{name}-{_content_hash(name)}.git"
    commits_file = git_dir / "rlvr-commits.json"
    if commits_file.is_file():
        return git_dir, json.loads(commits_file.read_text())
    staging = git_dir.with_name(f"{git_dir.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(DATA / name, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    git("-c", "init.defaultBranch=main", "init", "-q", cwd=staging)
    git("add", "-A", cwd=staging)
    git("commit", "-q", "-m", f"{name} (vendored)", cwd=staging)
    commits = {"base": git("rev-parse", "HEAD", cwd=staging).strip()}
    for bug in bugs()[name]["bugs"]:
        git("checkout", "-q", "-b", f"bug/{bug['id']}", "main", cwd=staging)
        path = staging / bug["file"]
        path.write_text(path.read_text().replace(bug["good"], bug["bad"], 1))
        git("commit", "-q", "-a", "-m", f"inject {bug['id']}", cwd=staging)
        commits[bug["id"]] = git("rev-parse", "HEAD", cwd=staging).strip()
        git("checkout", "-q", "main", cwd=staging)
    (staging / "rlvr-commits.json").write_text(json.dumps(commits, indent=1) + "\n")
    try:
        os.rename(staging, git_dir)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
    return git_dir, json.loads(commits_file.read_text())


def _digest(tree: Path) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    for dirpath, dirs, files in os.walk(tree):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(dirpath, name)
            h.update(os.path.relpath(full, tree).encode() + b"\0")
            with open(full, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
            n += 1
    return h.hexdigest(), n


_checked: set[str] = set()


def checkout(git_dir: str | Path, commit: str, build: list[str] | None = None, image: str = "") -> Path:
    """The read-only tree of ``commit`` of the repository at ``git_dir`` (extracted once). ``build``:
    a command run once in the sandbox over the fresh checkout (on ``image``'s interpreter, if
    given), before the tree is recorded: its outputs are part of every workspace; a failing build
    is a ``UserError`` and leaves no tree. A tree is kept per (commit, build, image)."""
    if not (len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)):
        raise UserError(f"repository task: commit {commit!r} is not a full 40-hex commit id")
    trees = repos_root() / "trees"
    trees.mkdir(exist_ok=True)
    name = commit if not build else f"{commit}-{hashlib.sha256(json.dumps([build, image]).encode()).hexdigest()[:12]}"
    tree, manifest = trees / name, trees / f"{name}.json"
    if manifest.is_file() and tree.is_dir():
        if str(tree) in _checked:
            return tree
        recorded = json.loads(manifest.read_text())
        if _digest(tree)[0] == recorded["digest"]:
            _checked.add(str(tree))
            return tree
        manifest.unlink()  # altered or partial: never used; extracted again below
    if not Path(git_dir).exists():
        raise UserError(f"repository task: {git_dir} does not exist")
    staging = trees / f".{name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=git_dir, env=GIT_ENV, capture_output=True)
    if archive.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"repository task: {git_dir} has no commit {commit[:12]}: "
                        f"{archive.stderr.decode(errors='replace').strip()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
    for dirpath, dirs, files in os.walk(staging):
        os.chmod(dirpath, 0o777)
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o777 if os.stat(full).st_mode & 0o100 else 0o666)
    if build:
        _build(staging, build, image)
    digest, n = _digest(staging)
    if tree.exists():
        shutil.rmtree(tree)
    os.rename(staging, tree)
    manifest.write_text(json.dumps({"commit": commit, "git": str(git_dir), "build": build, "image": image,
                                    "files": n, "digest": digest}) + "\n")
    _checked.add(str(tree))
    return tree


def _build(tree: Path, build: list[str], image: str) -> None:
    """Run a repository's build step in the sandbox over its fresh checkout (writable there)."""
    from rlvr.sandbox.config import shared_sandbox
    from rlvr.sandbox.types import Job, Limits

    job = Job.command(list(build), workdir=str(tree), image=image,
                      limits=Limits(wall_s=600.0, cpu_s=600, memory_mb=4096, processes=64, file_size_mb=256))
    result = shared_sandbox().run(job)
    if result.status != "ok" or result.exit_code != 0:
        shutil.rmtree(tree, ignore_errors=True)
        tail = (result.stderr.strip() or result.stdout.strip() or result.error).splitlines()[-1:] or [""]
        raise UserError(f"repository build {' '.join(build)!r} failed ({result.status}, exit {result.exit_code}): "
                        f"{tail[0][:300]}")
    for dirpath, dirs, files in os.walk(tree):  # what the build wrote is editable in the overlay too
        os.chmod(dirpath, 0o777)
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o777 if os.stat(full).st_mode & 0o100 else 0o666)
