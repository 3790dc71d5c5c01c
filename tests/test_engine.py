"""rlvr.rollout.engine: KV-cache batched generation against a plain no-cache reference."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.model.tokenizer import train_tokenizer
from rlvr.rollout.engine import SamplingParams, generate, sequence_logprobs, top_p_filter

CFG = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
PAD = 2


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


def test_greedy_with_cache_and_left_padding_matches_no_cache_reference(model, prompts):
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=())
    got = generate(model, prompts, params, pad_token_id=PAD)
    for i, (c, p) in enumerate(zip(got, prompts)):
        assert c.prompt_index == i
        assert (c.token_ids, c.finish_reason) == reference_greedy(model, p, 8, ())


def test_rows_stop_independently(model, prompts):
    """Stop on a token some rows produce at different steps; stopped rows leave the batch without
    changing the others, so every row still equals its own no-cache reference."""
    free = generate(model, prompts, SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=()), pad_token_id=PAD)
    stop = free[1].token_ids[2]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,))
    got = generate(model, prompts, params, pad_token_id=PAD)
    expected = [reference_greedy(model, p, 8, {stop}) for p in prompts]
    assert [(c.token_ids, c.finish_reason) for c in got] == expected
    assert got[1].finish_reason == "stop" and got[1].token_ids[-1] == stop and len(got[1].token_ids) <= 3
    assert {c.finish_reason for c in got} == {"stop", "length"} or all(c.finish_reason == "stop" for c in got)
    assert all(len(c.token_ids) == 8 for c in got if c.finish_reason == "length")


def test_default_stop_is_the_model_eos(model, prompts):
    free = generate(model, prompts[:1], SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=()), pad_token_id=PAD)
    eos = free[0].token_ids[3]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos  # pretend the model's EOS is a token it emits
    try:
        (c,) = generate(model, prompts[:1], SamplingParams(max_new_tokens=6, temperature=0.0), pad_token_id=PAD)
    finally:
        model.generation_config.eos_token_id = saved
    assert c.finish_reason == "stop" and c.token_ids[-1] == eos and len(c.token_ids) <= 4


def test_logprobs_are_plain_policy_logprobs(model, prompts):
    """Sampling with temperature/top-p still records log pi(y) at temperature 1, the same value
    a fresh right-padded forward pass gives."""
    params = SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, n=2, stop_token_ids=())
    got = generate(model, prompts, params, generator=torch.Generator().manual_seed(1), pad_token_id=PAD)
    seqs = [prompts[c.prompt_index] + c.token_ids for c in got]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), PAD)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)], mask[r, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, mask)
    for r, c in enumerate(got):
        start = len(prompts[c.prompt_index])
        torch.testing.assert_close(lp[r, start : start + len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-4, rtol=0)
        assert all(x <= 0 for x in c.logprobs)


def test_n_samples_are_prompt_major_and_chunking_keeps_greedy(model, prompts):
    params = SamplingParams(max_new_tokens=5, temperature=0.0, n=3, stop_token_ids=())
    whole = generate(model, prompts, params, pad_token_id=PAD)
    assert [c.prompt_index for c in whole] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert all(whole[3 * i].token_ids == whole[3 * i + k].token_ids for i in range(4) for k in (1, 2))
    chunked = generate(model, prompts, params, pad_token_id=PAD, batch_size=2)  # splits prompts' samples
    assert [(c.prompt_index, c.token_ids) for c in chunked] == [(c.prompt_index, c.token_ids) for c in whole]


def test_sampling_is_reproducible_for_a_generator(model, prompts):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=4, stop_token_ids=())

    def run(seed):
        out = generate(model, prompts, params, generator=torch.Generator().manual_seed(seed), pad_token_id=PAD)
        return [c.token_ids for c in out]

    a, b, c = run(0), run(0), run(1)
    assert a == b and a != c
    assert len({tuple(t) for t in a[:4]}) > 1  # samples of one prompt differ


def test_tiny_top_p_is_greedy(model, prompts):
    greedy = generate(model, prompts, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=()), pad_token_id=PAD)
    nucleus = generate(
        model, prompts, SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-6, n=2, stop_token_ids=()),
        generator=torch.Generator().manual_seed(0), pad_token_id=PAD,
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
