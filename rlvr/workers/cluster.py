"""Connecting to Ray: the one place that imports it for the workers (with the extra's error)."""

from __future__ import annotations

import math
import os
import socket

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
        # Ray's CPUs are a logical count: a local instance gets at least what the run's actors
        # reserve, so none of them waits for a CPU that will never come
        ray.init(num_cpus=cfg.num_cpus or max(os.cpu_count() or 1, math.ceil(required(cfg)["CPU"])), **options)
    else:
        if cfg.address != "auto":
            reachable(cfg.address)
        try:
            ray.init(address=cfg.address, **options)
        except ConnectionError as e:
            raise UserError(f"ray.address={cfg.address!r}: no Ray cluster reachable there ({e}); "
                            "start one with `ray start --head` (docs/distributed.md)") from e
    return ray


def reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a head that does not answer (Ray itself retries for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise UserError(f"ray.address={address!r}: nothing answers at {host}:{port} ({e.strerror or e}); start the "
                        "head with `ray start --head` or fix the address (docs/distributed.md)") from e


def required(cfg: RayConfig) -> dict[str, float]:
    """What the run's actors reserve: the trainer, the rollout and the verifier actors."""
    return {"CPU": cfg.trainer_cpus + cfg.rollout_workers * cfg.rollout_cpus + cfg.verifier_workers * cfg.verifier_cpus,
            "GPU": cfg.trainer_gpus + cfg.rollout_workers * cfg.rollout_gpus}


def check_resources(ray, cfg: RayConfig) -> None:
    """Refuse a run whose actors cannot all be placed on the cluster (they would wait forever)."""
    have = ray.cluster_resources()
    for name, need in required(cfg).items():
        if need > have.get(name, 0.0) + 1e-9:
            raise UserError(
                f"the run's Ray actors reserve {need:g} {name}s (ray.trainer_{name.lower()}s + ray.rollout_workers x "
                f"ray.rollout_{name.lower()}s" + (" + ray.verifier_workers x ray.verifier_cpus" if name == "CPU" else "")
                + f") but the cluster has {have.get(name, 0.0):g}: lower them, or add nodes (docs/distributed.md)")


def torch_threads(cpus: float) -> int:
    """Torch threads for an actor that Ray gave ``cpus`` CPUs."""
    return max(1, int(cpus))
