"""Preference pairs from verified rollouts (``rlvr pairs``): preferences from verification, not labels.

Sample ``samples`` completions per train task from a model, verify every one with the task's own
verifier (code in the sandbox), and pair a completion that passed with one that failed on the same
prompt. Tasks whose samples all pass or all fail give no pair (a tie says nothing about which
answer is better); identical completions are never paired. With ``prefer_shorter`` the shortest
correct answers are chosen first (less padding for the same verdict); rejected answers are taken
in a seeded shuffle. Each pair records both verdicts, the task and the model it came from
(``meta``), and the file is written atomically (``rlvr.tasks.pairs.write_pairs``).

Single-turn tasks only: a multi-turn episode is a conversation with tool results, not one response.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import torch

from rlvr.config import check_device, check_range, resolve_device
from rlvr.errors import UserError
from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer
from rlvr.rollout.collect import collect
from rlvr.rollout.engine import SamplingParams
from rlvr.tasks.pairs import PreferencePair, pair_problem, write_pairs
from rlvr.tasks.rows import TaskFileConfig, as_file_config
from rlvr.tasks.sets import build_task_set, needs_sandbox
from rlvr.tasks.validate import refuse_eval_tasks
from rlvr.types import Task, Trajectory, Verdict
from rlvr.verifiers.base import check_all


@dataclass
class PairsConfig:
    model: str = "runs/sft/final"
    """The model whose own samples are paired (usually the SFT model DPO starts from)."""
    model_load: ModelLoadConfig = field(default_factory=ModelLoadConfig)
    """How the model directory is loaded: dtype, trust_remote_code, chat_template."""
    out: str = "pairs.jsonl"
    """The pairs file written."""
    domains: list[str] = field(default_factory=lambda: ["math.arith", "math.word"])
    """Built-in domains whose train split is sampled (may be empty with ``task_files``)."""
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Difficulty levels included."""
    train_tasks: int = 500
    """Tasks drawn from ``domains`` (train split)."""
    task_files: list[TaskFileConfig | str] = field(default_factory=list)
    """The user's task files (docs/tasks.md)."""
    allow_eval_tasks: bool = False
    """Use tasks written from an eval result (``rlvr tasks from-failures``); refused by default."""
    seed: int = 0
    """Seed of the task draw and the sampling."""
    device: str = "cpu"
    """Where the model samples: cpu | cuda | cuda:N | auto."""
    samples: int = 8
    """Completions sampled per task."""
    temperature: float = 1.0
    """Sampling temperature (diverse samples give both verdicts more often)."""
    max_new_tokens: int = 64
    """Generation budget per completion; a completion cut at it is still paired by its verdict."""
    batch_size: int = 256
    """Sequences decoded together."""
    pairs_per_task: int = 1
    """Most pairs kept per task (distinct chosen/rejected combinations)."""
    prefer_shorter: bool = True
    """Choose the shortest correct completions first."""

    def __post_init__(self) -> None:
        check_device("pairs.device", self.device)
        self.task_files = [as_file_config(f) for f in self.task_files]
        if not (self.domains or self.task_files):
            raise UserError("pairs: no tasks: set 'domains' or 'task_files' (--tasks)")
        check_range("pairs.samples", self.samples, 2)
        check_range("pairs.pairs_per_task", self.pairs_per_task, 1)
        check_range("pairs.train_tasks", self.train_tasks, 1)


def _verdict(v: Verdict) -> dict:
    return {"passed": v.passed, "score": v.score, "reason": v.reason}


def pairs_of_task(task: Task, samples: list[tuple[Trajectory, Verdict]], k: int, prefer_shorter: bool,
                  rng: random.Random) -> list[tuple[tuple[Trajectory, Verdict], tuple[Trajectory, Verdict]]]:
    """Up to ``k`` (passed, failed) sample pairs of one task; none when all passed or all failed."""
    seen: set[str] = set()
    unique = [s for s in samples if s[0].completion.strip()  # an empty response is no answer to prefer
              and not (s[0].completion.strip() in seen or seen.add(s[0].completion.strip()))]
    passed = [s for s in unique if s[1].passed]
    failed = [s for s in unique if not s[1].passed]
    if not passed or not failed:
        return []
    if prefer_shorter:
        passed.sort(key=lambda s: sum(s[0].loss_mask))  # stable: equal lengths keep sample order
    rng.shuffle(failed)
    combos = sorted(product(range(len(passed)), range(len(failed))), key=lambda ij: (ij[0] + ij[1], ij[0]))
    return [(passed[i], failed[j]) for i, j in combos[:k]]


