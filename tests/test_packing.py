"""Packed training forward == plain right-padded forward: log-probs, loss and gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr.algos.losses import POLICY_LOSSES
from rlvr.model.logprobs import sequence_logprobs
from rlvr.train.batching import collate
from rlvr.train.packing import first_fit_decreasing, pack, packed_logprobs, padding_stats, shared_prompts
from rlvr.types import Trajectory

LENGTHS = [(5, 9), (3, 1), (7, 12), (1, 1), (4, 6), (6, 3), (2, 11), (8, 2)]  # (prompt, completion)


def _model(seed: int = 0, gqa: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2 if gqa else 4, max_position_embeddings=64,
                      initializer_range=0.3, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).float()


def _trajectories(seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (p, c) in enumerate(LENGTHS):
        ids = torch.randint(3, 61, (p + c,), generator=g).tolist()
        old = (torch.randn(c, generator=g) * 0.3 - 3.0).tolist()
        out.append(Trajectory(task_id=f"t{i}", group_id=i // 4, messages=(), completion="", token_ids=tuple(ids),
                              loss_mask=(0,) * p + (1,) * c, logprobs=(0.0,) * p + tuple(old),
                              finish_reason="length"))
    return out


@pytest.fixture()
def batch():
    advantages = [1.0, -0.5, 0.25, -1.0, 0.75, -0.25, 0.5, -0.75]
    return collate(_trajectories(), advantages, pad_token_id=0)


def test_first_fit_decreasing_fills_rows_within_width():
    lengths = [7, 3, 5, 2, 2, 6, 1]
    bins = first_fit_decreasing(lengths, 8)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 8 for b in bins)
    assert len(bins) == 4  # 26 tokens need at least 4 rows of 8


def test_pack_places_every_token_once_with_restarting_positions(batch):
    packed = pack(batch.input_ids, batch.attention_mask, width=24)
    real = batch.attention_mask.bool()
    slots = packed.slot[real]
    assert slots.unique().numel() == slots.numel() == int(real.sum())
    assert (packed.slot[~real] == -1).all()
    flat_ids, flat_pos = packed.input_ids.reshape(-1), packed.position_ids.reshape(-1)
    assert torch.equal(flat_ids[slots], batch.input_ids[real])
    b, t = real.nonzero(as_tuple=True)
    assert torch.equal(flat_pos[packed.slot[b, t]], t)
    assert packed.input_ids.shape[0] < batch.input_ids.shape[0]  # fewer rows than sequences
    stats = padding_stats(batch.attention_mask, width=24)
    assert stats["real_tokens"] <= stats["packed_slots"] < stats["padded_slots"]


def test_mask_is_block_diagonal_causal(batch):
    packed = pack(batch.input_ids, batch.attention_mask, width=24)
    mask = packed.attention_mask(torch.float32)[:, 0]
    seg = packed.segment
    W = seg.shape[1]
    allowed = mask == 0
    for r in range(seg.shape[0]):
        for q in range(W):
            for k in range(W):
                assert bool(allowed[r, q, k]) == (k <= q and bool(seg[r, q] == seg[r, k]))


@pytest.mark.parametrize("packing,width", [(True, None), (True, 24), (True, 64), (False, None), (None, None)])
@pytest.mark.parametrize("gqa", [True, False])
def test_packed_logprobs_match_the_padded_forward(batch, packing, width, gqa):
    model = _model(gqa=gqa)
    with torch.no_grad():
        plain = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
        everywhere = packed_logprobs(model, batch.input_ids, batch.attention_mask, width=width, packing=packing)
        on_mask = packed_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, width=width,
                                  packing=packing)
    assert plain.abs().max() > 1.0  # a model with sharp logits, so the comparison means something
    torch.testing.assert_close(everywhere, plain, atol=1e-5, rtol=0)
    m = batch.loss_mask.bool()
    torch.testing.assert_close(on_mask[m], plain[m], atol=1e-5, rtol=0)
    assert (on_mask[~m] == 0).all()


@pytest.mark.parametrize("packing", [True, False])
def test_fallback_without_a_plain_head_gives_the_same_logprobs(batch, monkeypatch, packing):
    import rlvr.train.packing as packing_module

    model = _model()
    with torch.no_grad():
        fast = packed_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, packing=packing)
        monkeypatch.setattr(packing_module, "_PLAIN_HEAD", set())
        full = packed_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, packing=packing)
    torch.testing.assert_close(fast, full, atol=1e-6, rtol=0)


def test_without_sequence_attention_auto_packs_rows_only_when_it_saves_enough_slots(batch, monkeypatch):
    import rlvr.train.packing as packing_module

    monkeypatch.setattr(packing_module.sequence_attention, "supported", lambda model, longest: False)
    calls = []
    real_pack, real_rows = packing_module.pack, packing_module.causal_rows
    monkeypatch.setattr(packing_module, "pack", lambda *a, **k: calls.append("pack") or real_pack(*a, **k))
    monkeypatch.setattr(packing_module, "causal_rows", lambda *a, **k: calls.append("rows") or real_rows(*a, **k))
    model = _model()
    with torch.no_grad():
        packed_logprobs(model, batch.input_ids, batch.attention_mask)  # lengths 2..19: packing saves a lot
        same = torch.ones_like(batch.attention_mask)
        packed_logprobs(model, batch.input_ids, same)  # all the same length: nothing to save
    assert calls == ["pack", "rows"]


def _loss_and_grads(model, batch, packed: bool | None, aggregation: str, width: int | None = None):
    model.zero_grad(set_to_none=True)
    if packed is not None:
        lp = packed_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, packing=packed,
                             width=width)
    else:
        lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(lp, batch.old_logprobs, batch.advantages, batch.loss_mask,
                                                  aggregation=aggregation, max_tokens=12)
    loss.backward()
    return loss.detach(), metrics, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_loss_and_gradients_match_the_padded_forward(batch, aggregation):
    model = _model()
    loss_a, met_a, grads_a = _loss_and_grads(model, batch, None, aggregation)  # sequence_logprobs
    for mode, width in ((True, None), (True, 24), (False, None)):  # flat, rows of 24, padded
        loss_b, met_b, grads_b = _loss_and_grads(model, batch, mode, aggregation, width)
        torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-5)
        for k in met_a:
            assert met_b[k] == pytest.approx(met_a[k], abs=1e-5), k
        for name, g in grads_a.items():
            assert g.abs().sum() > 0, name
            torch.testing.assert_close(grads_b[name], g, atol=1e-6, rtol=1e-4, msg=name)


def test_micro_loss_is_the_same_with_and_without_packing(batch):
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.update import micro_loss

    model = _model()
    totals = {"num_tokens": float(batch.loss_mask.sum()), "num_seqs": 8.0, "max_tokens": 12}
    batch = dataclasses.replace(batch, ref_logprobs=sequence_logprobs(_model(seed=1), batch.input_ids,
                                                                       batch.attention_mask).detach())
    out = {}
    for packing in (False, True):
        model.zero_grad(set_to_none=True)
        loss, metrics = micro_loss(model, batch, AlgoConfig(packing=packing, kl_coef=0.1), totals)
        loss.backward()
        out[packing] = loss.detach(), metrics, [p.grad.clone() for p in model.parameters()]
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-6, rtol=1e-5)
    assert out[True][1]["kl"] == pytest.approx(out[False][1]["kl"], abs=1e-5)
    for a, b in zip(out[True][2], out[False][2]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


# Two GRPO groups: 4 samples of one 6-token prompt, 3 of a 9-token prompt, one sequence alone.
GROUPS = [(6, [4, 9, 1, 7]), (9, [3, 12, 5]), (4, [8])]


@pytest.fixture()
def grouped():
    g = torch.Generator().manual_seed(3)
    trajectories = []
    for gid, (p, completions) in enumerate(GROUPS):
        prompt = torch.randint(3, 61, (p,), generator=g).tolist()
        for c in completions:
            ids = prompt + torch.randint(3, 61, (c,), generator=g).tolist()
            trajectories.append(Trajectory(
                task_id=f"t{gid}", group_id=gid, messages=(), completion="", token_ids=tuple(ids),
                loss_mask=(0,) * p + (1,) * c, logprobs=(0.0,) * p + tuple((torch.randn(c, generator=g) * 0.3 - 3).tolist()),
                finish_reason="length"))
    return collate(trajectories, [1.0, -0.5, 0.25, -1.0, 0.75, -0.25, 0.5, -0.75], pad_token_id=0)


def test_shared_prompts_finds_the_groups(grouped):
    groups = shared_prompts(grouped.input_ids, grouped.attention_mask, grouped.loss_mask)
    assert sorted((p, sorted(m)) for p, m in groups) == [(6, [0, 1, 2, 3]), (9, [4, 5, 6])]
    other = grouped.input_ids.clone()
    other[1, 2] = 60 if int(other[1, 2]) != 60 else 59  # one sample's prompt differs: it leaves the group
    groups = shared_prompts(other, grouped.attention_mask, grouped.loss_mask)
    assert sorted((p, sorted(m)) for p, m in groups) == [(6, [0, 2, 3]), (9, [4, 5, 6])]


@pytest.mark.parametrize("width", [None, 16, 30])
def test_shared_prompt_layout_stores_each_prompt_once_per_unit(grouped, width):
    groups = shared_prompts(grouped.input_ids, grouped.attention_mask, grouped.loss_mask)
    packed = pack(grouped.input_ids, grouped.attention_mask, width=width, groups=groups)
    real = grouped.attention_mask.bool()
    flat_ids, flat_pos = packed.input_ids.reshape(-1), packed.position_ids.reshape(-1)
    b, t = real.nonzero(as_tuple=True)
    assert torch.equal(flat_ids[packed.slot[b, t]], grouped.input_ids[b, t])
    assert torch.equal(flat_pos[packed.slot[b, t]], t)
    # the prompt tokens of a group's samples share slots; completion tokens never do
    used = packed.slot[real]
    completion = packed.slot[grouped.loss_mask.bool()]
    assert completion.unique().numel() == completion.numel()
    assert used.unique().numel() < used.numel()
    # every token sees exactly its own sequence's earlier tokens
    allowed = (packed.attention_mask(torch.float32)[:, 0] == 0).reshape(-1, packed.input_ids.numel() // packed.input_ids.shape[0])
    W = packed.input_ids.shape[1]
    for i in range(real.shape[0]):
        n = int(real[i].sum())
        slots = packed.slot[i, :n]
        for q in range(n):
            row, col = divmod(int(slots[q]), W)
            seen = {row * W + c for c in range(W) if allowed[row * W + col, c]}
            assert seen == {int(s) for s in slots[: q + 1]}, (i, q)


@pytest.mark.parametrize("width", [None, 16, 64])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_shared_prompts_give_the_padded_forward_logprobs_loss_and_gradients(grouped, width, aggregation):
    model = _model()
    loss_a, met_a, grads_a = _loss_and_grads(model, grouped, None, aggregation)
    model.zero_grad(set_to_none=True)
    lp = packed_logprobs(model, grouped.input_ids, grouped.attention_mask, grouped.loss_mask, width=width,
                         packing=True, share_prompts=True)
    plain = sequence_logprobs(model, grouped.input_ids, grouped.attention_mask).detach()
    m = grouped.loss_mask.bool()
    torch.testing.assert_close(lp[m].detach(), plain[m], atol=1e-5, rtol=0)
    loss_b, met_b = POLICY_LOSSES.get("ppo_clip")(lp, grouped.old_logprobs, grouped.advantages, grouped.loss_mask,
                                                  aggregation=aggregation, max_tokens=12)
    loss_b.backward()
    torch.testing.assert_close(loss_b.detach(), loss_a, atol=1e-6, rtol=1e-5)
    for name, p in model.named_parameters():
        assert grads_a[name].abs().sum() > 0, name
        torch.testing.assert_close(p.grad, grads_a[name], atol=1e-6, rtol=1e-4, msg=name)


def test_shared_prompts_save_slots(grouped):
    groups = shared_prompts(grouped.input_ids, grouped.attention_mask, grouped.loss_mask)
    alone = padding_stats(grouped.attention_mask, 30)
    shared = padding_stats(grouped.attention_mask, 30, groups)
    assert shared["packed_slots"] < alone["packed_slots"]


def test_shared_width_picks_the_cheapest_layout():
    """The row width for shared prompts is the candidate whose layout costs least (slots, each
    weighted by its dense-mask attention): a 16-token prompt with 8 samples of 31 more tokens packs
    as two rows of at least 140 tokens per group, not in 196-wide rows (5 samples + 3 left over);
    a wider model (attention cheaper relative to the matmuls) never picks a narrower row."""
    from rlvr.train.packing import ATTENTION_PER_COLUMN, layout_units, shared_width

    lengths, groups = [], []
    for g in range(8):
        groups.append((16, list(range(len(lengths), len(lengths) + 8))))
        lengths += [47] * 8

    def cost(w: int, hidden: int) -> float:
        rows = first_fit_decreasing([p + sum(lengths[i] - p for i in m) for p, m in layout_units(lengths, groups, w)], w)
        return len(rows) * w * (1 + ATTENTION_PER_COLUMN * w / hidden)

    w = shared_width(lengths, groups, 256)
    assert 140 <= w < 196
    assert cost(w, 256) < cost(196, 256) and cost(w, 256) < cost(47, 256)
    # candidates are 8 tokens apart: within 8 columns per row of the best width anywhere in range
    assert cost(w, 256) <= min(cost(c, 256) for c in range(47, 189)) * (1 + 8 / 140)
    assert shared_width(lengths, groups, 4096) >= w
    assert shared_width([9], None, 256) == 9  # never narrower than the longest sequence


def test_packed_gradients_are_bitwise_reproducible_on_two_threads():
    """A shared prompt's last slot predicts every sample's first token, so the gather of the
    head's inputs repeats indices; its backward must sum the repeats in a fixed order (two-thread
    GRPO runs used to drift apart in the last bits from the first step)."""
    import hashlib

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      tie_word_embeddings=True, pad_token_id=0, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(1)
    trajectories = []
    for gid in range(8):  # 8 GRPO groups of 8 samples sharing a 10-token prompt
        prompt = torch.randint(3, 61, (10,), generator=g).tolist()
        for _ in range(8):
            c = int(torch.randint(20, 31, (1,), generator=g))
            trajectories.append(Trajectory(
                task_id=f"t{gid}", group_id=gid, messages=(), completion="",
                token_ids=tuple(prompt + torch.randint(3, 61, (c,), generator=g).tolist()),
                loss_mask=(0,) * 10 + (1,) * c, logprobs=(0.0,) * (10 + c), finish_reason="length"))
    order = torch.randperm(64, generator=g).tolist()  # shuffled, as the update's mini-batches are
    batch = collate([trajectories[i] for i in order], [0.0] * 64, pad_token_id=0)
    weights = torch.randn(batch.input_ids.shape, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = set()
        for _ in range(8):
            model.zero_grad(set_to_none=True)
            lp = packed_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, share_prompts=True)
            (lp * weights).sum().backward()
            seen.add(hashlib.md5(b"".join(p.grad.numpy().tobytes() for p in model.parameters())).hexdigest())
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 1


# --------------------------------------------------------------------------- flat layout

def _has_attention_interface() -> bool:
    from rlvr.train import sequence_attention

    return sequence_attention._register()


# transformers before the attention and mask interfaces (< 4.53): the row layout only
needs_sequence_attention = pytest.mark.skipif(not _has_attention_interface(),
                                              reason="this transformers has no attention mask interface")


def test_flat_layout_holds_every_token_once_and_each_shared_prompt_once(grouped):
    from rlvr.train.packing import flat

    groups = shared_prompts(grouped.input_ids, grouped.attention_mask, grouped.loss_mask)
    packed = flat(grouped.input_ids, grouped.attention_mask, groups=groups)
    real = grouped.attention_mask.bool()
    prompts_saved = sum(p * (len(m) - 1) for p, m in groups)
    assert packed.input_ids.shape == (1, int(real.sum()) - prompts_saved)  # no padding, prompts once
    assert (packed.segment >= 0).all()
    b, t = real.nonzero(as_tuple=True)
    assert torch.equal(packed.input_ids.reshape(-1)[packed.slot[b, t]], grouped.input_ids[b, t])
    assert torch.equal(packed.position_ids.reshape(-1)[packed.slot[b, t]], t)


def test_sequence_indices_run_each_prompt_query_once_and_mask_to_each_sequence(grouped):
    """With shared prompts, a sequence's attention row holds the queries after its prompt and
    each group has one row for the prompt's queries: every slot is queried exactly once, and the
    mask lets each query see exactly the earlier tokens of its own sequence."""
    from rlvr.train import sequence_attention as sa
    from rlvr.train.packing import flat

    groups = shared_prompts(grouped.input_ids, grouped.attention_mask, grouped.loss_mask)
    real = grouped.attention_mask.bool()
    packed = flat(grouped.input_ids, grouped.attention_mask, groups=groups)
    ix = sa.indices(packed.slot, real)
    B, T = real.shape
    lengths = real.sum(1)
    completions = [int(lengths[b]) - next((p for p, m in groups if b in m), 0) for b in range(B)]
    rows, Q = ix["rlvr_queries"].shape
    assert rows == B + len(groups) and Q == max(completions + [p for p, _ in groups]) < T
    n = packed.input_ids.shape[1]
    queried = ix["rlvr_queries"].reshape(-1)[ix["rlvr_owner"]]
    assert torch.equal(queried, torch.arange(n))  # each slot's owner position queries that slot
    mask, keys = ix["rlvr_mask"][:, 0], ix["rlvr_keys"]
    for b in range(B):
        for t in range(int(lengths[b])):  # the query at (b, t) sees its own sequence's slots 0..t
            r, i = divmod(int(ix["rlvr_owner"][packed.slot[b, t]]), Q)
            assert sorted(keys[r][mask[r, i]].tolist()) == sorted(packed.slot[b, : t + 1].tolist())
    plain = sa.indices(flat(grouped.input_ids, grouped.attention_mask).slot, real)  # nothing shared
    assert "rlvr_mask" not in plain and plain["rlvr_queries"].shape == (B, T)
    assert torch.equal(plain["rlvr_queries"], plain["rlvr_keys"]) and plain["rlvr_key_shared"].numel() == 0


def test_sequence_gathers_backward_equals_the_scatter_add_of_index_select(grouped):
    """The gathers' backward (gathers only, no scatter-add) sums a shared prompt's key gradient
    over every row that reads it, and the output gather's backward puts each slot's gradient at its
    owner, as ``index_select``'s own backward (``index_add``) does."""
    from rlvr.train import sequence_attention as sa
    from rlvr.train.packing import flat

    groups = shared_prompts(grouped.input_ids, grouped.attention_mask, grouped.loss_mask)
    real = grouped.attention_mask.bool()
    ix = sa.indices(flat(grouped.input_ids, grouped.attention_mask, groups=groups).slot, real)
    keys, owner = ix["rlvr_keys"].reshape(-1), ix["rlvr_owner"]
    n = len(owner)
    assert ix["rlvr_key_more"].shape == (max(len(m) for _, m in groups), sum(p for p, _ in groups))
    seen = ix["rlvr_mask"].any(dim=2).reshape(-1)  # the keys some query sees: the others get no gradient
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, 3, generator=g, requires_grad=True)
    up = torch.randn(keys.numel(), 2, 3, generator=g) * seen.reshape(-1, 1, 1)
    want = torch.autograd.grad((x.index_select(0, keys) * up).sum(), x)[0]
    out = sa._ReadSlots.apply(x, keys, ix["rlvr_key_first"], ix["rlvr_key_more"], ix["rlvr_key_shared"])
    assert torch.equal(out, x.index_select(0, keys))
    torch.testing.assert_close(torch.autograd.grad((out * up).sum(), x)[0], want, atol=1e-6, rtol=0)
    shared = ix["rlvr_key_shared"]
    assert torch.equal(shared, (torch.bincount(keys[seen], minlength=n) > 1).nonzero().flatten())
    assert not torch.equal(want[shared], up[ix["rlvr_key_first"]][shared])  # the other readers' gradients count

    y = torch.randn(ix["rlvr_queries"].numel(), 2, 3, generator=g, requires_grad=True)
    down = torch.randn(n, 2, 3, generator=g)
    want = torch.autograd.grad((y.index_select(0, owner) * down).sum(), y)[0]
    out = sa._TakeOwners.apply(y, owner)
    assert torch.equal(out, y.index_select(0, owner))
    assert torch.equal(torch.autograd.grad((out * down).sum(), y)[0], want)


