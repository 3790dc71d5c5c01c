"""rlvr.rollout.speculative: greedy output identical to the target's own greedy decode, the
rejection-sampling rule exact (enumerated and sampled), caches rolled back, pairs checked."""

from __future__ import annotations

import copy

import pytest
import torch
from fast_models import DRAFT, PAD, TARGET, arith_tokenizer, noisy_model

from rlvr.model.tokenizer import train_tokenizer
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.rollout.speculative import (
    NgramDraft,
    SpecStats,
    accept_and_resample,
    check_pair,
    greedy_accept,
    ngram_propose,
    residual,
    speculative_generate,
)


@pytest.fixture(scope="module")
def tok():
    return arith_tokenizer()


@pytest.fixture(scope="module")
def target(tok):
    return noisy_model(TARGET, tok, 0)


@pytest.fixture(scope="module")
def prompts(tok):
    texts = ["Compute: 3 + 4", "The answer is", "Compute: 12 + 1\nThe", "9"]
    return [tok(t)["input_ids"] for t in texts]


def greedy(T: int, stop=()) -> SamplingParams:
    return SamplingParams(max_new_tokens=T, temperature=0.0, stop_token_ids=stop)


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("draft_seed", [1, 2, None])  # None: the draft is the target (all accepted)
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_the_targets_greedy_decode(tok, target, prompts, backend, draft_seed, k):
    draft = target if draft_seed is None else noisy_model(DRAFT, tok, draft_seed)
    T = 24
    ref = generate(target, prompts, greedy(T), pad_token_id=PAD, backend="fast")
    stats = SpecStats()
    out = speculative_generate(target, draft, prompts, greedy(T), k=k, pad_token_id=PAD, backend=backend,
                               draft_backend=backend, stats=stats)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    for c, r in zip(out, ref):
        assert c.finish_reason == r.finish_reason
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(r.logprobs), atol=1e-4)
    assert stats.proposed > 0
    if draft_seed is None:
        assert stats.acceptance_rate == 1.0
    else:
        assert stats.acceptance_rate < 1.0


@pytest.mark.parametrize("T", [1, 2, 5, 6, 7])
def test_max_tokens_and_stop_token_edges(tok, target, prompts, T):
    """Budgets around k + 1 = 5 and a stop token met inside an accepted run."""
    ref = generate(target, prompts, greedy(20), pad_token_id=PAD)
    stop = ref[0].token_ids[3]  # the 4th greedy token of prompt 0 stops every row that meets it
    for params in (greedy(T), greedy(20, stop=(stop,))):
        want = generate(target, prompts, params, pad_token_id=PAD)
        for draft in (target, noisy_model(DRAFT, tok, 3)):
            got = speculative_generate(target, draft, prompts, params, k=4, pad_token_id=PAD)
            assert [(c.token_ids, c.finish_reason) for c in got] == [(c.token_ids, c.finish_reason) for c in want]
    assert want[0].finish_reason == "stop" and want[0].token_ids[-1] == stop


def test_many_rejections_compact_the_cache(tok, target, prompts):
    """A poor draft at k = 6 over 60 tokens feeds more columns than the cache holds: the fast
    state compacts to its valid columns (defrag) and the output is still the target's."""
    draft = noisy_model(DRAFT, tok, 5)
    ref = generate(target, prompts, greedy(60), pad_token_id=PAD)
    stats = SpecStats()
    out = speculative_generate(target, draft, prompts, greedy(60), k=6, pad_token_id=PAD, stats=stats)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    assert stats.rounds * 7 > 2 * 60  # more columns fed than the allocation without defrag


def test_sampling_with_the_target_as_draft_accepts_everything(target, prompts):
    stats = SpecStats()
    params = SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, stop_token_ids=())
    out = speculative_generate(target, copy.deepcopy(target), prompts, params, k=3, pad_token_id=PAD,
                               generator=torch.Generator().manual_seed(0), stats=stats)
    assert stats.acceptance_rate == 1.0
    assert all(len(c.token_ids) == 16 for c in out)


def _dists(V: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g) ** 3
    p[0] = 0.0  # a token the distribution never gives
    return p / p.sum()


def test_rule_is_exact_by_enumeration():
    """sum_d q(d) [a(d) 1{x=d} + (1 - a(d)) r(x)] = p(x) for a(d) = min(1, p(d)/q(d))."""
    for seed in range(5):
        p, q = _dists(6, seed), _dists(6, seed + 100)
        a = torch.minimum(torch.ones(6), p / q.clamp(min=1e-30))
        a[q == 0] = 0
        r = residual(p[None], q[None])[0]
        out = q * a + (q * (1 - a)).sum() * r
        assert torch.allclose(out, p, atol=1e-6)


def test_accept_and_resample_follows_the_target_by_sampling():
    """200k rows of the real function: the first emitted token follows p[0], the second (given
    the first was accepted) follows p[1]; a draft that never proposes a token still lets it out."""
    V, n, k = 5, 200_000, 2
    p = torch.stack([_dists(V, 1), _dists(V, 2), _dists(V, 3)])  # [k+1, V]
    q = torch.stack([_dists(V, 10), _dists(V, 11)])
    q[:, 3] = 0.0  # the draft never proposes token 3
    q = q / q.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(0)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], 1)
    acc, nxt = accept_and_resample(p.expand(n, -1, -1), q.expand(n, -1, -1), drafts, g)
    first = torch.where(acc >= 1, drafts[:, 0], nxt)
    freq = torch.bincount(first, minlength=V).float() / n
    assert torch.allclose(freq, p[0], atol=0.005), (freq, p[0])
    sel = acc >= 1
    second = torch.where(acc[sel] >= 2, drafts[sel, 1], nxt[sel])
    freq2 = torch.bincount(second, minlength=V).float() / sel.sum()
    assert torch.allclose(freq2, p[1], atol=0.006), (freq2, p[1])
    assert freq[0] == 0 and freq[3] > 0.01


