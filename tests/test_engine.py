"""rlvr.rollout.engine: KV-cache batched generation against a plain no-cache reference.

Every decoding test runs on both backends: ``fast`` (rlvr's own decoder, rollout/decoder.py) and
``hf`` (the Hugging Face forward with its cache). GQA is covered: CFG has 4 query heads, 2 KV heads.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlvr.model.logprobs import sequence_logprobs
from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.model.tokenizer import train_tokenizer
from rlvr.rollout import decoder, gemm
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.rollout.kv_cache import DecodeState, KVPrefix
from rlvr.rollout.sampling import top_p_filter
from rlvr.model.inputs import pad_right

CFG = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
PAD = 2
BACKENDS = pytest.mark.parametrize("backend", ["fast", "hf"])


def greedy_params(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=())


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([f"Compute: {i} + {i * 7 % 13}\nThe answer is {i + i * 7 % 13}." for i in range(200)], 300)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(CFG, tok, seed=0)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, 290, (n,), generator=g).tolist() for n in (3, 9, 1, 6)]  # different lengths


def _right_padded(seqs):
    """Right-padded ids and attention mask, as the trainer builds them."""
    return pad_right(seqs, PAD, torch.long), pad_right([[1] * len(x) for x in seqs], 0, torch.long)


def reference_greedy(model, prompt, max_new, stop_ids):
    """Greedy decoding with full forward passes over the unpadded sequence: no cache, no mask."""
    seq, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(token), out.append(token)
            if token in stop_ids:
                return out, "stop"
    return out, "length"


@BACKENDS
def test_greedy_with_cache_and_left_padding_matches_no_cache_reference(model, prompts, backend):
    params = greedy_params(8)
    got = generate(model, prompts, params, pad_token_id=PAD, backend=backend)
    for i, (c, p) in enumerate(zip(got, prompts)):
        assert c.prompt_index == i
        assert (c.token_ids, c.finish_reason) == reference_greedy(model, p, 8, ())


@BACKENDS
def test_rows_stop_independently(model, prompts, backend):
    """Stop on a token some rows produce at different steps; stopped rows leave the batch without
    changing the others, so every row still equals its own no-cache reference."""
    free = generate(model, prompts, greedy_params(8), pad_token_id=PAD, backend=backend)
    stop = free[1].token_ids[2]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,))
    got = generate(model, prompts, params, pad_token_id=PAD, backend=backend)
    expected = [reference_greedy(model, p, 8, {stop}) for p in prompts]
    assert [(c.token_ids, c.finish_reason) for c in got] == expected
    assert got[1].finish_reason == "stop" and got[1].token_ids[-1] == stop and len(got[1].token_ids) <= 3
    assert {c.finish_reason for c in got} == {"stop", "length"} or all(c.finish_reason == "stop" for c in got)
    assert all(len(c.token_ids) == 8 for c in got if c.finish_reason == "length")


def test_default_stop_is_the_model_eos(model, prompts):
    free = generate(model, prompts[:1], greedy_params(6), pad_token_id=PAD)
    eos = free[0].token_ids[3]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos  # pretend the model's EOS is a token it emits
    try:
        (c,) = generate(model, prompts[:1], SamplingParams(max_new_tokens=6, temperature=0.0), pad_token_id=PAD)
    finally:
        model.generation_config.eos_token_id = saved
    assert c.finish_reason == "stop" and c.token_ids[-1] == eos and len(c.token_ids) <= 4


@BACKENDS
def test_logprobs_are_plain_policy_logprobs(model, prompts, backend):
    """Sampling with temperature/top-p still records log pi(y) at temperature 1, the same value
    a fresh right-padded forward pass gives."""
    params = SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, n=2, stop_token_ids=())
    got = generate(model, prompts, params, generator=torch.Generator().manual_seed(1), pad_token_id=PAD,
                   backend=backend)
    seqs = [prompts[c.prompt_index] + c.token_ids for c in got]
    ids, mask = _right_padded(seqs)
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, mask)
    for r, c in enumerate(got):
        start = len(prompts[c.prompt_index])
        torch.testing.assert_close(lp[r, start : start + len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-4, rtol=0)
        assert all(x <= 0 for x in c.logprobs)


@BACKENDS
def test_n_samples_are_prompt_major_and_chunking_keeps_greedy(model, prompts, backend):
    params = SamplingParams(max_new_tokens=5, temperature=0.0, n=3, stop_token_ids=())
    whole = generate(model, prompts, params, pad_token_id=PAD, backend=backend)
    assert [c.prompt_index for c in whole] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert all(whole[3 * i].token_ids == whole[3 * i + k].token_ids for i in range(4) for k in (1, 2))
    # batch_size=2 splits prompts' samples across chunks
    chunked = generate(model, prompts, params, pad_token_id=PAD, batch_size=2, backend=backend)
    assert [(c.prompt_index, c.token_ids) for c in chunked] == [(c.prompt_index, c.token_ids) for c in whole]


@BACKENDS
def test_sampling_is_reproducible_for_a_generator(model, prompts, backend):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=4, stop_token_ids=())

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        out = generate(model, prompts, params, generator=g, pad_token_id=PAD, backend=backend)
        return [c.token_ids for c in out]

    a, b, c = run(0), run(0), run(1)
    assert a == b and a != c
    assert len({tuple(t) for t in a[:4]}) > 1  # samples of one prompt differ


@BACKENDS
def test_tiny_top_p_is_greedy(model, prompts, backend):
    greedy = generate(model, prompts, greedy_params(6), pad_token_id=PAD, backend=backend)
    nucleus = generate(
        model, prompts, SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-6, n=2, stop_token_ids=()),
        generator=torch.Generator().manual_seed(0), pad_token_id=PAD, backend=backend,
    )
    assert [c.token_ids for c in nucleus] == [g.token_ids for g in greedy for _ in range(2)]


def test_top_p_filter_keeps_the_smallest_nucleus():
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()  # noqa: E731
    assert kept(0.4) == [False, True, False, False]
    assert kept(0.75) == [False, True, False, True]
    assert kept(0.85) == [False, True, True, True]
    assert kept(1.0) == [True] * 4


def test_zero_new_tokens_and_model_mode_restored(model, prompts):
    model.train()
    out = generate(model, prompts, SamplingParams(max_new_tokens=0, n=2), pad_token_id=PAD)
    assert [(c.token_ids, c.finish_reason) for c in out] == [([], "length")] * 8
    assert model.training
    model.eval()


def test_sequence_logprobs_matches_a_loop_and_has_grad(model, prompts):
    ids = torch.full((2, 9), PAD)
    mask = torch.zeros((2, 9), dtype=torch.long)
    ids[0, :3], mask[0, :3] = torch.tensor(prompts[0]), 1
    ids[1, :9], mask[1, :9] = torch.tensor(prompts[1]), 1
    lp = sequence_logprobs(model, ids, mask)
    assert lp.shape == (2, 9) and lp.requires_grad
    assert lp[:, 0].eq(0).all() and lp[0, 3:].eq(0).all()
    with torch.no_grad():
        full = model(torch.tensor([prompts[0]])).logits[0].log_softmax(-1)
    for t in range(1, 3):
        assert math.isclose(lp[0, t].item(), full[t - 1, prompts[0][t]].item(), abs_tol=1e-5)
    lp.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_bad_params_are_rejected():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)


def test_past_must_have_one_entry_per_prompt(model, prompts):
    with pytest.raises(ValueError, match="past has 1 entries for 4 prompts"):
        generate(model, prompts, greedy_params(2), pad_token_id=PAD, past=[None])


# -- the fast decoder ---------------------------------------------------------------------------


def _count_calls(monkeypatch, cls, name):
    calls = []
    original = getattr(cls, name)

    def spy(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, spy)
    return calls


def test_auto_uses_the_fast_decoder_for_llama(model, prompts, monkeypatch):
    assert decoder.unsupported_reason(model) is None
    starts = _count_calls(monkeypatch, decoder.FastLlama, "start")
    generate(model, prompts, greedy_params(3), pad_token_id=PAD)
    assert len(starts) == 1


def test_fast_equals_hf_path_with_n_and_rows_finishing_at_different_steps(model, prompts, monkeypatch):
    """Greedy tokens identical and logprobs equal between the two backends, with n > 1 and a stop
    token that rows reach at different steps (finished rows wait for compaction, then leave)."""
    free = generate(model, prompts, greedy_params(12), pad_token_id=PAD)
    counts = {}
    for c in free:
        for t in set(c.token_ids):
            counts[t] = counts.get(t, 0) + 1
    # a token that some (not all) prompts emit: rows stop at different steps
    stop = next(t for t in free[1].token_ids[1:] if 0 < counts[t] < len(prompts))
    params = SamplingParams(max_new_tokens=12, temperature=0.0, n=3, stop_token_ids=(stop,))
    compactions = _count_calls(monkeypatch, DecodeState, "compact")
    fast = generate(model, prompts, params, pad_token_id=PAD, backend="fast")
    hf = generate(model, prompts, params, pad_token_id=PAD, backend="hf")
    assert [(c.token_ids, c.finish_reason) for c in fast] == [(c.token_ids, c.finish_reason) for c in hf]
    assert {c.finish_reason for c in fast} == {"stop", "length"}
    assert compactions  # rows did leave the fast decoder's batch
    expected = [reference_greedy(model, prompts[c.prompt_index], 12, {stop}) for c in fast]
    assert [(c.token_ids, c.finish_reason) for c in fast] == expected
    for a, b in zip(fast, hf):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_sampling_matches_between_backends(model, prompts):
    """Same generator, same batch: the sampled tokens agree (the logits agree to float error)."""
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=2, stop_token_ids=())
    runs = [generate(model, prompts, params, generator=torch.Generator().manual_seed(3), pad_token_id=PAD, backend=b)
            for b in ("fast", "hf")]
    assert [c.token_ids for c in runs[0]] == [c.token_ids for c in runs[1]]


def test_fast_decoder_sees_weight_updates(model, prompts):
    """The decoder reads the module's parameters (no stale copies between calls)."""
    params = greedy_params(6)
    before = [c.token_ids for c in generate(model, prompts, params, pad_token_id=PAD, backend="fast")]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            g = torch.Generator().manual_seed(5)
            for p in model.parameters():  # an in-place "optimizer step"
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
        after = generate(model, prompts, params, pad_token_id=PAD, backend="fast")
        assert [c.token_ids for c in after] != before
        assert [(c.token_ids, c.finish_reason) for c in after] == [reference_greedy(model, p, 6, ()) for p in prompts]
    finally:
        model.load_state_dict(saved)


