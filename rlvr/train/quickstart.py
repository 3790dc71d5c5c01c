"""The quickstart: pretrain (cached) -> SFT -> eval -> GRPO -> eval -> report, on the tiny default.

With ``stages: [sft, dpo, grpo]`` (``configs/pipeline.yaml``) it is the whole post-training
pipeline: after SFT, ``rlvr pairs`` samples the SFT model on train tasks and pairs its verified
passes with its failures, DPO trains on those pairs from the SFT model, and GRPO starts from the
DPO model; every stage's final model is evaluated on the same held-out suite.

Everything lands in one directory (``runs/quickstart``): each stage's run directory, the eval
JSONs, ``report.json`` (per domain ``sft_pass@1`` and ``rl_pass@1``, wall seconds per stage),
PNG plots and ``report.html`` (``rlvr report``; written also when a stage crashes, saying so).
The eval tasks come from the eval split and are checked disjoint from every task used in
training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from rlvr.config import resolve_device, save_config, to_dict
from rlvr.eval import plots
from rlvr.eval.evaluate import EvalConfig
from rlvr.eval.report import eval_report
from rlvr.model.load import load_model_and_tokenizer
from rlvr.monitor.metrics import read_metrics
from rlvr.atomic import write_text_atomic
from rlvr.report import write_report
from rlvr.sandbox.config import SandboxConfig, shared_sandbox
from rlvr.tasks.base import DOMAINS as DOMAIN_REGISTRY
from rlvr.errors import ConfigError, UserError
from rlvr.tasks.base import generate_tasks, overlap
from rlvr.tasks.sets import file_tasks
from rlvr.train.grpo import GRPOConfig, RolloutConfig, run_grpo
from rlvr.train.compiled import cpu_compiler_found
from rlvr.train.precision import native_precision
from rlvr.train.pretrain import PretrainConfig, run_pretrain
from rlvr.train.dpo import DPOConfig, run_dpo
from rlvr.train.sft import SFTConfig, run_sft
from rlvr.train.verified_pairs import PairsConfig, run_pairs
from rlvr.types import Task

DOMAINS = ["math.arith", "math.word", "code.gen"]
MAX_NEW_TOKENS = 64  # the longest code.gen reference is about 48 tokens


def default_pretrain() -> PretrainConfig:
    """The quickstart's pretraining: 1,200 steps on the three domains' text, under bf16 autocast
    where this machine multiplies bf16 natively (``native_precision``: a CPU with AVX512-BF16 or
    AMX), compiled too where a C++ compiler is found: a step about 2x faster than fp32 here (the
    stage 1.3x, compile and data included), to the same SFT and GRPO quality (docs/benchmarks.md).
    Elsewhere fp32, eager (bf16 there is slower than fp32, and compile in fp32 measured no faster).
    GRPO stays fp32: bf16 measured no faster at this model size."""
    precision = native_precision()
    return PretrainConfig(domains=list(DOMAINS), steps=1200, precision=precision,
                          compile=precision == "bf16" and cpu_compiler_found())


@dataclass
class QuickstartConfig:
    out: str = "runs/quickstart"
    """Directory for every stage's output and the report."""
    pretrain: PretrainConfig = field(default_factory=default_pretrain)
    """The prior, on math and code text: past the point where the tiny model picks up digit
    arithmetic and the shape of small Python functions. Its precision and compile follow the
    machine (``default_pretrain``)."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=15, domains=list(DOMAINS)))
    """A deliberately short SFT (480 demonstrations): the model adopts the chat format but uses
    only part of what the prior knows, leaving RL real headroom."""
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(
        steps=350, domains=list(DOMAINS), train_tasks=1200,
        rollout=RolloutConfig(max_new_tokens=MAX_NEW_TOKENS),
        sandbox=SandboxConfig(allow_weak=True)))
    """GRPO on math and code together (350 steps x 16 tasks x 8 samples, a pool balanced over
    the three domains); code answers run in the sandbox against hidden tests. The quickstart
    accepts the weak sandbox (with a printed warning) so it runs on any laptop."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(
        domains=list(DOMAINS), tasks=600, max_new_tokens=MAX_NEW_TOKENS))
    """The held-out suite evaluated after every stage."""
    stages: list[str] = field(default_factory=lambda: ["sft", "grpo"])
    """The post-training stages after pretraining, in order: [sft, grpo] or [sft, dpo, grpo]
    (the pipeline: pairs from the SFT model's verified rollouts, then DPO, then GRPO)."""
    pairs: PairsConfig = field(default_factory=lambda: PairsConfig(
        domains=["math.arith", "math.word"], train_tasks=1000, samples=8, max_new_tokens=MAX_NEW_TOKENS))
    """How the DPO stage's pairs are made from the SFT model (its ``model`` and ``out`` are set by the run)."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """The DPO stage (its ``model``, ``pair_files`` and ``out`` are set by the run)."""

    def __post_init__(self) -> None:
        if self.stages not in (["sft", "grpo"], ["sft", "dpo", "grpo"]):
            raise ConfigError(f"config key 'stages' must be [sft, grpo] or [sft, dpo, grpo], got {self.stages}")


def _cache_key(cfg: PretrainConfig) -> str:
    d = to_dict(cfg)
    d.pop("out")
    d.pop("device")  # where it trained is not what it is: a cached model serves any device
    return hashlib.sha256(yaml.safe_dump(d, sort_keys=True).encode()).hexdigest()[:16]


def run_quickstart(cfg: QuickstartConfig, *, resume: bool = False, console: Console | None = None) -> dict:
    console = console or Console()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    # Every stage's device is resolved now: one that this machine lacks stops the run before the
    # stages ahead of it have spent their minutes.
    eval_device = resolve_device("eval.device", cfg.eval.device)
    for key, name in (("pretrain.device", cfg.pretrain.device), ("sft.device", cfg.sft.device),
                      ("grpo.device", cfg.grpo.device)):
        resolve_device(key, name)
    try:
        report = run_stages(cfg, out, eval_device, resume=resume, console=console)
    except BaseException as e:  # a crashed run gets its report too, saying what stopped it
        crash_report(out, f"stopped by {type(e).__name__}: {str(e)[:300]}", console)
        raise
    console.print(f"report: {write_report(out)}")
    return report


def crash_report(out: Path, error: str, console: Console) -> None:
    """The report of a quickstart that stopped; a failure to write it never hides the error."""
    try:
        console.print(f"report of the stopped run: {write_report(out, error=error)}")
    except Exception as e:  # noqa: BLE001 - the run's own exception is the one to see
        console.print(f"(no report of the stopped run: {type(e).__name__}: {e})")


def run_stages(cfg: QuickstartConfig, out: Path, eval_device, *, resume: bool, console: Console) -> dict:
    """The stages in order; returns report.json's content."""
    seconds: dict[str, float] = {}

    def stage(name: str, fn):
        console.print(f"[bold]{name}[/bold]")
        start = time.perf_counter()
        result = fn()
        seconds[name] = round(time.perf_counter() - start, 2)
        console.print(f"  done in {seconds[name]:.1f}s")
        return result

    pre = dataclasses.replace(cfg.pretrain, out=str(out / "pretrain"))
    key_file = out / "pretrain" / "cache_key"
    if key_file.exists() and key_file.read_text() == _cache_key(pre) and (out / "pretrain/final/config.json").exists():
        console.print("[bold]pretrain[/bold]\n  cached: reusing runs' pretrain/final (delete it to retrain)")
        seconds["pretrain"] = 0.0
    else:
        stage("pretrain", lambda: run_pretrain(pre, resume=resume))
        key_file.write_text(_cache_key(pre))

    if any(getattr(DOMAIN_REGISTRY.get(d), "needs_sandbox", False) for d in cfg.eval.domains):
        shared_sandbox(cfg.grpo.sandbox, out)  # code answers of every stage run here

    sft = dataclasses.replace(cfg.sft, model=str(out / "pretrain/final"), out=str(out / "sft"))
    stage("sft", lambda: run_sft(sft, resume=resume))

    eval_tasks = generate_tasks(cfg.eval.domains, "eval", cfg.eval.tasks, seed=cfg.eval.seed, levels=cfg.eval.levels)
    grpo = dataclasses.replace(cfg.grpo, model=str(out / "sft/final"), out=str(out / "grpo"))
    disjointness = eval_disjointness(training_tasks(sft, grpo), eval_tasks)

    def run_eval(model_dir: Path, name: str) -> dict:
        model, tokenizer = load_model_and_tokenizer(str(model_dir), device=eval_device)
        return eval_report(model, tokenizer, eval_tasks, cfg.eval, seed=0, model_name=None,
                           path=out / "eval" / f"{name}.json")

    sft_eval = stage("eval_sft", lambda: run_eval(out / "sft/final", "sft"))
    stage_evals = {}
    if "dpo" in cfg.stages:
        pairs = dataclasses.replace(cfg.pairs, model=str(out / "sft/final"), out=str(out / "pairs.jsonl"))
        eval_disjointness(training_tasks(pairs), eval_tasks)
        stage("pairs", lambda: console.print(f"  {run_pairs(pairs)}"))
        dpo = dataclasses.replace(cfg.dpo, model=str(out / "sft/final"), out=str(out / "dpo"),
                                  pair_files=[pairs.out])
        stage("dpo", lambda: run_dpo(dpo, resume=resume))
        stage_evals["dpo"] = stage("eval_dpo", lambda: run_eval(out / "dpo/final", "dpo"))
        grpo = dataclasses.replace(grpo, model=str(out / "dpo/final"))
    stage("grpo", lambda: run_grpo(grpo, resume=resume))
    rl_eval = stage("eval_rl", lambda: run_eval(out / "grpo/final", "rl"))

    report = build_report(sft_eval, rl_eval, seconds, len(eval_tasks), disjointness, stage_evals)
    write_text_atomic(out / "report.json", json.dumps(report, indent=2))
    plots.reward_curve(read_metrics(out / "grpo"), out / "plots" / "reward_curve.png")
    plots.before_after(report["domains"], out / "plots" / "eval_before_after.png")
    print_table(console, report, out)
    return report


