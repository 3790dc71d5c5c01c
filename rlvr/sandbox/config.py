"""How a run configures its sandbox, the one place that opens it (and refuses weak ones), and the
process-wide shared one that verifiers use (``shared_sandbox``)."""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import check_choice
from rlvr.errors import ConfigError
from rlvr.sandbox.detect import BACKENDS

UID_COUNT = 1000  # the sandbox uids (pool.UID_COUNT; not imported: pool is heavier)


@dataclass
class SandboxConfig:
    backend: str = "auto"
    """auto | forkserver | forkserver-userns | bwrap | weak (see ``rlvr sandbox info``)."""
    workers: int = 0
    """Pre-warmed worker processes; 0 = one per core (at most 8). Also the CPU budget: at most
    this many runs compute at once (runs seen sleeping or blocked do not count)."""
    max_slots: int = 64
    """Execution slots in all: while jobs wait and the busy runs are not using CPU (a program
    that sleeps until its wall limit), extra workers are started up to this many, each with
    its own uid. 0 = ``workers`` (fixed pool, no extra slots); never below ``workers``."""
    slot_idle_s: float = 30.0
    """An extra slot (beyond ``workers``) idle this many seconds retires."""
    allow_weak: bool = False
    """Accept the weak backend (no namespaces) where nothing stronger exists; prints what it lacks."""
    audit: bool = True
    """Write ``sandbox_audit.jsonl`` (one line per execution) in the run directory."""

    def __post_init__(self) -> None:
        check_choice("sandbox.backend", self.backend, BACKENDS)
        if self.workers < 0:
            raise ConfigError(f"sandbox.workers must be >= 0, got {self.workers}")
        if self.max_slots < 0 or self.max_slots > UID_COUNT:
            raise ConfigError(f"sandbox.max_slots must be in 0..{UID_COUNT} (one uid per slot), "
                              f"got {self.max_slots}")
        if self.max_slots and self.workers > self.max_slots:
            raise ConfigError(f"sandbox.max_slots ({self.max_slots}) must be >= sandbox.workers "
                              f"({self.workers}), or 0")
        if not self.slot_idle_s > 0:
            raise ConfigError(f"sandbox.slot_idle_s must be > 0, got {self.slot_idle_s}")


def open_sandbox(cfg: SandboxConfig, run_dir: str | Path | None = None, warn=print):
    """A ``Sandbox`` for a run. Raises ``UserError`` on a weak backend unless ``allow_weak``."""
    import warnings

    from rlvr.sandbox.pool import Sandbox

    audit = str(Path(run_dir) / "sandbox_audit.jsonl") if (cfg.audit and run_dir) else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sandbox = Sandbox(workers=cfg.workers or None, backend=cfg.backend,
                          allow_weak=cfg.allow_weak, audit_path=audit,
                          max_slots=cfg.max_slots, idle_s=cfg.slot_idle_s)
    for w in caught:
        warn(f"WARNING: {w.message}")
    return sandbox


# ---------------------------------------------------------------- the process-wide sandbox

_shared = None
_shared_pid = 0  # the process that opened it: a forked child never closes its parent's pool
_shared_lock = threading.Lock()


def _is_open(sandbox) -> bool:
    return sandbox is not None and not getattr(sandbox, "_closed", False)


def shared_sandbox(cfg: SandboxConfig | None = None, run_dir: str | Path | None = None, warn=print):
    """The process-wide ``Sandbox``, opened on first use with ``open_sandbox(cfg or default)``.

    Later calls return the same pool and ignore ``cfg``/``run_dir`` (unless it was closed, or
    this is a forked child of the process that opened it: then a new one is opened with them).
    Thread-safe; closed at interpreter exit.
    """
    global _shared, _shared_pid
    with _shared_lock:
        if not _is_open(_shared) or _shared_pid != os.getpid():
            _shared = open_sandbox(cfg or SandboxConfig(), run_dir, warn)
            _shared_pid = os.getpid()
        return _shared


def close_shared_sandbox() -> None:
    """Close the process-wide sandbox, if one is open; the next ``shared_sandbox()`` reopens."""
    global _shared
    with _shared_lock:
        sandbox, _shared = _shared, None
    if _is_open(sandbox) and _shared_pid == os.getpid():
        sandbox.close()


atexit.register(close_shared_sandbox)
