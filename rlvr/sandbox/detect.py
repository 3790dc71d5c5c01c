"""What this machine allows, and which backend the sandbox uses here.

Backends, strongest first:

- ``forkserver``: started as root. Per-slot non-root uid, pid + network + mount namespaces,
  landlock, seccomp, rlimits.
- ``forkserver-userns``: no root, but unprivileged user namespaces are allowed (most desktop
  Linux). The same namespaces, capabilities dropped, landlock, seccomp, rlimits; the run keeps
  your uid (no per-slot uid), so RLIMIT_NPROC counts your own processes too.
- ``bwrap``: bubblewrap started as the slot's non-root uid; each run also gets a fresh root
  filesystem. Slower (an interpreter starts per run); chosen explicitly, for shell tools.
- ``weak``: no namespaces. Landlock + seccomp (no new processes, no sockets) +
  rlimits where the kernel has them, rlimits only elsewhere (macOS). Not an isolation boundary
  against a determined attacker; training refuses it unless ``allow_weak`` is set.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from rlvr.errors import UserError
from rlvr.sandbox import bwrap, kernel, seccomp

BACKENDS = ("auto", "forkserver", "forkserver-userns", "bwrap", "weak")
STRICT = ("forkserver", "forkserver-userns", "bwrap")


@dataclass(frozen=True)
class Capabilities:
    platform: str
    root: bool
    user_namespaces: bool
    landlock_abi: int
    seccomp: bool
    bwrap: str | None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Backend:
    name: str
    strict: bool
    caps: Capabilities
    missing: list[str] = field(default_factory=list)  # what this backend does not protect

    def describe(self) -> str:
        text = f"{self.name} ({'strict' if self.strict else 'WEAK'})"
        return text + (": does not " + "; ".join(self.missing) if self.missing else "")


def capabilities() -> Capabilities:
    linux = kernel.LINUX
    return Capabilities(
        platform=sys.platform,
        root=linux and os.geteuid() == 0,
        user_namespaces=kernel.can_unshare(kernel.CLONE_NEWUSER | kernel.CLONE_NEWPID
                                           | kernel.CLONE_NEWNET | kernel.CLONE_NEWNS),
        landlock_abi=kernel.landlock_abi(),
        seccomp=seccomp.available(),
        bwrap=bwrap.find() if linux else None,
    )


def _weak_gaps(caps: Capabilities) -> list[str]:
    gaps = ["isolate the network by namespace (seccomp refuses every socket instead)",
            "give each run its own uid or pid namespace (new processes are refused instead)"]
    if caps.landlock_abi == 0:
        gaps.append("restrict the filesystem (no landlock): host files are readable and writable")
    if not caps.seccomp:
        gaps = ["block the network, new processes or dangerous syscalls (no seccomp)", *gaps[2:]]
    return gaps


def choose(requested: str = "auto", caps: Capabilities | None = None) -> Backend:
    if requested not in BACKENDS:
        raise UserError(f"sandbox.backend: unknown backend {requested!r}; "
                        f"choose one of {', '.join(BACKENDS)}")
    caps = caps or capabilities()
    linux_strict_base = caps.platform.startswith("linux") and caps.seccomp and caps.landlock_abi
    possible = {
        "forkserver": bool(linux_strict_base and caps.root),
        # as root the run would be uid 0 outside, which RLIMIT_NPROC ignores: use forkserver
        "forkserver-userns": bool(linux_strict_base and caps.user_namespaces and not caps.root),
        "bwrap": bool(caps.root and caps.bwrap and caps.user_namespaces),
        "weak": True,
    }
    if requested == "auto":
        requested = next(n for n in ("forkserver", "forkserver-userns", "weak") if possible[n])
    elif not possible[requested]:
        raise UserError(f"sandbox.backend={requested} is not available here "
                        f"({describe_caps(caps)}); use 'auto'")
    missing: list[str] = []
    if requested == "weak":
        missing = _weak_gaps(caps)
    elif requested == "forkserver-userns":
        missing = ["give each run its own uid (RLIMIT_NPROC counts all of your processes)"]
    return Backend(requested, requested in STRICT, caps, missing)


def available(name: str) -> bool:
    """Whether backend ``name`` can run on this machine (``choose`` would not refuse it)."""
    try:
        choose(name)
    except UserError:
        return False
    return True


def describe_caps(caps: Capabilities) -> str:
    return (f"platform={caps.platform} root={caps.root} userns={caps.user_namespaces} "
            f"landlock_abi={caps.landlock_abi} seccomp={caps.seccomp} bwrap={caps.bwrap}")