def training_tasks(*stages: SFTConfig | GRPOConfig | PairsConfig) -> list[Task]:
    """Every task the stages train on (generated train split and their task files)."""
    tasks = [t for c in stages if c.domains
             for t in generate_tasks(c.domains, "train", c.train_tasks, seed=c.seed, levels=c.levels)]
    tasks += file_tasks([f for c in stages for f in c.task_files], check=False)
    return tasks


def eval_disjointness(train: list[Task], eval_tasks: list[Task]) -> dict:
    """The eval set checked against everything trained on (``rlvr.tasks.base.overlap``: the same
    problem, or one a train reference reveals). A leak stops the run (``UserError`` naming the
    first leaked problems); otherwise the record ``report.json`` keeps."""
    leaked = overlap(train, eval_tasks)
    if leaked:
        shown = ", ".join(f"{d} {k!r}" for d, k in leaked[:3])
        raise UserError(f"{len(leaked)} of {len(eval_tasks)} eval tasks are also trained on ({shown}): "
                        "the held-out numbers would not be held out")
    return {"disjoint_from_training": not leaked, "train_tasks_checked": len(train),
            "eval_tasks_seen_in_training": len(leaked)}


def build_report(sft_eval: dict, rl_eval: dict, seconds: dict, n_eval: int, disjointness: dict,
                 between: dict[str, dict] | None = None) -> dict:
    """``between``: the evals of stages between SFT and GRPO (``{"dpo": report}``), reported as
    ``<stage>_pass@1`` beside ``sft_pass@1`` and ``rl_pass@1``."""
    between = between or {}
    domains = {
        d: {"sft_pass@1": sft_eval["by_domain"][d]["pass@1"],
            **{f"{name}_pass@1": ev["by_domain"][d]["pass@1"] for name, ev in between.items()},
            "rl_pass@1": rl_eval["by_domain"][d]["pass@1"],
            "delta_points": round(100 * (rl_eval["by_domain"][d]["pass@1"] - sft_eval["by_domain"][d]["pass@1"]), 1),
            "n_tasks": sft_eval["by_domain"][d]["n_tasks"]}
        for d in sorted(sft_eval["by_domain"])
    }
    overall = {"sft_pass@1": sft_eval["overall"]["pass@1"], "rl_pass@1": rl_eval["overall"]["pass@1"],
               "sft_pass@1_ci95": sft_eval["overall"]["pass@1_ci95"], "rl_pass@1_ci95": rl_eval["overall"]["pass@1_ci95"]}
    for name, ev in between.items():
        overall[f"{name}_pass@1"], overall[f"{name}_pass@1_ci95"] = ev["overall"]["pass@1"], ev["overall"]["pass@1_ci95"]
    overall["delta_points"] = round(100 * (overall["rl_pass@1"] - overall["sft_pass@1"]), 1)
    return {
        "eval": {"split": "eval", "tasks": n_eval, "decoding": "greedy", **disjointness},
        "overall": overall,
        "domains": domains,
        "stage_seconds": seconds,
        "total_seconds": round(sum(seconds.values()), 2),
        "summary": f"held-out greedy pass@1: SFT {100 * overall['sft_pass@1']:.1f}% -> GRPO "
                   f"{100 * overall['rl_pass@1']:.1f}% ({overall['delta_points']:+.1f} points)",
    }


def print_table(console: Console, report: dict, out: Path) -> None:
    table = Table(title="held-out pass@1 (greedy)")
    dpo = "dpo_pass@1" in report["overall"]
    columns = ("domain", "tasks", "SFT", *(("SFT + DPO",) if dpo else ()),
               "SFT + DPO + GRPO" if dpo else "SFT + GRPO", "change")
    for col in columns:
        table.add_column(col, justify="right" if col != "domain" else "left")

    def row(name: str, n: int, r: dict, **style) -> None:
        cells = [f"{100 * r[k]:.1f}%" for k in ("sft_pass@1", *(("dpo_pass@1",) if dpo else ()), "rl_pass@1")]
        table.add_row(name, str(n), *cells, f"{r['delta_points']:+.1f} pts", **style)

    for d, r in report["domains"].items():
        row(d, r["n_tasks"], r)
    row("all", report["eval"]["tasks"], report["overall"], style="bold")
    console.print(table)
    stages = "  ".join(f"{k} {v:.0f}s" for k, v in report["stage_seconds"].items())
    console.print(f"wall time: {stages}  (total {report['total_seconds']:.0f}s)")
    console.print(f"wrote {out}/report.json, {out}/plots/*.png, final model {out}/grpo/final")