def _first_stop(tok, ids, stop):
    """Reference: the first prefix of ``ids`` whose decoded text contains ``stop``."""
    for j in range(len(ids)):
        if stop in tok.decode(ids[: j + 1]):
            return j + 1
    return None


@BACKENDS
def test_stop_strings_spanning_two_tokens(model, tok, prompts, backend):
    free = generate(model, prompts, greedy_params(10), pad_token_id=PAD)
    ids = free[1].token_ids
    # a stop string made of the end of one token's text and the start of the next token's text
    k = next(k for k in range(1, 8) if tok.decode(ids[k : k + 1]) and tok.decode(ids[k + 1 : k + 2]))
    stop = tok.decode(ids[k : k + 1])[-1] + tok.decode(ids[k + 1 : k + 2])[0]
    end = _first_stop(tok, ids, stop)
    assert end is not None and end <= k + 2
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(), stop=(stop, "\x00never"))
    got = generate(model, prompts, params, pad_token_id=PAD, tokenizer=tok, backend=backend)
    assert got[1].token_ids == ids[:end] and got[1].finish_reason == "stop"
    for c, f in zip(got, free):  # every row: cut exactly at its own first stop string, if any
        e = _first_stop(tok, f.token_ids, stop)
        assert (c.token_ids, c.finish_reason) == ((f.token_ids[:e], "stop") if e else (f.token_ids, "length"))
        assert len(c.logprobs) == len(c.token_ids)


