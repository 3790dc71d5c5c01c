"""The quickstart's acceptance at full size (about 20 minutes on 2 cores): `make test-slow`."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.train.quickstart import QuickstartConfig, run_quickstart

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
# Its own limit: the whole quickstart takes 9-20 minutes on 2 cores, past pyproject's 600 s
# default, and a loaded machine can take longer; this only stops a run that hangs.
TIMEOUT_S = 3600


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_grpo_beats_sft_on_held_out_math_and_code(tmp_path):
    report = run_quickstart(load_config(QuickstartConfig, RECIPE, [f"out={tmp_path}/qs"]))
    assert report["eval"]["tasks"] >= 500
    assert 0.2 <= report["overall"]["sft_pass@1"] <= 0.7  # the SFT model has headroom
    assert report["overall"]["delta_points"] >= 10, report["summary"]
    code = report["domains"]["code.gen"]
    assert code["delta_points"] >= 10, code  # issue 4: code.gen improves by 10 points or more
    for math in ("math.arith", "math.word"):  # ... and math does not fall below its SFT level
        assert report["domains"][math]["rl_pass@1"] >= report["domains"][math]["sft_pass@1"]
