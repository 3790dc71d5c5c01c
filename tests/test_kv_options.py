"""Chunked prefill and the memory-bounded KV caches of the fast decoder (rollout/kv_cache.py,
rollout/kv_compress.py): ``SamplingParams.prefill_chunk``, ``kv_cache`` (full | int8 | sink_window)."""

from __future__ import annotations

import pytest
import torch

from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.model.tokenizer import train_tokenizer
from rlvr.rollout import decoder, kv_compress
from rlvr.rollout.engine import SamplingParams, generate

CFG = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
PAD = 2
T = 20


@pytest.fixture(scope="module")
def model():
    tok = train_tokenizer([f"Compute: {i} + {i * 7 % 13}\nThe answer is {i + i * 7 % 13}." for i in range(200)], 300)
    return build_tiny_model(CFG, tok, seed=0)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, 290, (n,), generator=g).tolist() for n in (3, 17, 1, 11)]


def run(model, prompts, n=1, T=T, stop=(), **kw):
    params = SamplingParams(max_new_tokens=T, temperature=0.0, stop_token_ids=stop, n=n, **kw)
    return generate(model, prompts, params, pad_token_id=PAD, backend="fast")


def max_diff(a, b):
    return max(max((abs(x - y) for x, y in zip(p.logprobs, q.logprobs)), default=0.0) for p, q in zip(a, b))


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("chunk", [1, 4, 11, 17, 64])
def test_chunked_prefill_equals_the_whole_prompt(model, prompts, n, chunk):
    """Chunks smaller than, equal to and larger than the prompts (17 the longest): same greedy
    tokens, log-probs to float rounding (observed <= 5e-7); n=3 exercises shared prompts."""
    base, got = run(model, prompts, n), run(model, prompts, n, prefill_chunk=chunk)
    assert [c.token_ids for c in got] == [c.token_ids for c in base]
    assert max_diff(base, got) < 1e-5


def test_chunked_prefill_keeps_prefix_reuse(model, prompts):
    """``past`` (multi-turn prefix reuse) with a chunked prefill continues as the whole prompt does."""
    first = generate(model, prompts, SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=()),
                     pad_token_id=PAD, backend="fast", keep_cache=True)
    longer = [p + c.token_ids + [17, 18, 19] for p, c in zip(prompts, first)]
    past = [c.cache for c in first]
    whole = run(model, longer, T=6)
    for chunk in (2, 5):
        got = generate(model, longer, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(), prefill_chunk=chunk),
                       pad_token_id=PAD, backend="fast", past=past)
        assert [c.token_ids for c in got] == [c.token_ids for c in whole]
        assert max_diff(whole, got) < 1e-5


@pytest.mark.parametrize("n", [1, 3])
def test_covering_windows_equal_full(model, prompts, n):
    """int8 with a window over the whole sequence quantises nothing; sink_window with sinks +
    window over it drops nothing: both equal ``full`` (bit for bit with n=1; n=3's full path
    shares prompts, so to float rounding)."""
    base = run(model, prompts, n)
    for kw in (dict(kv_cache="int8", kv_window=64), dict(kv_cache="sink_window", kv_window=40, kv_sinks=0),
               dict(kv_cache="sink_window", kv_window=30, kv_sinks=10)):
        got = run(model, prompts, n, **kw)
        assert [c.token_ids for c in got] == [c.token_ids for c in base], kw
        assert max_diff(base, got) == 0.0 if n == 1 else max_diff(base, got) < 1e-5, kw


def test_int8_small_window_is_close_and_stored_as_int8(model, prompts):
    """Observed: max |log-prob diff| ~2e-4 with windows of 1-4 on this model (asserted < 5e-3)."""
    base = run(model, prompts, 2)
    for w in (1, 4):
        got = run(model, prompts, 2, kv_cache="int8", kv_window=w)
        assert 0 < max_diff(base, got) < 5e-3
    with torch.inference_mode():
        f = decoder.FastLlama(model)
        full = f.start(8, 17 + T)
        st = f.start(8, 17 + T, kv_cache="int8", kv_window=4)
        assert isinstance(st, kv_compress.Int8State)
        assert all(t.dtype == torch.int8 for t in st.qk + st.qv)
        assert all(t.shape[2] == 4 for t in st.k + st.v)  # full precision: the window only
        assert st.kv_bytes() < 0.5 * full.kv_bytes()


def test_quantize_roundtrip():
    x = torch.randn(3, 2, 5, 8)
    q, s = kv_compress.quantize(x)
    assert q.dtype == torch.int8 and s.shape == (3, 2, 5)
    err = (kv_compress.dequantize(q, s, x.dtype) - x).abs()
    assert (err <= s[..., None] / 2 + 1e-6).all()


