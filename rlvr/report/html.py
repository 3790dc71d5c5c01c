"""The report page: one self-contained HTML file (inline CSS and SVG, images as data URIs, no
script, nothing fetched) built from ``rlvr.report.build.RunData``.

Sections: summary (finished, or crashed at step N), config, curves, eval tables and radar,
alerts linking to their trajectories, trajectories.
"""

from __future__ import annotations

import base64
import datetime as dt
from html import escape

from rlvr.monitor.alerts import describe
from rlvr.report import charts
from rlvr.report.build import RunData, names_with_prefix, select_trajectories, series
from rlvr.report.conversation import render_trajectory
from rlvr.report.style import CSS

STEP_PHASES = ("time/wait", "time/advantage", "time/prepare", "time/update", "time/weight_sync", "time/eval")


def render(data: RunData, *, per_step: int = 4) -> str:
    flagged, by_step = select_trajectories(data, per_step=per_step)
    shown = {t["id"] for t in flagged} | {t["id"] for ts in by_step.values() for t in ts}
    sections = [
        ("summary", "Summary", summary(data)),
        ("config", "Config", config(data)),
        ("curves", "Curves", curves(data)),
        ("eval", "Eval", evals(data)),
        ("alerts", f"Alerts ({len(data.alerts)})", alerts(data, shown)),
        ("trajectories", "Trajectories", trajectories(flagged, by_step, len(data.trajectories))),
    ]
    if data.plots:
        sections.append(("plots", "Plots", plots(data.plots)))
    nav = " ".join(f'<a href="#{sid}">{escape(title)}</a>' for sid, title, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{escape(title)}</h2>{html}</section>' for sid, title, html in sections)
    title = f"rlvr report: {data.path.name or data.path}"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{escape(title)}</title><link rel="icon" href="data:,"><style>{CSS}</style></head>'
            f'<body><header class="top"><h1>{escape(title)}</h1><nav>{nav}</nav></header>'
            f'<main>{body}</main></body></html>')


