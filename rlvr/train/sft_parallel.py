"""SFT in several processes under torchrun (docs/distributed.md, "Data parallel (torchrun)",
"Sequence parallelism", "Sharded training (FSDP2)"): the parts of ``rlvr.train.sft`` that differ
from one process.

``torchrun --nproc_per_node N -m rlvr.cli sft ...`` (or ``rlvr sft --nproc N``) starts N ranks;
every rank loads the same model and demonstrations, and draws the same batch order. Three layouts:

- **data parallel** (default): each rank takes its share of every batch's rows (rows r, r + N, ...),
  its loss is the sum of its response tokens' loss divided by the *global* number of response
  tokens of the batch, and the ranks' gradients are summed (``all_reduce_grads``): the sum is the
  one-process gradient of the batch's token mean.
- **sharded** (``sft.shard``): the policy is ``shard_model``-ed (FSDP2, one unit per decoder layer
  and the root); FSDP2 averages the gradients over the ranks itself, so the loss is scaled by N
  for the average to be the same sum. Checkpoints are DCP (``sharded.save_checkpoint``: every rank
  writes its shards) plus rank 0's ``trainer_state.pt`` (step, schedule, generator, RNGs, data
  order), atomic like ``rlvr.model.checkpoint``'s (manifest, marker, then a rename); they resume
  at another world size (tested: 2 ranks -> one plain process; ``restore_sharded``). ``final/`` is a Hugging Face
  directory rank 0 writes from ``full_state_dict``.
- **sequence parallel** (``sft.sequence_parallel``): the whole world is one sequence-parallel group;
  every rank takes every row of the batch, one row at a time through ``sequence_loss`` (prompt
  tokens labelled ``IGNORE``), weighted by its response tokens over the batch's, and the ranks'
  gradients are summed (``reduce_gradients``; FSDP2's average, scaled, when sharded too).

Sharding composes with LoRA (the frozen base and the adapters shard together, FSDP2 accepts the
mix; only the adapters get gradients and optimizer state; ``final/`` is written as ``lora.save``
says, from the gathered weights) and with ``optim.master_weights`` on a bf16/fp16 model (the model
is upcast before sharding: the float32 shards are the masters, FSDP2's mixed-precision policy
computes the forward in bf16 and reduces gradients in float32).

Refused (``check_parallel``, ``ConfigError``): ``shard`` or ``sequence_parallel`` without torchrun;
a batch smaller than the world in data parallel; a sharded run resuming a checkpoint that is not
sharded, or a sharded checkpoint of a LoRA run without LoRA (and the reverse); sequence
parallelism on a model whose head counts do not divide by the world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from rlvr.algos.losses import token_logprobs
from rlvr.errors import ConfigError
from rlvr.model.inputs import pad_right
from rlvr.train.common import clip_and_step
from rlvr.train.distributed import (
    DistributedConfig,
    Group,
    all_reduce_grads,
    barrier,
    open_group,
)

def check_parallel(cfg, group: Group) -> None:
    """Refuse the layouts of ``cfg`` (an ``SFTConfig``) that cannot run in ``group``."""
    wanted = [k for k in ("shard", "sequence_parallel") if getattr(cfg, k)]
    if wanted and group.world == 1:
        raise ConfigError(f"sft.{wanted[0]} needs several processes: run under torchrun "
                          "(torchrun --nproc_per_node N -m rlvr.cli sft ..., or rlvr sft --nproc N)")
    if group.world > 1 and not cfg.sequence_parallel and cfg.batch_size < group.world:
        raise ConfigError(f"sft.batch_size={cfg.batch_size} is smaller than the {group.world} processes: "
                          "data parallel gives every rank at least one row of each batch")


@dataclass
class Layout:
    """How this process takes part in the step (world 1: the single-process SFT)."""

    group: Group
    shard: bool = False
    sequence_parallel: bool = False
    opened: bool = False
    """This run opened the process group (and closes it at the end)."""
    mixed_precision: bool = False
    """Sharded with FSDP2's bf16 policy over float32 masters (``prepare`` with master weights)."""

    @property
    def world(self) -> int:
        return self.group.world

    def share(self, rows: list) -> list:
        """This rank's rows of a batch: all of them in sequence parallelism, else every N-th."""
        return rows if self.sequence_parallel else rows[self.group.rank::self.world]


