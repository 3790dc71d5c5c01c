"""The reward-learnability check: GRPO on a domain's reference policy with noise (rlvr.audit.learnability)."""

import random
import re

import pytest

import rlvr.tasks  # noqa: F401
from rlvr.audit.learnability import (ARMS, LearnabilityConfig, arms_for, jitter_literals, off_by,
                                     run_learnability)
from rlvr.tasks.base import DOMAINS
from rlvr.types import Spec


@pytest.mark.parametrize("number", ["12382", "53.0", "59.43", "3", "1,204", "-7.5", "0.01"])
def test_off_by_always_moves_the_number_and_keeps_its_decimals(number):
    rng = random.Random(0)
    plain = number.replace(",", "")
    decimals = len(plain.partition(".")[2])
    for rel in (0.01, 0.10):
        for _ in range(20):
            moved = off_by(number, rel, rng)
            assert float(moved) != float(plain)
            assert len(moved.partition(".")[2]) == decimals
            # rel of itself (rounded), or one unit of its last decimal where that rounds back to it
            assert abs(float(moved) - float(plain)) <= max(abs(float(plain)) * rel * 1.01, 10 ** -decimals * 1.01)


def test_jitter_moves_coordinates_but_not_colours_names_or_sizes_below_one():
    svg = '<rect x="42" y="0" width="1" height="34" fill="#a52a2a"/><circle cx="10" cy="10" r="2" fill="#800080"/>'
    rng = random.Random(1)
    seen = set()
    for _ in range(50):
        out = jitter_literals(svg, 3, rng)
        assert 'fill="#a52a2a"' in out and 'fill="#800080"' in out
        width = float(re.search(r'width="([^"]+)"', out).group(1))
        assert width >= 1
        seen.add(out)
    assert len(seen) > 1
    assert jitter_literals(svg, 0, rng) == svg


def test_every_professional_domain_has_arms_the_reference_first():
    for name in ("docs.tables", "render.svg", "cad.shapes", "data.analysis"):
        task = DOMAINS.get(name).generate("train", 1, 0, 0)
        arms = arms_for(task)
        assert arms[0][0] == "reference" and len(arms) >= 4
        assert arms[0][1](task, random.Random(0)) == (list(task.actions) if task.multi_turn else task.reference)
        for _, arm in arms[1:]:  # every noisy arm changes the attempt
            assert arm(task, random.Random(0)) != arms[0][1](task, random.Random(0))


def test_a_kind_without_arms_is_a_clear_error():
    import dataclasses
    task = DOMAINS.get("math.arith").generate("train", 1, 0, 0)
    task = dataclasses.replace(task, spec=Spec("no_such_kind", {}))
    with pytest.raises(ValueError, match="no noise arms for spec kind 'no_such_kind'.*kinds with arms: "):
        arms_for(task)
    assert "number" in ARMS


def test_grpo_on_the_noisy_reference_raises_held_out_pass_at_1_on_docs_tables():
    r = run_learnability(LearnabilityConfig("docs.tables", levels=(1, 2, 3), steps=6, tasks_per_step=4,
                                            samples_per_task=8, eval_tasks=12, start=0.05))
    assert r.arm_pass["reference"] == 1.0
    assert all(r.arm_pass[a] == 0.0 for a in r.arms[1:])  # wrong scale, off by 1%, hedged: never paid
    assert r.pass_before == pytest.approx(0.05, abs=1e-6)
    assert r.pass_after > 0.2 and r.probs_after[0] > r.probs_before[0]
    assert r.curve[-1]["reward"] > r.curve[0]["reward"]


def test_data_analysis_pays_only_the_grounded_deliverable():
    # levels 1 and 4: a number and a result table; the laundered and ungrounded arms earn nothing
    r = run_learnability(LearnabilityConfig("data.analysis", levels=(1, 4), steps=0, eval_tasks=4))
    assert r.arm_pass == {"reference": 1.0, "answer_only": 0.0, "constant_query": 0.0, "off_1pct": 0.0,
                          "off_10pct": 0.0}
    assert r.pass_after == r.pass_before


def test_partial_credit_walks_render_svg_down_the_noise_ladder():
    pytest.importorskip("resvg_py")
    r = run_learnability(LearnabilityConfig("render.svg", levels=(1, 2), steps=6, tasks_per_step=4,
                                            samples_per_task=8, eval_tasks=8, outcome="score", start=0.05))
    assert r.arm_pass["reference"] == 1.0
    after = dict(zip(r.arms, r.probs_after))
    assert after["jitter_12"] < 0.2 and after["recolour"] < 0.2  # the worst drawings lose most
    assert r.pass_after > r.pass_before


def test_the_cli_prints_before_and_after_and_refuses_a_kind_without_arms(tmp_path, capsys):
    import json

    from rlvr.cli import main

    out = tmp_path / "learn.json"
    assert main(["audit", "learnability", "--domains", "docs.tables", "--steps", "4", "--tasks-per-step", "4",
                 "--eval-tasks", "8", "--json", str(out)]) == 0
    assert "docs.tables (binary): held-out pass@1 5.0% -> " in capsys.readouterr().out
    result = json.loads(out.read_text())["domains"][0]
    assert result["pass_after"] > result["pass_before"] and result["arm_pass"]["reference"] == 1.0
    assert main(["audit", "learnability", "--domains", "math.arith"]) == 2
    assert "no noise arms for spec kind" in capsys.readouterr().err
    assert main(["audit", "learnability", "--domains", "docs.tables", "--levels", "9"]) == 2
    assert "docs.tables has levels [1, 2, 3, 4, 5, 6]" in capsys.readouterr().err
    assert main(["audit", "learnability", "--domains", "docs.tables", "--samples", "1"]) == 2
    assert "--samples must be at least 2, got 1" in capsys.readouterr().err  # a group of one has no advantage


def test_the_cli_exits_1_when_pass_at_1_does_not_rise(capsys):
    from rlvr.cli import main

    # the reference almost surely drawn already: every group all right, no advantage, no update
    with pytest.raises(SystemExit) as exit:
        main(["audit", "learnability", "--domains", "docs.tables", "--steps", "1", "--tasks-per-step", "2",
              "--eval-tasks", "4", "--start", "0.999999"])
    assert exit.value.code == 1
    assert "docs.tables: held-out pass@1 did not rise" in capsys.readouterr().err


def test_a_task_file_is_checked_with_every_fifth_row_held_out(tmp_path, capsys):
    import json

    from rlvr.audit.learnability import split_file_tasks
    from rlvr.cli import main

    rows = tmp_path / "sums.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"What is {a} + {a + 7}?", "answer": str(2 * a + 7)}) + "\n"
                            for a in range(100, 130)))
    out = tmp_path / "learn.json"
    assert main(["audit", "learnability", "--tasks", str(rows), "--verifier", "number", "--steps", "6",
                 "--tasks-per-step", "4", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["domains"][0]
    assert result["eval_tasks"] == 6 and result["arm_pass"]["reference"] == 1.0
    assert result["pass_after"] > result["pass_before"]
    assert main(["audit", "learnability", "--tasks", str(rows), "--verifier", "exact"]) == 2
    assert "sums.jsonl: no noise arms for spec kind 'exact'" in capsys.readouterr().err
    assert main(["audit", "learnability"]) == 2
    assert "nothing to check" in capsys.readouterr().err
    train, held_out = split_file_tasks(list(range(12)), 40)  # rows as they come: 0, 5, 10 held out
    assert held_out == [0, 5, 10] and 5 not in train and len(train) == 9
