"""GRPO-family RL from verifiable rewards: the training loop, read top to bottom.

One step:  batch = source.next()          which tasks (curriculum), then n samples per task
                                           (``rollout``: exact tokens + sampling logprobs; multi-turn
                                           tasks play episodes in their environments), then
                                           ``verify_and_reward``: verdict -> reward terms
           monitor.screen()                reward-hack detectors on the samples: alert, zero, stop
           select_samples()                zero-variance groups dropped (dynamic sampling, in the
                                           source, refilled them: ``algo.dynamic_sampling_rounds``)
           prepare()                       the kept samples collated once, and the no-grad forwards
                                           on them: the reference's log-probs (KL), the teacher's
                                           (``distill``), the critic's values (``algo.advantage: gae``)
           compute_advantages()            ADVANTAGES[...] per group over the kept samples' rewards
                                           (less the KL penalty: ``algo.kl_in_reward``), or GAE over
                                           the critic's values; the teacher's per-token reverse-KL
                                           signal added, or alone
           update()                        truncated rows out (``algo.overlong_filter``), then the
                                           policy loss's epochs over mini/micro-batches (and the
                                           critic's)
           source.push(model)              the rollout side gets the new weights
           log, eval, checkpoint           metrics.jsonl + TensorBoard, sampled trajectories, the
                                           detectors over the metrics (docs/monitoring.md);
                                           checkpoints atomic, resumable
Algorithm variants live in registries (``rlvr.algos``); this file never branches on their names.
What a step trains with is made of components: the policy (full weights or a LoRA adapter,
``rlvr.train.policy``), the reference, the teacher and the critic (``rlvr.train.components``);
which of them run with which producer is one table (``rlvr.train.compat``, docs/compatibility.md).
The configs are ``rlvr.train.grpo_config``, the run's state ``rlvr.train.grpo_setup``, the phases
between rollout and update ``rlvr.train.phases``, the update ``rlvr.train.update`` and the
rollout sources ``rlvr.train.sources``.

Batches come from a ``RolloutSource`` (``rlvr.rollout.source``): ``next`` gives the verified
batch of a step, ``push`` takes the weights after the update. The default (``SyncRollout``) runs
the curriculum, rollout and verify phases in this thread with the trainer's own model; in
asynchronous mode (``asynchronous.enabled``, docs/async.md) ``AsyncRollout`` generates and
verifies in background threads on an engine copy, batches at most ``max_staleness`` versions old,
and the update corrects stale samples with truncated IS weights (``rlvr.algos.off_policy``).
With ``backend: ray`` the same sources run their generate and verify phases on Ray actors
(``rlvr.workers``) and ``rlvr.train.ray_train`` runs this loop in a trainer actor.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.progress import Progress

from rlvr.curriculum.plots import curriculum_plot
from rlvr.eval.report import eval_report as write_eval_report
from rlvr.atomic import write_text_atomic
from rlvr.eval.suites import get_suite
from rlvr.model.checkpoint import has_checkpoint, prune_checkpoints, save_checkpoint
from rlvr import oplog
from rlvr.monitor.alerts import RunStopped, read_alerts
from rlvr.monitor.metrics import read_metrics
from rlvr.store import mirror_checkpoint, mirror_final
from rlvr.train.common import Timer, training_state
from rlvr.train.distributed import close_group, from_rank0
from rlvr.train.grpo_config import AlgoConfig, GRPOConfig, RolloutConfig
from rlvr.train.grpo_setup import Run, setup
from rlvr.train.sharded import save_sharded_checkpoint
from rlvr.train.phases import compute_advantages, prepare, select_samples
from rlvr.train.sources import mismatch_metric, push_weights, rollout_source
from rlvr.train.step_metrics import rollout_metrics
from rlvr.train.update import update

__all__ = ["AlgoConfig", "GRPOConfig", "RolloutConfig", "run_grpo"]


def run_grpo(cfg: GRPOConfig, *, resume: bool = False, progress: bool = True) -> dict:
    """Train ``cfg`` (or resume its newest checkpoint); the final model in ``final/``."""
    run = setup(cfg, resume)
    source = rollout_source(run, cfg)
    try:
        with Progress(disable=not progress or not run.group.is_main, transient=True) as bar:
            job = bar.add_task("grpo", total=cfg.steps, completed=run.step)
            for step in range(run.step + 1, cfg.steps + 1):
                metrics = train_step(run, source, cfg, step)
                bar.update(job, advance=1, description=f"grpo reward {metrics['rollout/reward_mean']:.2f} "
                                                       f"alerts {run.alerts.total}")
    except RunStopped as stop:
        stopped(run, cfg, stop)
        raise
    finally:
        source.close()
    return finish(run, cfg)


def train_step(run: Run, source, cfg: GRPOConfig, step: int) -> dict:
    """One step, phase by phase, each timed; logged, watched and checkpointed. Its metrics."""
    timer = Timer()
    with timer("wait"):
        batch = source.next(trainer_version=step - 1)
    with timer("monitor"):
        scored = run.monitor.screen(step, batch.scored)  # sample detectors: alert, zero or stop
    with timer("advantage"):
        kept = select_samples(scored, cfg)  # zero-variance groups dropped
    with timer("prepare"):
        prepared = prepare(run, kept, cfg)  # collated once; the components' forwards (reference, teacher, critic)
    with timer("advantage"):
        prepared, advantage_metrics = compute_advantages(prepared, cfg)
    with timer("update"):
        train_metrics = update(run, prepared, cfg)
    with timer("weight_sync"):
        push_weights(source, run, version=step)
    run.pool_state = batch.pool_state
    metrics = {**rollout_metrics(scored, kept), **advantage_metrics, **train_metrics, **run.monitor.counts,
               **mismatch_metric(run, batch, train_metrics, cfg), **source.metrics(batch, step - 1)}
    if cfg.eval_every and step % cfg.eval_every == 0:
        with timer("eval"):
            metrics.update(periodic_eval(run, cfg, step))
    run.step = step
    run.logger.log(step, {**metrics, **timer.pop()})
    run.monitor.keep(step, scored)  # trajectories/step_N.jsonl: the sampled share + the flagged
    run.monitor.watch(step, metrics)  # step detectors over the metrics history: alert or stop
    if step % cfg.checkpoint_every == 0 or step == cfg.steps:
        checkpoint(run, cfg)
    return metrics


def finish(run: Run, cfg: GRPOConfig) -> dict:
    """After the last step: logs closed, ``final/`` written (rank 0), the user's held-out file
    evaluated. The run's summary."""
    run.logger.close()
    run.alerts.close()
    oplog.close_log()
    if run.envs is not None:
        run.envs.close()
    if run.group.is_main:  # data parallel: the ranks' weights are the same, rank 0 writes them
        save_final_model(run, cfg)
        print(f"grpo {run.alerts.summary()}")
    out = {"steps": cfg.steps, "seconds": time.perf_counter() - run.started}
    if cfg.eval.task_files:  # the user's held-out file: the final model's report
        report = eval_report(run, cfg, run.dir / "eval" / "final.json")
        out.update({"eval/pass@1": report["overall"]["pass@1"], "eval_report": str(run.dir / "eval" / "final.json")})
    close_group()
    return out


