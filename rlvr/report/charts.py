"""Inline SVG charts for the report: line charts of metrics over steps and the per-domain radar.

Drawn as SVG text (no matplotlib, no script) so the page is one self-contained file that scales
with the window. Every label is escaped. A chart with no finite point is not drawn (``None``).
"""

from __future__ import annotations

import math
from html import escape

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]
W, H = 560, 240
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 30


def smooth(points: list[tuple[float, float]], window: int) -> list[tuple[float, float]]:
    """Trailing moving average over ``window`` points (the first points average what exists)."""
    if window <= 1:
        return list(points)
    out = []
    for i, (x, _) in enumerate(points):
        chunk = points[max(0, i - window + 1): i + 1]
        out.append((x, sum(y for _, y in chunk) / len(chunk)))
    return out


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.2g}"
    return f"{v:.3g}"


def line_chart(chart_id: str, title: str, lines: dict[str, list[tuple[float, float]]], *,
               y_range: tuple[float, float] | None = None, markers: bool = False, note: str = "") -> str | None:
    """A ``<figure>`` with one polyline per named series and an HTML legend; ``None`` if empty."""
    lines = {name: pts for name, pts in lines.items() if pts}
    if not lines:
        return None
    xs = [x for pts in lines.values() for x, _ in pts]
    ys = [y for pts in lines.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range or (min(ys), max(ys))
    if y_range is None:
        pad = (y1 - y0) * 0.05 or abs(y1) * 0.05 or 0.5
        y0, y1 = y0 - pad, y1 + pad
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def py(y: float) -> float:
        return H - BOTTOM - (y - y0) / (y1 - y0) * (H - TOP - BOTTOM)

    parts = [f'<svg class="plot" viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">']
    for t in ticks(y0, y1):
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{py(t) + 3:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in (t for t in ticks(x0, x1, 6) if t == int(t)):  # steps are whole numbers
        parts.append(f'<text class="tick" x="{px(t):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">{_fmt(t)}</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}"/>'
                 f'<text class="tick" x="{(LEFT + W - RIGHT) / 2}" y="{H - 2}" text-anchor="middle">step</text>')
    legend = []
    for i, (name, pts) in enumerate(lines.items()):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{coords}">'
                     f'<title>{escape(name)}</title></polyline>')
        if markers or len(pts) == 1:
            parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                      f'<title>{escape(name)} step {x:g}: {y:.4g}</title></circle>' for x, y in pts]
        legend.append(f'<span><i style="background:{color}"></i>{escape(name)} '
                      f'<b>{pts[-1][1]:.3g}</b></span>')
    parts.append("</svg>")
    caption = f'<figcaption><strong>{escape(title)}</strong>{" — " + escape(note) if note else ""}' \
              f'<div class="legend">{"".join(legend)}</div></figcaption>'
    return f'<figure class="chart" id="{escape(chart_id)}">{"".join(parts)}{caption}</figure>'


def radar(series: dict[str, dict[str, float]], title: str) -> str | None:
    """Per-domain values in [0, 1] of one or more labelled reports as a radar (three or more
    domains) or grouped bars (one or two, where a radar has no area); ``None`` if empty."""
    domains = sorted({d for values in series.values() for d in values})
    if not domains:
        return None
    legend = "".join(f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>{escape(label)}</span>'
                     for i, label in enumerate(series))
    size, r0 = 420, 140  # a wider box than the circle: room for the domain names at the sides
    c, cx = size / 2, size / 2 + 70
    parts = [f'<svg class="plot radar" viewBox="0 0 {size + 140} {size}" role="img" aria-label="{escape(title)}">']
    if len(domains) >= 3:
        angle = [2 * math.pi * i / len(domains) - math.pi / 2 for i in range(len(domains))]

        def at(i: int, r: float) -> tuple[float, float]:
            return cx + r * r0 * math.cos(angle[i]), c + r * r0 * math.sin(angle[i])

        for ring in (0.25, 0.5, 0.75, 1.0):
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(i, ring) for i in range(len(domains))))
            parts.append(f'<polygon class="grid" fill="none" points="{pts}"/>'
                         f'<text class="tick" x="{cx + 3}" y="{c - ring * r0 + 10:.1f}">{int(ring * 100)}%</text>')
        for i, d in enumerate(domains):
            x, y = at(i, 1.0)
            lx, ly = at(i, 1.12)
            anchor = "middle" if abs(lx - cx) < 20 else ("start" if lx > cx else "end")
            parts.append(f'<line class="grid" x1="{cx}" y1="{c}" x2="{x:.1f}" y2="{y:.1f}"/>'
                         f'<text class="label" x="{lx:.1f}" y="{ly + 4:.1f}" text-anchor="{anchor}">{escape(d)}</text>')
        for k, (label, values) in reversed(list(enumerate(series.items()))):
            color = COLORS[k % len(COLORS)]
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(i, values.get(d, 0.0)) for i, d in enumerate(domains)))
            parts.append(f'<polygon points="{pts}" fill="{color}" fill-opacity="0.15" stroke="{color}" '
                         f'stroke-width="2"><title>{escape(label)}</title></polygon>')
    else:
        bar_h = 60 / len(series)
        for i, d in enumerate(domains):
            top = 40 + i * 120
            parts.append(f'<text class="label" x="10" y="{top - 8}">{escape(d)}</text>')
            for k, (label, values) in enumerate(series.items()):
                if d in values:
                    w = values[d] * (size - 80)
                    parts.append(f'<rect x="10" y="{top + k * bar_h:.1f}" width="{w:.1f}" height="{bar_h - 4:.1f}" '
                                 f'fill="{COLORS[k % len(COLORS)]}"><title>{escape(label)}: {values[d]:.3f}</title></rect>'
                                 f'<text class="tick" x="{14 + w:.1f}" y="{top + k * bar_h + bar_h / 2 + 2:.1f}">'
                                 f'{100 * values[d]:.1f}%</text>')
    parts.append("</svg>")
    return (f'<figure class="chart" id="radar">{"".join(parts)}<figcaption><strong>{escape(title)}</strong>'
            f'<div class="legend">{legend}</div></figcaption></figure>')
