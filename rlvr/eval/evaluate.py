"""Evaluation: pass@1 (greedy) and unbiased pass@k with confidence intervals, per domain and level.

Tasks come from the eval split, which is disjoint from training by construction (hashed keys)
and by ``check_disjoint``. The result is a plain dict, written as JSON by the caller.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from rlvr.algos.passk import confidence_interval, pass_at_k, wilson_interval
from rlvr.config import check_choice, check_device, check_range
from rlvr.envs.base import EnvConfig
from rlvr.model.load import ModelLoadConfig
from rlvr.rollout.engine import PRECISIONS, SamplingParams
from rlvr.rollout.episodes import EnvPool, run_tasks
from rlvr.rollout.kv_compress import KV_CACHES
from rlvr.tasks.rows import TaskFileConfig, as_file_config
from rlvr.types import Task
from rlvr.verifiers.judge import judge


@dataclass
class EvalConfig:
    domains: list[str] = field(default_factory=lambda: ["math.arith", "math.word"])
    """Built-in domains of the eval suite (their eval split; may be empty with ``task_files``)."""
    tasks: int = 500
    """Held-out tasks drawn from ``domains`` (spread evenly over domains and levels)."""
    task_files: list[TaskFileConfig | str] = field(default_factory=list)
    """The user's eval files (every row, or the rows of a file's ``split``), as in ``task_files``
    of training (docs/tasks.md)."""
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Difficulty levels to include."""
    seed: int = 1234
    """Seed of the eval task draw."""
    samples: int = 1
    """Samples per task; 1 with temperature 0 is greedy pass@1."""
    temperature: float = 0.0
    """Sampling temperature for eval (0 = greedy)."""
    k: list[int] = field(default_factory=lambda: [1])
    """pass@k values to report (each k <= samples)."""
    max_new_tokens: int = 48
    """Generation budget per answer."""
    batch_size: int = 256
    """Sequences decoded together."""
    device: str = "cpu"
    """Where ``rlvr eval`` and the quickstart's eval stages load the model: cpu | cuda | cuda:N |
    auto (the periodic eval of a GRPO run uses the policy where it trains)."""
    precision: str = "model"
    """model | bf16: the engine's GEMMs in the model's dtype or in bfloat16 (``SamplingParams.precision``;
    faster on a CPU with bf16 GEMMs, at bf16 rounding of the logits, so a greedy answer can differ)."""
    prefill_chunk: int = 0
    """rlvr's engine's chunked prefill (``SamplingParams.prefill_chunk``; 0 = whole prompt at once),
    as ``rollout.prefill_chunk`` in training."""
    kv_cache: str = "full"
    """full | int8 | sink_window: the KV cache to evaluate under (``SamplingParams.kv_cache``), so
    accuracy can be read per option (docs/long_context.md)."""
    kv_window: int = 256
    """With kv_cache int8: recent tokens kept in full precision; sink_window: recent tokens kept."""
    kv_sinks: int = 4
    """With kv_cache sink_window: first tokens of each sequence always kept (attention sinks)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Budgets of multi-turn episodes (the same as in training, for a fair comparison)."""
    model_load: ModelLoadConfig = field(default_factory=ModelLoadConfig)
    """How ``rlvr eval`` loads the model directory: dtype, trust_remote_code, chat_template."""

    def __post_init__(self) -> None:
        check_range("eval.tasks", self.tasks, 1)
        self.task_files = [as_file_config(f) for f in self.task_files]
        check_range("eval.samples", self.samples, 1)
        check_choice("eval.precision", self.precision, list(PRECISIONS))
        check_device("eval.device", self.device)
        check_range("eval.prefill_chunk", self.prefill_chunk, 0)
        check_choice("eval.kv_cache", self.kv_cache, list(KV_CACHES))
        check_range("eval.kv_window", self.kv_window, 1)
        check_range("eval.kv_sinks", self.kv_sinks, 0)
        for k in self.k:
            check_range("eval.k", k, 1, self.samples)


def evaluate(model, tokenizer, tasks: list[Task], cfg: EvalConfig, *, seed: int = 0, sandbox=None) -> dict:
    """Run the suite; return {"overall": stats, "by_domain": {domain: stats + by_level},
    "by_tag": {tag: stats} (tasks with ``meta.tags``), "tasks": [per task: id, domain, level,
    correct, samples, task], "samples": [a few completions]}.

    Multi-turn tasks play episodes in their environments, whose tools run in ``sandbox``
    (default: the process-wide shared sandbox)."""
    params = SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0, n=cfg.samples,
        stop_token_ids=[tokenizer.eos_token_id], precision=cfg.precision, prefill_chunk=cfg.prefill_chunk,
        kv_cache=cfg.kv_cache, kv_window=cfg.kv_window, kv_sinks=cfg.kv_sinks,
    )
    gen = torch.Generator().manual_seed(seed)
    pool = None
    if any(t.multi_turn for t in tasks):
        from rlvr.sandbox.config import shared_sandbox

        pool = EnvPool(cfg.env, sandbox if sandbox is not None else shared_sandbox())
    try:
        episodes = run_tasks(model, tokenizer, tasks, params, pool, generator=gen, batch_size=cfg.batch_size)
        verdicts = judge(tasks, episodes)
    finally:
        if pool is not None:
            pool.close()
    trajectories = [ep.trajectory for ep in episodes]
    correct: dict[str, int] = defaultdict(int)
    for traj, verdict in zip(trajectories, verdicts):
        correct[tasks[traj.group_id].id] += int(verdict.passed)

    def stats(subset: list[Task]) -> dict:
        out: dict = {"n_tasks": len(subset), "samples": cfg.samples}
        for k in cfg.k:
            values = [pass_at_k(cfg.samples, correct[t.id], k) for t in subset]
            out[f"pass@{k}"] = sum(values) / len(values)
            if cfg.samples == 1:
                out[f"pass@{k}_ci95"] = list(wilson_interval(sum(correct[t.id] for t in subset), len(subset)))
            else:
                out[f"pass@{k}_ci95"] = list(confidence_interval(values))
        return out

    report: dict = {"overall": stats(tasks), "by_domain": {}}
    tags = sorted({tag for t in tasks for tag in t.meta.get("tags", [])})
    if tags:
        report["by_tag"] = {tag: stats([t for t in tasks if tag in t.meta.get("tags", [])]) for tag in tags}
    for domain in sorted({t.domain for t in tasks}):
        in_domain = [t for t in tasks if t.domain == domain]
        report["by_domain"][domain] = stats(in_domain)
        report["by_domain"][domain]["by_level"] = {
            str(level): stats([t for t in in_domain if t.level == level])
            for level in sorted({t.level for t in in_domain})
        }
    report["tasks"] = [{"id": t.id, "domain": t.domain, "level": t.level, "correct": correct[t.id],
                        "samples": cfg.samples, "task": t.to_dict()} for t in tasks]
    report["samples"] = [
        {"task_id": tr.task_id, "completion": tr.completion,
         **({"messages": list(tr.messages), "info": tr.episode.to_dict()} if tr.episode else {})}
        for tr in trajectories[: min(8, len(trajectories))]
    ]
    return report
