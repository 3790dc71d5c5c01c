"""rlvr.model.quantize: decoder Linear layers in int8, head and embeddings kept, the engine runs
it on the Hugging Face backend, logits near full precision, speculative decoding over it exact."""

from __future__ import annotations

import pytest
import torch
from fast_models import arith_tokenizer
from torch import nn

from rlvr.model.quantize import int8_layers, is_quantized, quantize_int8, weight_bytes
from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.rollout.decoder import unsupported_reason
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.rollout.speculative import speculative_generate

CFG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
PAD = 2


@pytest.fixture(scope="module")
def tok():
    return arith_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(CFG, tok, seed=0)


def test_decoder_linears_are_int8_head_and_embeddings_are_not(model):
    q = quantize_int8(model)
    names = int8_layers(model)
    assert len(names) == CFG.num_layers * 7  # q, k, v, o, gate, up, down
    mods = dict(q.named_modules())
    assert all(type(mods[n]) is torch.ao.nn.quantized.dynamic.Linear for n in names)
    assert isinstance(q.lm_head, nn.Linear) and q.lm_head.weight.dtype == torch.float32
    assert q.model.embed_tokens.weight.dtype == torch.float32
    assert is_quantized(q) and not is_quantized(model)
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear  # the original is untouched
    assert weight_bytes(q) < weight_bytes(model)
    assert mods[names[0]].weight().qscheme() == torch.per_channel_affine  # one scale per output row
    per_tensor = dict(quantize_int8(model, per_channel=False).named_modules())[names[0]]
    assert per_tensor.weight().qscheme() == torch.per_tensor_affine


def test_logits_near_full_precision_and_the_engine_runs_it_on_hf(model, tok):
    q = quantize_int8(model)
    ids = torch.tensor([tok("Compute: 12 + 5\nThe answer is")["input_ids"]])
    ref, got = model(ids).logits, q(ids).logits
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    assert "quantised" in unsupported_reason(q)
    with pytest.raises(ValueError, match="quantised"):
        generate(q, ids.tolist(), SamplingParams(max_new_tokens=3), pad_token_id=PAD, backend="fast")
    out = generate(q, ids.tolist(), SamplingParams(max_new_tokens=5, temperature=0.0), pad_token_id=PAD)
    assert len(out[0].token_ids) >= 1


def test_speculative_decoding_over_an_int8_target_follows_its_greedy_decode(model, tok):
    """Near, not bit for bit: dynamic int8 quantises each forward's activations with one scale
    for the whole input tensor, so a k+1-position verify rounds differently from one-token steps."""
    q = quantize_int8(model)
    prompts = [tok(t)["input_ids"] for t in ("Compute: 3 + 4", "The answer is 1")]
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=())
    ref = generate(q, prompts, params, pad_token_id=PAD)
    out = speculative_generate(q, model, prompts, params, k=3, pad_token_id=PAD)
    assert [c.token_ids[0] for c in out] == [c.token_ids[0] for c in ref]
    same = sum(a == b for c, r in zip(out, ref) for a, b in zip(c.token_ids, r.token_ids))
    assert same >= 15
