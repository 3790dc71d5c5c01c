"""Token-budget micro-batches (``algo.microbatch_tokens``, rlvr/train/token_batches.py): every row
once, within the budget, as many micro-batches on every rank, balanced; and the update's gradient
is the one-micro-batch gradient whatever the grouping and the world size."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from rlvr.errors import ConfigError
from rlvr.train.batching import collate, select
from rlvr.train.token_batches import rank_tokens, token_microbatches
from test_packing import _model, _trajectories


def _check(lengths: list[int], budget: int, world: int) -> list[list[int]]:
    micro = token_microbatches(lengths, budget, world)
    rows = sorted(itertools.chain.from_iterable(micro))
    assert rows == list(range(len(lengths)))  # every row exactly once
    for m in micro:
        assert m == sorted(m) and (len(m) == 1 or sum(lengths[i] for i in m) <= budget), (m, budget)
    if len(lengths) >= world:
        per_rank = [len(micro[r::world]) for r in range(world)]
        assert max(per_rank) - min(per_rank) <= 1
        if len(micro) < len(lengths):  # not capped by the number of rows: whole rounds
            assert len(micro) % world == 0
    return micro


@pytest.mark.parametrize("world", [1, 2, 4])
def test_random_batches_fit_the_budget_on_equal_numbers_of_micro_batches_per_rank(world):
    rng = random.Random(world)
    for _ in range(200):
        lengths = [rng.choice([rng.randint(5, 60), rng.randint(200, 2000)]) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(100, 4000)
        micro = _check(lengths, budget, world)
        # no fewer micro-batches than the tokens need, rounded up to whole rounds of the ranks
        need = max(-(-sum(lengths) // budget), sum(n > budget for n in lengths))
        assert len(micro) >= min(len(lengths), need)


def test_equal_lengths_pack_exactly_and_ranks_get_equal_tokens():
    micro = _check([100] * 16, budget=400, world=2)
    assert len(micro) == 4 and all(len(m) == 4 for m in micro)
    assert rank_tokens(micro, [100] * 16, 2) == [800, 800]


def test_long_rows_go_alone_and_the_ranks_are_balanced():
    lengths = [3000, 2900, 100, 120, 80, 90, 2000, 60]
    micro = _check(lengths, budget=2500, world=2)
    alone = [m for m in micro if len(m) == 1 and lengths[m[0]] > 2500]
    assert sorted(m[0] for m in alone) == [0, 1]
    totals = rank_tokens(micro, lengths, 2)
    # greedy balance: the ranks differ by no more than the largest micro-batch
    assert max(totals) - min(totals) <= max(sum(lengths[i] for i in m) for m in micro)
    # against sample-count micro-batches of the same number: those put both long rows on rank 0
    by_count = [list(range(k, min(k + 2, 8))) for k in range(0, 8, 2)]
    assert max(rank_tokens(by_count, lengths, 2)) > max(totals)


def test_more_ranks_than_rows_and_bad_budgets():
    assert token_microbatches([5, 7], budget=100, world=4) == [[1], [0]]
    assert token_microbatches([], budget=10) == []
    with pytest.raises(ValueError, match="budget"):
        token_microbatches([1], budget=0)
    from rlvr.config import load_config
    from rlvr.train.grpo import GRPOConfig

    with pytest.raises(ConfigError, match="algo.microbatch_tokens"):
        load_config(GRPOConfig, None, ["domains=[math.arith]", "algo.microbatch_tokens=-1"])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_gradient_is_the_one_micro_batch_gradient_at_any_world_size(world):
    """The micro-batches of every rank, each normalised by the mini-batch's totals: their summed
    gradient (what all_reduce_grads makes) equals one forward of the whole mini-batch."""
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.update import micro_loss, microbatch_rows

    batch = collate(_trajectories(), [1.0, -0.5, 0.25, -1.0, 0.75, -0.25, 0.5, -0.75], pad_token_id=0)
    totals = {"num_tokens": float(batch.loss_mask.sum()), "num_seqs": 8.0, "max_tokens": 12}
    model = _model()

    def grads(a: AlgoConfig, world: int) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        micros = microbatch_rows(batch, a, world)
        for rank in range(world):  # each rank's share, as minibatch_backward runs it
            for rows in micros[rank::world]:
                loss, _ = micro_loss(model, select(batch, rows), a, totals)
                loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    whole = grads(AlgoConfig(microbatch_size=64), 1)
    a = AlgoConfig(microbatch_tokens=24)
    micros = microbatch_rows(batch, a, world)
    assert len(micros) > 1 and all(int(batch.attention_mask[r].sum()) <= 24 or len(r) == 1 for r in micros)
    for g, w in zip(grads(a, world), whole):
        assert w.abs().sum() > 0
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("packing", [True, False])
def test_a_frozen_models_logprobs_in_token_micro_batches_equal_one_forward(packing):
    """The KL reference and the teacher run in the update's token micro-batches: the same
    log-probs wherever a row has tokens (padding is 0 either way)."""
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.update import frozen_logprobs, logprobs_of

    batch = collate(_trajectories(), [0.0] * 8, pad_token_id=0)
    model = _model(seed=3).eval()
    with torch.no_grad():
        whole = logprobs_of(model, batch, AlgoConfig(packing=packing))
        parts = frozen_logprobs(model, batch, AlgoConfig(packing=packing, microbatch_tokens=20))
        planned = frozen_logprobs(model, batch, AlgoConfig(packing=packing, memory_budget_mb=1))
    real = batch.attention_mask.bool()
    assert whole[real].abs().sum() > 0
    torch.testing.assert_close(parts[real], whole[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(planned[real], whole[real], atol=1e-5, rtol=1e-5)


def test_truncation_is_logged_per_level_when_a_batch_mixes_levels():
    """A length curriculum's batches mix levels: the share cut at the length limit per level."""
    import dataclasses

    from rlvr.tasks.base import generate_tasks
    from rlvr.train.step_metrics import rollout_metrics
    from rlvr.types import Scored, Trajectory, Verdict

    tasks = generate_tasks(["long_ctx.needle"], "train", 6, seed=0, levels=[1, 2])
    assert {t.level for t in tasks} == {1, 2}
    out = []
    first_level2 = next(i for i, t in enumerate(tasks) if t.level == 2)
    for i, t in enumerate(tasks):
        cut = i == first_level2
        traj = Trajectory(task_id=t.id, group_id=i, messages=(), completion="", token_ids=(1, 2), loss_mask=(0, 1),
                          logprobs=(0.0, -1.0), finish_reason="length" if cut else "stop")
        out.append(Scored(task=t, trajectory=traj, verdict=Verdict(False, 0.0, "mismatch"), reward=0.0))
    m = rollout_metrics(out, out)
    level2 = [s for s in out if s.task.level == 2]
    assert m["rollout/truncated_frac/level_1"] == 0.0
    assert m["rollout/truncated_frac/level_2"] == sum(s.trajectory.finish_reason == "length" for s in level2) / len(level2)
    assert m["rollout/truncated_frac/level_2"] > 0
    one_level = [dataclasses.replace(s, task=dataclasses.replace(s.task, level=1)) for s in out]
    assert not any(k.startswith("rollout/truncated_frac/") for k in rollout_metrics(one_level, one_level))
