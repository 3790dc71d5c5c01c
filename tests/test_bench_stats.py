"""The benchmarks' paired per-round statistics: each round's ratio comes from that round's runs only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_round_speedups_pair_each_rounds_steps():
    from grpo_step_vs_trl import round_speedups

    # round 1: the machine is fast (TRL 1.0 s, rlvr 0.5 s); round 2: everything 3x slower.
    trl = [1.0, 1.2, 0.9, 3.0, 3.3, 2.7]
    rlvr = [0.5, 0.4, 0.6, 1.5, 1.8, 1.2]
    assert round_speedups(trl, rlvr, per_round=3) == pytest.approx([2.0, 2.0])
    assert round_speedups(trl, rlvr[:4], per_round=3) == pytest.approx([2.0])  # an unfinished round is left out


def test_rollout_round_ratios_are_per_round_token_rates():
    from rollout_throughput import round_ratios

    times = {"hf_generate": [1.0, 2.0], "rlvr_fast": [0.25, 1.0]}
    tokens = {"hf_generate": 2048, "rlvr_fast": 2048}
    assert round_ratios(times, tokens, "rlvr_fast") == pytest.approx([4.0, 2.0])
    assert round_ratios(times, tokens, "hf_generate") == pytest.approx([1.0, 1.0])


def test_spread_reads_median_and_range():
    from common import spread

    assert spread([2.0, 1.5, 3.25]) == "2.00 [1.50-3.25]"
