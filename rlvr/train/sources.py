"""Where a GRPO run's batches come from: the rollout source for its producer.

    sync           ``SyncRollout``: curriculum, rollout and verify phases in the trainer's thread,
                   on the trainer's own model (a LoRA policy: its merged weights)
    async          ``AsyncRollout``: producer and verifier threads on an engine copy
                   (``Policy.engine_copy``), staleness bounded, weights pushed after each update
    ray, ray_async the same two with generate and verify on Ray actors (``rlvr.workers``)
    torchrun       ``SyncRollout`` over ``ShardedPhases``: chunks dealt to the ranks, gathered
    remote, vllm   an engine with weights of its own (``rlvr.rollout.engine_registry``), pushed
                   after each update; with ``remote_async`` the asynchronous producer pushes to it

Which producer a config names, and which step components run with it, is
``rlvr.train.compat``'s; this module only builds what the config asks for.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlvr.faults import fault_point
from rlvr.reward_sources.base import apply_sources
from rlvr.rewards import score_all
from rlvr.rollout.async_rollout import AsyncRollout, parity_kl
from rlvr.rollout.engine import SamplingParams
from rlvr.rollout.engine_registry import ROLLOUT_ENGINES, EngineSetup, EngineSource, RolloutEngine
from rlvr.rollout.episodes import EnvPool, Episode, run_tasks
from rlvr.rollout.sharded import ShardedPhases
from rlvr.rollout.source import RolloutBatch, RolloutSource
from rlvr.rollout.sync_rollout import SyncRollout
from rlvr.train.distributed import gather
from rlvr.train.grpo_config import GRPOConfig
from rlvr.types import Scored, Task
from rlvr.verifiers.judge import judge

if TYPE_CHECKING:
    import torch

    from rlvr.train.grpo_setup import Run


def rollout_source(run: Run, cfg: GRPOConfig) -> RolloutSource:
    """The source of ``cfg``'s producer (module docstring), started."""
    verify = functools.partial(verify_and_reward, cfg=cfg)
    external = external_engine(run, cfg) if cfg.rollout.engine != "rlvr" else None
    if cfg.asynchronous.enabled:
        return async_source(run, cfg, verify, external)
    refill = dynamic_sampling(cfg)
    common = dict(pool=run.pool, tasks_per_step=cfg.rollout.tasks_per_step, **refill)
    if external is not None:
        sync = SyncRollout(generate=lambda tasks, version: rollout(run, tasks, version, external), verify=verify,
                           **common)
        return EngineSource(sync, external)
    if cfg.backend == "ray":
        from rlvr.workers.ray_rollout import RayRollout

        return RayRollout(ray_workers(run, cfg, verify), generator=run.generator, **common)
    if cfg.distributed.rollout_chunk:  # data parallel: chunks dealt to the ranks, gathered after verify
        phases = ShardedPhases(generate=functools.partial(chunk_rollout, run), verify=verify, gather=gather,
                               rank=run.group.rank, world=run.group.world, generator=run.generator,
                               chunk=cfg.distributed.rollout_chunk)
        return SyncRollout(generate=phases.generate, verify=phases.verify, **common)
    return SyncRollout(generate=lambda tasks, version: rollout(run, tasks, version), verify=verify, **common)


def async_source(run: Run, cfg: GRPOConfig, verify: Callable, external: RolloutEngine | None) -> RolloutSource:
    """Asynchronous mode: the producer on an engine copy of the sampling policy (a LoRA policy's
    merged copy), or on Ray actors, or pushing to an external engine."""
    common = dict(pool=run.pool, tasks_per_step=cfg.rollout.tasks_per_step, start=run.step, total=cfg.steps,
                  pad_token_id=run.tokenizer.pad_token_id, seed=cfg.seed, **dynamic_sampling(cfg))
    engine = run.policy.engine_copy()
    with run.policy.sampling() as model:
        if cfg.backend == "ray":
            from rlvr.workers.ray_rollout import RayAsyncRollout

            workers = ray_workers(run, cfg, verify, engine=engine)
            return RayAsyncRollout(workers, model, cfg.asynchronous, engine=engine, **common).start()
        # its own tokenizer: a fast tokenizer is not safe to share across threads
        return AsyncRollout(
            model, cfg.asynchronous, generate=generation(run, copy.deepcopy(run.tokenizer), external), verify=verify,
            make_env_pool=(lambda: EnvPool(cfg.env, run.sandbox)) if run.envs is not None else None,
            engine=engine, external=external, **common,
        ).start()


def push_weights(source: RolloutSource, run: Run, version: int) -> None:
    """The policy's weights after the update to ``version`` (a LoRA policy: the merged weights) to
    the source, when it takes them (the in-process synchronous source samples from the policy itself).
    A sharded policy first gathers its weights into its sampling copy (every rank)."""
    run.policy.gather_weights()
    if not source.takes_weights:
        return
    with run.policy.sampling() as model:
        source.push(model, version=version)


def external_engine(run: Run, cfg: GRPOConfig) -> RolloutEngine:
    """The ``rollout.engine`` engine (vllm, remote): it gets the trainer's weights after each update."""
    with run.policy.sampling() as model:
        setup = EngineSetup(model, run.tokenizer, cfg.rollout, run.dir, cfg.model, run.step, cfg.seed)
        return ROLLOUT_ENGINES.get(cfg.rollout.engine)(setup)


