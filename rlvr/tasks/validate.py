"""``rlvr tasks validate | stats | export | from-failures``: a task set checked before it is trusted.

``validate(cfg, evals)`` lists every problem of a file (``rlvr.tasks.files.Problem``, each with
file, line or row, and field): rows that do not parse (schema, types, empty prompt, unknown
verifier, malformed spec), a file that cannot be read or is not UTF-8, duplicate ids, duplicate
prompts (compared case-folded with whitespace collapsed), a reference or gold answer that fails
its own verifier, and rows that are also in an eval set (same id, or the same prompt once
``contamination_text`` normalises it).

``contamination(train, eval)`` finds training tasks that are eval tasks (same id, canonical key or
normalised prompt); ``refuse_eval_tasks`` stops training on them, ``rlvr eval contamination``
reports them.

``from_failures(report)`` turns the failed items of an ``rlvr eval`` result into a task file
for the next round (the data flywheel). Those tasks keep ``meta.from_eval`` (the eval result
they came from), and training refuses them (``refuse_eval_tasks``) unless the run sets
``allow_eval_tasks``: an eval item trained on no longer measures anything.
"""

from __future__ import annotations

import json
import re
import statistics
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.errors import UserError
from rlvr.tasks.base import seen_in
from rlvr.tasks.files import (
    Problem,
    duplicate_ids,
    location_order,
    parse_file,
    self_check,
)
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
    prompts = {contamination_text(t): w for w, t in eval}
    out = []
    for where, task in train:
        if task.id in ids:
            out.append(Problem(where, "id", f"field 'id' {task.id!r} is also in the eval set ({ids[task.id]})"))
        elif contamination_text(task) in prompts:
            out.append(Problem(where, "prompt", f"field 'prompt' is also in the eval set "
                                                f"({prompts[contamination_text(task)]})"))
    return out


def refuse_eval_tasks(train: list[Task], eval: list[Task], *, allowed: bool, key: str) -> None:
    """Raise ``UserError`` when training tasks include eval items: tasks written from an eval
    result (``meta.from_eval``) or tasks that ``contamination`` finds in ``eval`` (same id, same
    canonical key, or the same prompt once normalised); ``allowed`` (the config key ``key``) lets
    them through. The message names the eval domains hit and shows one prompt."""
    if allowed:
        return
    from_eval = [t for t in train if t.meta.get("from_eval")]
    if from_eval:
        t = from_eval[0]
        raise UserError(f"{len(from_eval)} training task(s) came from an eval result (first: {t.id} from "
                        f"{t.meta['from_eval']}); training on eval items spoils that eval. Write new tasks "
                        f"like them, or set {key}=true to train on them anyway")
    found = contamination(train, eval)
    if found:
        first = found[0]
        where = first.train.meta.get("where", first.train.meta.get("source", "generated"))
        by_domain = Counter(c.eval.domain for c in found)
        domains = ", ".join(f"{d} {n}" for d, n in sorted(by_domain.items()))
        raise UserError(f"{len(found)} training task(s) are also eval tasks (first: {first.train.id}, {where}, "
                        f"same {first.how} as eval task {first.eval.id} of {first.eval.domain}: "
                        f"{_shorten(contamination_text(first.eval))!r}; eval tasks hit per domain: {domains}); "
                        f"remove them or set {key}=true")


# ---------------------------------------------------------------- contamination

_UNIFY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"',
                        "\u2013": "-", "\u2014": "-", "\u2212": "-", "\u00a0": " "})
_EDGE_PUNCT = re.compile(r"[.,;:!?]+(?=\s|$)|(?:(?<=\s)|^)[.,;:!?]+")
_CONTENT_INSTRUCTIONS = ("choice", "json")
"""Verifiers whose answer-format instruction carries part of the problem (the options, the schema)."""


def normalise_text(text: str) -> str:
    """Prompt text as the contamination check compares it: Unicode NFKC, case-folded, curly
    quotes and dashes made plain, sentence punctuation (``. , ; : ! ?``) dropped where it ends or
    starts a word, whitespace collapsed. Digits, operators, brackets, quotes and punctuation inside
    a token (``3.5``, ``1,000``, ``os.path``) stay: ``Compute: 3 + 4.`` and ``compute 3 + 4`` are
    one prompt, ``3 - 4`` and ``3 + 4`` are two."""
    text = unicodedata.normalize("NFKC", text).translate(_UNIFY).casefold()
    return " ".join(_EDGE_PUNCT.sub(" ", text).split())


def contamination_text(task: Task) -> str:
    """The user-visible problem of a task: its last user message, without the answer-format
    instruction its verifier appends (``rlvr.tasks.rows``), normalised (``normalise_text``)."""
    users = [m["content"] for m in task.prompt if m["role"] == "user"]
    text = users[-1] if users else ""
    if task.spec.kind not in _CONTENT_INSTRUCTIONS:
        from rlvr.verifiers import VERIFIERS

        make = getattr(VERIFIERS.get(task.spec.kind), "instruction", None) if task.spec.kind in VERIFIERS else None
        try:
            instruction = make(task.spec.payload) if callable(make) else ""
        except (KeyError, TypeError, ValueError):  # a payload the verifier cannot describe: keep the text
            instruction = ""
        if instruction and text.rstrip().endswith(instruction):
            text = text.rstrip()[: -len(instruction)]
    return normalise_text(text)


@dataclass(frozen=True)
class Contaminated:
    """A training task that is an eval task: ``how`` is ``id``, ``key`` (the canonical
    ``(domain, key)``, also when the train task's reference reveals it) or ``prompt``."""

    train: Task
    eval: Task
    how: str


def contamination(train: list[Task], eval: list[Task]) -> list[Contaminated]:
    """Each training task found in ``eval`` (in training order, the first match per task): same
    id, same canonical key (``rlvr.tasks.base.overlap``'s rule) or same ``contamination_text``.
    Multi-turn tasks are matched by id and key only: their prompt states the goal, the problem
    lives in the environment, so two different problems often share one prompt."""
    by_id = {t.id: t for t in eval}
    by_key = {(t.domain, t.key or t.id): t for t in eval}
    by_text: dict[str, Task] = {}
    for t in eval:
        if not t.multi_turn:
            by_text.setdefault(contamination_text(t), t)
    by_text.pop("", None)
    out = []
    for t in train:
        keyed = [by_key[k] for k in sorted(seen_in(t)) if k in by_key]
        if t.id in by_id:
            out.append(Contaminated(t, by_id[t.id], "id"))
        elif keyed:
            out.append(Contaminated(t, keyed[0], "key"))
        elif not t.multi_turn and by_text and contamination_text(t) in by_text:
            out.append(Contaminated(t, by_text[contamination_text(t)], "prompt"))
    return out


def _shorten(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


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