def test_stop_strings_need_a_tokenizer(model, prompts):
    with pytest.raises(ValueError, match="tokenizer"):
        generate(model, prompts, SamplingParams(max_new_tokens=3, stop=("\n",)), pad_token_id=PAD)
    with pytest.raises(ValueError, match="stop strings"):
        SamplingParams(stop=("",))
    assert SamplingParams(stop="ab").stop == ("ab",)


def test_non_llama_model_falls_back_to_the_hf_forward(tok, prompts):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(cfg).eval()
    assert decoder.unsupported_reason(gpt2) is not None
    params = greedy_params(5)
    got = generate(gpt2, prompts, params, pad_token_id=PAD)
    assert [(c.token_ids, c.finish_reason) for c in got] == [reference_greedy(gpt2, p, 5, ()) for p in prompts]
    with pytest.raises(ValueError, match="fast decoder"):
        generate(gpt2, prompts, params, pad_token_id=PAD, backend="fast")


# -- CUDA (skipped without a GPU: pytest -m gpu) --------------------------------------------------


def _cuda_model(model):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return copy.deepcopy(model).to("cuda", torch.bfloat16).eval()


def _same_up_to_ties(m, prompt, a, b, tol=0.02):
    """Greedy outputs agree, or first differ where the model's top two logits are within ``tol``
    (a bf16 near-tie that a different but correct summation order may break either way)."""
    j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is None:
        return len(a) == len(b)  # same prefix, so the same stop token ended both
    with torch.no_grad():
        logits = m(torch.tensor([list(prompt) + a[:j]], device=next(m.parameters()).device)).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1]) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_bf16_greedy_parity_with_hf_path(model, prompts, graphs):
    m = _cuda_model(model)
    stop = generate(m, prompts, greedy_params(10),
                    pad_token_id=PAD, backend="hf")[1].token_ids[3]
    params = SamplingParams(max_new_tokens=10, temperature=0.0, n=3, stop_token_ids=(stop,))
    fast = generate(m, prompts, params, pad_token_id=PAD, backend="fast", cuda_graphs=graphs)
    hf = generate(m, prompts, params, pad_token_id=PAD, backend="hf")
    same = [a.token_ids == b.token_ids for a, b in zip(fast, hf)]
    assert sum(same) >= 0.75 * len(same)
    for a, b in zip(fast, hf):
        assert _same_up_to_ties(m, prompts[a.prompt_index], a.token_ids, b.token_ids)
        if a.token_ids == b.token_ids:
            assert a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=5e-2, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_bf16_logprobs_match_sequence_logprobs(model, prompts, graphs):
    m = _cuda_model(model)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=5, stop_token_ids=())
    got = generate(m, prompts, params, generator=torch.Generator("cuda").manual_seed(0), pad_token_id=PAD,
                   backend="fast", cuda_graphs=graphs)
    assert all(len(c.token_ids) == 12 for c in got)
    seqs = [prompts[c.prompt_index] + c.token_ids for c in got]
    ids, mask = _right_padded(seqs)
    with torch.no_grad():
        lp = sequence_logprobs(m, ids.cuda(), mask.cuda()).cpu()
    diffs = []
    for r, c in enumerate(got):
        start = len(prompts[c.prompt_index])
        diffs.append((lp[r, start : start + len(c.token_ids)] - torch.tensor(c.logprobs)).abs())
    diffs = torch.cat(diffs)
    assert diffs.max() < 0.1 and diffs.mean() < 0.02, (diffs.max(), diffs.mean())


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_bf16_gemms_on_fp32_model_follow_the_autocast_trainer(model, prompts, graphs):
    """GRPO's CUDA rollouts: an fp32 model with ``precision="bf16"``. The GEMMs, attention and KV
    cache run in bf16 (as the trainer's forward under autocast runs them); the logprobs match that
    forward, the parameters stay fp32."""
    from rlvr.rollout.engine import precision_autocast

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    m = copy.deepcopy(model).cuda().eval()
    f = decoder.FastLlama(m, torch.bfloat16)
    assert f.kv_dtype == f.start(2, 8).k[0].dtype == torch.bfloat16 and f.embed.dtype == torch.float32
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=5, stop_token_ids=(), precision="bf16")
    got = generate(m, prompts, params, generator=torch.Generator().manual_seed(0), pad_token_id=PAD,
                   backend="fast", cuda_graphs=graphs)
    assert all(p.dtype == torch.float32 for p in m.parameters())
    ids, mask = _right_padded([prompts[c.prompt_index] + c.token_ids for c in got])
    with torch.no_grad(), precision_autocast(m, "bf16"):
        lp = sequence_logprobs(m, ids.cuda(), mask.cuda()).cpu()
    diffs = torch.cat([(lp[r, len(prompts[c.prompt_index]):][: len(c.token_ids)] - torch.tensor(c.logprobs)).abs()
                       for r, c in enumerate(got)])
    assert diffs.max() < 0.1 and diffs.mean() < 0.02, (diffs.max(), diffs.mean())


