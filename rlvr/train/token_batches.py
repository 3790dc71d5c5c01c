"""Micro-batches by a token budget, balanced across data-parallel ranks (``algo.microbatch_tokens``).

A micro-batch counted in samples holds as many tokens as its longest samples happen to have: with
long and short sequences mixed, one micro-batch of 8 may hold 8 x 30k tokens and the next 8 x 500.
Memory follows tokens, so long-context training packs micro-batches by tokens instead:

- ``token_microbatches(lengths, budget, world)``: the rows of a mini-batch grouped into
  micro-batches of at most ``budget`` tokens (a row longer than the budget alone: it cannot be
  split here; sequence parallelism splits it, ``rlvr.train.sequence_parallel``). Their number is
  the smallest multiple of ``world`` for which longest-first greedy packing (each row, longest
  first, into the micro-batch with the fewest tokens) fits the budget, so every data-parallel rank
  runs the same number of them; then they are dealt to the ranks longest-first, each to the rank
  with the fewest tokens so far among those still short of their share, so the ranks' token totals
  are as even as that greedy makes them. The returned order is the one ``update.py`` runs: rank r
  takes micro-batches r, r + world, r + 2 world, ...
- ``rank_tokens(micro, lengths, world)``: each rank's total tokens (for tests and metrics).

The gradient does not depend on the grouping: every micro-batch's loss is normalised by the
mini-batch's global totals and the gradients are summed (``update.minibatch_backward``).
The token count of a row is its real tokens (prompt + completion, padding excluded): what the
packed training forward (``algo.packing``) computes on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def token_microbatches(lengths: Sequence[int], budget: int, world: int = 1) -> list[list[int]]:
    """Row indices grouped into micro-batches of at most ``budget`` tokens each (a row longer than
    ``budget`` alone), as many as the smallest multiple of ``world`` that fits (capped at the
    number of rows), ordered so micro-batch u runs on rank u % world (see the module docstring)."""
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    rows = len(lengths)
    if rows == 0:
        return []
    order = sorted(range(rows), key=lambda i: (-lengths[i], i))
    oversized = sum(1 for n in lengths if n > budget)
    m = max(math.ceil(sum(lengths) / budget), oversized, 1)
    m = min(rows, world * math.ceil(m / world))
    while True:
        bins = _longest_first(order, lengths, m)
        if m >= rows or all(len(b) == 1 or sum(lengths[i] for i in b) <= budget for b in bins):
            break
        m = min(rows, m + world)
    return _deal(bins, lengths, world)


def rank_tokens(micro: list[list[int]], lengths: Sequence[int], world: int) -> list[int]:
    """Total tokens each rank runs when micro-batch u goes to rank u % world."""
    totals = [0] * world
    for u, rows in enumerate(micro):
        totals[u % world] += sum(lengths[i] for i in rows)
    return totals


def _longest_first(order: list[int], lengths: Sequence[int], m: int) -> list[list[int]]:
    """Rows (longest first) each into the bin with the fewest tokens; each bin's rows ascending."""
    heap = [(0, b) for b in range(m)]
    bins: list[list[int]] = [[] for _ in range(m)]
    for i in order:
        tokens, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (tokens + lengths[i], b))
    return [sorted(b) for b in bins if b]


def _deal(bins: list[list[int]], lengths: Sequence[int], world: int) -> list[list[int]]:
    """Bins dealt to ranks (largest first, to the rank with the fewest tokens that still lacks
    bins; every rank gets ``ceil`` or ``floor`` of len(bins) / world), in run order."""
    share = math.ceil(len(bins) / world)
    per_rank: list[list[list[int]]] = [[] for _ in range(world)]
    totals = [0] * world
    for b in sorted(bins, key=lambda b: (-sum(lengths[i] for i in b), b[0])):
        r = min((r for r in range(world) if len(per_rank[r]) < share), key=lambda r: (totals[r], r))
        per_rank[r].append(b)
        totals[r] += sum(lengths[i] for i in b)
    per_rank.sort(key=len, reverse=True)  # ranks are interchangeable: the fuller ones first
    out = []
    for k in range(share):
        out += [per_rank[r][k] for r in range(world) if k < len(per_rank[r])]
    return out
