"""``algo.compile``: compiled decoder layers give the eager loss and gradients, only where asked."""

from __future__ import annotations

import pytest
import torch
from test_packing import _model, _trajectories, grouped  # noqa: F401  (same tiny model and batches)

from rlvr.errors import ConfigError
from rlvr.train.batching import collate
from rlvr.train.compiled import compiled_layers, decoder_layers


def _grpo_loss_and_grads(model, batch, compile: bool, share: bool):
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.update import micro_loss

    totals = {"num_tokens": float(batch.loss_mask.sum()), "num_seqs": float(batch.input_ids.shape[0]), "max_tokens": 12}
    model.zero_grad(set_to_none=True)
    loss, _ = micro_loss(model, batch, AlgoConfig(compile=compile, share_prompts=share), totals)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_compiled_layers_give_the_eager_loss_and_gradients(grouped):  # noqa: F811
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    advantages = [1.0, -0.5, 0.25, -1.0, 0.75, -0.25, 0.5, -0.75]
    model = _model()
    keys = list(model.state_dict())
    # Packed batches of different shapes, without and with shared prompts: one dynamic-shape
    # compile (plus at most a recompile) serves them all.
    batches = [(collate(_trajectories(0), advantages, 0), False), (collate(_trajectories(1), advantages, 0), False),
               (grouped, True)]
    for batch, share in batches:
        loss_e, grads_e = _grpo_loss_and_grads(model, batch, compile=False, share=share)
        loss_c, grads_c = _grpo_loss_and_grads(model, batch, compile=True, share=share)
        torch.testing.assert_close(loss_c, loss_e, atol=1e-6, rtol=1e-5)
        for name, g in grads_e.items():
            assert g.abs().sum() > 0, name
            torch.testing.assert_close(grads_c[name], g, atol=1e-6, rtol=1e-4, msg=name)
    assert counters["stats"]["unique_graphs"] >= 1  # the compiled path really ran through dynamo
    # Outside the context the model is its eager self: same modules, same checkpoint keys.
    assert not any(isinstance(layer, torch._dynamo.eval_frame.OptimizedModule) for layer in decoder_layers(model))
    assert list(model.state_dict()) == keys


def test_compiled_layers_swap_only_inside_the_context():
    model = _model()
    eager = list(decoder_layers(model))
    with compiled_layers(model):
        inside = list(decoder_layers(model))
        assert all(c._orig_mod is e for c, e in zip(inside, eager))
        assert all(isinstance(c, torch._dynamo.eval_frame.OptimizedModule) for c in inside)
    assert all(a is b for a, b in zip(decoder_layers(model), eager))
    with compiled_layers(model):  # the wrappers are built once per model
        assert all(a is b for a, b in zip(decoder_layers(model), inside))
    with compiled_layers(model, enabled=False):
        assert all(a is b for a, b in zip(decoder_layers(model), eager))


def test_a_model_without_decoder_layers_runs_eager():
    lin = torch.nn.Linear(3, 3)
    assert decoder_layers(lin) is None
    with compiled_layers(lin):
        assert lin(torch.ones(1, 3)).shape == (1, 3)


def test_no_cpu_compiler_is_a_config_error_naming_the_key(monkeypatch):
    from rlvr.train import compiled

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    model = _model()
    with pytest.raises(ConfigError, match="algo.compile"), compiled_layers(model):
        pass
    assert model not in compiled._COMPILED
    assert all(not isinstance(x, torch._dynamo.eval_frame.OptimizedModule) for x in decoder_layers(model))
