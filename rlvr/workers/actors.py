"""The actors' classes (plain Python; ``ray.remote`` wraps them where they are started).

``RolloutWorker``: an engine copy of the policy. ``load`` takes a broadcast state dict and its
version and runs the weight-sync canary (``rlvr.rollout.weights.check_canary``) before the worker
serves it; ``generate`` refuses a version it does not serve. Multi-turn episodes are played in the
worker's own environments (its own sandbox pool) and judged there: their environments hold the
final state and stay on the worker, so the episode travels back with its verdict (``Settled``).

``VerifierWorker``: a sandbox pool (``rlvr.sandbox``) and the trainer's verify function
(verdicts -> rewards); ``run_jobs`` runs raw sandbox jobs for ``VerificationService``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr import oplog
from rlvr.rollout.episodes import EnvPool, Episode, run_tasks
from rlvr.rollout.weights import StaleWeightsError, check_canary
from rlvr.images.build import build as build_image
from rlvr.sandbox.config import SandboxConfig, shared_sandbox
from rlvr.types import Task, Verdict


@dataclass
class Settled:
    """What stands in for a played episode's environment once it has been judged on its worker."""

    verdict: Verdict

    def verify(self) -> Verdict:
        return self.verdict


class RolloutWorker:
    def __init__(self, model: torch.nn.Module, tokenizer, params, batch_size: int, env_cfg,
                 sandbox_cfg: SandboxConfig, work_dir: str, threads: int, gpus: float = 0.0) -> None:
        torch.set_num_threads(threads)
        device = "cuda" if gpus > 0 and torch.cuda.is_available() else "cpu"
        self.model = model.to(device).eval()
        self.tokenizer, self.params, self.batch_size = tokenizer, params, batch_size
        self.env_cfg, self.sandbox_cfg, self.work_dir = env_cfg, sandbox_cfg, work_dir
        self.envs: EnvPool | None = None
        self.version = -1

    def pid(self) -> int:
        return os.getpid()

    def load(self, version: int, state: dict, expected: torch.Tensor, ids: list[int], tolerance: float) -> int:
        """Serve ``version``: load its weights, then the canary against the trainer's probe."""
        previous, self.version = self.version, -1  # a load that fails its canary serves nothing
        self.model.load_state_dict(state)
        check_canary(self.model, ids, expected, version, previous, tolerance)
        self.version = version
        return version

    def generate(self, tasks: list[Task], version: int, rng_state: torch.Tensor
                 ) -> tuple[list[Episode], torch.Tensor, list[dict]]:
        """``run_tasks`` at ``version`` from the generator state ``rng_state``; the episodes
        (group ids local to ``tasks``), the generator's state after it, and the operations
        (tool calls, sandbox executions) for the run's log."""
        if version != self.version:
            raise StaleWeightsError(f"rollout worker asked to generate at version {version} serves {self.version}")
        generator = torch.Generator().set_state(rng_state)
        self.model.eval()
        with oplog.capture() as records:
            episodes = run_tasks(self.model, self.tokenizer, tasks, self.params, self._envs(tasks),
                                 generator=generator, policy_version=version, batch_size=self.batch_size)
            episodes = [Episode(ep.trajectory, Settled(ep.env.verify()) if ep.env is not None else None)
                        for ep in episodes]
        return episodes, generator.get_state(), records

    def _envs(self, tasks: list[Task]) -> EnvPool | None:
        if self.envs is None and any(t.multi_turn for t in tasks):
            Path(self.work_dir).mkdir(parents=True, exist_ok=True)
            sandbox = shared_sandbox(self.sandbox_cfg, self.work_dir)
            self.envs = EnvPool(self.env_cfg, sandbox)
        return self.envs


class VerifierWorker:
    def __init__(self, verify, sandbox_cfg: SandboxConfig, work_dir: str, open_sandbox: bool,
                 images: tuple = (), store=None) -> None:
        torch.set_num_threads(1)
        self.verify_fn, self.sandbox_cfg, self.work_dir = verify, sandbox_cfg, work_dir
        # The run's environment images (``ImageSpec``s) reach this node by their spec: found in its
        # cache and verified, fetched from the run's ``store`` and verified, or built here; a task's
        # image is verified again before each use.
        for spec in images:
            build_image(spec, store=store)
        if open_sandbox:  # the run's sandbox settings, before a verifier opens the default
            self.sandbox()

    def pid(self) -> int:
        return os.getpid()

    def sandbox(self):
        Path(self.work_dir).mkdir(parents=True, exist_ok=True)
        return shared_sandbox(self.sandbox_cfg, self.work_dir)

    def verify(self, tasks: list[Task], episodes: list[Episode]) -> tuple[list, list[dict]]:
        """Verdicts and rewards of ``episodes`` (``tasks[group_id]`` is an episode's task), and
        the sandbox executions for the run's log."""
        with oplog.capture() as records:
            scored = self.verify_fn(tasks, episodes)
        return scored, records

    def run_jobs(self, jobs: list) -> tuple[list, list[dict]]:
        """Raw sandbox jobs (``rlvr.sandbox.Job``) -> ``ExecResult`` in order, and the sandbox
        executions for the caller's operation log."""
        with oplog.capture() as records:
            results = self.sandbox().map(jobs)
        return results, records
