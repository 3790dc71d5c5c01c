"""PNG plots of a run: the reward curve, eval pass@1 before/after RL by domain, and the per-domain
radar of eval reports."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def reward_curve(metrics: list[dict], path: str | Path, window: int = 10) -> None:
    rows = [m for m in metrics if "rollout/reward_mean" in m]
    steps = [m["step"] for m in rows]
    rewards = [m["rollout/reward_mean"] for m in rows]
    passed = [m.get("rollout/pass_rate", float("nan")) for m in rows]

    def smooth(xs: list[float]) -> list[float]:
        return [sum(xs[max(0, i - window + 1): i + 1]) / len(xs[max(0, i - window + 1): i + 1]) for i in range(len(xs))]

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, alpha=0.3, color="C0")
    ax.plot(steps, smooth(rewards), color="C0", label=f"reward (mean, {window}-step avg)")
    ax.plot(steps, smooth(passed), color="C1", label="pass rate (train rollouts)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def before_after(domains: dict[str, dict], path: str | Path) -> None:
    """``domains``: {name: {"sft_pass@1": x, "rl_pass@1": y}}."""
    names = sorted(domains)
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([x - 0.2 for x in xs], [domains[n]["sft_pass@1"] for n in names], width=0.4, label="SFT")
    ax.bar([x + 0.2 for x in xs], [domains[n]["rl_pass@1"] for n in names], width=0.4, label="SFT + GRPO")
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out pass@1 (greedy)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def domain_scores(report: dict, metric: str = "pass@1") -> dict[str, float]:
    """``{domain: metric}`` of an eval report."""
    return {d: s[metric] for d, s in report["by_domain"].items() if metric in s}


def radar(series: dict[str, dict[str, float]], path: str | Path, *, metric: str = "pass@1") -> Path:
    """Per-domain ``metric`` of one or more reports (``{label: {domain: value in [0, 1]}}``, the
    first drawn on top of the others) as a radar chart PNG. A radar needs three axes: with one or
    two domains the same numbers are drawn as grouped horizontal bars instead. A domain missing
    from a report is drawn at 0 on the radar and left out of the bars."""
    domains = sorted({d for values in series.values() for d in values})
    if not domains:
        raise ValueError("no domains to plot")
    path = Path(path)
    if len(domains) < 3:
        fig, ax = plt.subplots(figsize=(6, 1.2 + 0.9 * len(domains) * max(1, len(series))))
        height = 0.8 / len(series)
        for i, (label, values) in enumerate(series.items()):
            ys = [j + (len(series) - 1 - 2 * i) * height / 2 for j, d in enumerate(domains) if d in values]
            ax.barh(ys, [values[d] for d in domains if d in values], height=height, label=label, color=f"C{i}")
        ax.set_yticks(range(len(domains)), domains)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel(f"held-out {metric}")
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"held-out {metric} by domain (bars: a radar needs 3 domains)", fontsize=10)
    else:
        import math

        angles = [2 * math.pi * i / len(domains) for i in range(len(domains))]
        fig, ax = plt.subplots(figsize=(6, 6), subplot_kw={"projection": "polar"})
        for i, (label, values) in reversed(list(enumerate(series.items()))):
            rs = [values.get(d, 0.0) for d in domains]
            ax.plot(angles + angles[:1], rs + rs[:1], color=f"C{i}", linewidth=2 if i == 0 else 1.2, label=label)
            ax.fill(angles + angles[:1], rs + rs[:1], color=f"C{i}", alpha=0.15)
        ax.set_xticks(angles, domains)
        ax.set_ylim(0, 1)
        ax.set_yticks([0.25, 0.5, 0.75, 1.0], ["25%", "50%", "75%", "100%"], fontsize=7)
        ax.set_title(f"held-out {metric} by domain", pad=18)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda j: list(series).index(labels[j]))
    ax.legend([handles[j] for j in order], [labels[j] for j in order], loc="lower right",
              bbox_to_anchor=(1.15, -0.08) if len(domains) >= 3 else None, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
