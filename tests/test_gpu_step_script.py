"""The prepared GPU check (``benchmarks/gpu_step.py``) runs end to end on its CPU path, so the one
command a GPU session gets is known to work up to the device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_step_script_runs_its_cpu_smoke_path(tmp_path):
    out = tmp_path / "gpu_step.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--device", "cpu", "--size", "small",
         "--prompts", "2", "--tasks", "2", "--samples", "2", "--new-tokens", "4", "--rounds", "1",
         "--steps", "1", "--warmup", "0", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    sides = {r["side"]: r for r in result["rollout"]["rows"]}
    assert set(sides) == {"hf_generate_bf16", "rlvr_bf16_weights", "rlvr_bf16_gemms"}
    assert all(r["tokens/s"] > 0 for r in sides.values())
    grpo = result["grpo"]
    assert grpo["forward"] > 0 and grpo["backward"] > 0 and grpo["fwd+bwd GF/s"] > 0
    assert "GRPO step" in proc.stdout and "rollout" in proc.stdout


def test_gpu_real_model_script_runs_its_cpu_smoke_path(tmp_path):
    """Issue 33's prepared GPU check (``benchmarks/gpu_real_model.py``) on its CPU path: both
    engines sample and agree with the training forward, and the LoRA and full GRPO variants run."""
    out = tmp_path / "gpu_real_model.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_real_model.py"), "--device", "cpu", "--shape", "tiny",
         "--prompts", "2", "--samples", "2", "--new-tokens", "8", "--rounds", "1", "--tasks", "2", "--micro", "4",
         "--steps", "2", "--variants", "lora,full", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    engines = {r["engine"]: r for r in result["engines"]["rows"]}
    assert {"hf_generate", "rlvr"} <= set(engines) and "vllm" in engines  # vllm: ran, or says why not
    for name in ("hf_generate", "rlvr"):
        assert engines[name]["tokens/s"] > 0
        assert engines[name]["mean_abs_delta"] < 0.01  # bf16 weights: sampling log-probs = the training forward's
    assert [r["variant"] for r in result["grpo"]] == ["lora", "full"]
    assert all("error" not in r and r["s/step"] > 0 for r in result["grpo"]), result["grpo"]
