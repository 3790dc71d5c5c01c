"""The policy's update: the loss's epochs over mini- and micro-batches of a prepared step.

    update(run, p)              truncated rows out (``algo.overlong_filter``), the off-policy
                                correction of stale rows (asynchronous mode), then
                                ``algo.ppo_epochs`` passes, one optimizer step per mini-batch,
                                micro-batched for memory (``algo.memory_budget_mb``: the
                                memory settings chosen per batch), data parallel across torchrun ranks;
                                then the step components' own training (the critic's)
    micro_loss(model, micro)    one micro-batch's forward and loss: ``POLICY_LOSSES`` over the
                                log-probs (packed, compiled, bf16 as ``algo`` says), plus the KL
                                term when the batch carries the reference's log-probs

The prepared step ``p`` is never changed: a filtered or corrected batch is a new value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from rlvr.algos.kl import KL_ESTIMATORS, logprob_mismatch_kl
from rlvr.algos.losses import AGGREGATIONS, POLICY_LOSSES
from rlvr.algos.off_policy import correct_off_policy
from rlvr.model.logprobs import sequence_logprobs
from rlvr.rollout.engine import precision_autocast
from rlvr.train.batching import select
from rlvr.faults import fault_point
from rlvr.train.common import clip_and_step
from rlvr.train.compiled import compiled_layers
from rlvr.train.distributed import all_reduce_grads, gather
from rlvr.train.grpo_config import AlgoConfig, GRPOConfig
from rlvr.train.memory import checkpointing, disable_activation_checkpointing, enable_activation_checkpointing
from rlvr.train.memory_plan import plan
from rlvr.train.packing import packed_logprobs
from rlvr.train.phases import Prepared
from rlvr.train.precision import training_attention
from rlvr.train.token_batches import token_microbatches
from rlvr.types import Batch, Scored

if TYPE_CHECKING:
    from rlvr.train.grpo_setup import Run


def update(run: Run, p: Prepared, cfg: GRPOConfig) -> dict:
    """Truncated rows out (``algo.overlong_filter``), then PPO-clip epochs over mini-batches (one
    optimizer step each), micro-batched for memory; then the components' training."""
    p, filtered = drop_overlong(p) if p.kept and cfg.algo.overlong_filter else (p, {})
    if not p.kept:
        return {"train/skipped": 1.0, **filtered}
    a, kept, budget = cfg.algo, p.kept, p.budget
    batch, off_policy = off_policy_correction(run, p.batch, kept, cfg) if cfg.asynchronous.enabled else (p.batch, {})
    a, planned = memory_settings(run.model, batch, a) if a.memory_budget_mb else (a, {})
    mismatch: list[float] = []  # rollout/logprob_mismatch_kl, from forwards before the first optimizer step
    run.model.train()
    n = batch.input_ids.shape[0]
    mb = a.minibatch_size or n
    sums: dict[str, list[float]] = defaultdict(list)
    for _ in range(a.ppo_epochs):
        order = torch.randperm(n, generator=run.generator)
        for start in range(0, n, mb):
            mini = select(batch, order[start: start + mb])
            totals = {"num_tokens": float(mini.loss_mask.sum()), "num_seqs": float(mini.input_ids.shape[0]),
                      "max_tokens": budget}
            mini_loss = 0.0
            for metrics in minibatch_backward(run, mini, a, totals, is_cap=cfg.asynchronous.is_cap):
                mini_loss += metrics["pg_loss"]
                if "train/grad_norm" not in sums:  # no optimizer step yet: trainer == engine weights
                    mismatch.append(metrics.pop("logprob_mismatch_kl"))
                metrics.pop("logprob_mismatch_kl", None)
                for k, v in metrics.items():
                    sums[f"train/{k}"].append(v)
            if run.monitor.stops_on_nonfinite:  # before the step: NaN/inf never reaches the weights
                run.monitor.guard_finite(run.step + 1, {"train/pg_loss": mini_loss, "train/grad_norm": grad_norm(run.model)},
                                         at_boundary="train/grad_norm" not in sums)
            fault_point("optimizer_step")
            sums["train/grad_norm"].append(clip_and_step(run.model, run.optimizer, run.scheduler, cfg.optim.grad_clip))
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    out["train/lr"] = run.scheduler.get_last_lr()[0]
    out["train/samples"] = float(n)
    out["train/policy_tokens"] = float(batch.loss_mask.sum())
    out["rollout/logprob_mismatch_kl"] = sum(mismatch) / len(mismatch)
    out.update(off_policy)
    out.update(filtered)
    out.update(planned)
    for part in run.components.values():  # the critic's epochs towards the returns, after the policy's
        out.update(part.after_update(batch, p.returns, p.values, run.generator))
    return out


