"""The regression gate: ``rlvr.eval.gate.compare`` on hand-written reports, and its exit codes
through ``rlvr eval compare`` and ``rlvr eval --baseline --gate`` (0 pass, 1 regression, 2 other
task set)."""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main
from rlvr.errors import UserError
from rlvr.eval.gate import compare


def report(values: dict[str, float], *, fp: str = "abc", n: int = 500, ci: float = 0.04, **extra) -> dict:
    """An eval report with ``pass@1`` per domain (and the mean as ``overall``)."""
    def stats(v: float) -> dict:
        return {"n_tasks": n, "samples": 1, "pass@1": v, "pass@1_ci95": [max(0.0, v - ci), min(1.0, v + ci)]}

    return {"suite": {"name": "s", "version": "v1"}, "fingerprint": fp,
            "overall": stats(sum(values.values()) / len(values)),
            "by_domain": {d: stats(v) for d, v in values.items()}, **extra}


def test_a_drop_within_the_tolerance_passes_and_one_beyond_fails():
    base = report({"math.arith": 0.80, "math.word": 0.60, "code.gen": 0.50})
    result = compare(base, report({"math.arith": 0.79, "math.word": 0.62, "code.gen": 0.45}), tolerance=2.0)
    assert result.same_suite and not result.passed
    assert [c.domain for c in result.regressions] == ["code.gen"]
    by = {c.domain: c for c in result.domains}
    assert by["math.arith"].change == pytest.approx(-1.0) and by["math.word"].change == pytest.approx(2.0)
    assert by["code.gen"].change == pytest.approx(-5.0)
    assert result.regression_lines() == ["code.gen: pass@1 50.0% -> 45.0% (-5.0 pts; tolerance 2)"]
    assert compare(base, report({"math.arith": 0.79, "math.word": 0.62, "code.gen": 0.45}), tolerance=5.0).passed


def test_a_drop_of_exactly_the_tolerance_passes():
    result = compare(report({"a": 0.50}), report({"a": 0.48}), tolerance=2.0)
    assert result.domains[0].change == pytest.approx(-2.0) and result.passed


def test_beyond_ci_says_whether_the_95_percent_intervals_are_apart():
    result = compare(report({"a": 0.50, "b": 0.50}), report({"a": 0.45, "b": 0.30}))
    by = {c.domain: c for c in result.domains}
    assert by["a"].beyond_ci is False  # [0.46, 0.54] and [0.41, 0.49] overlap: inside the noise
    assert by["b"].beyond_ci is True and by["a"].regressed(2.0) and by["b"].regressed(2.0)


def test_a_domain_in_one_report_only_is_shown_not_gated():
    result = compare(report({"a": 0.5, "b": 0.5}), report({"a": 0.5, "c": 0.1}))
    by = {c.domain: c for c in result.domains}
    assert by["b"].now is None and by["c"].baseline is None and by["b"].change is None
    assert result.passed


def test_fingerprints_decide_whether_the_reports_share_a_task_set():
    assert not compare(report({"a": 0.5}, fp="x"), report({"a": 0.5}, fp="y")).same_suite
    # a report written without a fingerprint gets one from its task list
    tasks = [{"id": "t1", "task": {"key": "1+1"}}, {"id": "t2", "task": {"key": "2+2"}}]
    old = {k: v for k, v in report({"a": 0.5}, tasks=tasks).items() if k != "fingerprint"}
    from rlvr.eval.suites import report_fingerprint

    new = report({"a": 0.5}, fp=report_fingerprint(old), tasks=list(reversed(tasks)))
    assert compare(old, new).same_suite
    assert not compare({k: v for k, v in report({"a": 0.5}).items() if k != "fingerprint"}, new).same_suite


def test_different_decoding_settings_are_noted():
    base = report({"a": 0.5}, settings={"samples": 1, "temperature": 0.0})
    result = compare(base, report({"a": 0.5}, settings={"samples": 8, "temperature": 0.0}))
    assert result.setting_differences == ("samples: 1 -> 8",)