def test_greedy_accept():
    logits = torch.tensor([[[0.0, 1, 0], [1, 0, 0], [0, 0, 1]]])  # argmax 1, 0, 2
    assert greedy_accept(logits, torch.tensor([[1, 0]])) == (torch.tensor([2]), torch.tensor([2]))
    a, nxt = greedy_accept(logits, torch.tensor([[1, 2]]))
    assert a.item() == 1 and nxt.item() == 0


def test_refuses_a_draft_with_another_vocabulary(tok, target):
    other = train_tokenizer([f"x{i} y{i * 3}" for i in range(100)], 280)
    draft = noisy_model(DRAFT, other, 0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        check_pair(target, draft)
    with pytest.raises(ValueError, match="vocabularies differ"):
        speculative_generate(target, draft, [[5, 6]], greedy(4), pad_token_id=PAD)
    with pytest.raises(ValueError, match="tokenizers differ"):
        check_pair(target, noisy_model(DRAFT, tok, 0), tok, other)


def test_streams_per_row_budgets_and_drops_a_cancelled_row(tok, target, prompts):
    draft = noisy_model(DRAFT, tok, 1)
    seen: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    ends: dict[int, str | None] = {}

    def on_tokens(i, toks, lps, reason):
        assert len(toks) == len(lps) >= 1
        seen[i] += toks
        if reason is not None:
            ends[i] = reason
        return i == 2 and len(seen[i]) >= 3  # the client of prompt 2 goes away

    budgets = [3, 10, 20, 7]
    out = speculative_generate(target, draft, prompts, greedy(20), k=4, pad_token_id=PAD, max_tokens=budgets,
                               on_tokens=on_tokens)
    ref = generate(target, prompts, greedy(20), pad_token_id=PAD)
    for i, b in enumerate(budgets):
        assert seen[i] == out[i].token_ids
        if i != 2:
            assert out[i].token_ids == ref[i].token_ids[:b] and ends[i] == "length"
    assert 3 <= len(out[2].token_ids) < 20 and 2 not in ends
    with pytest.raises(ValueError, match="max_tokens"):
        speculative_generate(target, draft, prompts, greedy(5), pad_token_id=PAD, max_tokens=[6, 1, 1, 1])


def test_without_a_draft_it_decodes_the_target_alone(target, prompts):
    ref = generate(target, prompts, greedy(9), pad_token_id=PAD)
    stats = SpecStats()
    out = speculative_generate(target, None, prompts, greedy(9), pad_token_id=PAD, stats=stats)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref] and stats.proposed == 0


def _propose_ref(ctx, k, max_ngram):
    """Plain loop: for n = max_ngram..1, the latest start i < len - n with ctx[i:i+n] == ctx[-n:]."""
    for n in range(max_ngram, 0, -1):
        if n >= len(ctx):
            continue
        starts = [i for i in range(len(ctx) - n) if ctx[i:i + n] == ctx[-n:]]
        if starts:
            return ctx[starts[-1] + n:starts[-1] + n + k]
    return []


def test_ngram_proposal_matches_a_plain_loop():
    assert ngram_propose([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert ngram_propose([5, 1, 2, 7, 1, 2], 4, max_ngram=2) == [7, 1, 2]  # fewer: the context ends
    assert ngram_propose([1, 2, 3], 4) == []  # no earlier occurrence
    assert ngram_propose([4, 4], 3) == [4]
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        ctx = torch.randint(0, 4, (int(torch.randint(0, 14, (1,), generator=g)),), generator=g).tolist()
        for k in (0, 1, 3):
            for mn in (1, 2, 3):
                assert ngram_propose(ctx, k, mn) == (_propose_ref(ctx, k, mn) if k else []), (ctx, k, mn)


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("k", [2, 4])
def test_ngram_draft_greedy_is_the_targets_greedy_decode(tok, target, prompts, backend, k):
    rep = [tok("Compute: 3 + 4\nThe answer is 7. Compute: 3 + 4\nThe answer is 7. Compute: 3 + 4")["input_ids"],
           tok("1 2 3 1 2 3 1 2 3 1 2")["input_ids"]]
    ps = prompts + rep
    T = 32
    ref = generate(target, ps, greedy(T), pad_token_id=PAD, backend="fast")
    for draft in ("ngram", NgramDraft(max_ngram=1)):
        stats = SpecStats()
        out = speculative_generate(target, draft, ps, greedy(T), k=k, pad_token_id=PAD, backend=backend, stats=stats)
        assert [c.token_ids for c in out] == [c.token_ids for c in ref]
        for c, r in zip(out, ref):
            assert c.finish_reason == r.finish_reason
            assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(r.logprobs), atol=1e-4)
        assert stats.accepted > 0 and stats.rounds < sum(len(c.token_ids) for c in out)


def test_ngram_draft_sampling_runs_and_respects_budgets(tok, target, prompts):
    stats = SpecStats()
    out = speculative_generate(target, "ngram", prompts, SamplingParams(max_new_tokens=20, temperature=0.8, top_p=0.9),
                               k=3, pad_token_id=PAD, generator=torch.Generator().manual_seed(0), stats=stats,
                               max_tokens=[5, 20, 1, 12])
    assert [len(c.token_ids) <= m for c, m in zip(out, [5, 20, 1, 12])] == [True] * 4
    assert all(c.finish_reason == "stop" or len(c.token_ids) == m for c, m in zip(out, [5, 20, 1, 12]))
