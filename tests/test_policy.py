"""``rlvr.train.policy.Policy`` on the tiny model: one object for LoRA-versus-full-weights. The
engine copy samples exactly what ``sampling()`` samples, ``plain_state_dict`` carries the merged
weights into a plain copy, ``save_final`` writes both ``lora.save`` modes (and leaves the model to
use after it), a checkpoint resumes the adapter, and the reference is the adapters-off base."""

from __future__ import annotations

import pytest
import torch

from rlvr.model.checkpoint import save_checkpoint
from rlvr.model.load import ModelLoadConfig, load_model, load_model_and_tokenizer
from rlvr.model.logprobs import sequence_logprobs
from rlvr.model.lora import (
    LoraConfig,
    is_adapter_dir,
    lora_layers,
    plain_state_dict,
    sampling_weights,
)
from rlvr.train.policy import Policy

OPTS = ModelLoadConfig()


def _lora(save="merged", **kw):
    return LoraConfig(enabled=True, r=4, save=save, **kw)


def _policy(path, cfg=None, ckpt=None, seed=0, dtype=None):
    """A policy of the tiny model; with LoRA its B matrices random (a non-zero update)."""
    options = ModelLoadConfig(dtype=dtype) if dtype else OPTS
    policy = Policy.load(path, cfg or LoraConfig(), ckpt, device="cpu", options=options)
    if policy.is_lora and ckpt is None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in lora_layers(policy.lora):
                w = layer.lora_B["default"].weight
                w.copy_(torch.randn(w.shape, generator=g) * 0.2)
    return policy


def _ids(n=3, length=12, seed=0, vocab=300):
    return torch.randint(3, vocab, (n, length), generator=torch.Generator().manual_seed(seed))


def _logprobs(model, ids):
    with torch.no_grad():
        return sequence_logprobs(model, ids, torch.ones_like(ids))


def test_plain_state_dict_is_the_state_dict_without_lora_and_round_trips_the_merged_weights(tiny_model_dir):
    plain = load_model(tiny_model_dir)
    assert plain_state_dict(plain).keys() == plain.state_dict().keys()
    assert all(torch.equal(v, plain.state_dict()[k]) and not v.requires_grad for k, v in plain_state_dict(plain).items())
    policy = _policy(tiny_model_dir, _lora())
    outside = plain_state_dict(policy.model)  # the base weights under the plain names
    assert outside.keys() == plain.state_dict().keys()
    assert all(torch.equal(outside[k], v) for k, v in plain.state_dict().items())
    ids = _ids()
    adapted = _logprobs(policy.model, ids)
    with sampling_weights(policy.lora) as merged:
        weights = plain_state_dict(merged)
        want = _logprobs(merged, ids)
        changed = [k for k in weights if not torch.equal(weights[k], outside[k])]
        assert changed and all("proj" in k for k in changed)  # the targeted linear layers, merged
        plain.load_state_dict(weights)  # strict: the same names as a plain model
    assert all(torch.equal(plain.state_dict()[k], weights[k]) for k in weights)
    assert torch.equal(_logprobs(plain, ids), want)
    assert torch.allclose(want, adapted, atol=1e-5)
    assert all(torch.equal(plain_state_dict(policy.model)[k], outside[k]) for k in outside)  # base restored


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_engine_copy_is_a_frozen_plain_copy_of_the_sampling_policy(tiny_model_dir, dtype):
    policy = _policy(tiny_model_dir, _lora(), dtype=dtype)
    copy = policy.engine_copy()
    assert not any("lora" in n for n, _ in copy.named_modules())
    assert not copy.training and not any(p.requires_grad for p in copy.parameters())
    ids = _ids()
    with policy.sampling() as merged:
        want = plain_state_dict(merged)
        assert all(torch.equal(copy.state_dict()[k], v) for k, v in want.items())  # exactly the merged weights
        assert torch.equal(_logprobs(copy, ids), _logprobs(merged, ids))
    # its own copy: training the policy further does not move it; plain_state_dict brings it up to date
    before = _logprobs(copy, ids)
    with torch.no_grad():
        for layer in lora_layers(policy.lora):
            layer.lora_B["default"].weight.mul_(2.0)
    assert torch.equal(_logprobs(copy, ids), before)
    with torch.no_grad(), policy.sampling() as merged:
        copy.load_state_dict(plain_state_dict(merged))
        assert torch.equal(_logprobs(copy, ids), _logprobs(merged, ids))
    assert not torch.equal(_logprobs(copy, ids), before)