def test_sink_window_memory_is_bounded_and_it_differs_from_full(model, prompts):
    base = run(model, prompts, 2, T=40)
    got = run(model, prompts, 2, T=40, kv_cache="sink_window", kv_window=6, kv_sinks=2)
    assert max_diff(base, got) > 1e-3  # the window is exceeded: attention differs
    with torch.inference_mode():
        f = decoder.FastLlama(model)
        st = f.start(4, 17 + 200, kv_cache="sink_window", kv_window=6, kv_sinks=2)
        logits = st.prefill(prompts, torch.arange(4), PAD)
        sizes = {st.kv_bytes()}
        assert st.col <= 2 + 6
        for _ in range(100):
            logits = st.step(logits.argmax(-1))
            sizes.add(st.kv_bytes())
            assert st.col <= st.cap <= 2 + 6 + 8
        assert len(sizes) == 1 and torch.isfinite(logits).all()
        assert st.kv_bytes() < f.start(4, 17 + 200).kv_bytes() / 10


def test_sink_window_eviction_equals_masking_alone(model, prompts, monkeypatch):
    """The bounded cache (periodic eviction) gives what attention under the sink + window mask
    over an unbounded cache gives: eviction only drops columns no query can see."""
    chunks = dict(kv_cache="sink_window", kv_window=5, kv_sinks=3)
    evicting = run(model, prompts, 2, T=40, **chunks)
    chunked = run(model, prompts, 2, T=40, prefill_chunk=4, **chunks)
    real = kv_compress.SinkWindowState._allocate

    def unbounded(self, cuda_graphs):
        self.window, w = 10_000, self.window  # cap = max_len: nothing evicted
        real(self, cuda_graphs)
        self.window = w

    monkeypatch.setattr(kv_compress.SinkWindowState, "_allocate", unbounded)
    masked = run(model, prompts, 2, T=40, **chunks)
    for got in (evicting, chunked):
        assert [c.token_ids for c in got] == [c.token_ids for c in masked]
        assert max_diff(masked, got) < 1e-5


@pytest.mark.parametrize("kw", [dict(kv_cache="int8", kv_window=3), dict(kv_cache="sink_window", kv_window=4, kv_sinks=1),
                                dict(kv_cache="int8", kv_window=3, prefill_chunk=4),
                                dict(kv_cache="sink_window", kv_window=4, kv_sinks=1, prefill_chunk=4)])
def test_bounded_caches_with_stop_tokens_and_rows_finishing(model, prompts, kw):
    """n > 1 and rows finishing at different steps (compaction): every row equals the same
    option's run without the stop token, cut at its first stop."""
    free = run(model, prompts, 2, T=30, **kw)
    stop = free[2].token_ids[3]
    got = run(model, prompts, 2, T=30, stop=(stop,), **kw)
    for f, g in zip(free, got):
        cut = f.token_ids.index(stop) + 1 if stop in f.token_ids else len(f.token_ids)
        assert g.token_ids == f.token_ids[:cut]
        assert max(abs(a - b) for a, b in zip(g.logprobs, f.logprobs[:cut])) < 1e-5
        assert g.finish_reason == ("stop" if stop in f.token_ids else "length")
    assert {c.finish_reason for c in got} == {"stop", "length"}


def test_bad_kv_options_are_rejected(model, prompts):
    with pytest.raises(ValueError, match="kv_cache must be one of full, int8, sink_window"):
        SamplingParams(kv_cache="fp8")
    with pytest.raises(ValueError, match="kv_window"):
        SamplingParams(kv_cache="int8", kv_window=0)
    with pytest.raises(ValueError, match="kv_sinks"):
        SamplingParams(kv_sinks=-1)
    with pytest.raises(ValueError, match="prefill_chunk"):
        SamplingParams(prefill_chunk=-2)
    for kw in (dict(prefill_chunk=4), dict(kv_cache="int8")):
        with pytest.raises(ValueError, match="Hugging Face backend cannot honour"):
            generate(model, prompts, SamplingParams(max_new_tokens=2, **kw), pad_token_id=PAD, backend="hf")
    with pytest.raises(ValueError, match="prefix reuse"):
        generate(model, prompts, SamplingParams(max_new_tokens=2, kv_cache="int8"), pad_token_id=PAD, backend="fast",
                 keep_cache=True)


def test_rollout_config_validates_and_passes_the_kv_options():
    from rlvr.errors import ConfigError
    from rlvr.train.grpo_config import RolloutConfig

    RolloutConfig(kv_cache="sink_window", kv_window=64, kv_sinks=4, prefill_chunk=128)
    for kw in (dict(kv_cache="fp8"), dict(kv_window=0), dict(prefill_chunk=-1), dict(kv_sinks=-1)):
        with pytest.raises(ConfigError, match="rollout.(kv_cache|kv_window|prefill_chunk|kv_sinks)"):
            RolloutConfig(**kw)


