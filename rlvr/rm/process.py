"""Process rewards: a reward model that scores each step of a solution, trained on step labels
derived automatically from a verifiable domain.

Why this and not an implicit PRM (PRIME): an explicit step model is trained once, offline, from
labels that are *checked*, so what it learned can be measured on held-out steps before any RL run
depends on it, and it plugs into the reward interface as one more source with no change to the
update. PRIME's implicit PRM needs a second trainable LM updated inside every step and
token-level advantages; on this scale it doubles the step's cost.

Step labels (``label_steps``): rlvr's arithmetic domains (``math.arith``, ``math.word``) write
their reference as one equation per step (``12 + 7 = 19``) and then ``Answer: N``. A response's
step k (its k-th non-empty line) is correct when it is an equation whose arithmetic is true and
whose result is the reference's k-th intermediate result, or ``Answer: N`` with N the gold
answer (a skipped equation is no error); once a step is wrong every later step is wrong (the first error decides,
as in PRM800K's labelling). A line the labeller cannot read is a wrong step.

Step files (JSONL, one solution a line): ``prompt`` (text or chat messages), ``steps`` (strings)
and ``labels`` (0/1, one per step), optional ``id``; ``rlvr rm steps`` writes them from a model's
own samples (``build_step_file``). The response scored is the steps joined by newlines; a step's
score is read at its last token (``rlvr.rm.model.step_ends``).

As a reward (``rlvr.reward_sources``, kind ``process_reward``): the sigmoid of each step's score;
a response's process reward is the minimum over its steps (the weakest step), 0 for no step.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass, field

import torch

from rlvr.errors import UserError
from rlvr.rm.model import RewardModel, batch_tensors, encode, step_ends
from rlvr.tasks.readers import read_rows
from rlvr.types import Task

ANSWER = re.compile(r"^\s*Answer:\s*(-?\d+(?:\.\d+)?)\s*$")
EQUATION = re.compile(r"^\s*([-+*/ ().\d]+?)\s*=\s*(-?\d+(?:\.\d+)?)\s*$")
LABELLED_DOMAINS = ("math.arith", "math.word")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    raise ValueError("not arithmetic")


def equation_value(line: str) -> float | None:
    """The stated result of ``line`` when it is an equation whose arithmetic is true, else None."""
    m = EQUATION.match(line)
    if not m or len(m.group(1)) > 64:
        return None
    try:
        lhs = _arith(ast.parse(m.group(1), mode="eval").body)
    except (ValueError, SyntaxError, ZeroDivisionError):
        return None
    rhs = float(m.group(2))
    return rhs if abs(lhs - rhs) < 1e-9 else None


def steps_of(text: str) -> list[str]:
    """The steps of a response: its non-empty lines, stripped."""
    return [line.strip() for line in text.split("\n") if line.strip()]


def label_steps(task: Task, response: str) -> list[int]:
    """0/1 per step of ``response`` to ``task`` (module docstring); needs ``task.reference``."""
    if task.reference is None:
        raise ValueError(f"task {task.id} has no reference to label steps against")
    ref = steps_of(task.reference)
    want = [equation_value(s) for s in ref if not ANSWER.match(s)]
    gold = float(task.spec.payload["answer"])
    labels, ok = [], True
    for k, step in enumerate(steps_of(response)):
        answer = ANSWER.match(step)
        if answer:
            good = float(answer.group(1)) == gold
        else:
            value = equation_value(step)
            good = value is not None and k < len(want) and want[k] is not None and value == want[k]
        ok = ok and good
        labels.append(int(ok))
    return labels


@dataclass(frozen=True)
class StepExample:
    ids: list[int]
    ends: list[int]
    """Positions in ``ids`` of each step's last token."""
    labels: list[int]
    where: str


def _prompt(value, where: str) -> tuple[dict, ...]:
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m
                                                 for m in value):
        return tuple(value)
    raise UserError(f"{where}: field 'prompt' must be text or a list of chat messages")


def read_step_file(path: str) -> list[tuple[str, tuple[dict, ...], list[str], list[int]]]:
    """(id, prompt, steps, labels) of every line of a step file; a bad line is an error naming it."""
    out = []
    for row in read_rows(path, "jsonl"):
        if row.error:
            raise UserError(f"{row.where}: {row.error}")
        d = row.data
        steps, labels = d.get("steps"), d.get("labels")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s.strip() and "\n" not in s
                                                                   for s in steps):
            raise UserError(f"{row.where}: field 'steps' must be a non-empty list of one-line strings")
        if not isinstance(labels, list) or len(labels) != len(steps) or any(v not in (0, 1) for v in labels):
            raise UserError(f"{row.where}: field 'labels' must be one 0/1 per step ({len(steps)} steps)")
        out.append((str(d.get("id", row.where)), _prompt(d.get("prompt"), row.where), steps,
                    [int(v) for v in labels]))
    return out


