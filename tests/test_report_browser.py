"""The run report in a real headless Chromium (issue 31, acceptance 4): the page renders without
console errors and without fetching anything, the curves and a trajectory are visible, model text
does not run as script, an alert's link scrolls to its trajectory, and a screenshot is written.

Chromium is the system one (`make test` installs Debian's package as root; playwright drives it,
no browser download). Without it the test skips saying why; with RLVR_REQUIRE_BROWSER=1 (`.ci/run`)
the skip is a failure. The screenshot goes to the test's tmp_path and to
runs/test-artifacts/report.png; its path is printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from rlvr.report import write_report
from test_report import make_run  # the synthetic run of tests/test_report.py

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "runs" / "test-artifacts"


def _browser_or_skip():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "the playwright package is not installed (pip install -e '.[dev]')"
    else:
        if Path(CHROMIUM).is_file():
            return sync_playwright
        missing = f"no Chromium at {CHROMIUM} (`make browser` installs Debian's chromium as root)"
    if os.environ.get("RLVR_REQUIRE_BROWSER", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"RLVR_REQUIRE_BROWSER is set but {missing}")
    pytest.skip(f"report browser test: {missing}")


@contextlib.contextmanager
def opened(report: Path, errors: list[str], requests: list[str]):
    """The report loaded in headless Chromium; console errors and page errors go to ``errors``,
    every URL the page asks for to ``requests``."""
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda req: requests.append(req.url))
            page.goto(report.as_uri(), wait_until="load")
            yield page
        finally:
            browser.close()


def test_the_report_renders_in_chromium_with_curves_and_a_trajectory(tmp_path):
    report = write_report(make_run(tmp_path))
    errors: list[str] = []
    requests: list[str] = []
    with opened(report, errors, requests) as page:
        assert errors == []
        assert [u for u in requests if not u.startswith(("file:", "data:"))] == []  # nothing fetched
        assert page.evaluate("typeof window.__pwned") == "undefined"  # the completion's <script>/onerror
        for chart in ("#chart-reward", "#chart-pass-rate", "#chart-eval", "#radar"):
            figure = page.locator(chart)
            assert figure.is_visible(), chart
            box = figure.bounding_box()
            assert box["width"] > 200 and box["height"] > 150, (chart, box)
            line = figure.locator("polyline, polygon").last.bounding_box()
            assert line["width"] > 0 and line["height"] > 0, chart
        assert page.locator("#chart-pass-rate polyline").count() == 4  # overall + 3 domains

        trajectory = page.locator("#traj-5-1")  # in the last step, open by default
        assert trajectory.is_visible() and trajectory.bounding_box()["height"] > 100
        assert "Compute: 2 + 2" in trajectory.inner_text()
        page.locator('#alerts table.alerts:not(.groups) a[href="#traj-5-0"]').click()  # the per-alert table's link
        assert page.evaluate("location.hash") == "#traj-5-0"
        top = page.evaluate("document.getElementById('traj-5-0').getBoundingClientRect().top")
        header = page.evaluate("document.querySelector('header.top').getBoundingClientRect().bottom")
        assert header <= top < 900  # scrolled into view, below the sticky header

        page.evaluate("window.scrollTo(0, 0)")
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
    assert errors == []
    assert shot.read_bytes()[:4] == b"\x89PNG"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report.png")
    print(f"screenshot: {shot} (copy: {ARTIFACTS / 'report.png'})")


@pytest.mark.parametrize("required", ["", "1"])
def test_a_missing_browser_skips_saying_why_or_fails_where_ci_requires_it(monkeypatch, required):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("RLVR_REQUIRE_BROWSER", required)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match="no Chromium at /nonexistent/chromium"):
        _browser_or_skip()


def test_the_report_of_a_real_tiny_run_renders_with_its_curves_and_trajectories(tmp_path):
    """The report a real run wrote (the quickstart at toy budgets: pretrain, SFT, GRPO with
    trajectories kept every step, evals), not a hand-made directory: no console error, nothing
    fetched, the reward curve drawn through every logged step, the kept trajectories on the page."""
    _browser_or_skip()  # before the run, not after
    import json

    from rlvr.config import load_config
    from rlvr.train.quickstart import QuickstartConfig, run_quickstart
    from test_quickstart import TOY

    cfg = load_config(QuickstartConfig, None, TOY + [f"out={tmp_path}/qs", "grpo.steps=4",
                                                     "grpo.save_trajectories_every=1"])
    run_quickstart(cfg)
    report = tmp_path / "qs" / "report.html"
    steps = [json.loads(line)["step"] for line in (tmp_path / "qs" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    errors: list[str] = []
    requests: list[str] = []
    with opened(report, errors, requests) as page:
        assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
        chart = page.locator("#chart-reward")
        assert chart.is_visible() and chart.bounding_box()["width"] > 200
        points = page.evaluate("document.querySelector('#chart-reward polyline').getAttribute('points')")
        xs = [float(p.split(",")[0]) for p in points.split()]
        assert len(xs) == len(steps) and xs == sorted(xs) and xs[-1] - xs[0] > 100, points  # a point a step
        kept = page.locator("[id^='traj-']")
        assert kept.count() == len(steps)  # the trajectories kept at every step
        newest = kept.last
        assert newest.is_visible() and newest.bounding_box()["height"] > 50  # the newest step is open
    assert errors == []
