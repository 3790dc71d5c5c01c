"""rlvr.model.quantize: decoder Linear layers in int8 (per-channel weights, per-token
activations), head and embeddings kept, logits near full precision, int8_linear against a plain
loop; rlvr's fast decoder runs the int8 model as its own forward does (fused int8 GEMMs exact
against the separate layers; tokens and log-probs equal to the Hugging Face backend's); a row's
output does not depend on its batch; speculative decoding over it gives its greedy decode."""

from __future__ import annotations

import pytest
import torch
from fast_models import arith_tokenizer
from torch import nn

from rlvr.model.quantize import Int8Linear, int8_layers, int8_linear, is_quantized, quantize_int8, weight_bytes
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
    assert all(type(mods[n]) is Int8Linear and mods[n].weight_int8.dtype == torch.int8 for n in names)
    assert isinstance(q.lm_head, nn.Linear) and q.lm_head.weight.dtype == torch.float32
    assert q.model.embed_tokens.weight.dtype == torch.float32
    assert is_quantized(q) and not is_quantized(model)
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear  # the original is untouched
    assert weight_bytes(q) < weight_bytes(model) / 2
    assert mods[names[0]].scale.unique().numel() > 1  # one scale per output row
    per_tensor = dict(quantize_int8(model, per_channel=False).named_modules())[names[0]]
    assert per_tensor.scale.unique().numel() == 1
    w = model.get_submodule(names[0]).weight
    assert (mods[names[0]].weight_int8.float() * mods[names[0]].scale[:, None] - w).abs().max() <= mods[names[0]].scale.max() / 2 + 1e-7


def test_int8_linear_is_the_plain_per_token_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, generator=g) * torch.tensor([1.0, 50.0, 0.01])[None, :, None]
    x[0, 0] = 0  # an all-zero row
    layer = Int8Linear(nn.Linear(16, 8).float())
    got = int8_linear(x, layer.weight_int8, layer.scale, layer.bias)
    ref = torch.zeros(2, 3, 8)
    for i in range(2):
        for j in range(3):
            row = x[i, j]
            s = max(row.abs().max().item(), 1e-12) / 127
            xq = [round(v / s) for v in row.tolist()]
            for o in range(8):
                acc = sum(a * int(layer.weight_int8[o, k]) for k, a in enumerate(xq))
                ref[i, j, o] = acc * s * layer.scale[o].item() + layer.bias[o].item()
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[0, 0], layer.bias)


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
    layers = [nn.Linear(32, 32, bias=with_bias), nn.Linear(32, 16, bias=False), nn.Linear(32, 16, bias=with_bias)]
    q = [Int8Linear(m, per_channel) for m in layers]
    x = torch.randn(3, 5, 32)
    ref = torch.cat([m(x) for m in q], -1)
    assert torch.equal(lin(x, int8_fused(*q)), ref)
    assert torch.equal(lin(x, int8_fused(q[0])), q[0](x))
    assert not torch.equal(ref, torch.cat([m(x) for m in layers], -1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_fast_decoder_runs_the_int8_model_as_the_hugging_face_forward_does(model, tok, temperature):
    q = quantize_int8(model)
    assert unsupported_reason(q) is None
    prompts = [tok(t)["input_ids"] for t in ("Compute: 12 + 5\nThe answer is", "Compute: 3 + 4", "1")]
    params = SamplingParams(max_new_tokens=8, temperature=temperature, stop_token_ids=())
    runs = {b: generate(q, prompts, params, pad_token_id=PAD, backend=b, generator=torch.Generator().manual_seed(1))
            for b in ("fast", "hf")}
    for f, h in zip(runs["fast"], runs["hf"]):
        assert f.token_ids == h.token_ids
        assert torch.allclose(torch.tensor(f.logprobs), torch.tensor(h.logprobs), atol=1e-4)
    full = generate(model, prompts, params, pad_token_id=PAD, backend="fast", generator=torch.Generator().manual_seed(1))
    assert any(not torch.allclose(torch.tensor(f.logprobs), torch.tensor(g.logprobs), atol=1e-3)
               for f, g in zip(runs["fast"], full))  # int8 did run


def test_a_rows_int8_output_does_not_depend_on_its_batch(model, tok):
    """Per-token activation scales: a prompt decoded alone or beside others (a large-activation
    one included) gives the same tokens and log-probs, up to float rounding."""
    q = quantize_int8(model)
    prompt = tok("Compute: 12 + 5\nThe answer is")["input_ids"]
    others = [tok(t)["input_ids"] for t in ("Compute: 3 + 4", "9" * 20)]
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=())
    alone = generate(q, [prompt], params, pad_token_id=PAD)[0]
    batched = generate(q, [*others, prompt], params, pad_token_id=PAD)[2]
    assert alone.token_ids == batched.token_ids
    assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(batched.logprobs), atol=1e-5)


def test_a_layer_half_int8_is_refused(model):
    q = quantize_int8(model)
    q.model.layers[0].mlp.down_proj = model.model.layers[0].mlp.down_proj
    assert "int8 and some are not" in unsupported_reason(q)


def test_speculative_decoding_over_an_int8_target_gives_its_greedy_decode(model, tok):
    """Per-token activation scales: a k+1-position verify quantises each position as a
    one-token step does."""
    q = quantize_int8(model)
    prompts = [tok(t)["input_ids"] for t in ("Compute: 3 + 4", "The answer is 1")]
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=())
    ref = generate(q, prompts, params, pad_token_id=PAD)
    out = speculative_generate(q, model, prompts, params, k=3, pad_token_id=PAD)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
