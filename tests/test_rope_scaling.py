"""RoPE scaling from config: ``model.rope_scaling`` (tiny model), ``model_load.rope_scaling``
(loaded directories), the rollout engine's fast decoder on scaled models, and the pretraining
``seq_len`` rule."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GPT2Config, LlamaConfig

from rlvr.config import from_dict
from rlvr.errors import ConfigError, UserError
from rlvr.model.checkpoint import save_model_dir
from rlvr.model.load import ModelLoadConfig, load_model, load_model_and_tokenizer
from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.model.tokenizer import train_tokenizer
from rlvr.rollout import decoder
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.train.pretrain import PretrainConfig

TRAINED = 32  # the tiny models' "trained" length here: prompts + completions go up to 4x past it
SHAPE = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
PAD = 2
LINEAR = {"type": "linear", "factor": 4}
YARN = {"type": "yarn", "factor": 4, "original_max_positions": TRAINED}


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([f"Compute: {i} + {i * 7 % 13}\nThe answer is {i + i * 7 % 13}." for i in range(200)], 300)


def tiny(tok, scaling=None, max_positions=TRAINED * 4):
    return build_tiny_model(TinyModelConfig(**SHAPE, max_positions=max_positions, rope_scaling=scaling), tok, seed=0)


# -- config validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("scaling, match", [
    ("linear", "must be a mapping"),
    ({"factor": 2}, r"model.rope_scaling.type' = None .*\['linear', 'yarn', 'dynamic'\]"),
    ({"type": "longrope", "factor": 2}, r"model.rope_scaling.type' = 'longrope' is not allowed"),
    ({"type": "linear"}, r"needs field\(s\) \['factor'\]"),
    ({"type": "linear", "factor": 2, "beta_fast": 8}, r"unknown field\(s\) \['beta_fast'\] for type linear"),
    ({"type": "linear", "factor": 0.5}, r"model.rope_scaling.factor' = 0.5 must be a number >= 1"),
    ({"type": "linear", "factor": "2"}, "must be a number"),
    ({"type": "yarn", "factor": 4}, r"needs field\(s\) \['original_max_positions'\]"),
    ({**YARN, "original_max_positions": 0}, "original_max_positions' = 0 must be a positive integer"),
    ({**YARN, "original_max_positions": 1024}, r"original_max_positions \(1024\) must be at most model.max_positions \(128\)"),
    ({**YARN, "beta_fast": 1, "beta_slow": 2}, "beta_fast .* must be greater than beta_slow"),
    ({**YARN, "attention_factor": 0}, "attention_factor' = 0 must be a number > 0"),
])
def test_bad_rope_scaling_is_refused_naming_the_key(scaling, match):
    with pytest.raises(ConfigError, match=match):
        TinyModelConfig(max_positions=128, rope_scaling=scaling)


def test_rope_scaling_from_a_config_mapping():
    cfg = from_dict(TinyModelConfig, {"max_positions": 1024, "rope_scaling": {"type": "yarn", "factor": 4,
                                                                              "original_max_positions": 256}})
    assert cfg.rope_scaling == {"type": "yarn", "factor": 4.0, "original_max_positions": 256}
    assert TinyModelConfig().rope_scaling is None
    # a loaded model's YaRN may leave the original length to the model's config
    assert ModelLoadConfig(rope_scaling={"type": "yarn", "factor": 2}).rope_scaling == {"type": "yarn", "factor": 2.0}
    with pytest.raises(ConfigError, match="model_load.rope_scaling.type"):
        ModelLoadConfig(rope_scaling={"type": "ntk", "factor": 2})
    with pytest.raises(ConfigError, match="model_load.max_positions' only applies with model_load.rope_scaling"):
        ModelLoadConfig(max_positions=512)


def test_pretrain_seq_len_longer_than_max_positions_names_both_keys():
    with pytest.raises(ConfigError, match=r"pretrain.seq_len \(512\) is longer than pretrain.model.max_positions \(256\)"):
        PretrainConfig(seq_len=512)
    assert PretrainConfig(seq_len=512, model=TinyModelConfig(max_positions=512)).seq_len == 512
    assert PretrainConfig().seq_len <= PretrainConfig().model.max_positions  # the defaults are untouched


# -- the tiny model ---------------------------------------------------------------------------------


def test_tiny_model_rope_tables(tok):
    plain, linear, yarn = tiny(tok), tiny(tok, LINEAR), tiny(tok, YARN)
    assert plain.config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert linear.config.rope_parameters == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    assert linear.config.max_position_embeddings == 4 * TRAINED
    torch.testing.assert_close(linear.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq / 4)
    assert linear.model.rotary_emb.attention_scaling == 1.0
    assert yarn.config.rope_parameters["original_max_position_embeddings"] == TRAINED
    assert yarn.model.rotary_emb.attention_scaling == pytest.approx(0.1 * math.log(4) + 1)
    inv, base = yarn.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq
    assert inv[0] == base[0] and torch.allclose(inv[-1], base[-1] / 4)  # fast dims kept, slow ones interpolated
    custom = tiny(tok, {**YARN, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.5})
    assert custom.model.rotary_emb.attention_scaling == 1.5
    # same weights: scaling changes positions only
    for a, b in zip(plain.parameters(), yarn.parameters()):
        assert torch.equal(a, b)


# -- model_load.rope_scaling ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_dir(tok, tmp_path_factory):
    """A tiny model "trained" at TRAINED positions, saved as a Hugging Face directory."""
    path = tmp_path_factory.mktemp("rope") / "model"
    save_model_dir(path, tiny(tok, max_positions=TRAINED), tok)
    return path


def test_loaded_model_gets_the_scaling_in_its_config(trained_dir, tmp_path):
    plain = load_model(trained_dir)
    linear = load_model(trained_dir, options=ModelLoadConfig(rope_scaling={"type": "linear", "factor": 2}))
    assert linear.config.rope_parameters == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    assert linear.config.max_position_embeddings == 2 * TRAINED  # trained length x factor
    torch.testing.assert_close(linear.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq / 2)
    for a, b in zip(plain.parameters(), linear.parameters()):
        assert torch.equal(a, b)
    yarn = load_model(trained_dir, options=ModelLoadConfig(rope_scaling={"type": "yarn", "factor": 4},
                                                          max_positions=100))
    assert yarn.config.rope_parameters["original_max_position_embeddings"] == TRAINED
    assert yarn.config.max_position_embeddings == 100
    assert yarn.model.rotary_emb.attention_scaling == pytest.approx(0.1 * math.log(4) + 1)
    # saved with its scaling, it loads with it (no override needed)
    save_model_dir(tmp_path / "yarn", yarn, load_model_and_tokenizer(trained_dir)[1])
    again = load_model(tmp_path / "yarn")
    assert again.config.rope_parameters == yarn.config.rope_parameters
    torch.testing.assert_close(again.model.rotary_emb.inv_freq, yarn.model.rotary_emb.inv_freq)
    assert plain.config.rope_parameters["rope_type"] == "default"  # no override: as saved


def test_model_without_rope_is_refused(tmp_path):
    GPT2Config(n_positions=64, n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="no rotary position embedding"):
        load_model(tmp_path, options=ModelLoadConfig(rope_scaling=LINEAR))


# -- the rollout engine on scaled models ------------------------------------------------------------


def _greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0.0, stop_token_ids=())


def _reference(model, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("scaling", [LINEAR, YARN], ids=["linear", "yarn"])
def test_fast_decoder_equals_hf_forward_past_the_trained_length(tok, scaling, monkeypatch):
    model = tiny(tok, scaling)
    assert decoder.unsupported_reason(model) is None
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, len(tok), (n,), generator=g).tolist() for n in (50, 3 * TRAINED, 20)]
    starts = []
    original = decoder.FastLlama.start
    monkeypatch.setattr(decoder.FastLlama, "start", lambda self, *a, **k: starts.append(1) or original(self, *a, **k))
    fast = generate(model, prompts, _greedy(24), pad_token_id=PAD)  # auto: takes the fast decoder
    assert starts
    hf = generate(model, prompts, _greedy(24), pad_token_id=PAD, backend="hf")
    assert [c.token_ids for c in fast] == [c.token_ids for c in hf]
    assert max(len(prompts[c.prompt_index]) + len(c.token_ids) for c in fast) > 3 * TRAINED
    for a, b in zip(fast, hf):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    assert fast[1].token_ids == _reference(model, prompts[1], 24)


def test_sequence_dependent_rope_falls_back_to_the_hf_forward(tok):
    model = tiny(tok, {"type": "dynamic", "factor": 4}, max_positions=TRAINED)
    assert "sequence length" in decoder.unsupported_reason(model)
    prompts = [list(range(10, 10 + 40))]
    got = generate(model, prompts, _greedy(6), pad_token_id=PAD)  # auto: the HF forward
    assert got[0].token_ids == _reference(model, prompts[0], 6)
    with pytest.raises(ValueError, match="fast decoder"):
        generate(model, prompts, _greedy(2), pad_token_id=PAD, backend="fast")
    half = SHAPE["hidden_size"] // SHAPE["num_heads"] // 2
    longrope = LlamaConfig(hidden_size=32, num_attention_heads=4, max_position_embeddings=128,
                           rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": TRAINED,
                                            "short_factor": [1.0] * half, "long_factor": [4.0] * half})
    assert "sequence length" in decoder.fast_path_reason(longrope)


@pytest.mark.parametrize("scaling", [{"type": "linear", "factor": 2}, {"type": "yarn", "factor": 2}],
                         ids=["linear", "yarn"])
def test_scaled_model_runs_at_twice_its_trained_length(tok, trained_dir, scaling):
    model = load_model(trained_dir, options=ModelLoadConfig(rope_scaling=scaling))
    ids = torch.randint(10, len(tok), (2, 2 * TRAINED), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape[:2] == (2, 2 * TRAINED) and torch.isfinite(logits).all()
