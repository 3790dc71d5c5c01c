"""How a run configures its sandbox, and the one place that opens it (and refuses weak ones)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr.config import check_choice
from rlvr.errors import ConfigError
from rlvr.sandbox.detect import BACKENDS


@dataclass
class SandboxConfig:
    backend: str = "auto"
    """auto | forkserver | forkserver-userns | bwrap | weak (see ``rlvr sandbox info``)."""
    workers: int = 0
    """Pre-warmed worker processes; 0 = one per core (at most 8)."""
    allow_weak: bool = False
    """Accept the weak backend (no namespaces) where nothing stronger exists; prints what it lacks."""
    audit: bool = True
    """Write ``sandbox_audit.jsonl`` (one line per execution) in the run directory."""

    def __post_init__(self) -> None:
        check_choice("sandbox.backend", self.backend, BACKENDS)
        if self.workers < 0:
            raise ConfigError(f"sandbox.workers must be >= 0, got {self.workers}")


def open_sandbox(cfg: SandboxConfig, run_dir: str | Path | None = None, warn=print):
    """A ``Sandbox`` for a run. Raises ``UserError`` on a weak backend unless ``allow_weak``."""
    import warnings

    from rlvr.sandbox.pool import Sandbox

    audit = str(Path(run_dir) / "sandbox_audit.jsonl") if (cfg.audit and run_dir) else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sandbox = Sandbox(workers=cfg.workers or None, backend=cfg.backend,
                          allow_weak=cfg.allow_weak, audit_path=audit)
    for w in caught:
        warn(f"WARNING: {w.message}")
    return sandbox
