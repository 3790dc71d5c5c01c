"""``rlvr tasks validate | stats | export | from-failures``: a task set checked before it is trusted.

``validate(cfg, evals)`` lists every problem of a file (``rlvr.tasks.files.Problem``, each with
file, line or row, and field): rows that do not parse (schema, types, empty prompt, unknown
verifier, malformed spec), a file that cannot be read or is not UTF-8, duplicate ids, duplicate
prompts (compared case-folded with whitespace collapsed), a reference or gold answer that fails
its own verifier, and rows that are also in an eval set (same id, or same normalised prompt).

``from_failures(report)`` turns the failed items of an ``rlvr eval`` result into a task file
for the next round (the data flywheel). Those tasks keep ``meta.from_eval`` (the eval result
they came from), and training refuses them (``refuse_eval_tasks``) unless the run sets
``allow_eval_tasks``: an eval item trained on no longer measures anything.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from rlvr.errors import UserError
from rlvr.tasks.files import Problem, duplicate_ids, location_order, parse_file, self_check
from rlvr.tasks.rows import TaskFileConfig, as_file_config, normalised_prompt
from rlvr.types import Task


def validate(cfg: TaskFileConfig | str, evals: list[TaskFileConfig | str] = (), *,
             check_answers: bool = True) -> list[Problem]:
    """Every problem of the task file ``cfg`` (and its overlap with the ``evals`` files), in file order."""
    cfg = as_file_config(cfg)
    parsed, problems = parse_file(cfg)
    problems += duplicate_ids(parsed)
    problems += duplicate_prompts(parsed)
    if check_answers and parsed:
        for (where, task), reason in zip(parsed, self_check([t for _, t in parsed])):
            if reason is not None:
                field = "reference" if task.reference is not None else "answer"
                problems.append(Problem(where, field, reason))
    for eval_cfg in evals:
        eval_parsed, eval_problems = parse_file(eval_cfg)
        problems += eval_problems
        problems += overlap_problems(parsed, eval_parsed)
    return sorted(problems, key=lambda p: location_order(p.where))


def duplicate_prompts(parsed: list[tuple[str, Task]]) -> list[Problem]:
    first: dict[str, str] = {}
    out = []
    for where, task in parsed:
        key = normalised_prompt(task)
        if key in first:
            out.append(Problem(where, "prompt", f"field 'prompt' repeats the prompt of {first[key]}"))
        else:
            first[key] = where
    return out


def overlap_problems(train: list[tuple[str, Task]], eval: list[tuple[str, Task]]) -> list[Problem]:
    ids = {t.id: w for w, t in eval}
    prompts = {normalised_prompt(t): w for w, t in eval}
    out = []
    for where, task in train:
        if task.id in ids:
            out.append(Problem(where, "id", f"field 'id' {task.id!r} is also in the eval set ({ids[task.id]})"))
        elif normalised_prompt(task) in prompts:
            out.append(Problem(where, "prompt", f"field 'prompt' is also in the eval set "
                                                f"({prompts[normalised_prompt(task)]})"))
    return out


def refuse_eval_tasks(train: list[Task], eval: list[Task], *, allowed: bool, key: str) -> None:
    """Raise ``UserError`` when training tasks include eval items: tasks written from an eval
    result (``meta.from_eval``) or tasks whose id or normalised prompt is in ``eval``; ``allowed``
    (the config key ``key``) lets them through."""
    if allowed:
        return
    from_eval = [t for t in train if t.meta.get("from_eval")]
    if from_eval:
        t = from_eval[0]
        raise UserError(f"{len(from_eval)} training task(s) came from an eval result (first: {t.id} from "
                        f"{t.meta['from_eval']}); training on eval items spoils that eval. Write new tasks "
                        f"like them, or set {key}=true to train on them anyway")
    ids = {t.id for t in eval}
    prompts = {normalised_prompt(t) for t in eval}
    both = [t for t in train if t.id in ids or normalised_prompt(t) in prompts]
    if both:
        raise UserError(f"{len(both)} training task(s) are also eval tasks (first: {both[0].id}, "
                        f"{both[0].meta.get('where', both[0].meta.get('source', 'generated'))}); "
                        f"remove them or set {key}=true")


# ---------------------------------------------------------------- stats and export


def _spread(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "median": 0, "max": 0}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def stats(tasks: list[Task]) -> dict[str, Any]:
    """Counts by domain, level, verifier and tag; prompt and answer lengths in characters."""
    tags = Counter(tag for t in tasks for tag in t.meta.get("tags", []))
    answers = [len(str(t.spec.payload["answer"])) for t in tasks if "answer" in t.spec.payload]
    return {
        "tasks": len(tasks),
        "by_domain": dict(sorted(Counter(t.domain for t in tasks).items())),
        "by_level": {str(k): v for k, v in sorted(Counter(t.level for t in tasks).items())},
        "by_verifier": dict(sorted(Counter(t.spec.kind for t in tasks).items())),
        **({"by_tag": dict(sorted(tags.items()))} if tags else {}),
        "prompt_chars": _spread([sum(len(m["content"]) for m in t.prompt) for t in tasks]),
        "answer_chars": _spread(answers),
        "with_reference": sum(t.reference is not None for t in tasks),
    }


def export(tasks: list[Task], out: str | Path) -> Path:
    """Tasks as rlvr JSONL (``Task.to_dict`` per line); the file loads back to the same tasks."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    return out


def from_failures(report_path: str | Path, *, below: float = 1.0) -> list[Task]:
    """The tasks of an ``rlvr eval`` result whose pass rate is below ``below`` (default: every
    task not solved by all its samples), marked ``meta.from_eval``."""
    path = Path(report_path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable eval result: {e}") from None
    items = report.get("tasks") if isinstance(report, dict) else None
    if not isinstance(items, list):
        raise UserError(f"{path}: no 'tasks' list; write it with `rlvr eval ... --out FILE`")
    out = []
    for i, item in enumerate(items):
        try:
            rate = item["correct"] / item["samples"]
            task = Task.from_dict(item["task"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            raise UserError(f"{path}: tasks[{i}] is malformed ({type(e).__name__}: {e})") from None
        if rate < below:
            meta = {**task.meta, "from_eval": str(path), "eval_pass_rate": rate}
            out.append(Task(**{**task.__dict__, "meta": meta}))
    return out
