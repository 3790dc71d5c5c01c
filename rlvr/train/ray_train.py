"""``backend: ray``: the GRPO trainer as a Ray actor, restarted from its last checkpoint when lost.

    driver (rlvr train)      connects (``ray.address``), starts the trainer actor, waits
      trainer actor          ``run_grpo`` as in-process, its rollout source on Ray actors
        rollout actors       engine copies of the policy (``rlvr.workers``)
        verifier actors      sandbox pools

The rollout and verifier actors belong to the trainer actor, so they go with it. When the
trainer actor dies (its process OOM-killed, its node lost), the driver logs it in
``workers.jsonl`` and starts a new one with ``resume``: it continues from the newest complete
checkpoint, exactly as ``rlvr train --resume`` would, at most ``ray.trainer_restarts`` times.
An error of the run itself (a bad config, a detector's stop) is not retried.
"""

from __future__ import annotations

import os

import torch

from rlvr.errors import UserError
from rlvr.model.checkpoint import latest_checkpoint
from rlvr.train.grpo import GRPOConfig, run_grpo
from rlvr.workers.cluster import check_resources, connect, torch_threads
from rlvr.workers.events import EventLog


class TrainerActor:
    def __init__(self, threads: int) -> None:
        torch.set_num_threads(threads)

    def pid(self) -> int:
        return os.getpid()

    def run(self, cfg: GRPOConfig, resume: bool) -> dict:
        return run_grpo(cfg, resume=resume, progress=False)


def run_on_ray(cfg: GRPOConfig, *, resume: bool = False) -> dict:
    """Run ``cfg`` (``backend: ray``) with the trainer on the cluster; the result of ``run_grpo``."""
    ray = connect(cfg.ray)
    check_resources(ray, cfg.ray)
    events = EventLog(cfg.out)
    trainer_cls = ray.remote(TrainerActor).options(num_cpus=cfg.ray.trainer_cpus, num_gpus=cfg.ray.trainer_gpus)
    restarts = 0
    while True:
        trainer = trainer_cls.remote(torch_threads(cfg.ray.trainer_cpus))
        try:
            return ray.get(trainer.run.remote(cfg, resume))
        except ray.exceptions.RayActorError as e:
            if restarts >= cfg.ray.trainer_restarts:
                raise UserError(f"the trainer actor was lost {restarts + 1} times (ray.trainer_restarts="
                                f"{cfg.ray.trainer_restarts}); last: {str(e).strip().splitlines()[0]}") from e
            restarts += 1
            ckpt = latest_checkpoint(cfg.out)
            events.write({"event": "trainer_lost", "restart": restarts,
                          "resume_from": str(ckpt) if ckpt else "the start", "error": str(e).strip().splitlines()[0][:300]})
            resume = True
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() from None
