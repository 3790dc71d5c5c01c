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


@pytest.mark.parametrize("key, value", [("kv_cache", "fp8"), ("prefill_chunk", -1), ("kv_window", 0), ("kv_sinks", -1)])
def test_bad_kv_settings_name_their_key(key, value):
    with pytest.raises(ConfigError, match=f"eval.{key}"):
        EvalConfig(**{key: value})


def test_evaluate_runs_under_each_kv_cache(tiny_model_dir, monkeypatch):
    """The eval's KV settings reach the engine, and a window covering every sequence gives the
    ``full`` cache's verdicts (per option accuracy, docs/long_context.md)."""
    import rlvr.rollout.collect as collect_mod
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.tasks.base import generate_tasks

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    seen = []
    real = collect_mod.generate

    def recording(model, prompts, params, **kw):
        seen.append((params.kv_cache, params.prefill_chunk, params.kv_window))
        return real(model, prompts, params, **kw)

    monkeypatch.setattr(collect_mod, "generate", recording)
    tasks = generate_tasks(["math.arith"], "eval", 6, seed=3)
    verdicts = {}
    for kw in ({}, {"kv_cache": "int8", "kv_window": 512, "prefill_chunk": 8},
               {"kv_cache": "sink_window", "kv_window": 512, "kv_sinks": 2, "prefill_chunk": 8}):
        cfg = EvalConfig(domains=["math.arith"], tasks=6, max_new_tokens=8, **kw)
        report = evaluate(model, tok, tasks, cfg)
        verdicts[kw.get("kv_cache", "full")] = [(t["id"], t["correct"]) for t in report["tasks"]]
    assert seen == [("full", 0, 256), ("int8", 8, 512), ("sink_window", 8, 512)]
    assert verdicts["int8"] == verdicts["full"] == verdicts["sink_window"]