@pytest.mark.parametrize("policy", [True, False])
def test_compaction_policy_does_not_change_results(model, prompts, monkeypatch, policy):
    """Finished rows either leave at once or stay (masked out of the results) until the end."""
    free = generate(model, prompts, greedy_params(10), pad_token_id=PAD)
    stop = free[2].token_ids[1]
    monkeypatch.setattr(DecodeState, "worth_compacting", lambda self, alive, remaining: policy)
    params = SamplingParams(max_new_tokens=10, temperature=0.0, n=2, stop_token_ids=(stop,))
    got = generate(model, prompts, params, pad_token_id=PAD, backend="fast")
    expected = [reference_greedy(model, prompts[c.prompt_index], 10, {stop}) for c in got]
    assert [(c.token_ids, c.finish_reason) for c in got] == expected
    assert any(c.finish_reason == "stop" for c in got) and any(c.finish_reason == "length" for c in got)


def test_static_step_matches_the_eager_step(model, prompts):
    """The capturable step of the CUDA-graph path (whole-cache attention under the mask, K/V
    written at a column held in a tensor), run eagerly on CPU, equals the eager step, compaction
    included. (Prompts are not shared, as with CUDA graphs: the static step reads every row's
    prompt columns.)"""
    with torch.inference_mode():
        f = decoder.FastLlama(model)
        rows = torch.tensor([0, 0, 1, 2, 2, 3])
        states = [f.start(6, 9 + 6, share_prompts=False) for _ in range(2)]
        for st in states:
            for buf in st.k + st.v:
                buf.zero_()
            first = st.prefill(prompts, rows, PAD)
        tok = first.argmax(-1)
        for t in range(5):
            if t == 2:
                for st in states:
                    st.compact(torch.tensor([0, 2, 3, 5]))
                tok = tok[[0, 2, 3, 5]]
            a = states[0].step(tok)
            b = states[1].step_static(tok, torch.tensor([states[1].col]))
            states[1].col += 1
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
            tok = a.argmax(-1)


