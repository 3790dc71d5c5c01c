"""Preference alignment: DPO-family training on (prompt, chosen, rejected) pairs.

The story of a run: load the policy and a frozen reference (the same directory by default); turn
every pair into two token sequences (the prompt through the chat template with the generation
prompt, then the response and the end token, exactly as SFT and the rollout engine lay them out);
compute the reference's summed log-probs of every response once, before training, and keep them in
``<out>/reference_logps.pt`` (a resumed run reads them back); then for each step take the next
pairs of a seeded per-epoch order, compute the policy's summed response log-probs in one packed
forward (chosen and rejected share their prompt, which runs once per pair), and minimise the
registered preference loss (``rlvr.algos.preference``). Logged: the loss, implicit rewards of
chosen and rejected, reward accuracy and margin, grad norm and LR. Checkpoints are atomic and
resumable (the batch order is a pure function of seed and step, so a resumed run sees the same
batches); the final model is a Hugging Face directory in ``<out>/final``.

Only response tokens carry loss; prompts are masked. SimPO needs no reference model, so none is
loaded for it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.progress import Progress

from rlvr.algos.preference import PREFERENCE_LOSSES, preference_metrics, sequence_logps
from rlvr.config import check_choice, check_device, check_range, resolve_device, to_dict
from rlvr.errors import ConfigError, UserError
from rlvr.model.checkpoint import latest_checkpoint, prune_checkpoints, save_checkpoint
from rlvr.store import StoreConfig, mirror_checkpoint, mirror_final, pull_if_missing
from rlvr.model.inputs import pad_right
from rlvr.model.load import ModelLoadConfig
from rlvr.model.lora import LoraConfig
from rlvr.model.tokenizer import encode_chat_prompt, encode_completion
from rlvr.monitor.metrics import MetricsLogger
from rlvr.monitor.trackers import TrackerConfig, open_trackers
from rlvr.tasks.pairs import PairFileConfig, PreferencePair, as_pair_file_config, load_pairs
from rlvr.train.allocator import keep_freed_memory
from rlvr.train.batching import batch_indices
from rlvr.train.common import (OptimConfig, build_optimizer, clip_and_step, prepare_run_dir, restore_training_state,
                               seed_everything, training_state)
from rlvr.train.packing import packed_logprobs
from rlvr.train.policy import Policy

REFERENCE_FILE = "reference_logps.pt"
REFERENCE_FREE = frozenset({"simpo"})  # losses that use no reference model


@dataclass
class DPOConfig:
    model: str = "runs/sft/final"
    """Hugging Face causal-LM directory to start from (the policy)."""
    ref_model: str | None = None
    """The frozen reference; None = the starting policy ``model`` (not loaded for reference-free losses)."""
    model_load: ModelLoadConfig = field(default_factory=ModelLoadConfig)
    """How the model directories are loaded: dtype, trust_remote_code, chat_template."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (docs/lora.md). With ``ref_model`` unset the
    reference is the policy with adapters off: no second model is loaded."""
    out: str = "runs/dpo"
    """Run directory; the model lands in <out>/final."""
    seed: int = 0
    """Seed of the batch order."""
    device: str = "cpu"
    """Where the model trains: cpu | cuda | cuda:N | auto."""
    pair_files: list[PairFileConfig | str] = field(default_factory=list)
    """Preference pair files (docs/tasks.md, "Preference pairs"): written by ``rlvr pairs`` or the user's."""
    loss: str = "sigmoid"
    """Preference loss (``rlvr.algos.preference``): sigmoid (DPO; cDPO with label_smoothing) | ipo | robust | simpo."""
    beta: float = 0.1
    """Inverse temperature of the implicit reward (DPO's beta; SimPO's beta)."""
    label_smoothing: float = 0.0
    """Assumed share of flipped labels: conservative DPO (sigmoid) and robust DPO (robust)."""
    simpo_gamma: float = 0.5
    """SimPO's target reward margin (gamma)."""
    rpo_alpha: float = 0.0
    """Weight of the chosen responses' token-mean NLL added to the loss (RPO, Pang et al. 2024,
    "Iterative Reasoning Preference Optimization"; TRL's ``rpo_alpha``): keeps the likelihood of the
    verified answers from falling with the rejected ones'. 0 = off."""
    epochs: float = 1.0
    """Passes over the pairs (may be fractional); the steps are ceil(epochs * pairs / batch_size)."""
    batch_size: int = 16
    """Pairs per optimizer step."""
    max_length: int | None = None
    """Longest sequence (prompt + response tokens) kept; None = the model's context. Longer pairs are dropped and counted."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=10, schedule="cosine"))
    """Optimizer and schedule."""
    log_every: int = 10
    """Log train/* every this many steps."""
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    """Experiment trackers beside metrics.jsonl and TensorBoard (rlvr.monitor.trackers): mlflow, wandb."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Object storage (docs/storage.md): checkpoints and the final model mirrored to ``store.url``;
    ``--resume`` in a directory without a checkpoint pulls the newest complete one from there."""
    checkpoint_every: int = 50
    """Write a resumable checkpoint every this many steps (``--resume`` continues from the newest;
    the two newest are kept, so a damaged newest falls back to the one before)."""

    def __post_init__(self) -> None:
        check_device("dpo.device", self.device)
        self.pair_files = [as_pair_file_config(f) for f in self.pair_files]
        check_choice("dpo.loss", self.loss, PREFERENCE_LOSSES.names())
        if self.beta <= 0:
            raise ConfigError(f"dpo.beta must be > 0, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.rpo_alpha < 0:
            raise ConfigError(f"dpo.rpo_alpha must be >= 0, got {self.rpo_alpha}")
        if self.loss == "ipo" and self.label_smoothing:
            raise ConfigError("dpo.label_smoothing has no effect on loss 'ipo'; leave it 0 (it applies to sigmoid, robust, simpo)")
        if self.epochs <= 0:
            raise ConfigError(f"dpo.epochs must be > 0, got {self.epochs}")
        check_range("dpo.batch_size", self.batch_size, 1)
        check_range("dpo.checkpoint_every", self.checkpoint_every, 1)
        check_range("dpo.log_every", self.log_every, 1)


@dataclass(frozen=True)
class PairIds:
    """One pair as token ids: the shared prompt, and each response with its end token."""

    prompt: tuple[int, ...]
    chosen: tuple[int, ...]
    rejected: tuple[int, ...]


def encode_pairs(tokenizer, pairs: list[PreferencePair], max_length: int | None) -> tuple[list[PairIds], int]:
    """Token ids of the pairs that fit ``max_length`` (prompt + the longer response), and how many did not."""
    out, dropped = [], 0
    for pair in pairs:
        prompt = tuple(encode_chat_prompt(tokenizer, list(pair.prompt)))
        ids = PairIds(prompt, tuple(encode_completion(tokenizer, pair.chosen)),
                      tuple(encode_completion(tokenizer, pair.rejected)))
        if max_length is not None and len(prompt) + max(len(ids.chosen), len(ids.rejected)) > max_length:
            dropped += 1
            continue
        out.append(ids)
    return out, dropped


def response_logps(model, rows: list[PairIds], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed log-probs of the chosen and rejected responses under ``model`` and their lengths, [B] each.

    One packed forward over the 2B sequences (chosen, rejected, chosen, ...); the pair's prompt is
    shared, so it runs once per pair where the flat layout applies. Gradients flow unless called
    under ``torch.no_grad``."""
    seqs, want = [], []
    for r in rows:
        for response in (r.chosen, r.rejected):
            seqs.append(list(r.prompt + response))
            want.append([0] * len(r.prompt) + [1] * len(response))
    device = next(model.parameters()).device
    ids = pad_right(seqs, pad_token_id, torch.long).to(device)
    attn = pad_right([[1] * len(s) for s in seqs], 0, torch.long).to(device)
    mask = pad_right(want, 0, torch.float32).to(device)
    lp = packed_logprobs(model, ids, attn, mask, share_prompts=True)
    sums, lengths = sequence_logps(lp, mask)
    return sums[0::2], sums[1::2], lengths[0::2], lengths[1::2]


def _fingerprint(rows: list[PairIds], ref_model: str) -> str:
    h = hashlib.sha256(ref_model.encode())
    for r in rows:
        h.update(json.dumps([r.prompt, r.chosen, r.rejected]).encode())
    return h.hexdigest()[:16]


def reference_logps(cfg: DPOConfig, run_dir: Path, rows: list[PairIds], pad_token_id: int, device,
                    policy: Policy) -> torch.Tensor | None:
    """[N, 2] summed reference log-probs (chosen, rejected) of every pair: computed once and kept
    in ``<out>/reference_logps.pt`` (read back when the pairs and reference are the same); None
    for a reference-free loss. The reference is ``ref_model`` loaded apart, else the starting
    ``policy`` (``Policy.load_reference``: with LoRA its adapters off, no model is loaded)."""
    if cfg.loss in REFERENCE_FREE:
        return None
    ref_dir = cfg.ref_model or cfg.model
    key = _fingerprint(rows, str(Path(ref_dir).resolve()))
    path = run_dir / REFERENCE_FILE
    if path.exists():
        saved = torch.load(path)
        if saved.get("fingerprint") == key:
            return saved["logps"]
    loaded = policy.load_reference(cfg.ref_model or None, device=device, options=cfg.model_load)
    with policy.reference(loaded) as ref:
        out = _logps_of(ref, rows, pad_token_id, cfg.batch_size)
    del ref, loaded  # a loaded reference is not kept for training
    tmp = path.with_suffix(".tmp")
    torch.save({"fingerprint": key, "logps": out}, tmp)
    tmp.replace(path)
    return out


def _logps_of(model, rows: list[PairIds], pad_token_id: int, batch_size: int) -> torch.Tensor:
    out = torch.empty(len(rows), 2, dtype=torch.float32)
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            c, r, _, _ = response_logps(model, rows[i: i + batch_size], pad_token_id)
            out[i: i + len(c), 0], out[i: i + len(c), 1] = c.cpu(), r.cpu()
    return out


def encoded_pairs(cfg: DPOConfig, model, tokenizer) -> tuple[list, int]:
    """The pairs of ``cfg.pair_files`` tokenised, those longer than ``max_length`` (default: the
    model's context) dropped; the rows and how many were dropped."""
    pairs = [p for f in cfg.pair_files for p in load_pairs(f)]
    max_length = cfg.max_length or getattr(model.config, "max_position_embeddings", None)
    rows, dropped = encode_pairs(tokenizer, pairs, max_length)
    if dropped:
        print(f"dpo: dropped {dropped} of {len(pairs)} pairs longer than {max_length} tokens")
    if not rows:
        raise UserError(f"dpo: no pair fits max_length={max_length} tokens")
    return rows, dropped


def dpo_step(model, batch: list, ref: torch.Tensor | None, cfg: DPOConfig, opt, sched, pad_token_id: int) -> dict:
    """One optimizer step on a batch of encoded pairs (``ref``: their reference log-probs, [B, 2],
    or None for reference-free losses); its metrics."""
    chosen, rejected, chosen_len, rejected_len = response_logps(model, batch, pad_token_id)
    losses, chosen_rewards, rejected_rewards = PREFERENCE_LOSSES.get(cfg.loss)(
        chosen, rejected, ref[:, 0] if ref is not None else None, ref[:, 1] if ref is not None else None,
        beta=cfg.beta, label_smoothing=cfg.label_smoothing, chosen_lengths=chosen_len, rejected_lengths=rejected_len,
        gamma=cfg.simpo_gamma if cfg.loss == "simpo" else 0.0)
    nll = -chosen.sum() / chosen_len.sum().clamp(min=1)  # token mean over the batch's chosen responses
    loss = losses.mean() + cfg.rpo_alpha * nll if cfg.rpo_alpha else losses.mean()
    loss.backward()
    grad_norm = clip_and_step(model, opt, sched, cfg.optim.grad_clip)
    return {"train/loss": loss.item(), "train/grad_norm": grad_norm, "train/lr": sched.get_last_lr()[0],
            **{f"train/{k}": v for k, v in preference_metrics(chosen_rewards, rejected_rewards).items()},
            "train/logps/chosen": chosen.mean().item(), "train/logps/rejected": rejected.mean().item(),
            "train/nll/chosen": nll.item()}


def run_dpo(cfg: DPOConfig, *, resume: bool = False, progress: bool = True) -> dict:
    keep_freed_memory()
    seed_everything(cfg.seed)
    if not cfg.pair_files:
        raise UserError("dpo: no preference pairs: give --pairs FILE (or dpo.pair_files); "
                        "`rlvr pairs` writes them from a model's verified rollouts")
    run_dir = prepare_run_dir(cfg.out, cfg)
    start = time.perf_counter()
    device = resolve_device("dpo.device", cfg.device)
    pull_if_missing(cfg.store, run_dir, resume)  # another machine's run, from the store alone
    ckpt = latest_checkpoint(run_dir) if resume else None
    policy = Policy.load(cfg.model, cfg.lora, ckpt, device=device, options=cfg.model_load)
    model, tokenizer = policy.model, policy.tokenizer
    rows, dropped = encoded_pairs(cfg, model, tokenizer)
    ref = reference_logps(cfg, run_dir, rows, tokenizer.pad_token_id, device, policy)
    steps = math.ceil(cfg.epochs * len(rows) / cfg.batch_size)
    model.train()
    opt, sched = build_optimizer(model, cfg.optim, steps)
    gen = torch.Generator().manual_seed(cfg.seed)  # checkpointed with the rest; the order needs none
    first = 1
    if ckpt is not None:
        first = restore_training_state(ckpt, opt, sched, gen)["step"] + 1
    logger = MetricsLogger(run_dir, resume_step=first - 1 if resume else None,
                           trackers=open_trackers(cfg.trackers, run_dir, to_dict(cfg)))
    metrics: dict[str, float] = {}
    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("dpo", total=steps, completed=first - 1)
        for step in range(first, steps + 1):
            idx = batch_indices(step, len(rows), cfg.batch_size, cfg.seed)
            metrics = dpo_step(model, [rows[i] for i in idx], ref[idx].to(device) if ref is not None else None,
                               cfg, opt, sched, tokenizer.pad_token_id)
            if step % cfg.log_every == 0 or step == steps:
                logger.log(step, metrics)
            if step % cfg.checkpoint_every == 0 and step < steps:
                path = save_checkpoint(run_dir, step, policy.checkpoint_module(), tokenizer,
                                       training_state(step, opt, sched, gen))
                prune_checkpoints(run_dir, keep=2)
                mirror_checkpoint(cfg.store, path, run_dir, keep=2)
            bar.update(job, advance=1, description=f"dpo loss {metrics['train/loss']:.3f}")
    logger.close()
    policy.save_final(run_dir / "final")
    mirror_final(cfg.store, run_dir / "final")
    return {"pairs": len(rows), "dropped": dropped, "steps": steps, **metrics,
            "seconds": time.perf_counter() - start}
