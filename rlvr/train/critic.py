"""The learned critic of PPO (``algo.advantage: gae``): a value model, its optimizer, its update.

The value model is transformers' own ``AutoModelForTokenClassification`` with one label: the
start model's decoder (its language-model head dropped) and a fresh linear score head giving one
scalar per position. Its dropout before the head is set to 0 (``classifier_dropout``), so the
values of a forward do not depend on the random state and ``values`` in eval mode equal the
values the update starts from. A family transformers has no token-classification class for
(e.g. Gemma 3's text model) is refused with a ``UserError`` naming the directory.

Alignment: ``values[b, t]`` is the value of the state before token t, read from the hidden state
at position t - 1 (the one that predicts token t), so it lines up with ``logprobs[b, t]`` and
``loss_mask[b, t]``; position 0 and padding are 0. The math (GAE, the clipped value loss) is in
``rlvr.algos.gae``; the trainer (``rlvr.train.grpo``) decides when values and updates happen.

Checkpoints: ``save(dir)`` writes a Hugging Face directory (the value model's weights and config)
and ``critic_state.pt`` (optimizer and schedule), ``load(dir)`` restores both; the trainer writes
it as ``<checkpoint>/critic/`` inside the policy's atomic checkpoint.

Forward: the policy's padding-free one (``rlvr.train.packing.packed_hidden``: the flat layout
with attention per sequence, a group's shared prompt run once, the score head on the wanted
positions only), following ``algo.packing`` and ``algo.share_prompts`` as the policy does. The
values are computed only where they are used, at the policy tokens (``loss_mask``: GAE, the value
loss and the metrics read nothing else), 0 elsewhere. A value model whose decoder and head cannot be
split (``value_decoder_and_head``) runs the padded forward (``value_forward``) on the same positions.

Data parallel (torchrun): as the policy's update (``minibatch_backward``). Every
rank holds the whole batch and the same weights; ``values`` runs whole on each rank; in
``update`` micro-batch u of each mini-batch runs on rank u % world, the loss normalised by the
mini-batch's global token count, the gradients summed over the ranks (``all_reduce_grads``) and
every rank steps the same; every micro-batch's metrics reach every rank (``gather``). World size
1 is the single-process update.

Not here: LoRA critics.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
from transformers import AutoConfig, AutoModelForTokenClassification

from rlvr.algos.gae import explained_variance, value_loss
from rlvr.config import check_range
from rlvr.errors import ConfigError, UserError
from rlvr.model.load import ModelLoadConfig, dtype_kwarg, load_tokenizer, pretrained_kwargs
from rlvr.rollout.engine import precision_autocast
from rlvr.train.common import OptimConfig, build_optimizer, clip_and_step
from rlvr.train.distributed import Group, active, all_reduce_grads, gather
from rlvr.train.packing import packed_hidden, plain_head_family, scatter_wanted

CRITIC_STATE = "critic_state.pt"
CRITIC_DIR = "critic"  # the critic's directory inside a policy checkpoint
GAE = "gae"  # the ``algo.advantage`` that turns the critic on


@dataclass
class CriticConfig:
    """The value model of PPO with a learned critic (config key ``critic``; used only with
    ``algo.advantage: gae``). Its forward follows the policy's ``algo.packing`` and
    ``algo.share_prompts`` (padding-free, a group's prompt once; see the module docstring)."""

    model: str = ""
    """Hugging Face model directory the value model starts from (its decoder; a fresh scalar head).
    Empty: the policy's start model (``model``)."""
    lr: float = 1e-4
    """Peak learning rate of the critic's own AdamW."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay of the critic."""
    warmup_steps: int = 0
    """Linear warm-up of the critic's learning rate, in critic optimizer steps (constant after)."""
    grad_clip: float = 1.0
    """Clip the critic's global gradient norm to this (0 disables)."""
    gamma: float = 1.0
    """GAE discount per policy token (1.0: undiscounted, the usual choice for outcome rewards)."""
    lam: float = 0.95
    """GAE lambda: 0 is one-step TD (low variance, biased by the critic), 1 is Monte Carlo."""
    value_clip: float = 0.2
    """Clip range of the value loss around the values before the update (0 disables)."""
    whiten_advantages: bool = True
    """Normalise the token advantages to mean 0, std 1 over the batch's policy tokens."""
    epochs: int = 1
    """Passes of the critic over each rollout batch (mini/micro-batches as ``algo.minibatch_size``,
    ``algo.microbatch_size``)."""

    def __post_init__(self) -> None:
        check_range("critic.lr", self.lr, 0.0)
        check_range("critic.weight_decay", self.weight_decay, 0.0)
        check_range("critic.warmup_steps", self.warmup_steps, 0)
        check_range("critic.grad_clip", self.grad_clip, 0.0)
        check_range("critic.gamma", self.gamma, 0.0, 1.0)
        check_range("critic.lam", self.lam, 0.0, 1.0)
        check_range("critic.value_clip", self.value_clip, 0.0)
        check_range("critic.epochs", self.epochs, 1)

    def optim(self, master_weights: bool = False) -> OptimConfig:
        """The critic's AdamW settings (``master_weights``: the policy's ``optim.master_weights``)."""
        return OptimConfig(lr=self.lr, weight_decay=self.weight_decay, warmup_steps=self.warmup_steps,
                           grad_clip=self.grad_clip, master_weights=master_weights)


def load_value_model(path: str | Path, *, device, options: ModelLoadConfig | None = None) -> torch.nn.Module:
    """A causal-LM (or saved value-model) directory as a one-label token-classification model:
    the decoder's weights loaded, the score head fresh unless the directory has one."""
    p, kwargs = pretrained_kwargs(path, options)
    try:
        config = AutoConfig.from_pretrained(p, **{k: v for k, v in kwargs.items() if k != dtype_kwarg()})
        config.num_labels = 1
        config.classifier_dropout = 0.0
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # "score newly initialized" is the point here
        try:
            model = AutoModelForTokenClassification.from_pretrained(p, config=config, **kwargs)
        finally:
            transformers.logging.set_verbosity(verbosity)
    except Exception as e:  # an architecture without a token-classification class, bad weights
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise UserError(f"could not load a value model (AutoModelForTokenClassification) from '{p}' "
                        f"(config key critic.model): {first}") from e
    return model.to(device)


def require_policy_vocabulary(path: str, model: torch.nn.Module, policy_model: str, tokenizer,
                              options: ModelLoadConfig | None) -> None:
    """ConfigError naming ``critic.model`` unless the value model's directory has the policy's
    tokenizer vocabulary and an embedding row for each of its ids."""
    theirs = load_tokenizer(path, require_chat_template=False, options=options).get_vocab()
    ours = tokenizer.get_vocab()
    rows = model.get_input_embeddings().weight.shape[0]
    if theirs != ours or rows < len(tokenizer):
        raise ConfigError(f"config key 'critic.model': {path!r} ({len(theirs)} tokens, {rows} embedding rows) does "
                          f"not have the vocabulary of the policy {policy_model!r} ({len(ours)} tokens): the critic "
                          "reads the policy's token ids, so both need one tokenizer (or leave critic.model empty)")


def value_head(model: torch.nn.Module) -> torch.nn.Module:
    """The linear score head of a token-classification model (``score`` in the decoder families,
    ``classifier`` in the encoder ones)."""
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if not isinstance(head, torch.nn.Linear):
        raise UserError(f"value model {type(model).__name__} has no linear 'score' or 'classifier' head")
    return head


def value_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] float32 values aligned with the tokens: out[b, t] = head(hidden[b, t - 1]);
    position 0 and padded positions 0."""
    scores = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[..., 0].float()
    return F.pad(scores[:, :-1], (1, 0)) * attention_mask.to(torch.float32)


def value_decoder_and_head(model: torch.nn.Module):
    """(base decoder, score head) when the values are exactly ``score(decoder(...).last_hidden_state)``:
    a family of ``rlvr.train.packing.plain_head_family`` (transformers' token-classification class
    for them is the decoder, a dropout and ``score``) with the dropout at 0; else (None, None)."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = getattr(model, "score", None)
    dropout = getattr(model, "dropout", None)
    if plain_head_family(model) and isinstance(head, torch.nn.Linear) and base is not None \
            and (dropout is None or getattr(dropout, "p", 1.0) == 0):
        return base, head
    return None, None


