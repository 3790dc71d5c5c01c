"""Evaluation settings reach the engine; a bad setting names its key."""

from __future__ import annotations

import pytest

from rlvr.errors import ConfigError
from rlvr.eval.evaluate import EvalConfig, evaluate


def test_eval_precision_must_be_a_known_one():
    with pytest.raises(ConfigError, match="eval.precision"):
        EvalConfig(precision="fp8")


@pytest.mark.parametrize("precision", ["model", "bf16"])
def test_evaluate_decodes_at_the_configured_precision(tiny_model_dir, monkeypatch, precision):
    import rlvr.rollout.collect as collect_mod
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.tasks.base import generate_tasks

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    seen = []
    real = collect_mod.generate

    def recording(model, prompts, params, **kw):
        seen.append(params.precision)
        return real(model, prompts, params, **kw)

    monkeypatch.setattr(collect_mod, "generate", recording)
    cfg = EvalConfig(domains=["math.arith"], tasks=4, max_new_tokens=6, precision=precision)
    tasks = generate_tasks(cfg.domains, "eval", cfg.tasks, seed=cfg.seed)
    result = evaluate(model, tok, tasks, cfg)
    assert seen == [precision]
    assert result["overall"]["n_tasks"] == 4