@pytest.mark.parametrize("rows", [[0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 0, 1, 2, 2, 3, 3]], ids=["full", "ragged"])
def test_shared_prompt_attention_equals_per_row_attention(model, prompts, rows):
    """A CPU decode step that reads each prompt's K/V once for all its rows (stacked queries)
    gives the logits of the step that reads every row's own copy: groups full or ragged (empty
    grid cells), GQA, and a compaction that empties one prompt's group and thins another."""
    rows_t = torch.tensor(rows)
    with torch.inference_mode():
        f = decoder.FastLlama(model)
        states = []
        for share in (True, False):
            st = f.start(len(rows), 9 + 6, share_prompts=share)
            first = st.prefill(prompts, rows_t, PAD)
            states.append(st)
        assert states[0].shared is not None and states[1].shared is None
        tok = first.argmax(-1)
        for t in range(5):
            if t == 2:
                keep = torch.tensor([0, 4, 5, 7])  # prompt 0 loses rows, prompt 1 all of its own
                for st in states:
                    st.compact(keep)
                tok = tok[keep]
            a, b = states[0].step(tok), states[1].step(tok)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
            tok = a.argmax(-1)
        assert states[0].shared.slots is not None  # after compaction the grid has empty cells


def test_qwen2_layout_with_qkv_bias_runs_fast(tok, prompts):
    """Qwen2 is Llama's layout plus q/k/v biases: the fast decoder takes it, and matches."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_sliding_window=False, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in qwen.model.layers:  # non-zero biases, so that they matter
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    assert decoder.unsupported_reason(qwen) is None
    params = SamplingParams(max_new_tokens=5, temperature=0.0, n=2, stop_token_ids=())
    fast = generate(qwen, prompts, params, pad_token_id=PAD, backend="fast")
    assert [(c.token_ids, c.finish_reason) for c in fast] == [
        reference_greedy(qwen, prompts[c.prompt_index], 5, ()) for c in fast]
    hf = generate(qwen, prompts, params, pad_token_id=PAD, backend="hf")
    for a, b in zip(fast, hf):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_past_prefix_continues_as_if_the_whole_prompt_ran(model, prompts):
    """Prefix reuse: a second call whose prompts extend the first call's (prompt, completion, new
    tokens), given the first call's caches as ``past``, samples the same tokens with the same
    logprobs as running the whole prompts; rows without a cache and a cache shorter than its
    prompt's prefix are mixed in."""
    params = SamplingParams(max_new_tokens=5, temperature=1.0, n=2, stop_token_ids=(7, 11))
    first = generate(model, prompts, params, pad_token_id=PAD, backend="fast", keep_cache=True,
                     generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    nxt, past = [], []
    for i, c in enumerate(first):
        nxt.append(list(prompts[c.prompt_index]) + c.token_ids + torch.randint(10, 270, (i % 3 + 1,), generator=g).tolist())
        assert c.cache is not None and c.cache.length == len(prompts[c.prompt_index]) + len(c.token_ids) - 1
        past.append(None if i == 2 else c.cache)
    short = past[5]
    past[5] = KVPrefix([k[:, :2] for k in short.k], [v[:, :2] for v in short.v])  # only 2 tokens cached
    runs = [generate(model, nxt, params, pad_token_id=PAD, backend="fast", past=p,
                     generator=torch.Generator().manual_seed(3)) for p in (past, None)]
    for a, b in zip(*runs):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def test_completion_cache_equals_a_fresh_prefill(model, prompts, monkeypatch):
    """``Completion.cache`` holds the K/V of the prompt and the completion but its last token,
    equal to what a prefill of exactly those tokens computes, also for rows that stopped early and
    rows moved by compaction (their prompt's K/V come from the shared copy); the HF path returns
    none."""
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=3, stop_token_ids=tuple(range(10, 60)))
    compactions = _count_calls(monkeypatch, DecodeState, "compact")
    out = generate(model, prompts, params, pad_token_id=PAD, backend="fast", keep_cache=True,
                   generator=torch.Generator().manual_seed(0))
    assert compactions and {c.finish_reason for c in out} == {"stop", "length"}
    with torch.inference_mode():
        f = decoder.FastLlama(model)
        for c in out:
            seq = list(prompts[c.prompt_index]) + c.token_ids[:-1]
            st = f.start(1, len(seq) + 1)
            st.prefill([seq], torch.tensor([0]), PAD)
            fresh = st.prefix(0, 0)
            assert c.cache.length == len(seq)
            for got, want in zip(c.cache.k + c.cache.v, fresh.k + fresh.v):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    hf = [generate(model, prompts, params, pad_token_id=PAD, backend="hf", keep_cache=keep,
                   generator=torch.Generator().manual_seed(0)) for keep in (True, False)]
    assert all(c.cache is None for c in hf[0])
    assert [c.token_ids for c in hf[0]] == [c.token_ids for c in hf[1]]