def build_pairs(cfg: PairsConfig, model, tokenizer, tasks: list[Task]) -> tuple[list[PreferencePair], dict]:
    """Sample, verify and pair; returns the pairs and counts (tasks, with pairs, all passed, all failed)."""
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, n=cfg.samples,
                            stop_token_ids=(tokenizer.eos_token_id,))
    gen = torch.Generator().manual_seed(cfg.seed)
    trajectories = collect(model, tokenizer, tasks, params, generator=gen, batch_size=cfg.batch_size)
    verdicts = check_all([(tasks[t.group_id], t.completion) for t in trajectories])
    by_task: dict[int, list[tuple[Trajectory, Verdict]]] = {}
    for t, v in zip(trajectories, verdicts):
        by_task.setdefault(t.group_id, []).append((t, v))
    rng = random.Random(cfg.seed)
    pairs: list[PreferencePair] = []
    counts = {"tasks": len(tasks), "tasks_with_pairs": 0, "all_passed": 0, "all_failed": 0, "samples": len(trajectories),
              "passed_samples": sum(v.passed for v in verdicts)}
    for g, task in enumerate(tasks):
        samples = by_task.get(g, [])
        n_pass = sum(v.passed for _, v in samples)
        counts["all_passed"] += n_pass == len(samples)
        counts["all_failed"] += n_pass == 0
        chosen_rejected = pairs_of_task(task, samples, cfg.pairs_per_task, cfg.prefer_shorter, rng)
        counts["tasks_with_pairs"] += bool(chosen_rejected)
        for n, ((c, cv), (r, rv)) in enumerate(chosen_rejected):
            pairs.append(PreferencePair(
                prompt=tuple(task.prompt), chosen=c.completion, rejected=r.completion, id=f"{task.id}/pair{n}",
                meta={"task_id": task.id, "domain": task.domain, "level": task.level, "model": cfg.model,
                      "chosen_verdict": _verdict(cv), "rejected_verdict": _verdict(rv),
                      "samples": cfg.samples, "temperature": cfg.temperature}))
    return pairs, counts


def run_pairs(cfg: PairsConfig) -> dict:
    device = resolve_device("pairs.device", cfg.device)
    tasks = build_task_set(cfg.domains, "train", cfg.train_tasks, seed=cfg.seed, levels=cfg.levels,
                           files=cfg.task_files)
    refuse_eval_tasks(tasks, [], allowed=cfg.allow_eval_tasks, key="allow_eval_tasks")
    multi = [t for t in tasks if t.multi_turn]
    if multi:
        raise UserError(f"pairs: {len(multi)} multi-turn task(s) (e.g. {multi[0].domain}): `rlvr pairs` "
                        "pairs single-turn responses; leave those domains out")
    if needs_sandbox(cfg.domains, tasks):
        from rlvr.sandbox.config import shared_sandbox

        shared_sandbox()  # code answers run here, never in this process
    model, tokenizer = load_model_and_tokenizer(cfg.model, device=device, options=cfg.model_load)
    model.eval()
    pairs, counts = build_pairs(cfg, model, tokenizer, tasks)
    writable = [p for p in pairs if pair_problem(p) is None]  # a pair that would not read back is left out
    counts["dropped_unwritable"] = len(pairs) - len(writable)
    if not writable:
        raise UserError(f"pairs: no task had both a passing and a failing sample among {cfg.samples} "
                        f"({counts['all_passed']} all passed, {counts['all_failed']} all failed); "
                        "raise --set samples or temperature, or pick harder/easier levels")
    write_pairs(Path(cfg.out), writable)
    return {"pairs": len(writable), **counts, "out": cfg.out}
