"""A GRPO run's state (``Run``) and how it is built or restored (``setup``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlvr.config import resolve_device, to_dict
from rlvr.curriculum.pool import TaskPool
from rlvr.curriculum.scheduler import Curriculum
from rlvr.eval.suites import get_suite, tasks_of
from rlvr.model.checkpoint import latest_checkpoint
from rlvr.images.build import build as build_image
from rlvr.images.spec import read_spec
from rlvr.store import pull_if_missing
from rlvr import oplog
from rlvr.monitor.alerts import AlertLog
from rlvr.monitor.push import AlertPusher
from rlvr.monitor.metrics import MetricsLogger, read_metrics
from rlvr.monitor.trackers import open_trackers
from rlvr.monitor.watch import Monitor
from rlvr.rollout.episodes import EnvPool
from rlvr.sandbox.config import shared_sandbox
from rlvr.tasks.files import drop_failing
from rlvr.tasks.sets import build_task_set, file_tasks, needs_sandbox
from rlvr.tasks.validate import refuse_eval_tasks
from rlvr.train.allocator import keep_freed_memory
from rlvr.train.code_tools import code_tools
from rlvr.train.common import build_optimizer, prepare_run_dir, restore_training_state, seed_everything
from rlvr.train.components import Setup, StepComponent, build_components
from rlvr.train.distributed import Group, barrier, launched, open_group, rank_device
from rlvr.train.grpo_config import GRPOConfig
from rlvr.train.memory import enable_activation_checkpointing
from rlvr.train.policy import Policy
from rlvr.train.sharded import check_sharded_resume, restore_sharded
from rlvr.types import Task


@dataclass
class Run:
    """Everything a step touches; checkpointed by ``grpo.checkpoint`` and restored by ``setup``."""

    cfg: GRPOConfig
    dir: Path
    policy: Policy  # the trained model: full weights or a LoRA adapter (rlvr.train.policy)
    optimizer: torch.optim.Optimizer
    scheduler: object
    pool: TaskPool | Curriculum
    generator: torch.Generator
    logger: MetricsLogger
    step: int
    started: float
    components: dict[str, StepComponent] = field(default_factory=dict)  # reference, teacher, critic: those on
    sandbox: object | None = None  # the shared rlvr.sandbox.Sandbox when a domain runs model code
    envs: EnvPool | None = None  # environment instances of multi-turn tasks, reused step to step
    pool_state: dict | None = None  # async: pool state after the newest trained batch's draw
    eval_tasks: list[Task] = field(default_factory=list)  # the periodic eval suite, built once
    alerts: AlertLog | None = None  # alerts.jsonl (seesaw control, the detectors)
    monitor: Monitor | None = None  # the detectors and the trajectory sample
    group: Group = field(default_factory=Group)  # data parallel (torchrun): this rank; world 1 without

    @property
    def model(self) -> torch.nn.Module:
        """The module the update trains (with LoRA: the base tree with its adapter layers)."""
        return self.policy.model

    @property
    def tokenizer(self):
        return self.policy.tokenizer


def setup(cfg: GRPOConfig, resume: bool) -> Run:
    """A fresh run of ``cfg``, or (``resume``) the newest complete checkpoint's."""
    keep_freed_memory()
    seed_everything(cfg.seed)
    group = launched()  # data parallel: rank 0 writes the run directory, the others log under ranks/
    run_dir = prepare_run_dir(cfg.out, cfg) if group.is_main else Path(cfg.out)
    log_dir = run_dir if group.is_main else run_dir / "ranks" / f"rank_{group.rank}"
    log_dir.mkdir(parents=True, exist_ok=True)  # the sandbox's audit log may open first
    device = rank_device(resolve_device("device", cfg.device))
    open_group(cfg.distributed, device)
    if group.is_main:
        pull_if_missing(cfg.store, run_dir, resume)  # another machine's run, from the store alone
    barrier()  # the other ranks read the pulled checkpoint
    ckpt = latest_checkpoint(run_dir) if resume else None
    sharded_ckpt = check_sharded_resume(ckpt, lora=cfg.lora.enabled, sharded=cfg.distributed.shard,
                                        shard_key="distributed.shard")
    policy = Policy.load(cfg.model, cfg.lora, None if sharded_ckpt else ckpt, device=device, options=cfg.model_load)
    sandbox, tasks, eval_tasks = task_sets(cfg, log_dir)
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.samples_per_task
    updates_per_step = cfg.algo.ppo_epochs * math.ceil(per_step / (cfg.algo.minibatch_size or per_step))
    if cfg.algo.gradient_checkpointing:
        enable_activation_checkpointing(policy.model)
    if cfg.distributed.shard:  # before the optimizer: its state is built over the shards
        policy.shard(master_weights=cfg.optim.master_weights)
    optimizer, scheduler = build_optimizer(policy.model, cfg.optim, cfg.steps * updates_per_step)
    components = build_components(Setup(cfg, policy, device, ckpt, updates_per_step))
    envs = EnvPool(cfg.env, sandbox) if any(t.multi_turn for t in tasks) else None
    pool = Curriculum(tasks, cfg.curriculum, cfg.seed) if cfg.curriculum.enabled else TaskPool(tasks, seed=cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    step = 0
    if ckpt is not None:
        if sharded_ckpt:  # DCP: the weights and optimizer at any world size, a plain process included
            state = restore_sharded(ckpt, policy.model, optimizer, scheduler, generator)
            policy.gather_weights()
        else:
            state = restore_training_state(ckpt, optimizer, scheduler, generator)
        pool.load_state_dict(state["pool"])
        step = state["step"]
    logger = MetricsLogger(log_dir, resume_step=step if resume else None, tensorboard=group.is_main,
                           trackers=open_trackers(cfg.trackers, run_dir, to_dict(cfg)) if group.is_main else ())
    # every tool call and sandbox execution of this process, hash-chained (rlvr.oplog); each rank its own
    oplog.open_log(log_dir / "operations.jsonl", actor="grpo" if group.is_main else f"grpo rank {group.rank}")
    # administrative actions: the run's configuration (a resume under another one is a config
    # change, seen as a new digest) and the weights it starts from
    oplog.write("run_config", config_sha256=oplog.digest(to_dict(cfg)), resumed_at=step if ckpt is not None else None)
    oplog.write("model_load", model=str(ckpt if ckpt is not None else cfg.model), outcome="ok")
    pusher = AlertPusher(cfg.monitor.push, run=str(run_dir)) if cfg.monitor.push.enabled and group.is_main else None
    alerts = AlertLog(log_dir, resume_step=step if resume else None, pusher=pusher)
    barrier()  # every rank's detectors start from rank 0's metrics history (truncated at the resumed step)
    monitor = Monitor(cfg.monitor, log_dir, alerts, cfg.reward, code_tools(), seed=cfg.seed,
                      history=read_metrics(run_dir), trajectories_every=cfg.save_trajectories_every)
    return Run(cfg, run_dir, policy, optimizer, scheduler, pool, generator, logger, step, time.perf_counter(),
               components, sandbox, envs, eval_tasks=eval_tasks, alerts=alerts, monitor=monitor, group=group)


def task_sets(cfg: GRPOConfig, log_dir: Path) -> tuple[object | None, list[Task], list[Task]]:
    """(the shared sandbox or None, the training pool's tasks, the periodic eval's tasks). The
    user's file tasks whose own answer fails their acceptance criteria are dropped; training on
    eval tasks is refused unless ``allow_eval_tasks``."""
    for spec in cfg.images:  # before any task's code runs on one: cached, fetched from the run's store, or built
        build_image(read_spec(spec), store=cfg.store)
    user_tasks = file_tasks(cfg.task_files, check=False)
    # The process-wide sandbox (the code verifier runs there), opened with this run's config.
    sandbox = shared_sandbox(cfg.sandbox, log_dir) if needs_sandbox(cfg.domains, user_tasks) else None
    if user_tasks:  # each file task's own answer must pass its acceptance criteria
        user_tasks = drop_failing(user_tasks, ", ".join(f.path for f in cfg.task_files))[0]
    tasks = build_task_set(cfg.domains, "train", cfg.train_tasks, seed=cfg.seed, levels=cfg.levels,
                           weights=cfg.domain_weights) + user_tasks
    eval_tasks = eval_task_set(cfg) if cfg.eval_every or cfg.eval.task_files else []
    refuse_eval_tasks(tasks, eval_tasks, allowed=cfg.allow_eval_tasks, key="allow_eval_tasks")
    return sandbox, tasks, eval_tasks


def eval_task_set(cfg: GRPOConfig) -> list[Task]:
    """The periodic eval suite: ``eval_suite``'s tasks, or the eval split of ``eval.domains``; and the
    ``eval.task_files``."""
    e = cfg.eval
    if cfg.eval_suite:
        return tasks_of(get_suite(cfg.eval_suite)) + build_task_set([], "eval", 0, seed=e.seed, files=e.task_files)
    return build_task_set(e.domains, "eval", e.tasks, seed=e.seed, levels=e.levels, files=e.task_files)
