"""PNG plots of a run: the reward curve and eval pass@1 before/after RL by domain."""

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
