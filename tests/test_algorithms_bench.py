"""``benchmarks/algorithms.py`` end to end on a tiny model (2 arms, 1 seed, 2 steps, a few eval
tasks): each arm runs in its own process and reports held-out pass@1, step time and peak memory;
``--merge`` joins result files by arm and seed and refuses an arm's seed present twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "algorithms.py"

RECIPE = """\
grpo:
  domains: [math.arith]
  levels: [1]
  train_tasks: 8
  rollout: {tasks_per_step: 2, samples_per_task: 4, max_new_tokens: 4}
  save_trajectories_every: 100
eval:
  domains: [math.arith, math.word]
  levels: [1]
  max_new_tokens: 4
"""


def test_algorithms_benchmark_runs_arms_and_merges(tiny_model_dir, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    common = ["--model", tiny_model_dir, "--recipe", str(recipe), "--seeds", "0", "--steps", "2",
              "--eval-tasks", "4", "--out", str(tmp_path / "runs")]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *common, "--arms", "grpo", "rloo", "--json", str(first),
                           "--png", str(tmp_path / "a.png")], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(first.read_text())
    assert list(out["runs"]) == ["grpo", "rloo"] and out["arms"]["rloo"] == ["algo.advantage=rloo"]
    assert set(out["sft"]["by_domain"]) == {"math.arith", "math.word"}
    for arm in ("grpo", "rloo"):
        (run,) = out["runs"][arm]
        assert run["seed"] == 0 and set(run["by_domain"]) == {"math.arith", "math.word"}
        assert 0.0 <= run["domain_mean"] <= 1.0
        assert run["wall_s"] > 0 and run["s_per_step"] > 0 and run["update_s"] > 0 and run["peak_rss_mb"] > 100
        s = out["summary"][arm]
        assert s["domain_mean"]["values"] == [run["domain_mean"]] and s["domain_mean"]["std"] == 0.0
        assert s["peak_rss_mb"]["mean"] == run["peak_rss_mb"]
        assert (tmp_path / "runs" / f"{arm}_s0" / "final" / "config.json").exists()
    assert 0.0 <= out["idle_cpu"]["start"] <= 1.0 and 0.0 <= out["idle_cpu"]["end"] <= 1.0
    assert (tmp_path / "a.png").stat().st_size > 0
    assert "idle CPU at start" in proc.stdout

    # a later run of another arm (here: the grpo run relabelled) joins by arm, another seed by seed; the
    # same arm and seed twice is refused
    sys.path.insert(0, str(ROOT))
    from benchmarks.algorithms import merge, report

    second.write_text(json.dumps({**out, "runs": {"dr_grpo": out["runs"]["grpo"]}, "arms": {"dr_grpo": []}}))
    report(merge([str(first), str(second)]), str(tmp_path / "all.json"), str(tmp_path / "all.png"))
    merged = json.loads((tmp_path / "all.json").read_text())
    assert list(merged["runs"]) == ["grpo", "rloo", "dr_grpo"] and set(merged["summary"]) == set(merged["runs"])
    assert merged["summary"]["dr_grpo"]["domain_mean"] == out["summary"]["grpo"]["domain_mean"]
    assert (tmp_path / "all.png").stat().st_size > 0
    third = tmp_path / "c.json"
    third.write_text(json.dumps({**out, "seeds": [1], "runs": {"rloo": [{**out["runs"]["rloo"][0], "seed": 1}]}}))
    joined = merge([str(first), str(third)])
    assert [r["seed"] for r in joined["runs"]["rloo"]] == [0, 1] and joined["seeds"] == [0, 1]
    with pytest.raises(SystemExit, match="in both"):
        merge([str(first), str(first)])
    second.write_text(json.dumps({**out, "steps": 3, "runs": {"dr_grpo": []}}))
    with pytest.raises(SystemExit, match="steps"):
        merge([str(first), str(second)])