def summary(data: RunData) -> str:
    s = data.status
    rows = [("status", f'<span class="badge {s.state}">{escape(s.state)}</span> {escape(s.note)}'),
            ("run directory", f"<code>{escape(str(data.path))}</code> ({escape(data.kind)})"),
            ("steps", f"{s.step}" + (f" of {s.steps}" if s.steps is not None else ""))]
    for name, label in (("rollout/reward_mean", "last reward mean"), ("rollout/pass_rate", "last pass rate"),
                        ("eval/pass@1", "last eval pass@1")):
        pts = series(data.metrics, name)
        if pts:
            rows.append((label, f"{pts[-1][1]:.3f} (step {pts[-1][0]:g})"))
    # the trainer's own phases (grpo.py's timer) are disjoint and cover a step; the rollout
    # source's (rollout, verify, ...) run inside "wait" or, asynchronously, beside it
    seconds = sum(v for m in data.metrics for k, v in m.items() if k in STEP_PHASES and isinstance(v, (int, float)))
    if seconds:
        rows.append(("training time", f"{seconds / 60:.1f} min (the steps' logged phases)"))
    if data.summary and isinstance(data.summary.get("summary"), str):
        rows.append(("quickstart", escape(data.summary["summary"])))
    rows.append(("alerts", str(len(data.alerts))))
    rows.append(("trajectory samples", f"{len(data.trajectories)} in {len({t['step'] for t in data.trajectories})} steps"))
    if data.skipped_lines:
        rows.append(("skipped", f"{data.skipped_lines} line(s) of JSONL files that were not JSON objects"))
    rows.append(("report written", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")))
    return "<table class='kv summary'>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def config(data: RunData) -> str:
    if not data.config_text:
        return "<p><i>no config.yaml in the run directory</i></p>"
    return f"<details><summary>config.yaml ({len(data.config_text.splitlines())} lines)</summary>" \
           f"<pre class='code'>{escape(data.config_text)}</pre></details>"


def curves(data: RunData) -> str:
    m = data.metrics
    if not m:
        return "<p><i>no metrics logged (metrics.jsonl is missing or empty)</i></p>"
    window = 1 if len(m) <= 40 else round(len(m) / 20)
    avg = f"moving average over {window} steps" if window > 1 else ""

    def rollout(names: dict[str, str]) -> dict[str, list]:
        return {label: charts.smooth(series(m, name), window) for name, label in names.items()}

    terms = {n: "term " + n.removeprefix("rollout/reward_") for n in names_with_prefix(m, "rollout/reward_")
             if n != "rollout/reward_mean"}
    domains = {n: n.removeprefix("rollout/pass_rate/") for n in names_with_prefix(m, "rollout/pass_rate/")}
    evals = {n: n.removeprefix("eval/pass@1/") for n in names_with_prefix(m, "eval/pass@1/")}
    kl = {n: n for n in ("train/kl", "train/approx_kl", "rollout/logprob_mismatch_kl")}
    figures = [
        charts.line_chart("chart-reward", "Reward", rollout({"rollout/reward_mean": "reward mean", **terms}), note=avg),
        charts.line_chart("chart-pass-rate", "Pass rate of training rollouts, overall and per domain",
                          rollout({"rollout/pass_rate": "all", **domains}), y_range=(0, 1), note=avg),
        charts.line_chart("chart-eval", "Held-out eval pass@1 per domain",
                          {"all": series(m, "eval/pass@1"), **{label: series(m, n) for n, label in evals.items()}},
                          y_range=(0, 1), markers=True),
        charts.line_chart("chart-length", "Response length (policy tokens, mean)",
                          rollout({"rollout/response_tokens_mean": "tokens"}), note=avg),
        charts.line_chart("chart-kl", "KL and sampler/trainer log-prob mismatch", rollout(kl), note=avg),
        charts.line_chart("chart-signal", "Learning signal: sampled entropy and within-group reward std",
                          rollout({"rollout/entropy": "entropy", "rollout/group_reward_std": "group reward std"}),
                          note=avg),
        charts.line_chart("chart-sources", "Reward sources: each one's unweighted score (reward.sources)",
                          rollout({n: n.removeprefix("rollout/score/") for n in names_with_prefix(m, "rollout/score/")
                                   if n not in (PROXY, GOLD) and not n.endswith("_failed")}), note=avg),
        proxy_vs_gold(m, window),
    ]
    return '<div class="charts">' + "".join(f for f in figures if f) + "</div>"


PROXY, GOLD = "rollout/score/proxy", "rollout/score/gold"


def proxy_vs_gold(m: list[dict], window: int) -> str | None:
    """The over-optimisation plot (Gao et al.): the trained-on proxy and the held-out gold score
    against sqrt(KL) from the initial policy (``train/kl``, with a KL reference), else the step."""
    proxy, gold = charts.smooth(series(m, PROXY), window), charts.smooth(series(m, GOLD), window)
    if not proxy or not gold:
        return None
    kl = dict(charts.smooth(series(m, "train/kl"), window))
    if kl:
        at = lambda pts: sorted((max(kl[s], 0.0) ** 0.5, v) for s, v in pts if s in kl)  # noqa: E731
        proxy, gold, axis = at(proxy), at(gold), "sqrt(KL) from the initial policy"
    else:
        axis = "step (no KL reference in this run: set algo.kl_coef > 0 for the sqrt(KL) axis)"
    return charts.line_chart("chart-overoptimization", f"Proxy vs gold reward against {axis}",
                             {"proxy (trained on)": proxy, "gold (held out)": gold},
                             note="proxy rising while gold falls is over-optimisation (monitor.overoptimization)")


def evals(data: RunData) -> str:
    if not data.evals:
        return "<p><i>no eval reports in the run directory</i></p>"
    labels = list(data.evals)
    domains = sorted({d for r in data.evals.values() for d in r["by_domain"]})
    head = "".join(f"<th>{escape(label)}</th>" for label in labels)
    rows = []
    for d in domains:
        rows.append(_eval_row(escape(d), [r["by_domain"].get(d) for r in data.evals.values()], "domain"))
        levels = sorted({lv for r in data.evals.values() for lv in r["by_domain"].get(d, {}).get("by_level", {})},
                        key=lambda s: (len(s), s))
        if len(levels) > 1:
            for lv in levels:
                cells = [r["by_domain"].get(d, {}).get("by_level", {}).get(lv) for r in data.evals.values()]
                rows.append(_eval_row(f"level {escape(str(lv))}", cells, "level"))
    rows.append(_eval_row("all", [r.get("overall") for r in data.evals.values()], "all"))
    table = (f"<table class='eval'><thead><tr><th>domain / level</th><th>tasks</th>{head}</tr></thead>"
             f"<tbody>{''.join(rows)}</tbody></table>")
    radar = charts.radar({label: {d: s["pass@1"] for d, s in r["by_domain"].items() if "pass@1" in s}
                          for label, r in data.evals.items()}, "Held-out pass@1 by domain")
    steps = f"<p>Periodic evals at steps {', '.join(map(str, data.eval_steps))}.</p>" if data.eval_steps else ""
    return f'<p>pass@1 [95% interval].</p>{steps}<div class="eval-grid"><div>{table}</div>{radar or ""}</div>'


def _eval_row(name: str, cells: list[dict | None], kind: str) -> str:
    n = next((c.get("n_tasks") for c in cells if c), "")

    def cell(c: dict | None) -> str:
        if not c or "pass@1" not in c:
            return "<td>—</td>"
        ci = c.get("pass@1_ci95")
        interval = f" <small>[{100 * ci[0]:.0f}–{100 * ci[1]:.0f}]</small>" if isinstance(ci, list) and len(ci) == 2 else ""
        return f"<td>{100 * c['pass@1']:.1f}%{interval}</td>"

    return f"<tr class='{kind}'><th>{name}</th><td>{n}</td>{''.join(cell(c) for c in cells)}</tr>"


def _examples(data: RunData, name: str, shown: set[str], n: int = 3) -> str:
    """Links to the first ``n`` shown samples ``name`` flagged, with their notes."""
    out = []
    for t in data.trajectories:
        notes = [f.get("note", "") for f in t.get("flags", []) or [] if isinstance(f, dict) and f.get("detector") == name]
        if notes and t["id"] in shown:
            tid = escape(str(t["id"]))
            out.append(f'<a href="#traj-{tid}">{tid}</a> <span class="muted">{escape(notes[0][:80])}</span>')
            if len(out) == n:
                break
    return "<br>".join(out) or "—"


def alert_groups(data: RunData, shown: set[str]) -> str:
    """One row per detector: severity, alerts, first and last step, where, the samples it flagged
    over the run (its ``monitor/flagged/*`` curve) and the first of them shown; then the trend of
    each sample detector's flagged share."""
    groups: dict[str, list[dict]] = {}
    for a in data.alerts:
        groups.setdefault(str(a.get("detector", "")), []).append(a)
    rows = []
    for name, items in sorted(groups.items(), key=lambda kv: min(int(a.get("step", 0)) for a in kv[1])):
        steps = [int(a.get("step", 0)) for a in items]
        where = sorted({str(a.get("domain") or a.get("group")) for a in items if a.get("domain") or a.get("group")})
        curve = series(data.metrics, f"monitor/flagged/{name}")
        flagged = f"{sum(v for _, v in curve):g}" if curve else "—"
        severity = escape(str(items[0].get("severity", "")))
        rows.append(f"<tr class='sev-{severity}'><td>{escape(name)}</td><td>{severity}</td><td>{len(items)}</td>"
                    f"<td>{min(steps)}</td><td>{max(steps)}</td><td>{escape(', '.join(where)) or '—'}</td>"
                    f"<td>{flagged}</td><td>{_examples(data, name, shown)}</td></tr>")
    table = ("<table class='alerts groups'><thead><tr><th>detector</th><th>severity</th><th>alerts</th>"
             "<th>first step</th><th>last step</th><th>where</th><th>samples flagged (whole run)</th>"
             "<th>examples</th></tr></thead>"
             "<tbody>" + "".join(rows) + "</tbody></table>")
    return table + flagged_trend(data)


def flagged_trend(data: RunData) -> str:
    """The flagged share of each sample detector per step (its ``monitor/rate/*`` curve)."""
    return charts.line_chart(
        "chart-flagged", "Flagged share per sample detector",
        {name.removeprefix("monitor/rate/"): series(data.metrics, name)
         for name in names_with_prefix(data.metrics, "monitor/rate/")},
        note="flagged / samples each detector looks at, per step; an alert needs a rise, not a level") or ""


def alerts(data: RunData, shown: set[str]) -> str:
    if not data.alerts:
        return "<p>No alerts were raised.</p>" + flagged_trend(data)
    kept = {t["id"] for t in data.trajectories}
    rows = []
    for a in data.alerts:
        evidence = a.get("evidence") if isinstance(a.get("evidence"), dict) else {}
        links = []
        for raw in a.get("trajectory_ids", []) or []:
            tid = escape(str(raw))
            if str(raw) in shown:
                links.append(f'<a href="#traj-{tid}">{tid}</a>')
            else:
                why = "not shown: past the report's limit" if str(raw) in kept else "not kept"
                links.append(f'<span class="muted">{tid} ({why})</span>')
        where = a.get("domain") or a.get("group") or ""
        rows.append(f"<tr class='sev-{escape(str(a.get('severity', '')))}'><td>{escape(str(a.get('step', '')))}</td>"
                    f"<td>{escape(str(a.get('detector', '')))}</td><td>{escape(str(a.get('severity', '')))}</td>"
                    f"<td>{escape(str(where))}</td>"
                    f"<td>{escape(describe(evidence))}</td>"
                    f"<td>{escape(str(a.get('action', '')))}</td><td>{' '.join(links) or '—'}</td></tr>")
    return (alert_groups(data, shown) + "<h3>Every alert</h3>"
            "<table class='alerts'><thead><tr><th>step</th><th>detector</th><th>severity</th><th>where</th>"
            "<th>evidence</th><th>action</th><th>trajectories</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def trajectories(flagged: list[dict], by_step: dict[int, list[dict]], total: int) -> str:
    if not total:
        return "<p><i>no trajectory samples (trajectories/step_N.jsonl) in the run directory</i></p>"
    shown = len(flagged) + sum(map(len, by_step.values()))
    out = [f"<p>{shown} of {total} samples shown: the flagged ones first, then at most a few per step.</p>"]
    if flagged:
        out.append(f'<h3>Flagged ({len(flagged)})</h3>' + "".join(render_trajectory(t) for t in flagged))
    last = max(by_step, default=None)
    for step in sorted(by_step):
        if by_step[step]:
            out.append(f'<details class="step"{" open" if step == last else ""}><summary>step {escape(str(step))} '
                       f'({len(by_step[step])} shown)</summary>' + "".join(render_trajectory(t) for t in by_step[step])
                       + "</details>")
    return "".join(out)


def plots(pngs: dict[str, bytes]) -> str:
    return '<div class="charts">' + "".join(
        f'<figure class="png"><img alt="{escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{escape(name)}</figcaption></figure>" for name, png in pngs.items()) + "</div>"
