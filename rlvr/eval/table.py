"""The eval report as a person reads it: pass@k with 95% intervals by domain, level and tag."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _pct(stats: dict, k: str) -> str:
    lo, hi = stats[f"{k}_ci95"]
    return f"{100 * stats[k]:.1f}% [{100 * lo:.0f}-{100 * hi:.0f}]"


def print_eval(report: dict, console: Console | None = None) -> None:
    console = console or Console()
    ks = [key for key in report["overall"] if key.startswith("pass@") and not key.endswith("_ci95")]
    if report.get("model"):
        console.print(f"model: {report['model']}")
    table = Table(title="pass@k by domain, level and tag")
    table.add_column("group")
    table.add_column("tasks", justify="right")
    for k in ks:
        table.add_column(f"{k} [95% CI]", justify="right")

    def row(name: str, stats: dict, style: str | None = None) -> None:
        table.add_row(name, str(stats["n_tasks"]), *(_pct(stats, k) for k in ks), style=style)

    for domain, stats in report["by_domain"].items():
        row(domain, stats)
        levels = stats.get("by_level", {})
        if len(levels) > 1:
            for level, s in levels.items():
                row(f"  level {level}", s, "dim")
    for tag, stats in report.get("by_tag", {}).items():
        row(f"tag {tag}", stats)
    row("all", report["overall"], "bold")
    console.print(table)
