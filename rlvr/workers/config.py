"""How a run uses a Ray cluster (``backend: ray``; the section ``ray:`` of a GRPO config)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlvr.config import check_range
from rlvr.errors import ConfigError

ADDRESS_FORMS = "local | auto | HOST:PORT | ray://HOST:PORT"


@dataclass
class RayConfig:
    address: str = "local"
    """local: start a Ray instance on this machine for the run; auto: join the cluster this
    machine's ``ray start`` belongs to; HOST:PORT (or ray://HOST:PORT): that cluster's head."""
    num_cpus: int = 0
    """CPUs of a ``local`` instance (0: every core); ignored when joining a cluster."""
    rollout_workers: int = 1
    """Rollout actors, each with an engine copy of the policy; a step's tasks are split among them."""
    verifier_workers: int = 1
    """Verifier actors, each with its own sandbox pool; a step's samples are split among them."""
    max_rollout_workers: int = 0
    """Elastic: rollout actors are added between steps, up to this many, while the cluster has the
    resources for one more (a node that joins gets work from the next step); 0: fixed at
    ``rollout_workers``."""
    max_verifier_workers: int = 0
    """The same for verifier actors; 0: fixed at ``verifier_workers``."""
    rollout_cpus: float = 1.0
    """CPUs Ray reserves for each rollout actor (fractions allowed; its torch threads: max(1, int))."""
    rollout_gpus: float = 0.0
    """GPUs per rollout actor (0: it generates on CPU)."""
    verifier_cpus: float = 1.0
    """CPUs Ray reserves for each verifier actor (its sandbox pool sizes itself to the machine)."""
    trainer_cpus: float = 1.0
    """CPUs of the trainer actor."""
    trainer_gpus: float = 0.0
    """GPUs of the trainer actor (1 to train on a GPU: set ``device: cuda`` too)."""
    max_retries: int = 3
    """Times one chunk of work is rerun on a replacement actor after the actor running it died."""
    trainer_restarts: int = 2
    """Times a lost trainer actor is restarted from the run's newest checkpoint."""

    def __post_init__(self) -> None:
        if not (self.address in ("local", "auto") or re.fullmatch(r"(ray://)?[\w.\-]+:\d+", self.address)):
            raise ConfigError(f"config key 'ray.address' = {self.address!r} is not allowed; use {ADDRESS_FORMS}")
        check_range("ray.num_cpus", self.num_cpus, 0)
        check_range("ray.rollout_workers", self.rollout_workers, 1)
        check_range("ray.verifier_workers", self.verifier_workers, 1)
        for key, base in (("max_rollout_workers", self.rollout_workers), ("max_verifier_workers", self.verifier_workers)):
            value = getattr(self, key)
            if value and value < base:
                raise ConfigError(f"config key 'ray.{key}' = {value} is below the starting count {base}; "
                                  f"set it to 0 (fixed) or at least {base}")
        for key in ("rollout_cpus", "rollout_gpus", "verifier_cpus", "trainer_cpus", "trainer_gpus"):
            check_range(f"ray.{key}", getattr(self, key), 0.0)
        check_range("ray.max_retries", self.max_retries, 0)
        check_range("ray.trainer_restarts", self.trainer_restarts, 0)
