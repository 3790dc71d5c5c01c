"""The numbers `evaluate()` and `rlvr eval --out` report, on hand-built cases.

Generation is scripted (``collect``, which ``run_tasks`` calls, is replaced by a function that
answers each task's samples right or wrong as the test says); everything after it is real: the
math verifier judges the answers, ``evaluate`` counts them and computes the statistics. The
expected values are worked out by hand below (pass@k from binomials, the intervals from their
textbook formulas), not by calling ``rlvr.algos.passk``.
"""

from __future__ import annotations

import json
import math
import statistics
from fractions import Fraction as F
from types import SimpleNamespace

import pytest

import rlvr.rollout.episodes as episodes_mod
import rlvr.tasks  # noqa: F401  (registers the domains)
from rlvr.eval.evaluate import EvalConfig, evaluate
from rlvr.tasks.base import generate_tasks
from rlvr.types import Trajectory

Z = 1.96
WRONG = "Answer: 100000"  # parses as an answer, never the right one here


def script_generation(monkeypatch, right):
    """Replace generation: sample ``j`` of task ``t`` answers with the task's reference when
    ``right(t, j)``, else with a wrong answer. Returns the list of (task id, sample) asked for."""
    asked = []

    def fake_collect(model, tokenizer, tasks, params, *, generator=None, policy_version=0, batch_size=None):
        out = []
        for i, t in enumerate(tasks):
            for j in range(params.n):
                asked.append((t.id, j))
                out.append(Trajectory(task_id=t.id, group_id=i, messages=tuple(t.prompt),
                                      completion=t.reference if right(t, j) else WRONG,
                                      token_ids=(), loss_mask=(), logprobs=(), finish_reason="stop",
                                      policy_version=policy_version))
        return out

    monkeypatch.setattr(episodes_mod, "collect", fake_collect)
    return asked


def normal_ci(values):
    """Textbook normal interval for a mean: mean +- z * s / sqrt(m), s with divisor m - 1,
    clipped to [0, 1]; with one value the spread is unknown: (0, 1)."""
    if len(values) == 1:
        return [0.0, 1.0]
    mean, half = statistics.fmean(values), Z * statistics.stdev(values) / math.sqrt(len(values))
    return [max(0.0, mean - half), min(1.0, mean + half)]