def save_final_model(run: Run, cfg: GRPOConfig) -> None:
    """``final/`` (and the curriculum's report and plot)."""
    run.policy.save_final(run.dir / "final")
    mirror_final(cfg.store, run.dir / "final")
    if cfg.curriculum.enabled:
        write_text_atomic(run.dir / "curriculum.json", json.dumps(
            {"events": run.pool.events, "frontier": run.pool.frontier, "tasks": run.pool.task_report()}, indent=1))
        curriculum_plot(read_metrics(run.dir), run.dir / "plots" / "curriculum.png", read_alerts(run.dir))


def eval_report(run: Run, cfg: GRPOConfig, path: Path) -> dict:
    """The eval suite on the current policy, written as JSON to ``path`` (``rlvr eval``'s format)."""
    def report() -> dict:  # data parallel: on rank 0, which writes it and sends it to the others
        suite = get_suite(cfg.eval_suite).record() if cfg.eval_suite else None
        with run.policy.sampling() as model:
            return write_eval_report(model, run.tokenizer, run.eval_tasks, cfg.eval, seed=cfg.seed,
                                     model_name=str(run.dir), suite=suite, path=path)

    return from_rank0(report)


def periodic_eval(run: Run, cfg: GRPOConfig, step: int) -> dict:
    """``eval/step_N.json`` and its pass@1 metrics; the curriculum's seesaw control sees it."""
    report = eval_report(run, cfg, run.dir / "eval" / f"step_{step}.json")
    out = {"eval/pass@1": report["overall"]["pass@1"]}
    for domain, stats in report["by_domain"].items():
        out[f"eval/pass@1/{domain}"] = stats["pass@1"]
    for alert in run.pool.on_eval(step, report["by_domain"]):  # seesaw control (the curriculum)
        run.alerts.write(alert)
    if not cfg.asynchronous.enabled:  # the checkpoint keeps what the eval changed
        run.pool_state = run.pool.state_dict()
    return out


def stopped(run: Run, cfg: GRPOConfig, stop: RunStopped) -> None:
    """A detector stopped the run (its alert and the step's trajectories are written): checkpoint
    the weights of the last finished step when they are intact and not saved yet, close the logs."""
    if stop.checkpoint and run.step > 0 and not has_checkpoint(run.dir, run.step):  # (no hashing: a name check)
        checkpoint(run, cfg)
    run.logger.close()
    run.alerts.close()
    oplog.close_log()


def checkpoint(run: Run, cfg: GRPOConfig) -> None:
    """Rank 0's (data parallel: the weights, optimizer, generator and pool are the same on every
    rank): the policy (LoRA: the adapter), its optimizer and the components' state, atomically.
    Sharded (``distributed.shard``): every rank writes its shards of the weights and optimizer
    (DCP), rank 0 the rest."""
    if not run.group.is_main and not run.policy.is_sharded:
        return
    pool = run.pool_state if run.pool_state is not None else run.pool.state_dict()  # async: not the producer's
    state = training_state(run.step, run.optimizer, run.scheduler, run.generator, pool=pool)

    def components(directory: Path) -> None:  # inside the atomic checkpoint
        for part in run.components.values():
            part.save(directory)

    extra = components if run.components else None
    if run.policy.is_sharded:  # every rank writes its shards; the optimizer is in them
        path = save_sharded_checkpoint(run.dir, run.step, run.model, run.optimizer, state, run.group.is_main,
                                       lora=run.policy.is_lora, mixed_precision=run.policy.mixed_precision, extra=extra)
        if not run.group.is_main:
            return
    else:
        path = save_checkpoint(run.dir, run.step, run.policy.checkpoint_module(), run.tokenizer, state, extra=extra)
    prune_checkpoints(run.dir, keep=cfg.keep_checkpoints)
    mirror_checkpoint(cfg.store, path, run.dir, keep=cfg.keep_checkpoints)  # files first, manifest last