@BACKENDS
def test_bf16_precision_samples_near_the_fp32_policy(model, prompts, backend):
    """``precision="bf16"`` on an fp32 model: the GEMMs run in bf16 (the fast decoder's weights are
    bf16 copies; the hf backend runs under autocast), so logprobs move off the fp32 forward by bf16
    rounding, and no further; the parameters themselves are untouched."""
    params = SamplingParams(max_new_tokens=10, temperature=1.0, n=3, stop_token_ids=(), precision="bf16")
    got = generate(model, prompts, params, generator=torch.Generator().manual_seed(0), pad_token_id=PAD,
                   backend=backend)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    seqs = [prompts[c.prompt_index] + c.token_ids for c in got]
    ids, mask = _right_padded(seqs)
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, mask)
    diffs = torch.cat([(lp[r, len(prompts[c.prompt_index]):][: len(c.token_ids)] - torch.tensor(c.logprobs)).abs()
                       for r, c in enumerate(got)])
    assert diffs.max() > 1e-5, "bf16 GEMMs should round the logits: did it run in fp32?"
    assert diffs.max() < 0.1 and diffs.mean() < 0.02, (diffs.max(), diffs.mean())


def test_bf16_fast_decoder_weights_and_greedy(model, prompts):
    """The fast decoder's matrices are bf16 copies (norms, embeddings and the cache stay fp32) and
    greedy decoding follows the fp32 path except at near-ties."""
    f = decoder.FastLlama(model, torch.bfloat16)
    assert {f.lm_head.dtype, f.layers[0].wqkv.dtype, f.layers[0].wgu.dtype, f.layers[0].wd.dtype} == {torch.bfloat16}
    assert f.embed.dtype == f.norm.dtype == f.start(2, 8).k[0].dtype == torch.float32
    fp32 = generate(model, prompts, greedy_params(8), pad_token_id=PAD, backend="fast")
    bf16 = generate(model, prompts, SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(),
                                                   precision="bf16"), pad_token_id=PAD, backend="fast")
    for a, b in zip(fp32, bf16):
        assert _same_up_to_ties(model, prompts[a.prompt_index], a.token_ids, b.token_ids, tol=0.1)