@needs_sequence_attention
def test_packed_forward_runs_attention_per_sequence_and_restores_the_model(grouped):
    from transformers import AttentionInterface

    from rlvr.train import sequence_attention as sa

    calls = []
    real_attention = sa.sequence_attention

    def spy(module, q, k, v, mask, **kwargs):
        calls.append((tuple(q.shape), mask, tuple(kwargs["rlvr_keys"].shape)))
        return real_attention(module, q, k, v, mask, **kwargs)

    AttentionInterface.register(sa.ATTENTION, spy)
    model = _model()
    try:
        with torch.no_grad():
            packed_logprobs(model, grouped.input_ids, grouped.attention_mask, grouped.loss_mask, share_prompts=True)
    finally:
        AttentionInterface.register(sa.ATTENTION, real_attention)
    assert len(calls) == model.config.num_hidden_layers
    (q_shape, mask, gather_shape), = set(calls)
    B, T = grouped.input_ids.shape
    groups = shared_prompts(grouped.input_ids, grouped.attention_mask, grouped.loss_mask)
    assert q_shape[0] == 1 and mask is None and gather_shape == (B + len(groups), T)  # a row per group
    assert model.config._attn_implementation == "sdpa"


@needs_sequence_attention
def test_a_plain_forward_during_the_swap_keeps_its_own_mask(batch):
    """Another forward of the same model while a flat forward has the attention swapped (async
    mode's producer thread) runs transformers' SDPA attention with its padding mask, unchanged."""
    from rlvr.train import sequence_attention as sa

    model = _model()
    assert sa.supported(model, 19)
    with torch.no_grad():
        before = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
        with sa.sequence_layout(model):
            sa._ACTIVE.on = False  # as seen from another thread
            during = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(during, before, atol=1e-6, rtol=0)


