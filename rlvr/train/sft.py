"""Supervised fine-tuning on chat pairs: the loss covers assistant tokens only.

An example is ``prompt ids`` (the chat template with the generation prompt) followed by the
assistant response ids and the end-of-turn token; the loss mask is 1 exactly on the latter,
which is the same token layout the policy later produces during RL.

Demonstrations come from the built-in domains' train split, the user's task files (a
``reference`` column) and the user's conversations (``messages`` rows: every assistant turn is
trained, the rest masked, with the same ``conversation_ids`` layout as multi-turn episodes).

Multi-turn tasks (tool environments) are demonstrated by real episodes: the task's scripted
expert actions (``Task.actions``) are played in its environment (tools run in the sandbox),
and the conversation becomes ids with ``rlvr.envs.tokens.conversation_ids``: assistant turns
trained, tool results masked, in exactly the layout of a rollout. A demonstration that does not
pass its own verifier, or does not fit the model's context, is dropped (and counted).

Under torchrun the same run trains data parallel, with sharded weights (``shard``, FSDP2) or
sequence parallel (``sequence_parallel``): ``rlvr.train.sft_parallel``; rank 0 writes the
metrics, the checkpoints (sharded: every rank its shards) and ``final/``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.progress import Progress

from rlvr.algos.losses import sft_loss
from rlvr.config import check_device, check_range, resolve_device, to_dict
from rlvr.envs.base import EnvConfig, play
from rlvr.envs.tokens import conversation_ids
from rlvr.errors import ConfigError, UserError
from rlvr.model.checkpoint import latest_checkpoint, prune_checkpoints, save_checkpoint
from rlvr.model.inputs import pad_right
from rlvr.model.load import ModelLoadConfig
from rlvr.model.lora import LoraConfig
from rlvr.model.tokenizer import encode_chat_prompt, encode_completion
from rlvr.monitor.metrics import MetricsLogger
from rlvr.monitor.trackers import TrackerConfig, open_trackers
from rlvr.sandbox.config import SandboxConfig
from rlvr.store import StoreConfig, mirror_checkpoint, mirror_final, pull_if_missing
from rlvr.tasks.conversations import load_conversations
from rlvr.tasks.rows import TaskFileConfig, as_file_config
from rlvr.tasks.sets import build_task_set, file_tasks
from rlvr.tasks.validate import refuse_eval_tasks
from rlvr.train import sft_parallel as par
from rlvr.train.allocator import keep_freed_memory
from rlvr.train.common import (
    OptimConfig,
    build_optimizer,
    clip_and_step,
    prepare_run_dir,
    restore_training_state,
    seed_everything,
    training_state,
)
from rlvr.train.distributed import barrier, launched, rank_device
from rlvr.train.policy import Policy
from rlvr.train.sharded import check_sharded_resume, restore_sharded, save_sharded_checkpoint
from rlvr.types import Task


@dataclass
class SFTConfig:
    model: str = "runs/pretrain/final"
    """Hugging Face causal-LM directory to start from."""
    model_load: ModelLoadConfig = field(default_factory=ModelLoadConfig)
    """How the model directory is loaded: dtype, trust_remote_code, chat_template."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (docs/lora.md); ``final/`` merged or an adapter."""
    out: str = "runs/sft"
    """Run directory; the model lands in <out>/final."""
    seed: int = 0
    """Seed for task draw, init of the order and batches."""
    device: str = "cpu"
    """Where the model trains: cpu | cuda | cuda:N | auto (cuda when torch sees a GPU)."""
    domains: list[str] = field(default_factory=lambda: ["math.arith", "math.word"])
    """Built-in domains whose train split supplies demonstrations (may be empty)."""
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Difficulty levels included."""
    train_tasks: int = 2000
    """Number of (prompt, reference response) pairs drawn from ``domains``."""
    task_files: list[TaskFileConfig | str] = field(default_factory=list)
    """The user's task files (docs/tasks.md); each row's ``reference`` column is its
    demonstration (map one with ``map: {reference: COLUMN}``)."""
    conversation_files: list[str] = field(default_factory=list)
    """The user's conversations: JSONL/Parquet/datasets rows with a ``messages`` list; the loss
    covers every assistant turn."""
    allow_eval_tasks: bool = False
    """Train on tasks written from an eval result (``rlvr tasks from-failures``); refused by default."""
    steps: int = 200
    """Optimizer steps."""
    batch_size: int = 32
    """Examples (sequences) per optimizer step."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=20, schedule="cosine"))
    """Optimizer and schedule."""
    log_every: int = 20
    """Log train/* every this many steps."""
    checkpoint_every: int = 100
    """Write a resumable checkpoint every this many steps and at the last (``--resume`` continues
    from the newest; the two newest are kept, so a damaged newest falls back to the one before)."""
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    """Experiment trackers beside metrics.jsonl and TensorBoard (rlvr.monitor.trackers): mlflow, wandb."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Object storage (docs/storage.md): checkpoints and the final model mirrored to ``store.url``;
    ``--resume`` in a directory without a checkpoint pulls the newest complete one from there."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(max_turns=12, max_tokens=4096, max_context=4096))
    """Budgets for playing the expert demonstrations of multi-turn tasks (generous: a
    demonstration is dropped only if it fails its own verifier or the model's context)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Where the tools of multi-turn demonstrations run (opened only if there are any)."""
    shard: bool = False
    """Under torchrun: shard the weights, gradients and optimizer state over the ranks (FSDP2,
    ``rlvr.train.sharded``); checkpoints are DCP and resume at any world size. With LoRA the
    frozen base and the adapters are sharded together (only the adapters train; ``final/`` as
    ``lora.save`` says); with ``optim.master_weights`` on a bf16/fp16 model the sharded parameters
    are float32 masters and the forward computes in bf16 (FSDP2's mixed precision). Refused
    without torchrun."""
    sequence_parallel: bool = False
    """Under torchrun: split each example's tokens across all ranks (Ulysses,
    ``rlvr.train.sequence_parallel``; every rank takes every row of the batch, one at a time).
    Needs the attention and key/value heads divisible by the world size; refused without torchrun."""

    def __post_init__(self) -> None:
        check_device("sft.device", self.device)
        self.task_files = [as_file_config(f) for f in self.task_files]
        if not (self.domains or self.task_files or self.conversation_files):
            raise ConfigError("no demonstrations: set 'domains', 'task_files' (--tasks) or "
                              "'conversation_files' (--conversations)")
        check_range("sft.steps", self.steps, 1)
        check_range("sft.batch_size", self.batch_size, 1)
        check_range("sft.checkpoint_every", self.checkpoint_every, 1)



def build_examples(tokenizer, tasks: list[Task], *, env_cfg: EnvConfig | None = None, sandbox=None,
                   max_len: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(input ids, loss mask) per task: prompt (mask 0) + reference response and end token
    (mask 1); a multi-turn task's demonstration episode as ``conversation_ids``. Multi-turn
    demonstrations that fail their verifier or exceed ``max_len`` tokens are left out."""
    from rlvr.envs.base import make_env

    examples = []
    envs: dict[str, object] = {}
    dropped = 0
    for task in tasks:
        if task.multi_turn:
            name = task.env
            env = envs.get(name) or envs.setdefault(name, make_env(name, env_cfg, sandbox))
            messages, verdict = play(env, task, list(task.actions))
            ids, mask = conversation_ids(tokenizer, messages, [t.schema() for t in env.tools()])
            if not verdict.passed or (max_len and len(ids) > max_len):
                dropped += 1
                continue
            examples.append((ids, mask))
            continue
        prompt = encode_chat_prompt(tokenizer, list(task.prompt))
        answer = encode_completion(tokenizer, task.reference)
        examples.append((prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    for env in envs.values():
        env.close()
    if dropped:
        print(f"sft: dropped {dropped} of {len(tasks)} demonstrations (failed their verifier or too long)")
    return examples


def demonstration_tasks(files: list[TaskFileConfig]) -> list[Task]:
    """The file tasks SFT learns from: each needs a ``reference`` (its demonstration), which must
    pass its own verifier (checked when the tasks are loaded)."""
    tasks = file_tasks(files, check=True)
    missing = [t for t in tasks if t.reference is None and not t.multi_turn]
    if missing:
        t = missing[0]
        raise UserError(f"{t.meta.get('where', t.id)}: field 'reference' is missing ({len(missing)} of "
                        f"{len(tasks)} tasks have none); SFT needs a reference response per row: map its "
                        "column with --map reference=COLUMN")
    return tasks


def run_sft(cfg: SFTConfig, *, resume: bool = False, progress: bool = True) -> dict:
    """Supervised fine-tuning; ``resume``: continue from the newest complete checkpoint (weights or
    adapter, optimizer, schedule, RNGs and the data order), the metrics cut back to it. Under
    torchrun: data parallel, sharded or sequence parallel (``rlvr.train.sft_parallel``)."""
    keep_freed_memory()
    seed_everything(cfg.seed)
    group = launched()
    par.check_parallel(cfg, group)
    run_dir = prepare_run_dir(cfg.out, cfg) if group.is_main else Path(cfg.out)
    start = time.perf_counter()
    device = rank_device(resolve_device("sft.device", cfg.device))
    layout = par.join(cfg, group, device)
    if group.is_main:
        pull_if_missing(cfg.store, run_dir, resume)  # another machine's run, from the store alone
    barrier()  # the other ranks read the pulled checkpoint
    ckpt = latest_checkpoint(run_dir) if resume else None
    sharded_ckpt = check_sharded_resume(ckpt, lora=cfg.lora.enabled, sharded=cfg.shard, shard_key="sft.shard")
    policy = Policy.load(cfg.model, cfg.lora, None if sharded_ckpt else ckpt, device=device, options=cfg.model_load)
    model, tokenizer = policy.model, policy.tokenizer  # LoRA: only the adapters require grad
    model.train()
    par.prepare(model, layout, master_weights=cfg.optim.master_weights)  # sharded: before the optimizer
    examples = sft_examples(cfg, run_dir, tokenizer, getattr(model.config, "max_position_embeddings", None))
    opt, sched = build_optimizer(model, cfg.optim, cfg.steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(examples), generator=gen).tolist()
    first, cursor, loss_value = 1, 0, float("nan")
    if ckpt is not None:
        state = (restore_sharded(ckpt, model, opt, sched, gen) if sharded_ckpt
                 else restore_training_state(ckpt, opt, sched, gen))
        first, order, cursor, loss_value = state["step"] + 1, state["order"], state["cursor"], state["loss"]
    logger = MetricsLogger(run_dir, resume_step=first - 1 if resume else None,
                           trackers=open_trackers(cfg.trackers, run_dir, to_dict(cfg))) if group.is_main else None
    with Progress(disable=not progress or not group.is_main, transient=True) as bar:
        job = bar.add_task("sft", total=cfg.steps, completed=first - 1)
        for step in range(first, cfg.steps + 1):
            if cursor + cfg.batch_size > len(order):
                order, cursor = torch.randperm(len(examples), generator=gen).tolist(), 0
            rows = [examples[i] for i in order[cursor: cursor + cfg.batch_size]]
            if layout.world == 1:
                metrics = sft_step(model, rows, cfg, opt, sched, tokenizer.pad_token_id, device)
            else:
                metrics = par.parallel_step(model, rows, layout, opt, sched, cfg.optim.grad_clip,
                                            tokenizer.pad_token_id, device)
            cursor += cfg.batch_size
            loss_value = metrics["train/loss"]
            if logger is not None and (step % cfg.log_every == 0 or step == cfg.steps):
                logger.log(step, metrics)
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:  # the last: a resume after it only saves final/
                state = training_state(step, opt, sched, gen, order=order, cursor=cursor, loss=loss_value)
                path = None
                if layout.shard:  # every rank writes its shards; the optimizer is in them
                    path = save_sharded_checkpoint(run_dir, step, model, opt, state, group.is_main,
                                                   lora=cfg.lora.enabled, mixed_precision=layout.mixed_precision)
                elif group.is_main:  # the ranks' weights are the same: rank 0 writes them
                    path = save_checkpoint(run_dir, step, policy.checkpoint_module(), tokenizer, state)
                if group.is_main:
                    prune_checkpoints(run_dir, keep=2)
                    mirror_checkpoint(cfg.store, path, run_dir, keep=2)
            bar.update(job, advance=1, description=f"sft loss {loss_value:.3f}")
    if logger is not None:
        logger.close()
    if layout.shard:
        par.save_final_sharded(run_dir / "final", model, tokenizer, cfg, layout)
    elif group.is_main:
        policy.save_final(run_dir / "final")
    if group.is_main:
        mirror_final(cfg.store, run_dir / "final")
    par.close(layout)
    return {"loss": loss_value, "examples": len(examples), "seconds": time.perf_counter() - start}


def sft_examples(cfg: SFTConfig, run_dir, tokenizer, max_len: int | None) -> list[tuple[list[int], list[int]]]:
    """The demonstrations of ``cfg`` as (input ids, loss mask): built-in domains' train tasks, the
    user's task files (multi-turn ones played in a sandbox) and conversation files."""
    tasks = build_task_set(cfg.domains, "train", cfg.train_tasks, seed=cfg.seed, levels=cfg.levels)
    tasks += demonstration_tasks(cfg.task_files)
    refuse_eval_tasks(tasks, [], allowed=cfg.allow_eval_tasks, key="allow_eval_tasks")
    sandbox = None
    if any(t.multi_turn for t in tasks):
        from rlvr.sandbox.config import shared_sandbox

        sandbox = shared_sandbox(cfg.sandbox, run_dir)
    examples = build_examples(tokenizer, tasks, env_cfg=cfg.env, sandbox=sandbox, max_len=max_len)
    return examples + [conversation_ids(tokenizer, messages)
                       for path in cfg.conversation_files for messages in load_conversations(path)]


def sft_step(model, rows: list, cfg: SFTConfig, opt, sched, pad_token_id: int, device) -> dict[str, float]:
    """One optimizer step of the token cross-entropy on the response tokens of ``rows``; its metrics."""
    ids = pad_right([r[0] for r in rows], pad_token_id, torch.long).to(device)
    mask = pad_right([r[1] for r in rows], 0, torch.float32).to(device)
    attn = pad_right([[1] * len(r[0]) for r in rows], 0, torch.long).to(device)
    loss = sft_loss(model(input_ids=ids, attention_mask=attn).logits, ids, mask)
    loss.backward()
    grad_norm = clip_and_step(model, opt, sched, cfg.optim.grad_clip)
    return {"train/loss": loss.item(), "train/grad_norm": grad_norm, "train/lr": sched.get_last_lr()[0]}
