"""benchmarks/long_context_accuracy.py: held-out accuracy per level, per KV option and per RoPE
scaling, on the same tasks in every cell (a smoke run on the tiny test model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import long_context_accuracy as bench  # noqa: E402


def test_the_grid_covers_every_option_and_scaling_on_the_same_tasks(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.eval.evaluate as evaluate_mod
    import rlvr.model.load as load_mod

    seen, loads, written = [], [], []
    real_eval, real_load = evaluate_mod.evaluate, load_mod.load_model_and_tokenizer
    out = tmp_path / "acc.json"

    def recording_eval(model, tokenizer, tasks, cfg, **kw):
        seen.append((cfg.kv_cache, cfg.prefill_chunk, cfg.kv_window, tuple(t.id for t in tasks)))
        written.append(json.loads(out.read_text()) if out.exists() else None)  # what a cut run would keep
        return real_eval(model, tokenizer, tasks, cfg, **kw)

    def recording_load(path, **kw):
        loads.append(kw.get("options"))
        return real_load(path, **kw)

    monkeypatch.setattr(evaluate_mod, "evaluate", recording_eval)
    monkeypatch.setattr(load_mod, "load_model_and_tokenizer", recording_load)
    result = bench.main(["--model", str(tiny_model_dir), "--levels", "1", "--tasks", "2", "--rope", "none", "linear:2",
                         "--max-new-tokens", "4", "--prefill-chunk", "256", "--kv-window", "64", "--trained-tokens", "300",
                         "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == result["rows"] and "partial" not in json.loads(out.read_text())
    assert written[0] is None and [len(w["rows"]) for w in written[1:]] == [1, 2, 3]  # each cell as measured
    assert all(w["partial"] for w in written[1:]) and written[3]["rows"] == result["rows"][:3]
    kinds = [(r["kind"], r["option"]) for r in result["rows"]]
    assert kinds == [("kv", "full"), ("kv", "int8"), ("kv", "sink_window"), ("rope", "linear:2")]
    assert [s[:3] for s in seen] == [("full", 256, 64), ("int8", 256, 64), ("sink_window", 256, 64), ("full", 256, 64)]
    assert len({s[3] for s in seen}) == 1  # the same two tasks in every cell
    assert loads[0] is None and loads[1].rope_scaling["type"] == "linear" and loads[1].rope_scaling["factor"] == 2.0
    trained = result["trained_positions"]
    assert trained == 300  # --trained-tokens, not the saved max_position_embeddings
    for r in result["rows"]:
        assert r["tasks"] == 2 and 0 <= r["pass@1"] <= 100 and r["ci95"][0] <= r["pass@1"] <= r["ci95"][1]
        assert r["x_trained"] == round(r["prompt_tokens"] / trained, 2) and r["prompt_tokens"] > 500
    full = result["rows"][0]["pass@1"]
    assert all(r["cost_points"] == round(r["pass@1"] - full, 1) for r in result["rows"][:3])


def test_a_bad_rope_spec_is_refused():
    with pytest.raises(SystemExit, match="--rope 'cubic:2'"):
        bench.parse_rope("cubic:2")
