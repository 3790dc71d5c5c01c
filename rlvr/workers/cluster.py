"""Connecting to Ray: the one place that imports it for the workers (with the extra's error)."""

from __future__ import annotations

import os

from rlvr.errors import UserError
from rlvr.workers.config import RayConfig


def ray_module():
    """``import ray``, or a one-line error naming the extra."""
    try:
        import ray
    except ImportError as e:
        raise UserError("backend 'ray' needs Ray: pip install 'rlvr[ray]' (or set backend: local)") from e
    return ray


def connect(cfg: RayConfig):
    """The ``ray`` module, connected: an already initialised session (a test's, or this process is
    itself a Ray worker) is reused; else ``ray.address`` says whether to start a local instance or
    join a cluster. Returns the module."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    # Workers inherit this environment: offline hub, one tokenizer thread per process.
    env = {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS")
           if k in os.environ}
    options = dict(include_dashboard=False, log_to_driver=True, runtime_env={"env_vars": env})
    if cfg.address == "local":
        ray.init(num_cpus=cfg.num_cpus or None, **options)
    else:
        try:
            ray.init(address=cfg.address, **options)
        except ConnectionError as e:
            raise UserError(f"ray.address={cfg.address!r}: no Ray cluster reachable there ({e}); "
                            "start one with `ray start --head` (docs/distributed.md)") from e
    return ray


def torch_threads(cpus: float) -> int:
    """Torch threads for an actor that Ray gave ``cpus`` CPUs."""
    return max(1, int(cpus))
