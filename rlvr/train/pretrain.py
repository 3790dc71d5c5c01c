"""Pretraining the embedded default: tokenizer + tiny Llama trained from scratch on raw text.

The corpus is procedural text from the built-in domains (train-split problems only, never chat
format). The result — ``<out>/final`` — is a plain Hugging Face model directory: the "prior" that
SFT and RL start from. This is deliberately tiny so the whole stack runs on a laptop CPU.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
from rich.progress import Progress

from rlvr.config import check_choice, check_device, check_range, resolve_device, to_dict
from rlvr.errors import ConfigError
from rlvr.model.checkpoint import latest_checkpoint, prune_checkpoints, save_checkpoint, save_model_dir
from rlvr.model.load import load_model_and_tokenizer
from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.model.tokenizer import train_tokenizer
from rlvr.monitor.metrics import MetricsLogger
from rlvr.monitor.trackers import TrackerConfig, open_trackers
from rlvr.rollout.engine import PRECISIONS, precision_autocast
from rlvr.tasks.base import DOMAINS
from rlvr.train.allocator import keep_freed_memory
from rlvr.train.common import (OptimConfig, build_optimizer, clip_and_step, prepare_run_dir, restore_training_state,
                               seed_everything, training_state)
from rlvr.train.compiled import check_cpu_compiler
from rlvr.train.precision import hf_training_attention


@dataclass
class PretrainConfig:
    out: str = "runs/pretrain"
    """Run directory; the model lands in <out>/final."""
    seed: int = 0
    """Seed for corpus, init and batch order."""
    device: str = "cpu"
    """Where the model trains: cpu | cuda | cuda:N | auto (cuda when torch sees a GPU)."""
    domains: list[str] = field(default_factory=lambda: ["math.arith", "math.word"])
    """Built-in domains whose procedural corpus is used."""
    docs_per_domain: int = 4000
    """Corpus documents generated per domain."""
    vocab_size: int = 384
    """BPE vocabulary size of the trained tokenizer (digits are always single tokens)."""
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Architecture of the tiny Llama."""
    steps: int = 600
    """Optimizer steps."""
    batch_size: int = 32
    """Sequences per optimizer step."""
    seq_len: int = 128
    """Tokens per sequence (documents are packed, separated by the end token); at most
    model.max_positions: raise both to train at a longer context."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3, warmup_steps=50, schedule="cosine", weight_decay=0.01))
    """Optimizer and schedule."""
    precision: str = "model"
    """model | bf16: forward and backward in the model's dtype, or under ``torch.autocast`` to
    bfloat16 (weights, gradients and AdamW state stay float32; on CPU the model's eager attention,
    ``rlvr.train.precision``). bf16 pays where the hardware multiplies bf16 natively
    (``native_precision``: the quickstart's default); elsewhere it is slower than fp32."""
    compile: bool = False
    """Run the model's forward and backward through ``torch.compile`` with static shapes (every
    step is [batch_size, seq_len]): one compile (about 25 s on 2 CPU cores, kept in inductor's
    on-disk cache for later runs), then RMSNorm, RoPE, SwiGLU and bf16 casts fused. It pays under
    bf16 autocast (a step 1.3-1.5x faster here, docs/benchmarks.md); in fp32 it measured no faster. On CPU it needs a
    C++ compiler (``ConfigError`` without one)."""
    log_every: int = 25
    """Log train/* every this many steps."""
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    """Experiment trackers beside metrics.jsonl and TensorBoard (rlvr.monitor.trackers): mlflow, wandb."""
    checkpoint_every: int = 100
    """Write a resumable checkpoint every this many steps (`--resume` continues from the newest;
    the two newest are kept, so a damaged newest falls back to the one before)."""

    def __post_init__(self) -> None:
        check_device("pretrain.device", self.device)
        check_range("pretrain.steps", self.steps, 1)
        check_range("pretrain.seq_len", self.seq_len, 8)
        check_choice("pretrain.precision", self.precision, list(PRECISIONS))
        if self.seq_len > self.model.max_positions:
            raise ConfigError(f"pretrain.seq_len ({self.seq_len}) is longer than pretrain.model.max_positions "
                              f"({self.model.max_positions}); to train at a longer context raise both "
                              "(e.g. pretrain.seq_len=512 pretrain.model.max_positions=512)")
        for d in self.domains:
            DOMAINS.get(d)


def build_corpus(cfg: PretrainConfig) -> list[str]:
    docs: list[str] = []
    for name in cfg.domains:
        docs.extend(DOMAINS.get(name).corpus(cfg.seed, cfg.docs_per_domain))
    random.Random(cfg.seed).shuffle(docs)
    return docs


def pack(tokenizer, docs: list[str], seq_len: int) -> torch.Tensor:
    """Concatenate documents (each followed by the end token) and cut into [N, seq_len] rows. A fast
    tokenizer encodes them in one batch on its Rust side (5.7 -> 3.3 s for the quickstart's 12,000
    documents), others one at a time; the ids are the same."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        encoded = [e.ids for e in backend.encode_batch(docs, add_special_tokens=False)]
    else:
        encoded = [tokenizer(doc, add_special_tokens=False)["input_ids"] for doc in docs]
    ids: list[int] = []
    for doc_ids in encoded:
        ids.extend(doc_ids)
        ids.append(tokenizer.eos_token_id)
    n = len(ids) // seq_len
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def run_pretrain(cfg: PretrainConfig, *, resume: bool = False, progress: bool = True) -> dict:
    keep_freed_memory()
    seed_everything(cfg.seed)
    run_dir = prepare_run_dir(cfg.out, cfg)
    start = time.perf_counter()
    ckpt = latest_checkpoint(run_dir) if resume else None
    device = resolve_device("pretrain.device", cfg.device)
    docs = build_corpus(cfg)
    if ckpt is None:
        tokenizer = train_tokenizer(docs, vocab_size=cfg.vocab_size)
        model = build_tiny_model(cfg.model, tokenizer, seed=cfg.seed).to(device)
    else:
        model, tokenizer = load_model_and_tokenizer(str(ckpt), device=device)
    data = pack(tokenizer, docs, cfg.seq_len)
    model.train()
    if cfg.compile and device.type == "cpu":
        check_cpu_compiler("pretrain.compile")
    forward = torch.compile(model, dynamic=False) if cfg.compile else model
    opt, sched = build_optimizer(model, cfg.optim, cfg.steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    first = 1
    if ckpt is not None:
        first = restore_training_state(ckpt, opt, sched, gen)["step"] + 1
    logger = MetricsLogger(run_dir, resume_step=first - 1 if resume else None,
                           trackers=open_trackers(cfg.trackers, run_dir, to_dict(cfg)))
    loss_value = float("nan")
    with hf_training_attention(model, cfg.precision), Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("pretrain", total=cfg.steps, completed=first - 1)
        for step in range(first, cfg.steps + 1):
            rows = torch.randint(0, data.shape[0], (cfg.batch_size,), generator=gen)
            batch = data[rows].to(device)
            with precision_autocast(model, cfg.precision):
                loss = forward(input_ids=batch, labels=batch).loss
            loss.backward()
            grad_norm = clip_and_step(model, opt, sched, cfg.optim.grad_clip)
            loss_value = loss.item()
            if step % cfg.log_every == 0 or step == cfg.steps:
                logger.log(step, {"train/loss": loss_value, "train/grad_norm": grad_norm,
                                  "train/lr": sched.get_last_lr()[0]})
            if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                save_checkpoint(run_dir, step, model, tokenizer, training_state(step, opt, sched, gen))
                prune_checkpoints(run_dir, keep=2)
            bar.update(job, advance=1, description=f"pretrain loss {loss_value:.3f}")
    logger.close()
    save_model_dir(run_dir / "final", model, tokenizer)
    return {"loss": loss_value, "tokens": int(data.numel()), "params": sum(p.numel() for p in model.parameters()),
            "seconds": time.perf_counter() - start}
