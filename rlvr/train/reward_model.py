"""``rlvr rm``: train a reward model on preference pairs (outcome) or step-labelled solutions (process).

The story of an outcome run: read the pair files (the formats ``rlvr dpo`` reads; ``rlvr pairs``
writes them from a model's verified rollouts), hold out the eval pairs (``eval_pair_files``, else a
stable ``eval_fraction`` of the pairs by id hash), encode every (prompt, response) with the reward
model's own chat template, refuse a pair whose two sides are the same ids after truncation (they
would get one score: the loss would sit at log 2), then for each step score the chosen and
rejected sides of the next pairs in one right-padded batch and minimise the Bradley-Terry loss
(``rlvr.algos.reward_model``: optional per-pair margin from a pair-file column, optional reward
centering). Logged: loss, pairwise accuracy, margin, the reward distribution; held-out accuracy
every ``eval_every`` steps and at the end. The final directory holds the normalisation statistics
of the training rewards and the held-out metrics (``rlvr.rm.model``).

A process run (``kind: process``; the labels: ``rlvr.rm.process``) reads step-labelled solutions
instead and minimises the binary cross-entropy of each step's score against its label.

Checkpoints are atomic and resumable (the batch order is a pure function of seed and step).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from rich.progress import Progress
from safetensors.torch import load_file, save_file

from rlvr.algos.reward_model import bradley_terry, pairwise_metrics, step_bce
from rlvr.config import check_choice, check_range, resolve_device, to_dict
from rlvr.errors import UserError
from rlvr.model.checkpoint import latest_checkpoint, prune_checkpoints, save_checkpoint
from rlvr.store import StoreConfig, mirror_checkpoint, mirror_final, pull_if_missing
from rlvr.model.load import ModelLoadConfig
from rlvr.model.lora import LoraConfig
from rlvr.monitor.metrics import MetricsLogger
from rlvr.monitor.trackers import TrackerConfig, open_trackers
from rlvr.rm.model import HEAD_FILE, RewardMeta, RewardModel, batch_tensors, encode, save_reward_model
from rlvr.rm.process import StepExample, encode_steps, read_step_file, step_scores
from rlvr.tasks.pairs import PairFileConfig, PreferencePair, as_pair_file_config, load_pairs
from rlvr.train.allocator import keep_freed_memory
from rlvr.train.batching import batch_indices
from rlvr.train.common import (OptimConfig, build_optimizer, clip_and_step, prepare_run_dir, restore_training_state,
                               seed_everything, training_state)
from rlvr.train.policy import Policy


@dataclass
class RMConfig:
    model: str = "runs/sft/final"
    """Hugging Face causal-LM directory the backbone starts from (any architecture)."""
    model_load: ModelLoadConfig = field(default_factory=ModelLoadConfig)
    """How the backbone is loaded: dtype, trust_remote_code, chat_template."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on the backbone instead of full fine-tuning (the head always trains); the
    final directory holds the merged backbone."""
    kind: Literal["outcome", "process"] = "outcome"
    """outcome: Bradley-Terry on preference pairs; process: per-step labels (``rlvr.rm.process``)."""
    out: str = "runs/rm"
    """Run directory; the reward model lands in <out>/final."""
    seed: int = 0
    """Seed of the head's init, the held-out split and the batch order."""
    device: str = "cpu"
    """cpu | cuda | cuda:N | auto."""
    pair_files: list[PairFileConfig | str] = field(default_factory=list)
    """outcome: preference pair files (docs/tasks.md, "Preference pairs")."""
    eval_pair_files: list[PairFileConfig | str] = field(default_factory=list)
    """outcome: held-out pairs; empty: ``eval_fraction`` of ``pair_files`` held out by a hash of the
    pair's ``task_id`` (``rlvr pairs`` records it; else its id), so one task's pairs stay together."""
    step_files: list[str] = field(default_factory=list)
    """process: step-labelled solution files (JSONL; ``rlvr.rm.process``)."""
    eval_step_files: list[str] = field(default_factory=list)
    """process: held-out step files; empty: ``eval_fraction`` held out by id hash."""
    eval_fraction: float = 0.1
    """Share held out when no eval files are given (0: no held-out evaluation)."""
    margin_key: str = ""
    """outcome: a pair-file column holding each pair's margin (how far chosen should beat rejected);
    empty: no margin."""
    center_coef: float = 0.0
    """Reward centering: + center_coef * mean((r_chosen + r_rejected)^2) (0 disables; TRL's 0.01)."""
    epochs: float = 2.0
    """Passes over the training examples."""
    batch_size: int = 16
    """Pairs (or solutions) per optimizer step."""
    max_length: int = 512
    """Tokens a scored sequence keeps (the prompt is cut from the left first)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-4, warmup_steps=5))
    """AdamW over the head and the trainable backbone weights."""
    eval_every: int = 0
    """Held-out evaluation every this many steps (0: only at the end)."""
    checkpoint_every: int = 50
    """Steps between resumable checkpoints."""
    log_every: int = 5
    """Steps between metrics lines."""
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    """Experiment trackers beside metrics.jsonl."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Object storage (docs/storage.md): checkpoints and the final model mirrored to ``store.url``;
    ``--resume`` in a directory without a checkpoint pulls the newest complete one from there."""

    def __post_init__(self) -> None:
        check_choice("rm.kind", self.kind, ("outcome", "process"))
        self.pair_files = [as_pair_file_config(f) for f in self.pair_files]
        self.eval_pair_files = [as_pair_file_config(f) for f in self.eval_pair_files]
        check_range("rm.eval_fraction", self.eval_fraction, 0.0, 0.9)
        check_range("rm.center_coef", self.center_coef, 0.0)
        check_range("rm.epochs", self.epochs, 1e-9)
        check_range("rm.batch_size", self.batch_size, 1)
        check_range("rm.max_length", self.max_length, 8)
        check_range("rm.eval_every", self.eval_every, 0)
        check_range("rm.checkpoint_every", self.checkpoint_every, 1)
        check_range("rm.log_every", self.log_every, 1)


@dataclass(frozen=True)
class EncodedPair:
    chosen: list[int]
    rejected: list[int]
    margin: float
    where: str


def held_out(key: str, seed: int, fraction: float) -> bool:
    """Whether the example with stable ``key`` is held out: a hash, so a split never moves."""
    h = int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


def _margin(pair: PreferencePair, key: str) -> float:
    if not key:
        return 0.0
    value = pair.meta.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{pair.meta.get('where', pair.id)}: field {key!r} (rm.margin_key) must be a finite number, "
                        f"got {value!r}")
    return float(value)


def encode_pairs(tokenizer, pairs: list[PreferencePair], cfg: RMConfig) -> list[EncodedPair]:
    """Every pair's two sequences; a pair whose sides are the same ids is refused (one line)."""
    out = []
    for p in pairs:
        c, _ = encode(tokenizer, p.prompt, p.chosen, cfg.max_length)
        r, _ = encode(tokenizer, p.prompt, p.rejected, cfg.max_length)
        where = str(p.meta.get("where", p.id))
        if c == r:
            raise UserError(f"{where}: chosen and rejected are the same {len(c)} tokens after truncation to "
                            f"rm.max_length={cfg.max_length}: one score for both, nothing to learn (raise "
                            f"rm.max_length or drop the pair)")
        out.append(EncodedPair(c, r, _margin(p, cfg.margin_key), where))
    return out


