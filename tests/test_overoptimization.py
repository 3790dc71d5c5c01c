"""A GRPO run trained on a deliberately exploitable proxy while a held-out source is the gold: the
proxy rises, the gold falls, ``overoptimization`` alerts (or stops the run) and the report plots the
two against each other."""

from __future__ import annotations

import json

import pytest
from test_grpo import _cfg, digits  # noqa: F401  (digits: an autouse fixture registering test.digits)

from rlvr.monitor.metrics import read_metrics
from rlvr.reward_sources.base import forget_sources


@pytest.fixture()
def letters(tmp_path):
    """The files of two scores: the proxy pays the share of digits in a completion (what a random
    tiny model learns in a few steps), the gold the share of letters, so whatever raises the proxy
    lowers the gold."""
    path = tmp_path / "scores.py"
    path.write_text("def digits(prompts, completions, **kw):\n"
                    "    return [sum(c.isdigit() for c in t) / max(len(t), 1) for t in completions]\n"
                    "def letters(prompts, completions, **kw):\n"
                    "    return [sum(c.isalpha() for c in t) / max(len(t), 1) for t in completions]\n")
    forget_sources()
    yield str(path)
    forget_sources()


def overoptimized_cfg(tiny_model_dir, out, scores: str, **extra):
    return _cfg(tiny_model_dir, out, steps=14, **{
        "reward.sources": json.dumps([{"kind": "verifier", "weight": 0},
                                      {"kind": "python", "function": f"{scores}:digits", "name": "proxy_fn"},
                                      {"kind": "python", "function": f"{scores}:letters", "name": "letters",
                                       "weight": 0}]),
        "reward.gold": "letters",
        "algo.kl_coef": 0.001, "monitor.overoptimization.window": 3,
        "monitor.overoptimization.min_rise": 0.05, "monitor.overoptimization.min_drop": 0.05, **extra})


def test_an_exploitable_proxy_raises_the_alert_as_gold_falls_and_the_report_plots_it(tiny_model_dir, tmp_path, letters):
    from rlvr.report.build import read_run
    from rlvr.report.html import render
    from rlvr.train.grpo import run_grpo

    run_grpo(overoptimized_cfg(tiny_model_dir, tmp_path / "run", letters), progress=False)
    rows = read_metrics(tmp_path / "run")
    proxy = [r["rollout/score/proxy"] for r in rows]
    gold = [r["rollout/score/gold"] for r in rows]
    assert sum(proxy[-3:]) / 3 > sum(proxy[:3]) / 3 + 0.05, proxy  # the policy learned the proxy
    assert sum(gold[-3:]) / 3 < max(gold[:6]) - 0.05, gold  # ... and the gold fell
    assert all("rollout/reward_outcome" not in r for r in rows)  # the verifier was never trained on
    alerts = [json.loads(line) for line in open(tmp_path / "run" / "alerts.jsonl")]
    found = [a for a in alerts if a["detector"] == "overoptimization"]
    assert len(found) >= 1 and found[0]["severity"] == "critical"
    evidence = found[0]["evidence"]
    assert evidence["proxy"][1] > evidence["proxy"][0] and evidence["gold"][1] < evidence["gold"][0]
    assert evidence["sqrt_kl"] is not None and evidence["sqrt_kl"] > 0
    html = render(read_run(tmp_path / "run"))
    assert 'id="chart-overoptimization"' in html and "sqrt(KL) from the initial policy" in html
    assert "proxy (trained on)" in html and "gold (held out)" in html


def test_the_alert_can_stop_the_run(tiny_model_dir, tmp_path, letters):
    from rlvr.monitor.alerts import RunStopped
    from rlvr.train.grpo import run_grpo

    cfg = overoptimized_cfg(tiny_model_dir, tmp_path / "run", letters, **{"monitor.overoptimization.action": "stop"})
    with pytest.raises(RunStopped, match="overoptimization"):
        run_grpo(cfg, progress=False)
    assert len(read_metrics(tmp_path / "run")) < 14
