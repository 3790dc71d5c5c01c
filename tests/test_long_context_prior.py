"""benchmarks/long_context_prior.py: the needle rows, the positions whose argmax is "exact
retrieval", the haystack growth rule, and a short run that writes a loadable model."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import long_context_prior as prior  # noqa: E402


def test_a_row_plants_its_needles_and_asks_for_one_of_them():
    rng = random.Random(3)
    for filler in (0, 5, 30):
        prompt, reference, number = prior.needle_row(rng, filler)
        key = prompt.rsplit("for ", 1)[1].split(" mentioned")[0]
        assert f"The special magic number for {key} is {number}." in prompt
        assert reference == f"The special magic number for {key} is {number}.\nAnswer: {number}"
        assert 2 <= prompt.count("The special magic number for") <= 6


def test_the_digit_positions_hold_the_answer_needles_seven_digits(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, attention, loss_mask, digits = prior.encode_batch(tokenizer, random.Random(0), 4, 6)
    for i, d in enumerate(digits):
        number = tokenizer.decode(ids[i, d:d + 7])
        assert len(number) == 7 and number.isdigit()
        row = tokenizer.decode(ids[i, attention[i].bool()])
        assert f"is {number}.\nAnswer: {number}" in row
        answer = tokenizer.decode(ids[i, loss_mask[i].bool()])  # the loss covers the reply only
        assert answer.startswith("The special magic number for") and number in answer


def test_the_haystack_grows_by_a_quarter_and_stops_at_the_cap():
    sizes = [0]
    while sizes[-1] < 40:
        sizes.append(prior.grow(sizes[-1], 40))
    assert sizes[:6] == [0, 1, 2, 3, 4, 5] and sizes[-1] == 40
    assert all(b - a >= 1 and b <= max(a + 1, 1.25 * a + 1) for a, b in zip(sizes, sizes[1:]))


def test_a_short_run_writes_a_model_rlvr_loads(tmp_path):
    from rlvr.model.load import load_model_and_tokenizer

    out = tmp_path / "prior"
    assert prior.main(["--out", str(out), "--steps", "2", "--batch", "2", "--hidden", "64", "--layers", "1",
                       "--max-positions", "512", "--json", str(tmp_path / "p.json")]) == 0
    curve = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [1, 2] and all(0 <= r["exact"] <= 1 for r in curve)
    model, tokenizer = load_model_and_tokenizer(str(out))
    assert model.config.max_position_embeddings == 512 and model.config.hidden_size == 64
    assert tokenizer.decode(tokenizer("4829137")["input_ids"][:1]) == "4"  # single-digit tokens


def test_the_long_context_recipe_runs_grpo_under_the_length_curriculum_from_such_a_prior(tmp_path):
    """configs/long_context.yaml as written (its budgets cut): the prior loads, L1 tasks are drawn
    by the curriculum, and the step logs the frontier and truncation per level."""
    from rlvr.config import load_config
    from rlvr.monitor.metrics import read_metrics
    from rlvr.train import grpo

    model = tmp_path / "prior"
    prior.main(["--out", str(model), "--steps", "1", "--batch", "2", "--hidden", "64", "--layers", "1"])
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(grpo.GRPOConfig, root / "configs" / "long_context.yaml", [
        f"model={model}", f"out={tmp_path / 'run'}", "steps=1", "train_tasks=24", "rollout.tasks_per_step=2",
        "rollout.samples_per_task=2", "rollout.max_new_tokens=4"])
    assert cfg.domains == ["long_ctx.needle"] and cfg.levels == [1, 2, 3] and cfg.curriculum.enabled
    grpo.run_grpo(cfg, progress=False)
    (step,) = read_metrics(tmp_path / "run")
    assert step["curriculum/frontier/long_ctx.needle"] == 1  # the length curriculum starts at L1 (~1k tokens)
    assert "rollout/truncated_frac" in step