def test_full_weights_policy_samples_itself_and_copies_itself(tiny_model_dir):
    policy = _policy(tiny_model_dir)
    assert not policy.is_lora and policy.lora is None and policy.checkpoint_module() is policy.model
    with policy.sampling() as m:
        assert m is policy.model
    copy = policy.engine_copy()
    assert copy is not policy.model and not copy.training and not any(p.requires_grad for p in copy.parameters())
    ids = _ids()
    assert torch.equal(_logprobs(copy, ids), _logprobs(policy.model, ids))
    with pytest.raises(ValueError, match="load_reference"), policy.reference():
        pass
    ref = policy.load_reference(device="cpu", options=OPTS)  # the starting weights, loaded apart
    assert ref is not policy.model and not ref.training and not any(p.requires_grad for p in ref.parameters())
    with policy.reference(ref) as r:
        assert r is ref


def test_lora_reference_is_the_base_with_adapters_off_and_restores_the_mode(tiny_model_dir):
    policy = _policy(tiny_model_dir, _lora())
    assert policy.is_lora and policy.model is policy.lora.get_base_model()
    assert policy.checkpoint_module() is policy.lora
    assert policy.load_reference(device="cpu", options=OPTS) is None  # no second model
    ids = _ids()
    base = _logprobs(load_model(tiny_model_dir), ids)
    policy.model.train()
    with policy.reference() as ref:
        assert not policy.model.training
        assert torch.equal(_logprobs(ref, ids), base)
    assert policy.model.training
    assert not torch.allclose(_logprobs(policy.model, ids), base, atol=1e-3)  # the adapters are back on
    loaded = policy.load_reference(tiny_model_dir, device="cpu", options=OPTS)  # an explicit path: loaded apart
    assert loaded is not None and torch.equal(_logprobs(loaded, ids), base)


def test_save_final_merged_leaves_the_plain_merged_model(tiny_model_dir, tmp_path):
    policy = _policy(tiny_model_dir, _lora("merged"))
    ids = _ids()
    with policy.sampling() as merged:
        want = _logprobs(merged, ids)
    model = policy.save_final(tmp_path / "final")
    assert model is policy.model and policy.lora is None and not policy.is_lora
    assert not any("lora" in n for n, _ in model.named_modules())
    assert policy.checkpoint_module() is model
    with policy.sampling() as m:
        assert m is model
    assert torch.allclose(_logprobs(model, ids), want, atol=1e-5)
    assert (tmp_path / "final" / "config.json").exists() and not is_adapter_dir(tmp_path / "final")
    assert torch.allclose(_logprobs(load_model(tmp_path / "final"), ids), want, atol=1e-5)


def test_save_final_adapter_keeps_the_adapter(tiny_model_dir, tmp_path):
    policy = _policy(tiny_model_dir, _lora("adapter"))
    model, lora = policy.model, policy.lora
    ids = _ids()
    want = _logprobs(model, ids)
    assert policy.save_final(tmp_path / "final") is model
    assert policy.model is model and policy.lora is lora and policy.is_lora
    assert is_adapter_dir(tmp_path / "final")
    loaded, _ = load_model_and_tokenizer(tmp_path / "final")  # rlvr merges it onto its base
    assert torch.allclose(_logprobs(loaded, ids), want, atol=1e-5)


def test_save_final_full_weights(tiny_model_dir, tmp_path):
    policy = _policy(tiny_model_dir)
    assert policy.save_final(tmp_path / "final") is policy.model
    ids = _ids()
    assert torch.equal(_logprobs(load_model(tmp_path / "final"), ids), _logprobs(policy.model, ids))


@pytest.mark.parametrize("lora", [True, False])
def test_load_with_a_checkpoint_resumes_it(tiny_model_dir, tmp_path, lora):
    cfg = _lora() if lora else LoraConfig()
    policy = _policy(tiny_model_dir, cfg)
    if not lora:  # full weights: move them away from the start
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.01)
    ckpt = save_checkpoint(tmp_path, 3, policy.checkpoint_module(), policy.tokenizer, {"step": 3})
    assert is_adapter_dir(ckpt) == lora
    resumed = _policy(tiny_model_dir, cfg, ckpt)
    assert resumed.is_lora == lora
    ids = _ids()
    assert torch.equal(_logprobs(resumed.model, ids), _logprobs(policy.model, ids))
    if lora:  # the base from the starting path, the adapter from the checkpoint; the reference is the base
        start, base = plain_state_dict(load_model(tiny_model_dir)), plain_state_dict(resumed.model)
        assert base.keys() == start.keys() and all(torch.equal(v, start[k]) for k, v in base.items())
        assert [n for n, p in resumed.model.named_parameters() if p.requires_grad] == \
            [n for n, p in policy.model.named_parameters() if p.requires_grad]
