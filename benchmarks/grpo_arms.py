"""Shared pieces of the benchmarks that compare GRPO arms from one SFT model on a held-out draw
(``curriculum_vs_uniform.py``, ``algorithms.py``).

- ``arm_config(recipe, model, out, seed, steps, overrides, **fields)``: the recipe's ``grpo``
  block from ``model`` for ``steps`` steps with ``seed``, then ``fields``, then ``overrides``
  (``KEY=VALUE`` strings, as ``--set``).
- ``held_out(recipe, eval_seed, eval_tasks)``: the recipe's eval suite drawn with ``eval_seed``
  (not a periodic eval's seed), and a function that evaluates a model directory on it greedily:
  pass@1 per domain, their mean (``domain_mean``) and the overall pass@1.
- ``spread(values)``: mean, min, max and sample standard deviation over seeds (with the values).
- ``pass_summary(runs)``: those spreads of an arm's runs per domain, for the mean and overall.
- ``print_pass_table``: the per-domain table with the SFT row, mean ± std per arm, extra columns.
- ``pass_bars(ax, out, arms)``: grouped bars of held-out pass@1 per domain (and the mean) per arm,
  the SFT model first, error bars = std over seeds; ``save_figure``.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def arm_config(recipe: dict, model: str, out: str, seed: int, steps: int, overrides: list[str], **fields):
    from rlvr.config import apply_overrides, from_dict
    from rlvr.train.grpo import GRPOConfig

    grpo = {**recipe.get("grpo", {}), "model": model, "out": out, "seed": seed, "steps": steps, **fields}
    return from_dict(GRPOConfig, apply_overrides(grpo, list(overrides)))


def held_out(recipe: dict, eval_seed: int, eval_tasks: int | None) -> tuple[list, Callable[[str], dict]]:
    """The held-out tasks and ``evaluate(model_dir) -> {"by_domain", "domain_mean", "overall"}``."""
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.config import from_dict
    from rlvr.eval.evaluate import EvalConfig, evaluate
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.sandbox.config import SandboxConfig, shared_sandbox
    from rlvr.tasks.sets import build_task_set

    cfg = from_dict(EvalConfig, {**recipe.get("eval", {}), "seed": eval_seed,
                                 **({"tasks": eval_tasks} if eval_tasks else {})})
    tasks = build_task_set(cfg.domains, "eval", cfg.tasks, seed=cfg.seed, levels=cfg.levels)
    sandbox = from_dict(SandboxConfig, recipe.get("grpo", {}).get("sandbox", {}))

    def run(model_dir: str) -> dict:
        model, tok = load_model_and_tokenizer(model_dir)
        shared_sandbox(sandbox)  # the one a GRPO run in this process opened, else the recipe's
        report = evaluate(model, tok, tasks, cfg)
        by = {d: s["pass@1"] for d, s in report["by_domain"].items()}
        return {"by_domain": by, "domain_mean": statistics.fmean(by.values()), "overall": report["overall"]["pass@1"]}

    return tasks, run


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}


def pass_summary(runs: list[dict]) -> dict:
    return {"domain_mean": spread([r["domain_mean"] for r in runs]),
            "overall": spread([r["overall"] for r in runs]),
            "by_domain": {d: spread([r["by_domain"][d] for r in runs]) for d in runs[0]["by_domain"]}}


def print_pass_table(sft: dict, summary: dict, extra: dict[str, Callable[[dict], str]] | None = None,
                     width: int = 12) -> None:
    """Held-out pass@1 in points, mean ± std over seeds; ``extra``: column name -> cell of an arm's summary."""
    extra = extra or {}
    domains = sorted(sft["by_domain"])
    print(f"{'':<{width}}" + "".join(f"{d:>13}" for d in domains) + f"{'mean':>13}"
          + "".join(f"{name:>{max(9, len(name) + 1)}}" for name in extra))
    print(f"{'SFT':<{width}}" + "".join(f"{100 * sft['by_domain'][d]:>13.1f}" for d in domains)
          + f"{100 * sft['domain_mean']:>13.1f}")
    for arm, s in summary.items():
        cells = "".join(f"{100 * s['by_domain'][d]['mean']:>8.1f}±{100 * s['by_domain'][d]['std']:<4.1f}"
                        for d in domains)
        print(f"{arm:<{width}}{cells}{100 * s['domain_mean']['mean']:>8.1f}±{100 * s['domain_mean']['std']:<4.1f}"
              + "".join(f"{cell(s):>{max(9, len(name) + 1)}}" for name, cell in extra.items()))


def pass_bars(ax, out: dict[str, Any], arms: list[str]) -> None:
    """Held-out pass@1 per domain and their mean: the SFT model, then each arm (mean, std error bars)."""
    domains = sorted(out["sft"]["by_domain"]) + ["mean"]
    sides = ["sft", *arms]
    width = 0.8 / len(sides)
    for j, arm in enumerate(sides):
        if arm == "sft":
            ys = [out["sft"]["by_domain"].get(d, out["sft"]["domain_mean"]) for d in domains]
            errs = None
        else:
            s = out["summary"][arm]
            stats = [s["by_domain"][d] if d != "mean" else s["domain_mean"] for d in domains]
            ys, errs = [x["mean"] for x in stats], [x["std"] for x in stats]
        ax.bar([i + (j - (len(sides) - 1) / 2) * width for i in range(len(domains))], ys, width=width, yerr=errs,
               capsize=2, label=arm)
    ax.set_xticks(range(len(domains)), domains)
    ax.set_ylabel("held-out pass@1 (greedy)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, ncol=4 if len(sides) > 4 else 1, loc="upper left" if len(sides) > 4 else "best")
    ax.grid(axis="y", alpha=0.3)


def figure(ncols: int = 1, widths: list[float] | None = None, size: tuple[float, float] = (7, 3.5)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=size, gridspec_kw={"width_ratios": widths} if widths else None)
    return fig, axes


def save_figure(fig, path: str) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
