"""The trainer's rollout interface on Ray actors.

``RayWorkers`` holds the rollout actors (engine copies of the policy) and the verifier actors
(sandbox pools), and does three things for a source:

    push(model, version)              the state dict put once in the object store, loaded by every
                                      rollout actor, each checked by the weight-sync canary
    generate(tasks, version, gen)     tasks split into one contiguous chunk per rollout actor;
                                      with one actor it draws from the trainer's generator (state
                                      sent and taken back: the run repeats the in-process one
                                      exactly), with several each chunk gets a generator seeded
                                      from it (a retried chunk draws the same numbers again)
    verify(tasks, episodes)           samples split into one chunk per verifier actor, in order

``RayRollout`` is the synchronous source on them (``SyncRollout``'s phases, so dynamic sampling
works the same); ``RayAsyncRollout`` is ``AsyncRollout`` with ``generate_from`` and ``verify``,
whose staleness gate holds across the actors because every chunk is generated at the version it
is handed (an actor refuses any other).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from rlvr import oplog
from rlvr.model.lora import plain_state_dict
from rlvr.rollout.async_rollout import AsyncRollout
from rlvr.rollout.episodes import Episode
from rlvr.rollout.sharded import chunk_seeds, shift_group
from rlvr.rollout.source import RolloutBatch
from rlvr.rollout.sync_rollout import SyncRollout
from rlvr.rollout.weights import canary_ids, probe
from rlvr.sandbox.config import SandboxConfig
from rlvr.types import Scored, Task
from rlvr.workers.actors import RolloutWorker, VerifierWorker
from rlvr.workers.cluster import connect, torch_threads
from rlvr.workers.config import RayConfig
from rlvr.workers.events import EventLog
from rlvr.workers.group import ActorGroup


class RayWorkers:
    def __init__(self, model: torch.nn.Module, tokenizer, *, params, batch_size: int, verify, cfg: RayConfig,
                 env_cfg, sandbox_cfg: SandboxConfig, needs_sandbox: bool, run_dir: str | Path, version: int,
                 canary_tolerance: float = 1e-4, engine: torch.nn.Module | None = None,
                 images: tuple = (), store=None) -> None:
        """``model``: the sampling policy now (its weights are the first push); ``engine``: the plain
        model the actors start from (default ``model``; a LoRA policy passes its merged copy);
        ``images``: the run's environment image specs, which every verifier actor finds, fetches from
        ``store`` (a ``StoreConfig``) or builds."""
        ray = self.ray = connect(cfg)
        run_dir = Path(run_dir)
        self.events = EventLog(run_dir)
        self.ids, self.tolerance = canary_ids(model.config.vocab_size), canary_tolerance
        engine = model if engine is None else engine
        on_cpu = next(engine.parameters()).device.type == "cpu"
        model_ref = ray.put(engine if on_cpu else copy.deepcopy(engine).cpu())
        tokenizer_ref, verify_ref = ray.put(tokenizer), ray.put(verify)
        rollout_cls, verifier_cls = ray.remote(RolloutWorker), ray.remote(VerifierWorker)

        def make_rollout(i: int):
            return rollout_cls.options(num_cpus=cfg.rollout_cpus, num_gpus=cfg.rollout_gpus).remote(
                model_ref, tokenizer_ref, params, batch_size, env_cfg, sandbox_cfg,
                str(run_dir / "workers" / f"rollout-{i}"), torch_threads(cfg.rollout_cpus), cfg.rollout_gpus)

        def make_verifier(i: int):
            return verifier_cls.options(num_cpus=cfg.verifier_cpus).remote(
                verify_ref, sandbox_cfg, str(run_dir / "workers" / f"verifier-{i}"), needs_sandbox, images, store)

        common = dict(max_retries=cfg.max_retries, log=self.events.write)
        self.latest: tuple | None = None
        self.rollout = ActorGroup("rollout", make_rollout, cfg.rollout_workers, prepare=self._catch_up,
                                  max_size=cfg.max_rollout_workers,
                                  resources={"CPU": cfg.rollout_cpus, "GPU": cfg.rollout_gpus}, **common)
        self.verifiers = ActorGroup("verifier", make_verifier, cfg.verifier_workers, max_size=cfg.max_verifier_workers,
                                    resources={"CPU": cfg.verifier_cpus}, **common)
        self.push(model, version)

    # ------------------------------------------------------------------ weights

    def push(self, model: torch.nn.Module, version: int) -> None:
        """Broadcast ``model``'s weights as ``version``; every rollout actor loads and checks them."""
        state = {k: v.to("cpu", copy=True) for k, v in plain_state_dict(model).items()}  # LoRA: merged, plain names
        self.latest = (version, self.ray.put(state), probe(model, self.ids), self.ids, self.tolerance)
        self.rollout.broadcast("load", self.latest)

    def _catch_up(self, actor) -> None:
        """A replacement rollout actor loads the newest weights before it takes work."""
        if self.latest is not None:
            self.ray.get(actor.load.remote(*self.latest))

    @property
    def version(self) -> int:
        return -1 if self.latest is None else self.latest[0]

    # ------------------------------------------------------------------ phases

    def generate(self, tasks: list[Task], version: int, generator: torch.Generator) -> list[Episode]:
        self.rollout.grow(version=version)  # elastic: a node that joined gets work from this step
        parts = split(tasks, self.rollout.size)
        if len(parts) == 1:
            states = [generator.get_state()]
        else:
            seeds = chunk_seeds(generator, len(parts))
            states = [torch.Generator().manual_seed(s).get_state() for s in seeds]
        results = self.rollout.run("generate", [(part, version, state) for part, state in zip(parts, states)])
        if len(parts) == 1:
            generator.set_state(results[0][1])
        episodes, offset = [], 0
        for k, (part, (chunk, _state, records)) in enumerate(zip(parts, results)):
            episodes += [shift_group(ep, offset) for ep in chunk]
            offset += len(part)
            oplog.replay(records, origin=f"rollout worker {k}")
        return episodes

    def generate_from(self, engine: torch.nn.Module, tasks: list[Task], version: int, _envs,
                      generator: torch.Generator) -> list[Episode]:
        """``AsyncRollout``'s generate: the actors first take the engine copy's weights when
        they do not serve ``version`` yet (the engine copy passed its own canary)."""
        if version != self.version:
            self.push(engine, version)
        return self.generate(tasks, version, generator)

    def verify(self, tasks: list[Task], episodes: list[Episode]) -> list[Scored]:
        tasks_ref = self.ray.put(tasks)
        self.verifiers.grow()
        parts = split(episodes, self.verifiers.size)
        scored = []
        for k, (chunk, records) in enumerate(self.verifiers.run("verify", [(tasks_ref, part) for part in parts])):
            scored += chunk
            oplog.replay(records, origin=f"verifier {k}")
        return scored

    def metrics(self) -> dict[str, float]:
        return {"workers/retries": float(self.rollout.retries + self.verifiers.retries),
                "workers/replaced": float(self.rollout.replaced + self.verifiers.replaced),
                "workers/rollout": float(self.rollout.size), "workers/verifier": float(self.verifiers.size)}

    def close(self) -> None:
        self.rollout.close()
        self.verifiers.close()


