"""Task sets from a user's files: JSONL, CSV, Parquet or a Hugging Face datasets directory.

``load_tasks(cfg)`` reads a ``TaskFileConfig`` (``rlvr.tasks.rows``: path, column mapping,
verifier, options, system prompt, instruction, split) into ``Task``s. ``parse_file`` does the
reading and parsing and returns every problem it finds (``rlvr tasks validate`` lists them all);
``load_tasks`` stops at the first malformed row with ``FILE:LINE: field 'x' ...`` (a
``UserError``), refuses duplicate ids, then checks acceptance criteria against themselves: a
task whose reference (or, without one, its gold answer placed where the verifier wants it) fails
its own verifier is dropped with the reason (code references run in the sandbox, all in one
batch), and the rest are kept: a task no answer can pass only adds noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import UserError
from rlvr.tasks.readers import Url, is_url, read_rows
from rlvr.tasks.rows import INSTRUCTION, RowError, TaskFileConfig, as_file_config, row_to_task
from rlvr.types import Task

__all__ = ["INSTRUCTION", "Problem", "TaskFileConfig", "load_task_file", "load_tasks", "parse_file", "drop_failing",
           "self_check"]

MAX_REASONS_SHOWN = 3


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a task file: where (``FILE:LINE``, ``FILE:row N`` or ``FILE``), which
    field (may be empty), and what."""

    where: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def parse_file(cfg: TaskFileConfig | str) -> tuple[list[tuple[str, Task]], list[Problem]]:
    """``(where, task)`` for every row that parses, and a ``Problem`` for every row that does not
    (a file that cannot be read at all is one problem). Rows of another split are left out."""
    cfg = as_file_config(cfg)
    path = Url(cfg.path) if is_url(cfg.path) else Path(cfg.path)
    parsed: list[tuple[str, Task]] = []
    problems: list[Problem] = []
    index = 0
    try:
        rows = list(read_rows(path, cfg.format, cfg.hf_split))
    except UserError as e:  # unreadable, not UTF-8, not CSV/Parquet/datasets: the whole file
        where, _, message = str(e).partition(": ")
        return [], [Problem(where, "", message)]
    for row in rows:
        if row.error:
            problems.append(Problem(row.where, "", row.error))
            continue
        index += 1
        try:
            task = row_to_task(row, cfg, path.stem, index)
        except RowError as e:
            problems.append(Problem(row.where, e.field, str(e)))
            continue
        except UserError as e:  # a verifier refused its payload
            problems.append(Problem(row.where, "spec", str(e)))
            continue
        if task is not None:
            parsed.append((row.where, task))
    return parsed, problems


def duplicate_ids(parsed: list[tuple[str, Task]]) -> list[Problem]:
    first: dict[str, str] = {}
    problems = []
    for where, task in parsed:
        if task.id in first:
            problems.append(Problem(where, "id", f"field 'id' repeats task {task.id!r} "
                                                 f"({_line_of(first[task.id])})"))
        else:
            first[task.id] = where
    return problems


def _line_of(where: str) -> str:
    tail = where.rsplit(":", 1)[-1]
    return f"line {tail}" if tail.isdigit() else tail


def load_tasks(cfg: TaskFileConfig | str, *, check_solutions: bool = True,
               warn=print) -> tuple[list[Task], list[str]]:
    """Tasks of a file, and the reasons for the ones dropped (see the module docstring).

    Raises ``UserError`` naming file, line and field at the first malformed row (with a count
    of the others) or a duplicate id.
    """
    cfg = as_file_config(cfg)
    parsed, problems = parse_file(cfg)
    problems = problems + duplicate_ids(parsed)
    if problems:
        first = min(problems, key=lambda p: location_order(p.where))
        more = (f" ({len(problems) - 1} more problem(s) in this file; `rlvr tasks validate {cfg.path}` "
                "lists them)") if len(problems) > 1 else ""
        raise UserError(f"{first}{more}")
    tasks = [t for _, t in parsed]
    if not tasks:
        raise UserError(f"{cfg.path}: no tasks" + (f" in split {cfg.split!r}" if cfg.split else ""))
    if not check_solutions:
        return tasks, []
    return drop_failing(tasks, str(cfg.path), warn)


def drop_failing(tasks: list[Task], source: str, warn=print) -> tuple[list[Task], list[str]]:
    """The tasks whose own answer passes their acceptance criteria (``self_check``), and the
    reasons for the others; ``warn`` gets one summary line. ``UserError`` when none pass."""
    reasons = self_check(tasks)
    kept = [t for t, r in zip(tasks, reasons) if r is None]
    dropped = [r for r in reasons if r is not None]
    summary = f"kept {len(kept)} of {len(tasks)} tasks from {source}"
    if dropped:
        shown = "; ".join(dropped[:MAX_REASONS_SHOWN])
        more = f"; and {len(dropped) - MAX_REASONS_SHOWN} more" if len(dropped) > MAX_REASONS_SHOWN else ""
        summary += f"; dropped {len(dropped)}: {shown}{more}"
    warn(summary)
    if tasks and not kept:
        raise UserError(f"{source}: every task fails its own acceptance criteria; first: {dropped[0]}")
    return kept, dropped


def location_order(where: str) -> tuple[str, int]:
    """Sort key of a ``FILE:LINE`` / ``FILE:row N`` / ``FILE`` location: file, then line."""
    head, _, tail = where.rpartition(":")
    digits = "".join(ch for ch in tail if ch.isdigit())
    return (head, int(digits)) if head and digits else (where, 0)


def load_task_file(path: str | Path, *, check_solutions: bool = True, warn=print) -> tuple[list[Task], list[str]]:
    """``load_tasks`` of one file read with the defaults (no mapping)."""
    return load_tasks(TaskFileConfig(path=str(path)), check_solutions=check_solutions, warn=warn)


def self_check(tasks: list[Task]) -> list[str | None]:
    """For each task, why its acceptance criteria reject its own answer, or None.

    The answer is the task's ``reference`` or, without one, the verifier's ``gold_completion``
    of the payload; a task with neither is not checked. A malformed code spec is a reason too.
    """
    from rlvr.verifiers import VERIFIERS, check_all
    from rlvr.verifiers.code import check_spec

    reasons: list[str | None] = [None] * len(tasks)
    pairs: list[tuple[int, str]] = []
    for i, task in enumerate(tasks):
        if task.multi_turn:
            continue  # an episode's scripted actions are checked by playing them (sft, conformance)
        if task.spec.kind == "code":
            try:
                check_spec(task)
            except UserError as e:
                reasons[i] = str(e)
                continue
        answer = task.reference
        if answer is None:
            gold = getattr(VERIFIERS.get(task.spec.kind), "gold_completion", None)
            answer = gold(task.spec.payload) if callable(gold) else None
        if isinstance(answer, str):
            pairs.append((i, answer))
    verdicts = check_all([(tasks[i], answer) for i, answer in pairs])
    for (i, answer), verdict in zip(pairs, verdicts):
        if not verdict.passed:
            error = verdict.details.get("error") or verdict.details.get("stderr") or ""
            what = "reference solution fails its tests" if tasks[i].spec.kind == "code" else (
                "reference fails its verifier" if tasks[i].reference is not None else
                "gold answer fails its own verifier")
            reasons[i] = (f"task {tasks[i].id}: {what}: {verdict.reason}"
                          + (f" ({str(error).strip()[:200]})" if error else ""))
    return reasons