def split_pairs(cfg: RMConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    pairs = [p for f in cfg.pair_files for p in load_pairs(f)]
    if cfg.eval_pair_files:
        return pairs, [p for f in cfg.eval_pair_files for p in load_pairs(f)]
    key = lambda p: str(p.meta.get("task_id", p.id))  # noqa: E731  (pairs of one task stay together)
    train = [p for p in pairs if not held_out(key(p), cfg.seed, cfg.eval_fraction)]
    return train, [p for p in pairs if held_out(key(p), cfg.seed, cfg.eval_fraction)]


def pair_rewards(rm: RewardModel, batch: list[EncodedPair], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of the chosen and rejected sides, [N] each, from one forward over 2N rows."""
    ids, mask = batch_tensors([p.chosen for p in batch] + [p.rejected for p in batch], pad_token_id, device)
    r = rm(ids, mask)
    return r[: len(batch)], r[len(batch):]


def outcome_step(rm: RewardModel, batch: list[EncodedPair], cfg: RMConfig, pad_token_id: int, device) -> tuple[torch.Tensor, dict]:
    chosen, rejected = pair_rewards(rm, batch, pad_token_id, device)
    margin = torch.tensor([p.margin for p in batch], device=device) if cfg.margin_key else None
    loss = bradley_terry(chosen, rejected, margin, cfg.center_coef)
    return loss, {f"train/{k}": v for k, v in pairwise_metrics(chosen, rejected).items()}


def outcome_eval(rm: RewardModel, pairs: list[EncodedPair], pad_token_id: int, device, batch_size: int) -> dict:
    """Held-out pairwise accuracy and margin (no grad)."""
    chosen, rejected = [], []
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            c, r = pair_rewards(rm, pairs[i: i + batch_size], pad_token_id, device)
            chosen.append(c), rejected.append(r)
    m = pairwise_metrics(torch.cat(chosen), torch.cat(rejected))
    return {"eval/accuracy": m["accuracy"], "eval/margin": m["margin"], "eval/pairs": float(len(pairs))}


def normalisation(rm: RewardModel, seqs: list[list[int]], pad_token_id: int, device, batch_size: int) -> tuple[float, float]:
    """Mean and std of the rewards of ``seqs`` (the training responses)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(seqs), batch_size):
            ids, mask = batch_tensors(seqs[i: i + batch_size], pad_token_id, device)
            out.append(rm(ids, mask).float().cpu())
    r = torch.cat(out)
    std = r.std(unbiased=False).item()
    return r.mean().item(), std if std > 1e-6 else 1.0


@dataclass
class Job:
    """What the shared loop trains: examples, a step, an evaluation, the sequences to normalise on."""

    train: list
    held: list
    step: Callable[[RewardModel, list], tuple[torch.Tensor, dict]]
    evaluate: Callable[[RewardModel, list], dict]
    normalise_on: Callable[[list], list[list[int]]] | None
    """The sequences whose rewards give the normalisation statistics; None: none (process scores are
    read through a sigmoid)."""


def outcome_job(cfg: RMConfig, tokenizer, device) -> Job:
    train, held = split_pairs(cfg)
    if not train:
        raise UserError("rm: no training pairs: give --pairs FILE (or rm.pair_files); `rlvr pairs` writes them "
                        "from a model's verified rollouts")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Job(encode_pairs(tokenizer, train, cfg), encode_pairs(tokenizer, held, cfg),
               step=lambda rm, b: outcome_step(rm, b, cfg, pad, device),
               evaluate=lambda rm, pairs: outcome_eval(rm, pairs, pad, device, cfg.batch_size),
               normalise_on=lambda rows: [s for p in rows for s in (p.chosen, p.rejected)])


def process_job(cfg, tokenizer, device):
    """The ``Job`` of a process run: step-labelled solutions, BCE at each step's last token."""
    if not cfg.step_files:
        raise UserError("rm: kind process needs step files: --steps FILE (or rm.step_files); `rlvr rm steps` "
                        "writes them from a model's own solutions")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def examples(files, keep) -> list[StepExample]:
        out = []
        for f in files:
            for id_, prompt, steps, labels in read_step_file(f):
                if keep(id_):
                    e = encode_steps(tokenizer, prompt, steps, labels, cfg.max_length, f"{f}:{id_}")
                    out.extend([e] if e is not None else [])
        return out

    if cfg.eval_step_files:
        train, held = examples(cfg.step_files, lambda i: True), examples(cfg.eval_step_files, lambda i: True)
    else:
        train = examples(cfg.step_files, lambda i: not held_out(i, cfg.seed, cfg.eval_fraction))
        held = examples(cfg.step_files, lambda i: held_out(i, cfg.seed, cfg.eval_fraction))
    if not train:
        raise UserError("rm: no step-labelled solution fits rm.max_length")

    def step(rm, batch):
        logits = torch.cat(step_scores(rm, batch, pad, device))
        labels = torch.tensor([v for e in batch for v in e.labels], device=logits.device)
        acc = ((logits > 0).long() == labels).float().mean().item()
        return step_bce(logits, labels), {"train/step_accuracy": acc, "train/step_positive": labels.float().mean().item()}

    def evaluate(rm, held_examples):
        with torch.no_grad():
            logits = torch.cat([torch.cat(step_scores(rm, held_examples[i: i + cfg.batch_size], pad, device))
                                for i in range(0, len(held_examples), cfg.batch_size)])
        labels = torch.tensor([v for e in held_examples for v in e.labels], device=logits.device)
        first_error = [next((k for k, v in enumerate(e.labels) if v == 0), -1) for e in held_examples]
        return {"eval/step_accuracy": ((logits > 0).long() == labels).float().mean().item(),
                "eval/step_bce": step_bce(logits, labels).item(), "eval/steps": float(len(labels)),
                "eval/solutions_with_error": float(sum(f >= 0 for f in first_error))}

    return Job(train, held, step, evaluate, normalise_on=None)


def run_rm(cfg: RMConfig, *, resume: bool = False, progress: bool = True) -> dict:
    """Train, evaluate and save the reward model of ``cfg``; the final metrics."""
    keep_freed_memory()
    seed_everything(cfg.seed)
    run_dir = prepare_run_dir(cfg.out, cfg)
    start = time.perf_counter()
    device = resolve_device("rm.device", cfg.device)
    pull_if_missing(cfg.store, run_dir, resume)  # another machine's run, from the store alone
    ckpt = latest_checkpoint(run_dir) if resume else None
    policy = Policy.load(cfg.model, cfg.lora, ckpt, device=device, options=cfg.model_load)
    tokenizer = policy.tokenizer
    if cfg.kind == "process":
        job = process_job(cfg, tokenizer, device)
    else:
        job = outcome_job(cfg, tokenizer, device)
    head = None
    if ckpt is not None:
        head = torch.nn.Linear(policy.model.config.hidden_size, 1, bias=False)
        with torch.no_grad():
            head.weight.copy_(load_file(str(ckpt / HEAD_FILE))["weight"])
    rm = RewardModel(policy.model, head).train()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    steps = math.ceil(cfg.epochs * len(job.train) / cfg.batch_size)
    opt, sched = build_optimizer(rm, cfg.optim, steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    first = 1 if ckpt is None else restore_training_state(ckpt, opt, sched, gen)["step"] + 1
    logger = MetricsLogger(run_dir, resume_step=first - 1 if resume else None,
                           trackers=open_trackers(cfg.trackers, run_dir, to_dict(cfg)))
    metrics: dict[str, float] = {}
    held: dict[str, float] = {}
    with Progress(disable=not progress, transient=True) as bar:
        job_bar = bar.add_task(f"rm ({cfg.kind})", total=steps, completed=first - 1)
        for step in range(first, steps + 1):
            idx = batch_indices(step, len(job.train), cfg.batch_size, cfg.seed)
            loss, metrics = job.step(rm, [job.train[i] for i in idx])
            loss.backward()
            metrics = {"train/loss": loss.item(), "train/grad_norm": clip_and_step(rm, opt, sched, cfg.optim.grad_clip),
                       "train/lr": sched.get_last_lr()[0], **metrics}
            if job.held and ((cfg.eval_every and step % cfg.eval_every == 0) or step == steps):
                rm.eval()
                held = job.evaluate(rm, job.held)
                rm.train()
                metrics.update(held)
            if step % cfg.log_every == 0 or step == steps or held is metrics:
                logger.log(step, metrics)
            if step % cfg.checkpoint_every == 0 and step < steps:
                path = save_checkpoint(run_dir, step, policy.checkpoint_module(), tokenizer,
                                       training_state(step, opt, sched, gen),
                                       extra=lambda d: save_file({"weight": rm.head.weight.detach().cpu().contiguous()},
                                                                 d / HEAD_FILE))
                prune_checkpoints(run_dir, keep=2)
                mirror_checkpoint(cfg.store, path, run_dir, keep=2)
            bar.update(job_bar, advance=1, description=f"rm loss {metrics['train/loss']:.3f}")
    logger.close()
    rm.eval()
    if job.held and not held:
        held = job.evaluate(rm, job.held)
    mean, std = (normalisation(rm, job.normalise_on(job.train), pad, device, cfg.batch_size)
                 if job.normalise_on is not None else (0.0, 1.0))
    backbone = policy.lora.merge_and_unload() if policy.is_lora else policy.model
    rm.backbone = backbone
    meta = RewardMeta(kind=cfg.kind, pooling="last_token" if cfg.kind == "outcome" else "step_end", mean=mean,
                      std=std, max_length=cfg.max_length, base=str(cfg.model),
                      metrics={k: float(v) for k, v in held.items()})
    save_reward_model(run_dir / "final", rm, backbone, tokenizer, meta)
    mirror_final(cfg.store, run_dir / "final")
    return {"kind": cfg.kind, "train_examples": len(job.train), "held_out": len(job.held), "steps": steps,
            **metrics, **held, "reward_mean": mean, "reward_std": std, "seconds": time.perf_counter() - start}