class RayRollout(SyncRollout):
    """The synchronous ``RolloutSource`` on Ray actors: draw here, generate and verify there."""

    takes_weights = True  # the actors' copies of the policy

    def __init__(self, workers: RayWorkers, *, pool, tasks_per_step: int, generator: torch.Generator,
                 refill_rounds: int = 0, refill_metrics: str = "curriculum") -> None:
        super().__init__(pool=pool, tasks_per_step=tasks_per_step, refill_rounds=refill_rounds,
                         refill_metrics=refill_metrics,
                         generate=lambda tasks, version: workers.generate(tasks, version, generator),
                         verify=workers.verify)
        self.workers = workers

    def push(self, model: torch.nn.Module, version: int) -> None:
        self.workers.push(model, version)

    def metrics(self, batch: RolloutBatch, trainer_version: int) -> dict[str, float]:
        return {**super().metrics(batch, trainer_version), **self.workers.metrics()}

    def close(self) -> None:
        self.workers.close()


class RayAsyncRollout(AsyncRollout):
    """Asynchronous mode on Ray actors: ``AsyncRollout``'s producer and verifier threads (and its
    staleness gate) with the generate and verify phases on the actors."""

    def __init__(self, workers: RayWorkers, model: torch.nn.Module, cfg, **kw) -> None:
        super().__init__(model, cfg, generate=workers.generate_from, verify=workers.verify, **kw)
        self.workers = workers

    def metrics(self, batch: RolloutBatch, trainer_version: int) -> dict[str, float]:
        return {**super().metrics(batch, trainer_version), **self.workers.metrics()}

    def close(self) -> None:
        super().close()
        self.workers.close()


def split(items: list, n: int) -> list[list]:
    """``items`` in at most ``n`` contiguous, non-empty, near-equal chunks (order kept)."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out