def join(cfg, group: Group, device: torch.device) -> Layout:
    """The run's layout; under torchrun the process group joined (gloo on CPU, nccl on CUDA)."""
    opened = group.world > 1 and not dist.is_initialized()
    open_group(DistributedConfig(), device)
    return Layout(group, cfg.shard, cfg.sequence_parallel, opened)


def close(layout: Layout) -> None:
    barrier()
    if layout.opened and dist.is_initialized():
        dist.destroy_process_group()


def prepare(model: torch.nn.Module, layout: Layout, master_weights: bool = False) -> torch.nn.Module:
    """Check the heads for sequence parallelism and shard ``model`` (before its optimizer); with
    ``master_weights`` and a trainable parameter not in float32, upcast first and shard with bf16
    mixed precision (the float32 shards are the masters)."""
    if layout.sequence_parallel:
        from rlvr.train.sequence_parallel import check_heads

        try:
            check_heads(model.config, layout.world)
        except ValueError as e:
            raise ConfigError(f"sft.sequence_parallel: {e}") from None
    if layout.shard:
        from rlvr.train.sharded import shard_for_training

        layout.mixed_precision = shard_for_training(model, master_weights)
    return model


def response_tokens(row: tuple[list[int], list[int]]) -> int:
    """The trained targets of a row (its loss mask past the first token, as ``sft_loss`` counts)."""
    return sum(row[1][1:])


def parallel_step(model, rows: list, layout: Layout, opt, sched, grad_clip: float, pad_token_id: int,
                  device) -> dict[str, float]:
    """One optimizer step over the global batch ``rows`` (the same list on every rank); its metrics
    equal one process's ``sft_step`` on the same rows (float rounding aside)."""
    denom = max(sum(response_tokens(r) for r in rows), 1)
    scale = layout.world if layout.shard else 1  # FSDP2 averages the ranks' gradients: undo the 1/N
    if layout.sequence_parallel:
        from rlvr.train.sequence_parallel import IGNORE, reduce_gradients, sequence_loss

        total = 0.0
        for ids, mask in rows:
            input_ids = torch.tensor([ids], dtype=torch.long, device=device)
            labels = torch.where(torch.tensor([mask], device=device) == 1, input_ids, IGNORE)
            out = sequence_loss(model, input_ids, labels=labels, pad_id=pad_token_id)
            (out.loss * (out.tokens * scale / denom)).backward()
            total += out.loss.item() * out.tokens  # equal on every rank: the whole sequence's
        loss_value = total / denom
        if not layout.shard:
            reduce_gradients(model)
    else:
        mine = layout.share(rows)
        ids = pad_right([r[0] for r in mine], pad_token_id, torch.long).to(device)
        mask = pad_right([r[1] for r in mine], 0, torch.float32).to(device)
        attn = pad_right([[1] * len(r[0]) for r in mine], 0, torch.long).to(device)
        logits = model(input_ids=ids, attention_mask=attn).logits
        nll = -(token_logprobs(logits, ids)[:, 1:] * mask[:, 1:].to(logits.dtype)).sum()
        (nll * (scale / denom)).backward()
        summed = torch.tensor([nll.item()], dtype=torch.float64)
        dist.all_reduce(summed)
        loss_value = summed.item() / denom
        if not layout.shard:
            all_reduce_grads([p for p in model.parameters() if p.requires_grad])
    grad_norm = clip_and_step(model, opt, sched, grad_clip)
    return {"train/loss": loss_value, "train/grad_norm": grad_norm, "train/lr": sched.get_last_lr()[0]}


def save_final_sharded(directory: Path, model, tokenizer, cfg, layout: Layout) -> None:
    """``final/``: the whole weights gathered on every rank (a collective), loaded by rank 0 into a
    plain copy of the starting policy (LoRA: the base with fresh adapters) and written as one
    process writes it (``Policy.save_final``: a Hugging Face directory; LoRA as ``lora.save``)."""
    from rlvr.train.policy import Policy
    from rlvr.train.sharded import full_state_dict

    weights = full_state_dict(model)
    if layout.group.is_main:
        plain = Policy.load(cfg.model, cfg.lora, device="cpu", options=cfg.model_load)
        plain.model.load_state_dict(weights)
        plain.save_final(directory)
    barrier()