def encode_steps(tokenizer, prompt, steps: list[str], labels: list[int], max_length: int,
                 where: str) -> StepExample | None:
    """The example's ids and each step's last-token position; None when truncation cut a step."""
    response = "\n".join(steps)
    ids, start = encode(tokenizer, prompt, response, max_length)
    ends = [start + e for e in step_ends(tokenizer, response)]
    if len(ends) != len(steps) or ends[-1] >= len(ids) - 1:
        return None
    return StepExample(ids, ends, labels, where)


def step_scores(rm: RewardModel, batch: list[StepExample], pad_token_id: int, device) -> list[torch.Tensor]:
    """Each example's step logits, one tensor per example."""
    ids, mask = batch_tensors([e.ids for e in batch], pad_token_id, device)
    scores = rm.token_scores(ids, mask)
    return [scores[i, e.ends] for i, e in enumerate(batch)]


def step_rows(tasks: list[Task], completions: list[tuple[int, str]]) -> list[dict]:
    """Step-file rows of ``(task index, completion)`` samples: each labelled by ``label_steps``;
    a completion with no step, or seen before for its task, is left out."""
    rows, seen = [], set()
    for g, text in completions:
        task, steps = tasks[g], steps_of(text)
        if not steps or (g, tuple(steps)) in seen:
            continue
        seen.add((g, tuple(steps)))
        rows.append({"id": f"{task.id}/s{len(rows)}", "task_id": task.id, "prompt": [dict(m) for m in task.prompt],
                     "steps": steps, "labels": label_steps(task, text)})
    return rows


def write_step_file(path: str, rows: list[dict]) -> None:
    """``rows`` as JSONL at ``path``, atomically."""
    from rlvr.atomic import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


@dataclass
class StepsConfig:
    """``rlvr rm steps``: step-labelled solutions from a model's own samples."""

    model: str = "runs/sft/final"
    """The model whose samples are labelled (usually the SFT model the policy starts from)."""
    out: str = "steps.jsonl"
    """The step file written."""
    domains: list[str] = field(default_factory=lambda: list(LABELLED_DOMAINS))
    """Domains with step labels (math.arith, math.word)."""
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Difficulty levels included."""
    train_tasks: int = 500
    """Train-split tasks sampled."""
    samples: int = 4
    """Completions per task."""
    temperature: float = 1.0
    """Sampling temperature (diverse samples give both labels)."""
    max_new_tokens: int = 64
    """Generation budget per completion."""
    batch_size: int = 256
    """Sequences decoded together."""
    seed: int = 0
    """Seed of the task draw and the sampling."""
    device: str = "cpu"
    """Where the model samples: cpu | cuda | cuda:N | auto."""

    def __post_init__(self) -> None:
        bad = [d for d in self.domains if d not in LABELLED_DOMAINS]
        if bad or not self.domains:
            raise UserError(f"rm steps: step labels exist for {', '.join(LABELLED_DOMAINS)}; got {bad or 'none'}")


def run_steps(cfg: StepsConfig) -> dict:
    """Sample, label and write the step file; counts of solutions and steps by label."""
    from rlvr.config import resolve_device
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.rollout.collect import collect
    from rlvr.rollout.engine import SamplingParams
    from rlvr.tasks.sets import build_task_set

    model, tokenizer = load_model_and_tokenizer(cfg.model, device=resolve_device("steps.device", cfg.device))
    tasks = build_task_set(cfg.domains, "train", cfg.train_tasks, seed=cfg.seed, levels=cfg.levels)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, n=cfg.samples,
                            stop_token_ids=(tokenizer.eos_token_id,))
    trajectories = collect(model.eval(), tokenizer, tasks, params, generator=torch.Generator().manual_seed(cfg.seed),
                           batch_size=cfg.batch_size)
    rows = step_rows(tasks, [(t.group_id, t.completion) for t in trajectories])
    write_step_file(cfg.out, rows)
    labels = [v for r in rows for v in r["labels"]]
    return {"out": cfg.out, "tasks": len(tasks), "samples": len(trajectories), "solutions": len(rows),
            "steps": len(labels), "correct_steps": sum(labels),
            "solutions_all_correct": sum(all(r["labels"]) for r in rows)}