def packed_values(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  want: torch.Tensor | None = None, *, packing: bool = True,
                  share_prompts: bool = False) -> torch.Tensor:
    """``value_forward``'s values at the positions where ``want`` is nonzero (default: every real
    token but the first), 0.0 elsewhere, from the padding-free forward of ``packed_hidden`` (the
    score head on those positions only). ``packing`` False: the padded rows with the causal mask
    only; ``share_prompts``: a group's shared prompt once (both as for ``packed_logprobs``). A
    model ``value_decoder_and_head`` cannot split runs ``value_forward``, masked to ``want``.
    input_ids, attention_mask, want: [B, T], right-padded -> [B, T] float32."""
    base, head = value_decoder_and_head(model)
    if base is None:
        values = value_forward(model, input_ids, attention_mask)
        return values if want is None else torch.where(want.bool(), values, torch.zeros_like(values))
    hidden, b_idx, t_idx = packed_hidden(model, input_ids, attention_mask, want, decoder=base,
                                         packing=None if packing else False, share_prompts=share_prompts)
    return scatter_wanted(head(hidden)[:, 0].float(), b_idx, t_idx, input_ids.shape)


def _rows(rows: torch.Tensor, attention_mask: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` [B, T] at ``rows``, trimmed to the longest of those rows."""
    width = max(1, int(attention_mask[rows].sum(dim=1).max()))
    return [t[rows, :width] for t in tensors]


class Critic:
    """The value model with its AdamW and schedule; ``values`` before the advantages, ``update``
    after them, ``save``/``load`` with the policy's checkpoints."""

    def __init__(self, model: torch.nn.Module, cfg: CriticConfig, total_steps: int, precision: str = "model",
                 master_weights: bool = False, packing: bool = True, share_prompts: bool = True) -> None:
        self.model, self.cfg, self.precision = model, cfg, precision
        self.packing, self.share_prompts = packing, share_prompts  # the policy's algo.packing, algo.share_prompts
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim(master_weights), total_steps)

    @classmethod
    def build(cls, cfg: CriticConfig, policy_model: str, *, device, total_steps: int,
              options: ModelLoadConfig | None = None, precision: str = "model", master_weights: bool = False,
              tokenizer=None, packing: bool = True, share_prompts: bool = True) -> Critic:
        """A fresh critic from ``cfg.model`` (or ``policy_model`` when that is empty). Given the
        policy's ``tokenizer``, a ``cfg.model`` of another vocabulary is refused (the critic reads
        the policy's token ids)."""
        model = load_value_model(cfg.model or policy_model, device=device, options=options)
        if cfg.model and tokenizer is not None:
            require_policy_vocabulary(cfg.model, model, policy_model, tokenizer, options)
        with torch.no_grad():
            for p in value_head(model).parameters():
                p.zero_()
        return cls(model, cfg, total_steps, precision, master_weights, packing, share_prompts)

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 want: torch.Tensor | None) -> torch.Tensor:
        with precision_autocast(self.model, self.precision):
            return packed_values(self.model, input_ids, attention_mask, want, packing=self.packing,
                                 share_prompts=self.share_prompts)

    @torch.no_grad()
    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, microbatch_size: int,
               loss_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T] values of the batch's states, in eval mode, ``microbatch_size`` rows at a time: at
        the policy tokens (``loss_mask``; None: every real token but the first), 0 elsewhere."""
        self.model.eval()
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        want = attention_mask if loss_mask is None else loss_mask
        for rows in torch.arange(input_ids.shape[0], device=input_ids.device).split(microbatch_size):
            ids, mask, w = _rows(rows, attention_mask, input_ids, attention_mask, want)
            out[rows, : ids.shape[1]] = self._forward(ids, mask, None if loss_mask is None else w)
        return out

    def update(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
               returns: torch.Tensor, old_values: torch.Tensor, generator: torch.Generator, *,
               minibatch_size: int, microbatch_size: int, group: Group | None = None,
               bucket_mb: float = 64.0) -> dict[str, float]:
        """``cfg.epochs`` passes of the clipped value loss towards ``returns`` (all [B, T]; values
        clipped around ``old_values``, the values the advantages were computed from), one
        optimizer step per mini-batch (0: the whole batch), micro-batched. Metrics under
        ``critic/``: value_loss, value_clip_frac, grad_norm (means over optimizer steps), lr, and
        of the batch before the update: value_mean, returns_mean, explained_variance (left out
        when the returns do not vary).

        Data parallel: ``group`` (default: the open process group, world 1 without) and
        ``bucket_mb`` (``distributed.bucket_mb``) as in the policy's update (module docstring); the
        same micro-batches, steps and metrics at every world size."""
        n = input_ids.shape[0]
        mb = minibatch_size or n
        group = group or (Group(dist.get_rank(), dist.get_world_size()) if active() else Group())
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        sums: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.cfg.epochs):
            order = torch.randperm(n, generator=generator).to(input_ids.device)
            for start in range(0, n, mb):
                mini = order[start: start + mb]
                num_tokens = float((loss_mask[mini] > 0).sum())
                micros = mini.split(microbatch_size)
                mine = []  # (value_loss, value_clip_frac weighted by its token share) of this rank's micro-batches
                for u in range(group.rank, len(micros), group.world):
                    ids, mask, lm, ret, old = _rows(micros[u], attention_mask, input_ids, attention_mask, loss_mask,
                                                    returns, old_values)
                    loss, metrics = value_loss(self._forward(ids, mask, lm), old, ret, lm, clip=self.cfg.value_clip,
                                               num_tokens=max(num_tokens, 1.0))
                    loss.backward()
                    share = float((lm > 0).sum()) / max(num_tokens, 1.0)
                    mine.append((float(loss.detach()), metrics["value_clip_frac"] * share))
                all_reduce_grads(params, bucket_mb)
                per_rank = gather(mine)
                step = defaultdict(float)
                for u in range(len(micros)):  # in micro-batch order: the same sums at every world size
                    loss_u, clip_u = per_rank[u % group.world][u // group.world]
                    step["value_loss"] += loss_u
                    step["value_clip_frac"] += clip_u
                for k, v in step.items():
                    sums[k].append(v)
                sums["grad_norm"].append(clip_and_step(self.model, self.optimizer, self.scheduler, self.cfg.grad_clip))
        on = loss_mask > 0
        out = {f"critic/{k}": sum(v) / len(v) for k, v in sums.items()}
        out["critic/lr"] = self.scheduler.get_last_lr()[0]
        out["critic/value_mean"] = float(old_values[on].mean()) if on.any() else 0.0
        out["critic/returns_mean"] = float(returns[on].mean()) if on.any() else 0.0
        ev = explained_variance(old_values, returns, loss_mask)
        if math.isfinite(ev):  # undefined when the returns do not vary: left out, not logged as nan
            out["critic/explained_variance"] = ev
        return out

    def save(self, directory: str | Path) -> None:
        """The value model as a Hugging Face directory plus ``critic_state.pt`` (optimizer, schedule)."""
        directory = Path(directory)
        self.model.save_pretrained(directory, safe_serialization=True)
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                   directory / CRITIC_STATE)

    @classmethod
    def load(cls, directory: str | Path, cfg: CriticConfig, *, device, total_steps: int,
             options: ModelLoadConfig | None = None, precision: str = "model",
             master_weights: bool = False, packing: bool = True, share_prompts: bool = True) -> Critic:
        """A critic as ``save`` wrote it: the value model, its optimizer and schedule state."""
        critic = cls(load_value_model(directory, device=device, options=options), cfg, total_steps, precision,
                     master_weights, packing, share_prompts)
        state = torch.load(Path(directory) / CRITIC_STATE, map_location="cpu", weights_only=False)
        critic.optimizer.load_state_dict(state["optimizer"])
        critic.scheduler.load_state_dict(state["scheduler"])
        return critic
