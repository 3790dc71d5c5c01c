"""The update's memory settings from the sequence lengths and a budget (``algo.memory_budget_mb``).

``estimate_bytes`` counts what one training step holds at its peak beyond the weights, for a
Llama-layout decoder computing in float32:

- fixed: the gradients, 4 bytes per trainable parameter (AdamW's two moments come at the
  optimizer step, once the activations are freed: the peak is the larger of the two moments);
- activations: what autograd keeps per token and layer (``ACT_PER_HIDDEN`` x hidden +
  ``ACT_PER_INTER`` x intermediate + ``ACT_PER_KV`` x the key/value width, 4 bytes each: the norms'
  inputs and outputs, q/k/v, the attention output and its log-sum-exp, the MLP's gate, up and
  product). With activation checkpointing a layer keeps only its input (hidden per token), and
  the backward recomputes one layer at a time (half a layer's activations at its peak, measured);
- logits: the LM head runs on policy tokens only; its [tokens, vocabulary] float32 logits, their
  log-softmax, their gradient and a temporary are alive together (``LOGIT_COPIES``), for all
  policy tokens at once or for ``logits_chunk`` of them.

The constants were fitted on ``benchmarks/long_context.py``'s measurements (docs/long_context.md
gives the table; the estimate is within the stated error there).

``plan(config, lengths, budget_bytes)`` picks, in this order, the cheapest settings whose estimate
for the longest sequence fits the budget: nothing; chunked logits (``CHUNK`` tokens); chunked
logits and activation checkpointing. Then the micro-batch token budget: as many tokens as fit with
those settings (never fewer than the longest sequence: a sequence is not split here). When even
one sequence does not fit with both, the plan says so (``fits`` False): the sequence needs sequence
parallelism or a larger budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ACT_PER_HIDDEN = 16
ACT_PER_INTER = 4
ACT_PER_KV = 4
FLOAT = 4
CHUNK = 1024
LOGIT_COPIES = 4


@dataclass(frozen=True)
class MemoryPlan:
    microbatch_tokens: int
    logits_chunk: int
    gradient_checkpointing: bool
    estimate_bytes: int
    """The estimate for a micro-batch of ``microbatch_tokens`` tokens with these settings."""
    fits: bool
    """Whether the longest sequence fits the budget with these settings."""


def _dims(config) -> tuple[int, int, int, int, int]:
    h = config.hidden_size
    heads = config.num_attention_heads
    hd = getattr(config, "head_dim", None) or h // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * hd
    return h, config.intermediate_size, kv, config.num_hidden_layers, config.vocab_size


def activation_bytes_per_token(config, checkpointing: bool) -> float:
    """Activation bytes one token costs across the decoder (see the module docstring)."""
    h, inter, kv, layers, _ = _dims(config)
    layer = (ACT_PER_HIDDEN * h + ACT_PER_INTER * inter + ACT_PER_KV * kv) * FLOAT
    if checkpointing:
        return layers * h * FLOAT + layer // 2  # the layers' inputs + a recomputed layer, freed as its backward runs
    return layers * layer


def estimate_bytes(config, tokens: int, policy_tokens: int, logits_chunk: int = 0, checkpointing: bool = False,
                   trainable_params: int | None = None) -> dict:
    """Peak bytes of one forward + backward + optimizer step on ``tokens`` tokens of which
    ``policy_tokens`` are trained on: {"fixed", "activations", "logits", "total"}."""
    h, _, _, _, vocab = _dims(config)
    if trainable_params is None:
        trainable_params = _params(config)
    grads = FLOAT * trainable_params
    activations = int(activation_bytes_per_token(config, checkpointing) * tokens)
    head_tokens = min(policy_tokens, logits_chunk) if logits_chunk else policy_tokens
    logits = LOGIT_COPIES * FLOAT * head_tokens * vocab + FLOAT * policy_tokens * h
    # the backward's peak (gradients, activations, logits) or the optimizer step's (gradients and
    # AdamW's two moments: the activations are gone by then)
    total = max(grads + activations + logits, 3 * grads)
    return {"fixed": grads, "activations": activations, "logits": logits, "total": total}


def _params(config) -> int:
    h, inter, kv, layers, vocab = _dims(config)
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * inter + 2 * h
    head = 0 if getattr(config, "tie_word_embeddings", False) else vocab * h
    return layers * per_layer + vocab * h + head + h


def plan(config, lengths: Sequence[int], budget_bytes: int, policy_share: float = 1.0,
         trainable_params: int | None = None) -> MemoryPlan:
    """Settings for micro-batches of these sequences under ``budget_bytes`` (see the module
    docstring). ``policy_share``: the share of a sequence's tokens trained on (1.0: all, the
    safe bound)."""
    longest = max(lengths)
    total = sum(lengths)
    options = ((0, False), (CHUNK, False), (CHUNK, True))
    for chunk, ckpt in options:
        est = estimate_bytes(config, longest, int(longest * policy_share), chunk, ckpt, trainable_params)
        if est["total"] <= budget_bytes or (chunk, ckpt) == options[-1]:
            break
    fits = est["total"] <= budget_bytes
    tokens = longest
    if fits:  # grow the micro-batch while the estimate fits (whole budget, all sequences at most)
        lo, hi = longest, max(longest, total)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            e = estimate_bytes(config, mid, int(mid * policy_share), chunk, ckpt, trainable_params)
            lo, hi = (mid, hi) if e["total"] <= budget_bytes else (lo, mid - 1)
        tokens = lo
    est = estimate_bytes(config, tokens, int(tokens * policy_share), chunk, ckpt, trainable_params)
    return MemoryPlan(tokens, chunk, ckpt, est["total"], fits)
