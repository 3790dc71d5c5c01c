"""PNG of the curriculum over a run: the mix weights per group and each domain's frontier level."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

WEIGHT, FRONTIER = "curriculum/weight/", "curriculum/frontier/"


def curriculum_plot(metrics: list[dict], path: str | Path, alerts: list[dict] = ()) -> None:
    """Weights over steps (top; seesaw alerts marked) and frontier levels (bottom)."""
    rows = [m for m in metrics if any(k.startswith(WEIGHT) for k in m)]
    steps = [m["step"] for m in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    for key in sorted({k for m in rows for k in m if k.startswith(WEIGHT)}):
        top.plot(steps, [m.get(key, float("nan")) for m in rows], label=key[len(WEIGHT):])
    for a in alerts:
        if a.get("detector") == "seesaw":
            top.axvline(a["step"], color="red", alpha=0.3, linestyle="--")
    top.set_ylabel("mix weight")
    top.grid(alpha=0.3)
    top.legend(fontsize=7, loc="upper right")
    for key in sorted({k for m in rows for k in m if k.startswith(FRONTIER)}):
        bottom.step(steps, [m.get(key, float("nan")) for m in rows], where="post", label=key[len(FRONTIER):])
    bottom.set_ylabel("frontier level")
    bottom.set_xlabel("RL step")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
