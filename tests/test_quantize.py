"""rlvr.model.quantize: decoder Linear layers in int8, head and embeddings kept, logits near full
precision; rlvr's fast decoder runs the int8 model as its own forward does (fused int8 GEMMs
exact against the separate layers; tokens and log-probs equal to the Hugging Face backend's);
speculative decoding over it follows its greedy decode."""

from __future__ import annotations

import pytest
import torch
from fast_models import arith_tokenizer
from torch import nn

from rlvr.model.quantize import int8_layers, is_quantized, quantize_int8, weight_bytes
from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.rollout.decoder import unsupported_reason
from rlvr.rollout.gemm import int8_fused, lin
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


def test_logits_near_full_precision(model, tok):
    q = quantize_int8(model)
    ids = torch.tensor([tok("Compute: 12 + 5\nThe answer is")["input_ids"]])
    ref, got = model(ids).logits, q(ids).logits
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    assert (got - ref).abs().max() > 0  # (it is quantised)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_int8_matrix_is_the_separate_layers_exactly(per_channel, with_bias):
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(32, 32, bias=with_bias), nn.Linear(32, 16, bias=False), nn.Linear(32, 16, bias=with_bias))
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qc = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    q = quantize_dynamic(layers, {str(i): qc for i in range(3)}, dtype=torch.qint8)
    x = torch.randn(3, 5, 32)
    ref = torch.cat([m(x) for m in q], -1)
    assert torch.equal(lin(x, int8_fused(*q)), ref)
    assert torch.equal(lin(x, int8_fused(q[0])), q[0](x))
    assert not torch.equal(lin(x, int8_fused(*q)), torch.cat([m(x) for m in layers], -1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_fast_decoder_runs_the_int8_model_as_the_hugging_face_forward_does(model, tok, temperature):
    """Same tokens; log-probs within 2e-3, not bit for bit: activations are quantised with one
    scale per input tensor, and the fast decoder's prefill runs the last layer's attention output
    and MLP on the last position only (the Hugging Face forward on every position). int8 itself
    moves them further from full precision."""
    q = quantize_int8(model)
    assert unsupported_reason(q) is None
    prompts = [tok(t)["input_ids"] for t in ("Compute: 12 + 5\nThe answer is", "Compute: 3 + 4", "1")]
    params = SamplingParams(max_new_tokens=8, temperature=temperature, stop_token_ids=())
    runs = {b: generate(q, prompts, params, pad_token_id=PAD, backend=b, generator=torch.Generator().manual_seed(1))
            for b in ("fast", "hf")}
    for f, h in zip(runs["fast"], runs["hf"]):
        assert f.token_ids == h.token_ids
        assert torch.allclose(torch.tensor(f.logprobs), torch.tensor(h.logprobs), atol=2e-3)
    full = generate(model, prompts, params, pad_token_id=PAD, backend="fast", generator=torch.Generator().manual_seed(1))
    assert any(not torch.allclose(torch.tensor(f.logprobs), torch.tensor(g.logprobs), atol=2e-3)
               for f, g in zip(runs["fast"], full))  # int8 did run


def test_a_layer_half_int8_is_refused(model):
    q = quantize_int8(model)
    q.model.layers[0].mlp.down_proj = model.model.layers[0].mlp.down_proj
    assert "int8 and some are not" in unsupported_reason(q)


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
