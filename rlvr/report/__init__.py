"""``rlvr report RUN_DIR``: one self-contained ``report.html`` of a run, readable offline.

``build`` reads the run directory (config, metrics, evals, alerts, trajectory samples; a crashed
run's leftovers too), ``charts`` draws the SVG curves and radar, ``conversation`` renders a
trajectory, ``html`` lays out the page. See docs/report.md.
"""

from __future__ import annotations

from pathlib import Path


def write_report(run_dir: str | Path, out: str | Path | None = None, *, error: str | None = None,
                 per_step: int = 4) -> Path:
    """Write the report of ``run_dir`` (default ``<run_dir>/report.html``) and return its path.
    ``error``: what stopped the run, when the caller knows (shown in the summary)."""
    from rlvr.report.build import read_run
    from rlvr.report.html import render

    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    page = render(read_run(run_dir, error=error), per_step=per_step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
