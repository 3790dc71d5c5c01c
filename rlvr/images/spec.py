"""An environment image's declaration (``ImageSpec``), read from YAML, and its content key.

A spec names the image, the interpreter (``python``: a version such as ``"3.11"`` that ``uv`` finds
installed, never downloaded; default the host's), the packages as a lock (``requirements``: one
``name==version --hash=sha256:...`` per line, every one pinned and hashed: the build installs with
``--require-hashes``), where the wheels come from (``index_url`` or ``find_links``, a directory of
wheels for offline builds), ``files`` written into the image (``files/`` under its root) and a
``setup`` command run once at build time with the image's interpreter first on ``PATH``.

The key is a SHA-256 over what decides the image's content: the lock with its hashes (sorted), the
interpreter (implementation, full version, platform), the files' contents and the setup command.
Two builds of one spec on one platform get one key, so an image is built once and shared by every
task (and every repository at a commit) that names it. Where the wheels came from is not in the key:
the hashes already pin them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import UserError

FORMAT = 1  # bump when the build's output changes for one spec
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
PINNED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?==[^\s;]+")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
FIELDS = ("name", "python", "requirements", "index_url", "find_links", "files", "setup")


@dataclass(frozen=True)
class ImageSpec:
    name: str
    requirements: tuple[str, ...] = ()  # "pkg==1.2 --hash=sha256:..." lines
    python: str = ""  # "" = the interpreter rlvr runs on
    index_url: str = ""
    find_links: str = ""  # a directory of wheels (offline builds)
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text
    setup: str = ""
    source: str = ""  # the file it was read from (messages only; not part of the key)

    def key(self, interpreter: dict[str, str]) -> str:
        """The content key, given the interpreter the build resolved (``interpreter_identity``)."""
        body = {"format": FORMAT, "requirements": sorted(_normal(r) for r in self.requirements),
                "interpreter": interpreter, "setup": self.setup,
                "files": {p: hashlib.sha256(t.encode()).hexdigest() for p, t in sorted(self.files.items())}}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def lock_text(self) -> str:
        return "".join(r + "\n" for r in self.requirements)


def _normal(line: str) -> str:
    name, _, rest = line.partition("==")
    hashes = sorted(HASH.findall(rest))
    version = rest.split()[0] if rest.split() else ""
    return f"{name.strip().lower().replace('_', '-')}=={version} {' '.join(hashes)}"


def parse_spec(data: Any, where: str, base_dir: Path | None = None) -> ImageSpec:
    """An ``ImageSpec`` from a mapping; every problem names ``where`` and the field."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: an image spec is a mapping with {', '.join(FIELDS)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r}; an image spec has {', '.join(FIELDS)}")
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise UserError(f"{where}: name: {name!r} is not an image name (lowercase letters, digits, '.', '_', '-')")
    reqs = data.get("requirements", [])
    if isinstance(reqs, str):
        reqs = [line for line in reqs.splitlines()]
    if not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs):
        raise UserError(f"{where}: requirements: a list of 'name==version --hash=sha256:...' lines")
    lines = [r.strip() for r in reqs if r.strip() and not r.strip().startswith("#")]
    for i, line in enumerate(lines):
        if not PINNED.match(line):
            raise UserError(f"{where}: requirements[{i}]: {line!r} is not pinned with '=='")
        if not HASH.search(line):
            raise UserError(f"{where}: requirements[{i}]: {line!r} has no --hash=sha256:<64 hex>; "
                            "an image installs hashed packages only")
    for key in ("python", "index_url", "find_links", "setup"):
        if not isinstance(data.get(key, ""), str):
            raise UserError(f"{where}: {key}: must be a string")
    files = data.get("files", {}) or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise UserError(f"{where}: files: a mapping of relative path -> text")
    for rel in files:
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts:
            raise UserError(f"{where}: files: {rel!r} is not a relative path inside the image")
    find_links = data.get("find_links", "")
    if find_links and base_dir is not None and not Path(find_links).is_absolute():
        find_links = str((base_dir / find_links).resolve())
    return ImageSpec(name=name, requirements=tuple(lines), python=data.get("python", ""),
                     index_url=data.get("index_url", ""), find_links=find_links,
                     files=dict(files), setup=data.get("setup", ""), source=where)


def read_spec(path: str | Path) -> ImageSpec:
    from rlvr.config import read_yaml

    path = Path(path)
    try:
        data = read_yaml(path)
    except UserError as e:
        raise UserError(f"image spec {e}") from None
    return parse_spec(data, str(path), base_dir=path.parent)
