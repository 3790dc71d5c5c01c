"""Verification as a service on the cluster: sandbox jobs spread over verifier actors.

    with VerificationService(RayConfig(verifier_workers=4), SandboxConfig()) as service:
        results = service.map(jobs)          # ExecResult per Job, in order

Each verifier actor owns a sandbox pool (``rlvr.sandbox``) on whatever node Ray placed it, so the
service grows with the cluster: more actors, more pools, more execution slots. Jobs travel in
chunks of ``chunk_size`` (one Ray call each, which amortises the call's overhead); chunks go to the
actors round-robin, and a chunk whose actor dies is rerun on a replacement (``ActorGroup``).
The trainer's verify phase uses the same actors through ``RayWorkers.verify``.
"""

from __future__ import annotations

from pathlib import Path

from rlvr import oplog
from rlvr.sandbox.config import SandboxConfig
from rlvr.workers.actors import VerifierWorker
from rlvr.workers.cluster import connect
from rlvr.workers.config import RayConfig
from rlvr.workers.events import EventLog
from rlvr.workers.group import ActorGroup


class VerificationService:
    def __init__(self, cfg: RayConfig, sandbox_cfg: SandboxConfig, *, work_dir: str | Path = "runs/verify-service",
                 chunk_size: int = 32) -> None:
        ray = connect(cfg)
        self.chunk_size = chunk_size
        self.events = EventLog(work_dir)
        verifier_cls = ray.remote(VerifierWorker)

        def make(i: int):
            return verifier_cls.options(num_cpus=cfg.verifier_cpus).remote(
                None, sandbox_cfg, str(Path(work_dir) / f"verifier-{i}"), True)

        self.group = ActorGroup("verifier", make, cfg.verifier_workers, max_retries=cfg.max_retries,
                                log=self.events.write)

    def map(self, jobs: list) -> list:
        """``ExecResult`` of every ``rlvr.sandbox.Job``, in order."""
        chunks = [(jobs[i:i + self.chunk_size],) for i in range(0, len(jobs), self.chunk_size)]
        results = []
        for k, (chunk, records) in enumerate(self.group.run("run_jobs", chunks)):
            results += chunk
            oplog.replay(records, origin=f"verifier {k}")
        return results

    @property
    def retries(self) -> int:
        return self.group.retries

    def close(self) -> None:
        self.group.close()

    def __enter__(self) -> VerificationService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
