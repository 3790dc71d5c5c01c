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