def test_sink_window_chunked_prefill_holds_only_what_can_be_seen(model, prompts, monkeypatch):
    """A chunked prefill under sink_window keeps, between chunks, only the sinks and the last
    ``kv_window`` columns: never more than sinks x prompts + window + chunk columns at once."""
    held = []
    end = kv_compress.SinkPrefill.end

    def spy(self, e):
        held.append(len(self.cols))
        end(self, e)
        assert all(k.shape[2] == len(self.cols) for k, _ in self.kv)

    monkeypatch.setattr(kv_compress.SinkPrefill, "end", spy)
    long = [p * 6 for p in prompts]  # up to 102 tokens
    run(model, long, 2, T=5, kv_cache="sink_window", kv_window=5, kv_sinks=3, prefill_chunk=4)
    assert len(held) == -(-102 // 4) and max(held) <= 3 * 4 + 5 + 4


@pytest.mark.parametrize("n", [1, 2])
def test_int8_chunked_prefill_quantises_as_it_goes(model, prompts, n, monkeypatch):
    """int8 with a chunked prefill: a covering window equals ``full``; a small one stays close,
    the full-precision tail never exceeds window + chunk columns, and layer 0's int8 columns
    (whose K/V depend on no attention) are exactly the quantised full-precision ones, in place
    (n=1: one row per prompt) or copied to the rows (n=2)."""
    long = [p * 4 for p in prompts]  # up to 68 tokens, + 20 new
    base = run(model, long, n, prefill_chunk=8)
    got = run(model, long, n, kv_cache="int8", kv_window=90, prefill_chunk=8)
    assert [c.token_ids for c in got] == [c.token_ids for c in base]
    assert max_diff(base, got) < 1e-5
    tails = []
    end = kv_compress.Int8Prefill.end

    def spy(self, e):
        tails.append(self.tail[0][0].shape[2])
        end(self, e)

    monkeypatch.setattr(kv_compress.Int8Prefill, "end", spy)
    small = run(model, long, n, kv_cache="int8", kv_window=4, prefill_chunk=8)
    assert 0 < max_diff(base, small) < 5e-3
    assert max(tails) <= 4 + 8
    with torch.inference_mode():
        f = decoder.FastLlama(model)
        W = max(map(len, long))
        rows = torch.arange(len(long)).repeat_interleave(n)
        full = f.start(len(rows), W + 2, share_prompts=False)  # every row's prompt K/V in its rows
        full.prefill(long, rows, PAD)
        st = f.start(len(rows), W + 2, kv_cache="int8", kv_window=4)
        st.prefill(long, rows, PAD, chunk=8)
        a = W - 4
        for q8, sc, K in ((st.qk[0], st.sk[0], full.k[0]), (st.qv[0], st.sv[0], full.v[0])):
            want_q, want_s = kv_compress.quantize(K[:, :, :a])
            valid = full.valid[:, None, :a]
            assert torch.equal(q8[:, :, :a][valid.expand_as(q8[:, :, :a, 0])], want_q[valid.expand_as(want_q[..., 0])])
            torch.testing.assert_close(sc[:, :, :a][valid.expand_as(sc[:, :, :a])], want_s[valid.expand_as(want_s)])


def test_int8_decode_attention_equals_the_dequantised_cache_in_column_order(model, prompts):
    """The decode step's attention (scales folded into scores and probabilities, the ring read in
    slot order) against the plain reference: the int8 columns dequantised, the ring rotated into
    column order, one softmax over all of it."""
    with torch.inference_mode():
        f = decoder.FastLlama(model)
        st = f.start(4, 17 + 30, kv_cache="int8", kv_window=12)
        logits = st.prefill(prompts, torch.arange(4), PAD)
        for _ in range(9):  # the ring wraps, and holds a padding column of the 1-token prompt
            logits = st.step(logits.argmax(-1))
        st.valid[:st.n, st.col] = True
        mask = st._bias(st.valid[:st.n, :st.col + 1])
        q = torch.randn(st.n, f.num_heads, f.head_dim, generator=torch.Generator().manual_seed(0))
        S, R = st.col + 1, st.R
        a = S - R
        for li in range(len(f.layers)):
            got = st._attend(li, q, mask)
            cols = [(c % R) for c in range(a, S)]
            K = torch.cat([kv_compress.dequantize(st.qk[li][:, :, :a], st.sk[li][:, :, :a], f.kv_dtype),
                           st.k[li][:, :, cols]], 2)
            V = torch.cat([kv_compress.dequantize(st.qv[li][:, :, :a], st.sv[li][:, :, :a], f.kv_dtype),
                           st.v[li][:, :, cols]], 2)
            want = kv_compress.DecodeState._attend_over(st, q, K, V, mask)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