def test_reports_that_cannot_be_compared_are_user_errors():
    with pytest.raises(UserError, match="baseline report is not an `rlvr eval` result"):
        compare({"x": 1}, report({"a": 0.5}))
    with pytest.raises(UserError, match="current report has no pass@8; it has: pass@1"):
        with_pass8 = report({"a": 0.5})
        with_pass8["overall"]["pass@8"] = 0.9
        compare(with_pass8, report({"a": 0.5}), metric="pass@8")
    with pytest.raises(UserError, match="tolerance"):
        compare(report({"a": 0.5}), report({"a": 0.5}), tolerance=-1)


def write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_compare_command_exit_codes(tmp_path, capsys):
    base = write(tmp_path / "base.json", report({"math.arith": 0.8, "math.word": 0.6}))
    same = write(tmp_path / "same.json", report({"math.arith": 0.79, "math.word": 0.65}))
    worse = write(tmp_path / "worse.json", report({"math.arith": 0.70, "math.word": 0.50}))
    other = write(tmp_path / "other.json", report({"math.arith": 0.8, "math.word": 0.6}, fp="zzz"))

    assert main(["eval", "compare", base, same, "--gate"]) == 0
    out = capsys.readouterr().out
    assert "math.arith" in out and "-1.0 pts" in out and "gate passed" in out

    assert main(["eval", "compare", base, worse]) == 0  # without --gate: the table only
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "compare", base, worse, "--gate"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["rlvr: regression: math.arith: pass@1 80.0% -> 70.0% (-10.0 pts; tolerance 2)",
                   "rlvr: regression: math.word: pass@1 60.0% -> 50.0% (-10.0 pts; tolerance 2)"]
    assert main(["eval", "compare", base, worse, "--gate", "--tolerance", "10"]) == 0

    assert main(["eval", "compare", base, other, "--gate"]) == 2
    err = capsys.readouterr().err
    assert "different task sets" in err and "--allow-different-suite" in err
    assert main(["eval", "compare", base, other, "--gate", "--allow-different-suite"]) == 0

    assert main(["eval", "compare", base, str(tmp_path / "missing.json")]) == 2
    assert "not a readable eval result" in capsys.readouterr().err


def test_compare_command_draws_both_reports_radar(tmp_path):
    from matplotlib.image import imread

    base = write(tmp_path / "base.json", report({"a": 0.8, "b": 0.6, "c": 0.3}))
    now = write(tmp_path / "now.json", report({"a": 0.7, "b": 0.7, "c": 0.4}))
    assert main(["eval", "compare", base, now, "--radar", str(tmp_path / "radar.png")]) == 0
    assert imread(tmp_path / "radar.png").ndim == 3


def test_eval_refuses_a_baseline_of_another_task_set_before_loading_the_model(tmp_path, capsys):
    base = write(tmp_path / "base.json", report({"math.arith": 0.8}, fp="not-this-suite"))
    code = main(["eval", "--model", str(tmp_path / "no-such-model"), "--baseline", base, "--gate",
                 "--set", "tasks=4", "--out", str(tmp_path / "eval.json")])
    assert code == 2 and "measured on another task set" in capsys.readouterr().err
    assert not (tmp_path / "eval.json").exists()


def test_eval_with_a_baseline_gates_the_new_report(tiny_model_dir, tmp_path, capsys):
    from rlvr.eval.suites import SUITES, fingerprint
    from rlvr.tasks.sets import build_task_set

    fields = {**SUITES.get("default").eval_fields(), "tasks": 4, "levels": [1]}
    tasks = build_task_set(fields["domains"], "eval", 4, seed=fields["seed"], levels=[1])
    args = ["eval", "--model", tiny_model_dir, "--set", "tasks=4", "--set", "levels=[1]",
            "--set", "max_new_tokens=4", "--no-radar", "--gate"]
    perfect = write(tmp_path / "perfect.json", report({"math.arith": 1.0, "math.word": 1.0}, fp=fingerprint(tasks)))
    with pytest.raises(SystemExit) as exit_:  # a random tiny model cannot match 100%
        main([*args, "--baseline", perfect, "--out", str(tmp_path / "a.json")])
    assert exit_.value.code == 1 and "rlvr: regression: math.arith" in capsys.readouterr().err
    zero = write(tmp_path / "zero.json", report({"math.arith": 0.0, "math.word": 0.0}, fp=fingerprint(tasks)))
    assert main([*args, "--baseline", zero, "--out", str(tmp_path / "b.json")]) == 0
    assert "gate passed" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text())["fingerprint"] == fingerprint(tasks)
