"""rlvr.serve.shared_prefix: the fast mode's running rows keep a shared prompt prefix once. Every
decode step's logits equal the plain decoder's (rows holding their whole prompts) through joins at
different times, a row without the prefix, rows leaving, a full cache shifting left, and a weight
update retiring the prefix."""

from __future__ import annotations

import pytest
import torch
from fast_models import arith_tokenizer

from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.rollout.decoder import FastLlama
from rlvr.rollout.prefix_cache import PrefixCache
from rlvr.serve.rows import FastRows
from rlvr.serve.shared_prefix import SharedPrefixState

PAD = 2


@pytest.fixture(scope="module")
def fast():
    tok = arith_tokenizer()
    cfg = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                          max_positions=128)
    return FastLlama(build_tiny_model(cfg, tok, seed=3).eval())


def prompts(seed: int, n: int, shared: list[int], tail: tuple[int, int] = (3, 8)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [shared + torch.randint(5, 250, (int(torch.randint(*tail, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("max_len", [128, 80])  # 80: the cache fills and shifts left
def test_steps_equal_the_plain_decoder(fast, max_len):
    g = torch.Generator().manual_seed(0)
    system = torch.randint(5, 250, (40,), generator=g).tolist()  # 2 whole 16-token blocks
    plain = FastRows(fast, 6, max_len, PAD)
    shared = FastRows(fast, 6, max_len, PAD, PrefixCache(1 << 24, block=16))
    assert isinstance(shared.state, SharedPrefixState)
    born: list[int] = []  # the step each running row joined at
    with torch.inference_mode():
        def both(fn):
            a, b = fn(plain), fn(shared)
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()

        def join(ps, s):
            both(lambda r: r.join(ps))
            born.extend([s] * len(ps))

        first = prompts(1, 3, system)
        join(first[:1], 0)  # a cold cache: no shared prefix yet
        assert not shared.state.in_use
        join(first[1:], 0)  # hits: the prefix is adopted, these rows use it
        assert shared.state.in_use and shared.state.prefix.length == 32
        assert shared.state.uses[:3].tolist() == [False, True, True]
        cols = []
        for s in range(60):
            if s in (8, 20, 32, 44):  # rows older than 16 steps leave; new ones join, one without the prefix
                keep = [i for i, b in enumerate(born) if s - b < 16]
                plain.keep(keep)
                shared.keep(keep)
                born[:] = [born[i] for i in keep]
                if s == 32:  # a weight update: new rows do not attach, the running ones keep it
                    shared.retire_prefix()
                n_before = shared.n
                join(prompts(s, 2, system) + prompts(s + 1, 1, [], tail=(20, 30)), s)
                uses = shared.state.uses[n_before:shared.n].tolist()
                # at 32 the retired prefix is still in use: nothing attaches; at 44 its rows have left and
                # a new prefix is adopted (the Batcher clears the cache on an update: new weights' K/V)
                assert uses == ([False] * 3 if s == 32 else [True, True, False]), (s, uses)
            step = torch.randint(5, 250, (plain.n,), generator=torch.Generator().manual_seed(s))
            both(lambda r, t=step: r.step(t))
            cols.append(shared.state.col)
        assert (cols != sorted(cols)) == (max_len == 80)  # the full cache shifted left


def test_a_row_without_the_prefix_is_masked_from_it(fast):
    """With the prefix's scores not masked for rows that do not start with it, their logits would
    change: the check above would fail (the adopted prefix is not the third prompt's start)."""
    g = torch.Generator().manual_seed(5)
    system = torch.randint(5, 250, (33,), generator=g).tolist()
    ps = prompts(6, 2, system) + prompts(7, 1, [], tail=(20, 30))
    cache = PrefixCache(1 << 24, block=16)
    rows = FastRows(fast, 4, 96, PAD, cache)
    with torch.inference_mode():
        rows.join(ps[:1])
        rows.join(ps[1:])
        s = rows.state
        assert s.in_use and s.uses[:3].tolist() == [False, True, False]
        mask = s._step_mask(s.valid[:3], s.col + 1)
        assert torch.isinf(mask.pre.view(3, -1)[[0, 2]]).all() and (mask.pre.view(3, -1)[1] == 0).all()