def wilson(successes, n):
    """Wilson score interval (Wilson 1927): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    p = successes / n
    centre = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2)) / (1 + Z**2 / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def check_stats(got, *, n_tasks, samples, passk, ci):
    assert got["n_tasks"] == n_tasks and got["samples"] == samples
    for k, want in passk.items():
        assert got[f"pass@{k}"] == pytest.approx(float(want), abs=1e-12), k
        assert got[f"pass@{k}_ci95"] == pytest.approx(ci[k], abs=1e-12), k
    assert set(got) - {"by_level"} == {"n_tasks", "samples"} | {f"pass@{k}{s}" for k in passk for s in ("", "_ci95")}


@pytest.fixture(scope="module")
def six_tasks():
    """arith level 1 (two), arith level 2, word level 1, word level 2 (two)."""
    pool = generate_tasks(["math.arith", "math.word"], "eval", 16, seed=1234, levels=[1, 2])
    pick = {("math.arith", 1): 2, ("math.arith", 2): 1, ("math.word", 1): 1, ("math.word", 2): 2}
    tasks = []
    for (domain, level), count in pick.items():
        tasks += [t for t in pool if t.domain == domain and t.level == level][:count]
    assert len(tasks) == 6 and len({t.id for t in tasks}) == 6
    return tasks


def test_pass_at_k_and_normal_intervals_with_four_samples(monkeypatch, six_tasks):
    # correct samples out of n = 4, per task, in the order of six_tasks
    c = [4, 1, 0, 2, 3, 0]
    by_id = dict(zip((t.id for t in six_tasks), c))
    asked = script_generation(monkeypatch, lambda t, j: j < by_id[t.id])
    cfg = EvalConfig(samples=4, temperature=1.0, k=[1, 2, 4])
    report = evaluate(None, SimpleNamespace(eos_token_id=0), six_tasks, cfg)
    assert len(asked) == 24

    # per task, by hand: pass@1 = c/4; pass@2 = 1 - C(4-c, 2)/C(4, 2) with C(4, 2) = 6:
    # c=4: 1 - 0/6 = 1, c=3: 1 - C(1,2)=0 -> 1, c=2: 1 - 1/6 = 5/6, c=1: 1 - 3/6 = 1/2, c=0: 0;
    # pass@4 = 1 if any sample is right (C(4-c, 4) = 0 unless c = 0)
    p1 = [F(1), F(1, 4), F(0), F(1, 2), F(3, 4), F(0)]
    p2 = [F(1), F(1, 2), F(0), F(5, 6), F(1), F(0)]
    p4 = [F(1), F(1), F(0), F(1), F(1), F(0)]
    # ... and the same from the binomials, independently of rlvr.algos.passk
    assert p2 == [1 - F(math.comb(4 - ci, 2), math.comb(4, 2)) for ci in c]
    assert p4 == [1 - F(math.comb(4 - ci, 4), math.comb(4, 4)) for ci in c]

    def expect(idx):
        per_k = {1: [p1[i] for i in idx], 2: [p2[i] for i in idx], 4: [p4[i] for i in idx]}
        return dict(n_tasks=len(idx), samples=4,
                    passk={k: sum(v) / len(v) for k, v in per_k.items()},
                    ci={k: normal_ci([float(x) for x in v]) for k, v in per_k.items()})

    overall = report["overall"]
    check_stats(overall, **expect(range(6)))
    # the headline values, written out: pass@1 = 2.5/6, pass@2 = (1 + 1/2 + 5/6 + 1)/6 = 5/9, pass@4 = 4/6
    assert overall["pass@1"] == pytest.approx(5 / 12)
    assert overall["pass@2"] == pytest.approx(5 / 9)
    assert overall["pass@4"] == pytest.approx(2 / 3)
    # overall pass@1 interval: mean 5/12, sample std of (1, .25, 0, .5, .75, 0) = sqrt(0.70833/5)
    s = math.sqrt(sum((x - 5 / 12) ** 2 for x in (1, .25, 0, .5, .75, 0)) / 5)
    assert overall["pass@1_ci95"] == pytest.approx([5 / 12 - Z * s / math.sqrt(6), 5 / 12 + Z * s / math.sqrt(6)])
    # pass@4 of (1, 1, 0, 1, 1, 0): the upper bound is clipped to 1 only if the half-width passes 1/3
    assert overall["pass@4_ci95"][1] <= 1.0

    assert list(report["by_domain"]) == ["math.arith", "math.word"]
    arith, word = report["by_domain"]["math.arith"], report["by_domain"]["math.word"]
    check_stats(arith, **expect([0, 1, 2]))
    check_stats(word, **expect([3, 4, 5]))
    assert arith["pass@1"] == pytest.approx(5 / 12) and word["pass@2"] == pytest.approx(11 / 18)
    assert list(arith["by_level"]) == ["1", "2"] and list(word["by_level"]) == ["1", "2"]
    check_stats(arith["by_level"]["1"], **expect([0, 1]))
    check_stats(arith["by_level"]["2"], **expect([2]))
    check_stats(word["by_level"]["1"], **expect([3]))
    check_stats(word["by_level"]["2"], **expect([4, 5]))
    assert arith["by_level"]["1"]["pass@1"] == pytest.approx(5 / 8)
    assert arith["by_level"]["2"]["pass@4_ci95"] == [0.0, 1.0]  # one task: spread unknown
    assert word["by_level"]["2"]["pass@2"] == pytest.approx(1 / 2)

    # the first 8 samples, task-major, as a reader sees them
    assert [s["task_id"] for s in report["samples"]] == [six_tasks[0].id] * 4 + [six_tasks[1].id] * 4
    assert [s["completion"] for s in report["samples"]] == [six_tasks[0].reference] * 4 + \
        [six_tasks[1].reference] + [WRONG] * 3


def test_greedy_pass_at_1_uses_the_wilson_interval(monkeypatch, six_tasks):
    # one sample each; right on tasks 0, 2, 3 (3 of 6)
    right = {six_tasks[i].id for i in (0, 2, 3)}
    script_generation(monkeypatch, lambda t, j: t.id in right)
    report = evaluate(None, SimpleNamespace(eos_token_id=0), six_tasks, EvalConfig(samples=1, k=[1]))
    check_stats(report["overall"], n_tasks=6, samples=1, passk={1: F(1, 2)}, ci={1: wilson(3, 6)})
    arith, word = report["by_domain"]["math.arith"], report["by_domain"]["math.word"]
    check_stats(arith, n_tasks=3, samples=1, passk={1: F(2, 3)}, ci={1: wilson(2, 3)})
    check_stats(word, n_tasks=3, samples=1, passk={1: F(1, 3)}, ci={1: wilson(1, 3)})
    # arith level 1: 1 of 2; level 2: 1 of 1; word level 1: 1 of 1; word level 2: 0 of 2
    check_stats(arith["by_level"]["1"], n_tasks=2, samples=1, passk={1: F(1, 2)}, ci={1: wilson(1, 2)})
    check_stats(arith["by_level"]["2"], n_tasks=1, samples=1, passk={1: F(1)}, ci={1: wilson(1, 1)})
    check_stats(word["by_level"]["2"], n_tasks=2, samples=1, passk={1: F(0)}, ci={1: wilson(0, 2)})
    # closed forms at the edges: 0 of n -> [0, z^2/(n + z^2)]; n of n -> [n/(n + z^2), 1]
    assert word["by_level"]["2"]["pass@1_ci95"] == pytest.approx([0.0, Z**2 / (2 + Z**2)])
    assert arith["by_level"]["2"]["pass@1_ci95"] == pytest.approx([1 / (1 + Z**2), 1.0])


def test_wilson_interval_matches_a_published_value(monkeypatch):
    # 3 of 5: the Wilson 95% interval is (0.2307, 0.8824) (e.g. Newcombe 1998, Table I method 3)
    tasks = generate_tasks(["math.arith"], "eval", 5, seed=7, levels=[1])
    right = {t.id for t in tasks[:3]}
    script_generation(monkeypatch, lambda t, j: t.id in right)
    report = evaluate(None, SimpleNamespace(eos_token_id=0), tasks, EvalConfig(domains=["math.arith"], samples=1))
    assert report["overall"]["pass@1"] == pytest.approx(0.6)
    assert report["overall"]["pass@1_ci95"] == pytest.approx([0.2307, 0.8824], abs=5e-5)


def test_rlvr_eval_writes_the_json_a_user_reads(monkeypatch, tmp_path, tiny_model_dir, capsys):
    """`rlvr eval --out`: arith always right; word level 1 always right; word level 2 right on
    its first sample only (so pass@1 = 1/2 there and pass@2 = 1)."""
    from rlvr.cli import main

    asked = script_generation(monkeypatch, lambda t, j: t.domain == "math.arith" or t.level == 1 or j == 0)
    out = tmp_path / "sub" / "eval.json"
    main(["eval", "--model", tiny_model_dir, "--out", str(out),
          "--set", "domains=[math.arith,math.word]", "--set", "tasks=8", "--set", "levels=[1,2]",
          "--set", "samples=2", "--set", "temperature=1.0", "--set", "k=[1,2]"])
    assert len(asked) == 16
    report = json.loads(out.read_text())
    assert set(report) == {"model", "suite", "fingerprint", "settings", "overall", "by_domain", "tasks", "samples"}
    assert report["model"] == tiny_model_dir
    # every task with its result (rlvr tasks from-failures reads these)
    assert sorted((t["domain"], t["level"], t["correct"]) for t in report["tasks"]) == sorted(
        [("math.arith", 1, 2)] * 2 + [("math.arith", 2, 2)] * 2 + [("math.word", 1, 2)] * 2 + [("math.word", 2, 1)] * 2)
    assert all(t["samples"] == 2 and t["task"]["id"] == t["id"] for t in report["tasks"])
    # 8 tasks: 2 per (domain, level); per-task pass@1 is 1 except word level 2 (1/2): 7/8 overall
    word2 = [1 / 2, 1 / 2]
    check_stats(report["overall"], n_tasks=8, samples=2, passk={1: F(7, 8), 2: F(1)},
                ci={1: normal_ci([1.0] * 6 + word2), 2: [1.0, 1.0]})
    arith, word = report["by_domain"]["math.arith"], report["by_domain"]["math.word"]
    check_stats(arith, n_tasks=4, samples=2, passk={1: F(1), 2: F(1)}, ci={1: [1.0, 1.0], 2: [1.0, 1.0]})
    check_stats(word, n_tasks=4, samples=2, passk={1: F(3, 4), 2: F(1)},
                ci={1: normal_ci([1.0, 1.0, 0.5, 0.5]), 2: [1.0, 1.0]})
    check_stats(word["by_level"]["1"], n_tasks=2, samples=2, passk={1: F(1), 2: F(1)},
                ci={1: [1.0, 1.0], 2: [1.0, 1.0]})
    check_stats(word["by_level"]["2"], n_tasks=2, samples=2, passk={1: F(1, 2), 2: F(1)},
                ci={1: [0.5, 0.5], 2: [1.0, 1.0]})
    assert sorted(arith["by_level"]) == ["1", "2"]
    assert len(report["samples"]) == 8 and all(set(s) == {"task_id", "completion"} for s in report["samples"])
    # what the command prints: a table of pass@k with intervals per domain (and level), then "all"
    printed = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in printed.splitlines() if line.count("│") > 3}
    assert "100.0%" in rows["math.arith"] and "75.0%" in rows["math.word"] and "87.5%" in rows["all"]
    assert "50.0%" in rows["level 2"]
    assert f"wrote {out}\n" in printed and printed.rstrip().endswith(f"wrote {out.with_name('eval_radar.png')}")