def test_bf16_fast_decoder_mlp_computes_as_autocast_does(model):
    """With bf16 GEMMs the MLP's activations (``silu(gate) * up``) stay in bf16 and feed the down
    projection as they are, as under ``torch.autocast``; its output is added to the fp32 residual
    stream. Same values as the Hugging Face MLP under autocast, not as an fp32 SwiGLU of bf16 GEMMs."""
    f = decoder.FastLlama(model, torch.bfloat16)
    layer, L = model.model.layers[0], f.layers[0]
    x = torch.randn(5, CFG.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        h = f.rms(x, L.ln2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = layer.mlp(h)
        got = f.mlp(x, L)
        def bf16_gemm(a, lin):
            return (a.bfloat16() @ lin.weight.t().bfloat16()).float()
        # the SwiGLU in fp32 on bf16 GEMM outputs, cast once for the down GEMM
        act = torch.nn.functional.silu(bf16_gemm(h, layer.mlp.gate_proj)) * bf16_gemm(h, layer.mlp.up_proj)
        fp32_act = bf16_gemm(act, layer.mlp.down_proj)
    assert f.act(x, L).dtype == want.dtype == torch.bfloat16
    assert (got.float() - want.float()).abs().max() <= 1e-6 * want.float().abs().max()
    assert not torch.equal(fp32_act, want.float())  # (the test tells the two apart)
    assert (x + got).dtype == torch.float32


def test_bf16_gemms_with_biases_follow_autocast(tok, prompts):
    """Biases (Llama's ``mlp_bias``/``attention_bias``) next to bf16 GEMMs: added in bf16 where
    the output stays bf16 (the MLP), as autocast adds them; greedy tokens and log-probs match the
    Hugging Face forward under autocast."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      mlp_bias=True, attention_bias=True)
    torch.manual_seed(0)
    biased = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in biased.model.layers:
            for lin in (layer.mlp.gate_proj, layer.mlp.down_proj, layer.self_attn.q_proj):
                lin.bias.normal_(0, 0.5)
    assert decoder.unsupported_reason(biased) is None
    params = SamplingParams(max_new_tokens=5, temperature=0.0, n=2, stop_token_ids=(), precision="bf16")
    fast, hf = (generate(biased, prompts, params, pad_token_id=PAD, backend=b) for b in ("fast", "hf"))
    for a, b in zip(fast, hf):
        assert _same_up_to_ties(biased, prompts[a.prompt_index], a.token_ids, b.token_ids, tol=0.1)
        if a.token_ids == b.token_ids:
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=5e-3, rtol=0)


def test_onednn_packed_weights_equal_the_plain_gemms(model, prompts, monkeypatch):
    """On CPU the fast decoder's matrices are oneDNN-packed copies (a faster GEMM at decode
    shapes); the plain-matrix path (MKL GEMMs) samples the same tokens with the same log-probs, up
    to float summation order, through prefill, decode steps, early stops and compaction. (bf16
    GEMMs on packed weights: the autocast MLP test and the bf16 sampling tests above.)"""
    if not gemm.onednn_linear_available():
        pytest.skip("this torch build or CPU has no oneDNN packed linear")
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3, stop_token_ids=tuple(range(10, 40)))
    runs = {}
    available = gemm.onednn_linear_available
    for packed in (True, False):
        if not packed:  # the plain-matrix path, as on a torch without oneDNN
            monkeypatch.setattr(gemm, "onednn_linear_available", lambda dtype=torch.float32: False)
        assert decoder.FastLlama(model).packed is packed
        assert decoder.FastLlama(model, torch.bfloat16).packed is (packed and available(torch.bfloat16))
        runs[packed] = generate(model, prompts, params, pad_token_id=PAD, backend="fast",
                                generator=torch.Generator().manual_seed(0))
    assert {c.finish_reason for c in runs[True]} == {"stop", "length"}
    for a, b in zip(runs[True], runs[False]):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def test_unknown_precision_is_rejected():
    with pytest.raises(ValueError, match="precision must be one of model, bf16; got 'fp8'"):
        SamplingParams(precision="fp8")