def sampling_params(run: Run) -> SamplingParams:
    """The run's sampling settings (``params.n`` samples per task)."""
    r = run.cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                          n=r.samples_per_task, stop_token_ids=[run.tokenizer.eos_token_id], precision=r.precision,
                          prefill_chunk=r.prefill_chunk, kv_cache=r.kv_cache, kv_window=r.kv_window, kv_sinks=r.kv_sinks)


def generation(run: Run, tokenizer, engine: RolloutEngine | None = None) -> Callable:
    """The rollout phase as a source calls it: ``(model, tasks, version, envs, generator) ->
    episodes`` under the run's sampling settings; ``engine`` None: rlvr's engine on ``model``."""
    params, batch_size = sampling_params(run), run.cfg.rollout.batch_size

    def generate(model, tasks: list[Task], version: int, envs: EnvPool | None, generator) -> list[Episode]:
        return run_tasks(model, tokenizer, tasks, params, envs, generator=generator, policy_version=version,
                         batch_size=batch_size, engine=engine)

    return generate


def rollout(run: Run, tasks: list[Task], policy_version: int, engine: RolloutEngine | None = None) -> list[Episode]:
    """One batch of episodes from the trainer's model (or ``engine``), as the synchronous source makes it."""
    fault_point("rollout")
    run.model.eval()
    with run.policy.sampling() as model:  # LoRA: the merged weights
        return generation(run, run.tokenizer, engine)(model, tasks, policy_version, run.envs, run.generator)


def chunk_rollout(run: Run, tasks: list[Task], policy_version: int, generator: torch.Generator) -> list[Episode]:
    """``rollout`` of one chunk from its own generator (``rlvr.rollout.sharded``)."""
    return rollout(dataclasses.replace(run, generator=generator), tasks, policy_version)


def dynamic_sampling(cfg: GRPOConfig) -> dict:
    """The sources' refill settings: the curriculum's ``filter.refill_rounds`` (metrics
    ``curriculum/*``) or ``algo.dynamic_sampling_rounds`` (metrics ``dynamic_sampling/*``)."""
    c = cfg.curriculum
    if c.enabled and c.filter.enabled and c.filter.refill_rounds:
        return {"refill_rounds": c.filter.refill_rounds, "refill_metrics": "curriculum"}
    return {"refill_rounds": cfg.algo.dynamic_sampling_rounds, "refill_metrics": "dynamic_sampling"}


def ray_workers(run: Run, cfg: GRPOConfig, verify: Callable, engine: torch.nn.Module | None = None):
    """The rollout and verifier actors of a ``backend: ray`` run, serving the sampling policy."""
    from rlvr.images.spec import read_spec
    from rlvr.workers.ray_rollout import RayWorkers

    if engine is None and run.policy.is_lora:
        engine = run.policy.engine_copy()
    with run.policy.sampling() as model:
        return RayWorkers(model, run.tokenizer, params=sampling_params(run), batch_size=cfg.rollout.batch_size,
                          verify=verify, cfg=cfg.ray, env_cfg=cfg.env, sandbox_cfg=cfg.sandbox,
                          needs_sandbox=run.sandbox is not None, run_dir=run.dir, version=run.step,
                          canary_tolerance=cfg.asynchronous.canary_tolerance, engine=engine,
                          images=tuple(read_spec(path) for path in cfg.images), store=cfg.store)


def mismatch_metric(run: Run, batch: RolloutBatch, train_metrics: dict, cfg: GRPOConfig) -> dict:
    """``rollout/logprob_mismatch_kl``: the producer's own parity check when it generated on an
    engine copy; else the update's forwards before its first step (trainer == sampling weights);
    else (every group dropped, nothing trained) a parity forward of the sampling policy. Logged every
    step, whatever the settings: it is how a lossy ``rollout.kv_cache`` (int8, sink_window) or bf16
    ``rollout.precision`` shows its off-policy gap."""
    if batch.mismatch_kl is not None:
        return {"rollout/logprob_mismatch_kl": batch.mismatch_kl}
    if "rollout/logprob_mismatch_kl" in train_metrics:
        return {}
    run.model.eval()
    with run.policy.sampling() as model:
        return {"rollout/logprob_mismatch_kl": parity_kl(model, [s.trajectory for s in batch.scored],
                                                         run.tokenizer.pad_token_id, cfg.asynchronous.parity_rows)}


def verify_and_reward(tasks: list[Task], episodes: list[Episode], cfg: GRPOConfig) -> list[Scored]:
    """The verify phase: each episode's verdict (``judge``), its reward terms (``score_all``) and
    those of the run's other reward sources (``apply_sources``: reward models, judges, callables)."""
    fault_point("verify")
    trajectories = [ep.trajectory for ep in episodes]
    matched = [tasks[traj.group_id] for traj in trajectories]
    scored = score_all(matched, judge(tasks, episodes), trajectories, cfg.reward, cfg.rollout.max_new_tokens)
    return apply_sources(scored, cfg.reward)
