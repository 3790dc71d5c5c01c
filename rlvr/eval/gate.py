"""The regression gate: one eval report against a baseline report, per domain, as plain data.

``compare(baseline, now)`` reads two ``rlvr eval`` reports (dicts, as written to JSON) and
returns a ``GateResult``: for each domain the baseline's and the current value of ``metric``
(pass@1 unless asked otherwise), the change in points, and whether the change lies outside the
noise of the two 95% intervals. A domain *regresses* when it drops by more than ``tolerance``
points (``now < baseline - tolerance``); the gate passes when none does. The tolerance is the
rule; the interval column is information (``beyond_ci``: the two reports' 95% intervals do not
overlap, a conservative sign that the change is not task-sampling noise; a 500-task domain at 50%
has an interval of about +-4.4 points, so a 2-point gate also fails on drops inside the noise;
widen the tolerance or the suite, not the rule, when that bites).

Both reports must have been measured on the same tasks: ``same_suite`` compares their
fingerprints (``rlvr.eval.suites``); the CLI refuses a different suite unless told otherwise.
Nothing here runs a model or reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.errors import UserError
from rlvr.eval.suites import report_fingerprint

DEFAULT_TOLERANCE = 2.0
"""Points of per-domain drop the gate accepts."""
SETTINGS_COMPARED = ("samples", "temperature", "max_new_tokens", "k", "precision")


@dataclass(frozen=True)
class Change:
    """One domain (or ``all``): values in [0, 1], ``change`` in points (now - baseline)."""

    domain: str
    baseline: float | None
    now: float | None
    baseline_ci: tuple[float, float] | None = None
    now_ci: tuple[float, float] | None = None
    n_baseline: int = 0
    n_now: int = 0

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.now is None:
            return None
        return 100.0 * (self.now - self.baseline)

    @property
    def beyond_ci(self) -> bool | None:
        """True when the two 95% intervals do not overlap; None when one is unknown."""
        if self.baseline_ci is None or self.now_ci is None:
            return None
        return self.now_ci[0] > self.baseline_ci[1] or self.now_ci[1] < self.baseline_ci[0]

    def regressed(self, tolerance: float) -> bool:
        return self.change is not None and -self.change > tolerance + 1e-9


@dataclass(frozen=True)
class GateResult:
    metric: str
    tolerance: float
    domains: tuple[Change, ...]
    """Every domain of either report, sorted; one present in only one report has ``None`` on the other side."""
    overall: Change
    baseline_fingerprint: str | None
    now_fingerprint: str | None
    baseline_suite: dict = field(default_factory=dict)
    now_suite: dict = field(default_factory=dict)
    setting_differences: tuple[str, ...] = ()
    """Decoding settings recorded differently in the two reports (``key: baseline -> now``)."""

    @property
    def same_suite(self) -> bool:
        """Both fingerprints known and equal."""
        return self.baseline_fingerprint is not None and self.baseline_fingerprint == self.now_fingerprint

    @property
    def regressions(self) -> tuple[Change, ...]:
        """Domains that dropped by more than ``tolerance`` points (``all`` is shown, not gated)."""
        return tuple(c for c in self.domains if c.regressed(self.tolerance))

    @property
    def passed(self) -> bool:
        return not self.regressions

    def regression_lines(self) -> list[str]:
        return [f"{c.domain}: {self.metric} {100 * c.baseline:.1f}% -> {100 * c.now:.1f}% "
                f"({c.change:+.1f} pts; tolerance {self.tolerance:g})" for c in self.regressions]

    def suite_line(self) -> str:
        """Why the suites differ, in one line."""
        def name(suite: dict, fp: str | None) -> str:
            label = f"{suite.get('name', '?')} {suite.get('version', '')}".strip() if suite else "no suite recorded"
            return f"{label}, fingerprint {fp[:12] if fp else 'unknown'}"

        return (f"the reports were measured on different task sets (baseline: "
                f"{name(self.baseline_suite, self.baseline_fingerprint)}; now: "
                f"{name(self.now_suite, self.now_fingerprint)})")


def _change(domain: str, base: dict | None, now: dict | None, metric: str) -> Change:
    def value(stats: dict | None) -> float | None:
        return None if stats is None or metric not in stats else float(stats[metric])

    def ci(stats: dict | None) -> tuple[float, float] | None:
        got = None if stats is None else stats.get(f"{metric}_ci95")
        return (float(got[0]), float(got[1])) if isinstance(got, (list, tuple)) and len(got) == 2 else None

    return Change(domain, value(base), value(now), ci(base), ci(now),
                  int((base or {}).get("n_tasks", 0)), int((now or {}).get("n_tasks", 0)))


def _check_report(report: object, which: str, metric: str) -> dict:
    if not isinstance(report, dict) or not isinstance(report.get("by_domain"), dict) or "overall" not in report:
        raise UserError(f"the {which} report is not an `rlvr eval` result (no 'by_domain' and 'overall')")
    if metric not in report["overall"]:
        have = [k for k in report["overall"] if k.startswith("pass@") and not k.endswith("_ci95")]
        raise UserError(f"the {which} report has no {metric}; it has: {', '.join(have) or 'none'}")
    return report


def compare(baseline: dict, now: dict, *, tolerance: float = DEFAULT_TOLERANCE, metric: str = "pass@1") -> GateResult:
    """``now`` against ``baseline`` (two eval reports), per domain. Raises ``UserError`` when a
    report is not an eval result, lacks ``metric`` or ``tolerance`` is negative."""
    if tolerance < 0:
        raise UserError(f"--tolerance must be >= 0 points, got {tolerance}")
    _check_report(baseline, "baseline", metric)
    _check_report(now, "current", metric)
    names = sorted(set(baseline["by_domain"]) | set(now["by_domain"]))
    domains = tuple(_change(d, baseline["by_domain"].get(d), now["by_domain"].get(d), metric) for d in names)
    b_set, n_set = baseline.get("settings") or {}, now.get("settings") or {}
    differences = tuple(f"{k}: {b_set[k]} -> {n_set[k]}" for k in SETTINGS_COMPARED
                        if k in b_set and k in n_set and b_set[k] != n_set[k])
    return GateResult(metric=metric, tolerance=float(tolerance), domains=domains,
                      overall=_change("all", baseline["overall"], now["overall"], metric),
                      baseline_fingerprint=report_fingerprint(baseline), now_fingerprint=report_fingerprint(now),
                      baseline_suite=baseline.get("suite") or {}, now_suite=now.get("suite") or {},
                      setting_differences=differences)


def print_gate(result: GateResult, console=None, *, labels: tuple[str, str] = ("baseline", "now")) -> None:
    """The comparison as a table: domain, tasks, baseline, now, change, beyond the 95% CIs."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    table = Table(title=f"{result.metric}: {labels[1]} against {labels[0]} (gate: drop > {result.tolerance:g} pts)")
    for name, justify in (("domain", "left"), ("tasks", "right"), (labels[0], "right"), (labels[1], "right"),
                          ("change", "right"), ("beyond 95% CIs", "center"), ("gate", "center")):
        table.add_column(name, justify=justify)
    for c in (*result.domains, result.overall):
        gated = c is not result.overall
        verdict = "" if not gated or c.change is None else ("FAIL" if c.regressed(result.tolerance) else "ok")
        beyond = {None: "-", True: "yes", False: "no"}[c.beyond_ci]
        table.add_row(c.domain, str(c.n_now or c.n_baseline), pct(c.baseline), pct(c.now),
                      "-" if c.change is None else f"{c.change:+.1f} pts", beyond, verdict,
                      style="bold" if not gated else ("red" if verdict == "FAIL" else None))
    console.print(table)
    for line in result.setting_differences:
        console.print(f"note: decoding differs between the reports ({line})")
