"""`rlvr report`: the builder over a synthetic run directory (finished, crashed, quickstart), the
escaping of model text, alert links, code.repair diffs and the CLI's errors.

``make_run`` is shared with tests/test_report_browser.py, which renders the same run in Chromium.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.report import write_report
from rlvr.report.build import read_run, select_trajectories
from rlvr.report.charts import line_chart, ticks
from rlvr.report.html import alerts

DOMAINS = ["code.repair", "math.arith", "math.word"]
SCRIPT = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"
OPS = "def add(a, b):\n    return a - b\n"


def _eval_report(step: int) -> dict:
    def stats(p: float, n: int = 20) -> dict:
        return {"n_tasks": n, "samples": 1, "pass@1": p, "pass@1_ci95": [max(0.0, p - 0.2), min(1.0, p + 0.2)]}

    by_domain = {d: {**stats(0.1 * i + 0.05 * step), "by_level": {"1": stats(0.5, 10), "2": stats(0.1 * i, 10)}}
                 for i, d in enumerate(DOMAINS)}
    return {"overall": stats(0.3 + 0.01 * step, 60), "by_domain": by_domain}


def _repair_episode() -> list[dict]:
    call = lambda name, **args: {"role": "assistant", "content": f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"}  # noqa: E731
    return [
        {"role": "system", "content": "You repair Python projects. Tools: read_file, replace, write_file, submit."},
        {"role": "user", "content": "The tests of ops.py fail. Fix the project."},
        call("read_file", path="ops.py"), {"role": "tool", "name": "read_file", "content": OPS},
        call("replace", path="ops.py", old="return a - b", new="return a + b"),
        {"role": "tool", "name": "replace", "content": "ok"},
        call("write_file", path="notes.txt", content="fixed the sign\n"),
        {"role": "tool", "name": "write_file", "content": "ok"},
        call("submit"), {"role": "tool", "name": "submit", "content": "ok"},
    ]


def make_run(root: Path, *, steps: int = 6) -> Path:
    """A finished GRPO run directory of ``steps`` steps, as ``rlvr train`` leaves it."""
    run = root / "run"
    (run / "final").mkdir(parents=True)
    (run / "config.yaml").write_text(f"out: {run}\nsteps: {steps}\ndomains: [{', '.join(DOMAINS)}]\n")
    lines = []
    for step in range(1, steps + 1):
        m = {"step": step, "rollout/reward_mean": 0.1 * step, "rollout/pass_rate": 0.08 * step,
             "rollout/reward_outcome": 0.1 * step, "rollout/reward_format": 0.01,
             "rollout/response_tokens_mean": 20 + step, "train/kl": 0.001 * step,
             "time/wait": 2.0, "time/rollout": 1.9, "time/update": 1.0,
             "rollout/logprob_mismatch_kl": float("nan") if step == 2 else 1e-6,
             **{f"rollout/pass_rate/{d}": 0.05 * step + 0.1 * i for i, d in enumerate(DOMAINS)},
             "monitor/flagged/reward_hacking": float(step == 5), "monitor/eligible/reward_hacking": 10.0,
             "monitor/rate/reward_hacking": 0.1 * (step == 5)}
        if step % 3 == 0:
            report = _eval_report(step)
            (run / "eval").mkdir(exist_ok=True)
            (run / "eval" / f"step_{step}.json").write_text(json.dumps(report))
            m["eval/pass@1"] = report["overall"]["pass@1"]
            m.update({f"eval/pass@1/{d}": s["pass@1"] for d, s in report["by_domain"].items()})
        lines.append(json.dumps(m))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "alerts.jsonl").write_text(json.dumps(
        {"step": 5, "detector": "reward_hacking", "severity": "critical", "domain": "code.repair",
         "evidence": {"passed_without_tests": 1}, "trajectory_ids": ["5-0", "5-9"], "action": "logged"}) + "\n")
    samples = [
        {"id": "5-0", "step": 5, "index": 0, "task_id": "code.repair/v1/train/2/000007", "domain": "code.repair",
         "level": 2, "group_id": 0, "prompt": _repair_episode()[:2], "completion": "<tool_call>...</tool_call>",
         "messages": _repair_episode(), "info": {"env": "code.repair", "finish": "submit", "turns": 4},
         "finish_reason": "stop", "reward": 1.0, "terms": {"outcome": 1.0, "format": 0.0},
         "verdict": {"passed": True, "score": 1.0, "reason": "ok", "details": {"tests_passed": 3}},
         "flags": [{"detector": "reward_hacking", "severity": "critical", "note": "passed without running tests"}],
         "kept": "flagged"},
        {"id": "5-1", "step": 5, "index": 1, "task_id": "math.arith/v1/train/1/000003", "domain": "math.arith",
         "level": 1, "group_id": 1, "prompt": [{"role": "user", "content": "Compute: 2 + 2"}],
         "completion": "The answer is 4. " + SCRIPT + "\n```python\nprint(2 + 2)\n```", "finish_reason": "stop",
         "reward": 0.0, "terms": {"outcome": 0.0}, "verdict": {"passed": False, "score": 0.0, "reason": "mismatch",
                                                                "details": {"expected": "4", "got": SCRIPT}},
         "flags": [], "kept": "sampled"},
    ]
    older = {"task_id": "math.word/v1/train/3/000042", "completion": "x = 3", "finish_reason": "length",
             "reward": 0.5, "terms": {"outcome": 0.5}, "verdict": {"passed": False, "score": 0.5, "reason": "no_answer"}}
    (run / "trajectories").mkdir()
    (run / "trajectories" / "step_5.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run / "trajectories" / "step_3.jsonl").write_text(json.dumps(older) + "\n" + '{"task_id": "cut by a cra\n')
    return run


def test_a_finished_run_reports_curves_evals_alerts_and_trajectories(tmp_path):
    run = make_run(tmp_path)
    data = read_run(run)
    assert (data.kind, data.status.state, data.status.step, data.status.steps) == ("grpo", "finished", 6, 6)
    assert data.skipped_lines == 1  # the half-written line
    html = write_report(run).read_text()
    for chart in ("chart-reward", "chart-pass-rate", "chart-eval", "chart-length", "chart-kl", "radar"):
        assert f'id="{chart}"' in html
    assert 'id="chart-signal"' not in html  # no entropy or group std logged: no empty chart
    for d in DOMAINS:  # per-domain pass-rate and eval curves, and eval table rows
        assert html.count(f">{d} <b>") == 2 and f"<th>{d}</th>" in html
    assert "<th>step 3</th><th>step 6</th>" in html and "level 2" in html
    assert "term outcome" in html and "term format" in html
    assert "0.3 min (the steps' logged phases)" in html  # wait + update; rollout ran inside wait
    assert "<script" not in html.lower() and "badge crashed" not in html


def test_model_text_is_escaped_never_markup(tmp_path):
    html = write_report(make_run(tmp_path)).read_text()
    assert "<script" not in html.lower() and "<img src=x" not in html
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html
    assert 'onerror=&quot;window.__pwned = 2&quot;' in html


def test_a_huge_completion_is_cut_saying_so(tmp_path):
    run = make_run(tmp_path)
    row = {"task_id": "math.arith/v1/train/1/000001", "completion": "7" * 50_000}
    (run / "trajectories" / "step_6.jsonl").write_text(json.dumps(row) + "\n")
    html = write_report(run).read_text()
    assert "7" * 20_000 + "\n[... 30000 more characters not shown]" in html and "7" * 20_001 not in html


def test_alerts_link_to_kept_trajectories_and_name_the_missing_ones(tmp_path):
    html = write_report(make_run(tmp_path)).read_text()
    assert '<a href="#traj-5-0">5-0</a>' in html and 'id="traj-5-0"' in html
    assert "5-9 (not kept)" in html
    assert html.index("<h3>Flagged (1)</h3>") < html.index('id="traj-5-0"') < html.index('id="traj-5-1"')
    assert "passed without running tests" in html


def test_alerts_are_grouped_by_detector_with_a_trend_and_readable_evidence(tmp_path):
    run = make_run(tmp_path)
    with (run / "alerts.jsonl").open("a") as f:
        for step in (2, 4):
            f.write(json.dumps({"step": step, "detector": "entropy_collapse", "severity": "warning",
                                "evidence": {"entropy": 0.02712345, "start": 0.1362, "min_entropy": 0.03},
                                "trajectory_ids": [], "action": "logged"}) + "\n")
    html = write_report(run).read_text()
    groups = html[html.index("<table class='alerts groups'>"):html.index("<h3>Every alert</h3>")]
    # one row per detector, by first step: severity, alerts, first and last step, where, samples flagged
    assert groups.index("entropy_collapse") < groups.index("reward_hacking")
    assert "<td>entropy_collapse</td><td>warning</td><td>2</td><td>2</td><td>4</td><td>—</td><td>—</td><td>—</td>" in groups
    assert ("<td>reward_hacking</td><td>critical</td><td>1</td><td>5</td><td>5</td><td>code.repair</td><td>1</td>"
            '<td><a href="#traj-5-0">5-0</a> <span class="muted">passed without running tests</span></td>') in groups
    assert 'id="chart-flagged"' in groups and "reward_hacking" in groups
    assert "entropy 0.02712, start 0.1362, min entropy 0.03" in html  # not a Python dict repr
    assert "{&#x27;" not in html and "passed without tests 1" in html


def test_code_repair_changes_are_diffs_against_the_file_the_episode_read(tmp_path):
    html = write_report(make_run(tmp_path)).read_text()
    assert '<span class="del">-    return a - b</span>' in html
    assert '<span class="add">+    return a + b</span>' in html
    assert "not read earlier in the episode: the whole written text" in html  # notes.txt
    assert '<span class="add">+fixed the sign</span>' in html
    assert "files changed over the episode" in html
    assert "call <b>read_file</b>" in html and "tool result: read_file" in html


def test_an_episode_that_changes_a_file_twice_shows_the_net_diff(tmp_path):
    from rlvr.report.conversation import file_changes

    messages = _repair_episode()[:6] + [
        {"role": "assistant", "content": '<tool_call>{"name": "replace", "arguments": {"path": "ops.py", '
                                         '"old": "a + b", "new": "b + a"}}</tool_call>'},
        {"role": "tool", "name": "replace", "content": "ok"},
        {"role": "assistant", "content": '<tool_call>{"name": "replace", "arguments": {"path": "ops.py", '
                                         '"old": "b + a", "new": "b * a"}}</tool_call>'},
        {"role": "tool", "name": "replace", "content": "error: old text not found in ops.py"},
    ]
    per_call, net = file_changes(messages)
    assert sorted(per_call) == [4, 6, 8]  # every change asked for, the refused one too
    assert net == {"ops.py": (OPS, "def add(a, b):\n    return b + a\n")}  # what the accepted ones did


def test_older_lines_get_an_id_domain_and_level_from_their_task_id(tmp_path):
    data = read_run(make_run(tmp_path))
    old = next(t for t in data.trajectories if t["step"] == 3)
    assert (old["id"], old["domain"], old["level"], old["kept"], old["flags"]) == ("3-0", "math.word", 3, "sampled", [])
    assert 'id="traj-3-0"' in write_report(make_run(tmp_path / "again")).read_text()


def test_a_crashed_run_says_where_it_stopped(tmp_path):
    run = make_run(tmp_path)
    shutil.rmtree(run / "final")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:4]) + "\n")
    status = read_run(run).status
    assert (status.state, status.step) == ("crashed", 4)
    assert "no final/ model" in status.note and "metrics stop at step 4 of 6" in status.note
    html = write_report(run).read_text()
    assert '<span class="badge crashed">crashed</span> crashed at step 4' in html


def test_a_run_a_detector_stopped_says_which(tmp_path):
    run = make_run(tmp_path)
    shutil.rmtree(run / "final")
    with (run / "alerts.jsonl").open("a") as f:
        f.write(json.dumps({"step": 6, "detector": "tampering", "severity": "critical", "evidence": {},
                            "trajectory_ids": [], "action": "stopped"}) + "\n")
    status = read_run(run).status
    assert status.state == "stopped"
    assert status.note == "stopped at step 6 by detector 'tampering' (its alert at step 6): no final/ model"


def test_a_quickstart_directory_reports_its_stage_evals_or_where_it_stopped(tmp_path):
    qs = tmp_path / "qs"
    qs.mkdir()
    (qs / "config.yaml").write_text("out: qs\npretrain: {steps: 8}\ngrpo: {steps: 6}\nstages: [sft, grpo]\n")
    status = read_run(qs, error="stopped by RuntimeError: boom").status
    assert status.state == "crashed" and status.note.startswith("crashed before GRPO started: stopped by RuntimeError")
    run = make_run(tmp_path)
    run.rename(qs / "grpo")
    (qs / "eval").mkdir()
    for name in ("sft", "rl"):
        (qs / "eval" / f"{name}.json").write_text(json.dumps(_eval_report(1 if name == "sft" else 6)))
    (qs / "report.json").write_text(json.dumps({"summary": "held-out greedy pass@1: SFT 31.0% -> GRPO 36.0%"}))
    data = read_run(qs)
    assert (data.kind, data.status.state, list(data.evals)) == ("quickstart", "finished", ["SFT", "after GRPO"])
    html = write_report(qs).read_text()
    assert "<th>SFT</th><th>after GRPO</th>" in html and "SFT 31.0% -&gt; GRPO 36.0%" in html


def test_each_step_shows_a_few_samples_of_different_tasks(tmp_path):
    run = make_run(tmp_path)
    rows = [{"task_id": f"math.arith/v1/train/1/{i // 4:06d}", "completion": str(i), "reward": 0.0} for i in range(12)]
    (run / "trajectories" / "step_6.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    flagged, by_step = select_trajectories(read_run(run), per_step=3)
    assert [t["id"] for t in flagged] == ["5-0"]  # flagged and linked from the alert
    assert [t["completion"] for t in by_step[6]] == ["0", "4", "8"]  # one of each task first


def test_flagged_samples_past_the_limit_are_named_not_shown_and_alert_links_come_first(tmp_path):
    run = make_run(tmp_path)
    flag = [{"detector": "length", "severity": "warning", "note": "long"}]
    rows = [{"id": f"6-{i}", "task_id": "math.arith/v1/train/1/000001", "completion": "", "flags": flag}
            for i in range(5)]
    (run / "trajectories" / "step_6.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with (run / "alerts.jsonl").open("a") as f:
        f.write(json.dumps({"step": 6, "detector": "length", "severity": "warning", "evidence": {},
                            "trajectory_ids": ["6-4", "6-3", "6-1"], "action": "logged"}) + "\n")
    data = read_run(run)
    flagged, _ = select_trajectories(data, max_flagged=3, per_step=0)
    assert [t["id"] for t in flagged] == ["5-0", "6-1", "6-3"]
    table = alerts(data, {t["id"] for t in flagged})
    assert '<a href="#traj-6-3">6-3</a>' in table and "5-9 (not kept)" in table
    assert "6-4 (not shown: past the report's limit)" in table



def test_charts_skip_empty_series_and_choose_round_ticks():
    assert line_chart("c", "empty", {"a": []}) is None
    assert ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    svg = line_chart("c", "one point", {"x<y": [(3.0, 0.5)]})
    assert "<circle" in svg and "x&lt;y" in svg


def test_cli_writes_the_report_and_refuses_what_is_not_a_run(tmp_path, capsys):
    run = make_run(tmp_path)
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'r.html'}"
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == f"rlvr: error: {tmp_path / 'missing'}: no such run directory"
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["report", str(run), "--per-step", "-1"]) == 2


def _quickstart(tmp_path: Path, monkeypatch, stages) -> tuple[Path, str]:
    """run_quickstart with its stages replaced by ``stages(out)``: (out, what it printed)."""
    import io

    from rich.console import Console

    import rlvr.train.quickstart as qs
    from rlvr.config import load_config

    out = tmp_path / "qs"
    monkeypatch.setattr(qs, "run_stages", lambda cfg, out, device, **kw: stages(out))
    console = Console(file=io.StringIO(), width=300)
    try:
        qs.run_quickstart(load_config(qs.QuickstartConfig, None, [f"out={out}"]), console=console)
    finally:
        printed = console.file.getvalue()
    return out, printed


def test_the_quickstart_writes_its_report_and_prints_the_path(tmp_path, monkeypatch):
    def stages(out: Path) -> dict:
        make_run(out).rename(out / "grpo")
        (out / "report.json").write_text("{}")
        return {}

    out, printed = _quickstart(tmp_path, monkeypatch, stages)
    assert f"report: {out / 'report.html'}" in printed
    assert '<span class="badge finished">' in (out / "report.html").read_text()


def test_a_crashed_quickstart_still_gets_a_report_saying_so(tmp_path, monkeypatch):
    def stages(out: Path) -> dict:
        run = make_run(out)
        shutil.rmtree(run / "final")
        run.rename(out / "grpo")
        raise RuntimeError("CUDA error: an illegal memory access")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        _quickstart(tmp_path, monkeypatch, stages)
    html = (tmp_path / "qs" / "report.html").read_text()
    assert "crashed at step 6: stopped by RuntimeError: CUDA error: an illegal memory access; no final/ model" in html