def test_the_swap_is_undone_on_error():
    from rlvr.train import sequence_attention as sa

    model = _model()
    with pytest.raises(RuntimeError), sa.sequence_layout(model):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa" and not getattr(sa._ACTIVE, "on", False)


@needs_sequence_attention
def test_models_outside_the_plain_attention_families_keep_the_row_layout():
    from rlvr.train import sequence_attention as sa

    model = _model()
    assert sa.supported(model, 40)
    model.config.sliding_window = 32  # a window shorter than the longest sequence changes attention
    assert not sa.supported(model, 40) and sa.supported(model, 32)
    model.config.sliding_window = None
    model.config.model_type = "gemma2"  # soft-capped attention logits
    assert not sa.supported(model, 40)


def test_sequence_indices_build_no_query_by_key_tensor_without_shared_prompts():
    """Without shared prompts or a window the causal flag is the mask: nothing of [rows, Q, T] is
    made (it was, and discarded: 2 GB of transient bools for one 32k-token sequence)."""
    from torch.profiler import ProfilerActivity, profile

    from rlvr.train import sequence_attention as sa
    from rlvr.train.packing import flat

    T = 1024
    ids = torch.randint(3, 61, (1, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    slot = flat(ids, mask).slot
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        ix = sa.indices(slot, mask.bool())
    assert "rlvr_mask" not in ix and "rlvr_window_mask" not in ix
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert 0 < largest < T * T  # (an index of T longs is 8 KB; a [1, T, T] bool mask would be 1 MB)
    windowed = sa.indices(slot, mask.bool(), window=16)  # a window still gets its mask
    assert windowed["rlvr_window_mask"].shape == (1, 1, T, T)