def minibatch_backward(run: Run, mini: Batch, a: AlgoConfig, totals: dict, is_cap: float) -> list[dict]:
    """Forward and backward of ``mini`` in micro-batches; the metrics of each, in order.

    Data parallel: micro-batch u runs on rank u % world (the same micro-batches at every world
    size; the ranks all work when a mini-batch has at least ``world`` of them), the loss is
    normalised by the mini-batch's global ``totals``, so the sum of the ranks' gradients
    (``all_reduce_grads``) is the one-process gradient and every rank steps the same; every
    micro-batch's metrics reach every rank. With ``algo.microbatch_tokens`` the micro-batches hold
    at most that many tokens each, as many on every rank (``rlvr.train.token_batches``). Sharded
    (``distributed.shard``): FSDP2 reduce-scatters the gradients as an average, so the loss is
    scaled by the world size, and a rank with one micro-batch fewer runs a zero-weighted one (each
    sharded forward and backward is a collective of every rank)."""
    micros = microbatch_rows(mini, a, run.group.world)
    sharded, world = run.policy.is_sharded, run.group.world
    mine = []
    for u in range(run.group.rank, len(micros), world):
        micro = mini if len(micros) == 1 else select(mini, micros[u])
        loss, metrics = micro_loss(run.model, micro, a, totals, is_cap=is_cap)
        (loss * world if sharded else loss).backward()  # FSDP2 averages the ranks' gradients: undo the 1/N
        mine.append(metrics)
    if sharded and len(mine) < math.ceil(len(micros) / world):  # every rank must join each sharded forward
        loss, _ = micro_loss(run.model, mini if len(micros) == 1 else select(mini, micros[0]), a, totals,
                             is_cap=is_cap)
        (loss * 0.0).backward()
    if not sharded:
        all_reduce_grads([p for p in run.model.parameters() if p.requires_grad], run.cfg.distributed.bucket_mb)
    per_rank = gather(mine)
    return [per_rank[u % run.group.world][u // run.group.world] for u in range(len(micros))]


def microbatch_rows(mini: Batch, a: AlgoConfig, world: int) -> list[torch.Tensor]:
    """The row indices of each micro-batch of ``mini``, in run order (micro-batch u on rank
    u % world): with ``algo.microbatch_tokens`` by that token budget (a row's real tokens), else
    ``algo.microbatch_size`` consecutive rows."""
    if a.microbatch_tokens:
        lengths = mini.attention_mask.sum(1).tolist()
        return [torch.tensor(r) for r in token_microbatches(lengths, a.microbatch_tokens, world)]
    return list(torch.arange(mini.input_ids.shape[0]).split(a.microbatch_size))


def memory_settings(model, batch: Batch, a: AlgoConfig) -> tuple[AlgoConfig, dict]:
    """``algo.memory_budget_mb``: the micro-batch token budget, the logits chunk and activation
    checkpointing for this batch's lengths (``rlvr.train.memory_plan.plan``), each only where the
    user left it at its default (0, 0, false); checkpointing is switched on or off on the model to
    match. Returns the settings to run and the ``train/memory_plan_*`` metrics."""
    lengths = batch.attention_mask.sum(1).tolist()
    share = float(batch.loss_mask.sum()) / max(1, sum(lengths))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    chosen = plan(model.config, lengths, a.memory_budget_mb * 2**20, policy_share=share, trainable_params=trainable)
    ckpt = a.gradient_checkpointing or chosen.gradient_checkpointing
    if ckpt != checkpointing(model):
        (enable_activation_checkpointing if ckpt else disable_activation_checkpointing)(model)
    a = dataclasses.replace(a, microbatch_tokens=a.microbatch_tokens or chosen.microbatch_tokens,
                            logits_chunk=a.logits_chunk or chosen.logits_chunk)
    return a, {"train/memory_plan_microbatch_tokens": float(a.microbatch_tokens),
               "train/memory_plan_logits_chunk": float(a.logits_chunk),
               "train/memory_plan_checkpointing": float(ckpt),
               "train/memory_plan_estimate_mb": chosen.estimate_bytes / 2**20,
               "train/memory_plan_fits": float(chosen.fits)}


def grad_norm(model: torch.nn.Module) -> float:
    """The total L2 norm of the gradients (what ``clip_and_step`` clips), without stepping."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: the whole gradient's


def logprobs_of(model, batch: Batch, a: AlgoConfig) -> torch.Tensor:
    """[B, T] log-probs of ``batch`` under ``model``: on policy tokens only when packing, else
    every real token but the first. ``a.precision == "bf16"``: the forward under autocast;
    ``a.compile``: with compiled decoder layers."""
    # With activation checkpointing the backward reruns each layer outside this function's
    # contexts, so the forward must not depend on them: padded rows (the LM head still on policy
    # tokens only) and torch's default attention backend.
    recompute = model.training and checkpointing(model)
    with precision_autocast(model, a.precision), \
            contextlib.nullcontext() if recompute else training_attention(model, a.precision), \
            compiled_layers(model, a.compile):
        if a.packing:
            return packed_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                   share_prompts=a.share_prompts and not recompute,
                                   packing=False if recompute else None, logits_chunk=a.logits_chunk)
        return sequence_logprobs(model, batch.input_ids, batch.attention_mask)


def frozen_logprobs(model, batch: Batch, a: AlgoConfig) -> torch.Tensor:
    """[B, T] log-probs of a frozen model (the KL reference, the teacher) for ``batch``: in the
    update's token micro-batches when ``algo.microbatch_tokens`` or ``algo.memory_budget_mb`` is
    set (the plan's token budget and logits chunk: its logits never outgrow the update's), else
    in one forward. Positions a micro-batch does not reach (its padding) are 0."""
    if not (a.microbatch_tokens or a.memory_budget_mb):
        return logprobs_of(model, batch, a)
    if a.memory_budget_mb:
        lengths = batch.attention_mask.sum(1).tolist()
        share = float(batch.loss_mask.sum()) / max(1, sum(lengths))
        chosen = plan(model.config, lengths, a.memory_budget_mb * 2**20, policy_share=share, trainable_params=0)
        a = dataclasses.replace(a, microbatch_tokens=a.microbatch_tokens or chosen.microbatch_tokens,
                                logits_chunk=a.logits_chunk or chosen.logits_chunk)
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows in microbatch_rows(batch, a, 1):
        lp = logprobs_of(model, select(batch, rows), a)
        out[rows, :lp.shape[1]] = lp.to(out.dtype)
    return out


def off_policy_correction(run: Run, batch: Batch, kept: list[Scored], cfg: GRPOConfig) -> tuple[Batch, dict]:
    """Async mode: samples generated by an older policy version get pi_old = the trainer's
    log-probs at the start of this update and per-token truncated IS weights
    (``rlvr.algos.off_policy``; behaviour = the engine's sampling log-probs). On-policy rows keep
    pi_old = behaviour and weight 1. Rows of ``batch`` are ``kept`` in order.

    Single-pass update (one epoch, one mini-batch: the default): the loss's own forward runs at
    exactly those weights, so it supplies pi_old (``off_policy_terms``): no extra forward, only
    ``stale`` is set. Otherwise one no-grad forward over the stale rows, before any step. Returns
    the batch to train (a new one when anything changed) and the metrics."""
    stale = torch.tensor([s.trajectory.policy_version < run.step for s in kept], device=batch.input_ids.device)
    out = {"async/stale_frac": float(stale.float().mean())}
    if not stale.any():
        return batch, out
    n = batch.input_ids.shape[0]
    if cfg.algo.ppo_epochs == 1 and (cfg.algo.minibatch_size == 0 or cfg.algo.minibatch_size >= n):
        return dataclasses.replace(batch, stale=stale), out
    rows = stale.nonzero().flatten()
    was_training = run.model.training
    run.model.eval()
    with torch.no_grad():
        pi_old = torch.cat([logprobs_of(run.model, select(batch, r), cfg.algo)
                            for r in rows.split(cfg.algo.microbatch_size)])
    run.model.train(was_training)
    old, weights, metrics = correct_off_policy(pi_old, batch.old_logprobs[rows], batch.loss_mask[rows] > 0,
                                                cfg.asynchronous.is_cap)
    is_weights = torch.ones_like(batch.old_logprobs)
    is_weights[rows] = weights
    old_logprobs = batch.old_logprobs.clone()
    old_logprobs[rows] = old
    out.update({f"train/{k}": v for k, v in metrics.items()})
    return dataclasses.replace(batch, is_weights=is_weights, old_logprobs=old_logprobs), out


def off_policy_terms(logprobs: torch.Tensor, micro: Batch, is_cap: float) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """(pi_old, IS weights or None, metrics) for the loss. Rows marked ``micro.stale`` (async,
    single-pass update) take pi_old = this forward's log-probs (the trainer's weights before its
    step) and truncated IS weights; other rows keep the batch's values."""
    if micro.stale is None or not bool(micro.stale.any()):
        return micro.old_logprobs, micro.is_weights, {}
    return correct_off_policy(logprobs, micro.old_logprobs, micro.stale[:, None] & (micro.loss_mask > 0), is_cap)


def micro_loss(model, micro: Batch, a: AlgoConfig, totals: dict, is_cap: float = 2.0) -> tuple[torch.Tensor, dict]:
    # Packed: log-probs on policy tokens only (0 elsewhere; the loss and KL see only those).
    logprobs = logprobs_of(model, micro, a)
    old_logprobs, is_weights, off_metrics = off_policy_terms(logprobs, micro, is_cap)  # async only
    off_policy = {"is_weights": is_weights} if is_weights is not None else {}  # async only
    loss, metrics = POLICY_LOSSES.get(a.policy_loss)(
        logprobs, old_logprobs, micro.advantages, micro.loss_mask,
        clip_low=a.clip_low, clip_high=a.clip_high, aggregation=a.aggregation, **totals, **off_policy)
    metrics = dict(metrics, **off_metrics)
    metrics["logprob_mismatch_kl"] = logprob_mismatch_kl(logprobs, micro.old_logprobs, micro.loss_mask)
    metrics["pg_loss"] = float(loss.detach())
    if micro.ref_logprobs is not None:
        kl = KL_ESTIMATORS.get(a.kl_estimator)(logprobs, micro.ref_logprobs)
        kl_loss = AGGREGATIONS.get(a.aggregation)(kl, micro.loss_mask, **totals)
        loss = loss + a.kl_coef * kl_loss
        metrics["kl"] = float(kl_loss.detach())
    return loss, metrics


def drop_overlong(p: Prepared) -> tuple[Prepared, dict]:
    """``algo.overlong_filter`` (DAPO, Yu et al. 2025, Sec. 3.4): ``p`` without the samples cut at
    the length limit (their rewards already took part in their groups' advantages): their rows of
    the batch and of every per-sample tensor. The share filtered, as a metric."""
    truncated = [s.trajectory.finish_reason == "length" for s in p.kept]
    out = {"train/overlong_filtered_frac": sum(truncated) / len(truncated)}
    if not any(truncated):
        return p, out
    kept = [s for s, t in zip(p.kept, truncated) if not t]
    if not kept:
        return dataclasses.replace(p, kept=[], batch=None), out
    rows = torch.tensor([i for i, t in enumerate(truncated) if not t], dtype=torch.long)
    batch = select(p.batch, rows)
    width = batch.input_ids.shape[1]
    rest = {}
    for f in dataclasses.fields(p):  # the reference's, the teacher's, ... log-probs: same rows, same width
        x = getattr(p, f.name)
        if isinstance(x, torch.Tensor):
            rows_x = rows.to(x.device)
            rest[f.name] = x[rows_x, :width] if x.dim() == 2 else x[rows_x]
    return dataclasses.replace(p, kept=kept, batch=batch, **rest), out
