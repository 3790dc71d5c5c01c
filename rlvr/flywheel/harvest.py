"""``rlvr flywheel harvest``: captured traffic (``rlvr serve --capture``) to verified task files.

Every captured chat response becomes a candidate task when a reference answer exists for it, from
(first that applies): the user's **correction** (``POST /v1/feedback``; the answer read from it at
the criteria's ``answer_at`` and the correction kept as the reference, or the whole correction as
the answer when none can be read there), the user's **checker**
(``checker: module:fn`` in the criteria file, called with the last user message; it returns the
answer, or None when it cannot tell), or the response itself when it was rated **up** (its
answer read at the criteria's ``answer_at``; the response kept as the reference). The prompt is
the request's messages as served. Then, in this order, a candidate is dropped when:

- ``completions`` / ``tool_conversation``: it came from ``/v1/completions`` (raw text, not a
  chat), or its request offered tools or its messages hold tool calls or results (the task's
  prompt would not be what the model saw);
- ``no_reference`` / ``rejected_without_correction`` / ``approved_without_answer`` /
  ``checker_error``: no reference could be had;
- ``unverifiable``: ``rlvr tasks validate`` finds a problem in its row (a reference that fails
  the criteria's verifier, a payload the verifier refuses, ...);
- ``contaminated``: it is an item of an eval file the user names (same prompt once normalised),
  or ``near_contaminated``: a near-duplicate of one (``rlvr.flywheel.near_dup``);
- ``duplicate`` / ``near_duplicate``: an earlier kept candidate has the same (or a nearly the
  same) prompt; the first in traffic order stays.

The rest are split into train and held-out by a stable key (sha256 of the normalised prompt), so
a prompt lands on the same side in every harvest. Written to ``OUT``: ``train.jsonl`` and
``heldout.jsonl`` (rlvr task rows: ``--tasks`` reads them as they are), ``candidates.jsonl``
(every candidate row, as validated), ``dropped.jsonl`` (id, reason, detail) and ``report.json``
(counts). The criteria file is YAML with the keys a ``task_files`` entry takes (``verifier``,
``options``, ``reward``, ``system_prompt``, ``instruction``, ``domain``, ``level``; defaults here:
``instruction: ""``, served prompts are trained as users sent them, and ``domain: flywheel``)
plus ``checker``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlvr.atomic import write_text_atomic
from rlvr.config import from_dict, read_yaml
from rlvr.errors import ConfigError, UserError
from rlvr.flywheel.near_dup import NearDuplicateIndex
from rlvr.serve.capture import ReadStats, read_traffic
from rlvr.tasks.files import parse_file
from rlvr.tasks.rows import TaskFileConfig, as_file_config
from rlvr.tasks.validate import contamination_text, export, validate
from rlvr.types import Task
from rlvr.verifiers.answer import locate_answer

CRITERIA_KEYS = ("verifier", "options", "reward", "system_prompt", "instruction", "domain", "level", "checker")
REASONS = ("completions", "tool_conversation", "no_reference", "rejected_without_correction",
           "approved_without_answer", "checker_error", "unverifiable", "contaminated", "near_contaminated",
           "duplicate", "near_duplicate")


@dataclass
class Criteria:
    """The acceptance criteria of harvested tasks (a criteria YAML file)."""

    file: TaskFileConfig
    """How a candidate row becomes a task (its ``path`` is set per file)."""
    checker: str = ""
    """``module:fn`` or ``file.py:fn``: the reference answer of a prompt, or None."""


def load_criteria(path: str | Path) -> Criteria:
    data = read_yaml(path)
    unknown = sorted(set(data) - set(CRITERIA_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; a criteria file takes: {', '.join(CRITERIA_KEYS)}")
    checker = data.pop("checker", "") or ""
    if checker:
        from rlvr.verifiers.python_reward import resolve_reward_fn

        resolve_reward_fn(checker)  # a checker that cannot be imported stops here, once
    return Criteria(from_dict(TaskFileConfig, {"instruction": "", "domain": "flywheel", **data}), checker)


@dataclass
class HarvestConfig:
    traffic: str
    """The capture directory (``rlvr serve --capture DIR``)."""
    criteria: str
    """The criteria YAML file."""
    out: str
    """Where the task files and the report go."""
    eval_files: list[TaskFileConfig | str] = field(default_factory=list)
    """Eval files whose items (and near-duplicates of them) never become training tasks."""
    held_out: float = 0.2
    """Share of kept tasks in ``heldout.jsonl``."""
    near_dup: float = 0.8
    """Character 5-gram Jaccard similarity (same numbers) at which two prompts are one."""

    def __post_init__(self) -> None:
        self.eval_files = [as_file_config(f) for f in self.eval_files]
        if not 0.0 <= self.held_out < 1.0:
            raise ConfigError(f"held_out must be in [0, 1), got {self.held_out}")
        if not 0.0 < self.near_dup <= 1.0:
            raise ConfigError(f"near_dup must be in (0, 1], got {self.near_dup}")


@dataclass
class Dropped:
    id: str
    reason: str
    detail: str = ""


def held_out_side(task: Task, share: float) -> bool:
    """Whether ``task`` is held out: the first 8 bytes of sha256(its normalised prompt) below ``share``."""
    digest = hashlib.sha256(contamination_text(task).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def _user_text(messages: list[dict]) -> str:
    users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


def candidate_row(rid: str, record: dict, feedback: dict | None, criteria: Criteria) -> dict | Dropped:
    """The task row of one captured response, or why it has none."""
    if record.get("endpoint") != "chat":
        return Dropped(rid, "completions", "raw-text prompts of /v1/completions are not chat tasks")
    messages = (record.get("request") or {}).get("messages") or []
    if (record.get("request") or {}).get("tools") or any(m.get("role") == "tool" or m.get("tool_calls")
                                                         for m in messages):
        return Dropped(rid, "tool_conversation")
    prompt = [{"role": "system" if m["role"] == "developer" else m["role"], "content": m.get("content") or ""}
              for m in messages]
    choices = record.get("choices") or []
    k = (feedback or {}).get("choice", 0)
    text = choices[k]["text"] if k < len(choices) else ""
    row: dict[str, Any] = {"id": f"traffic:{rid}", "prompt": prompt}
    rating = (feedback or {}).get("rating")
    answer_at = criteria.file.options.get("answer_at", "final")
    if feedback and feedback.get("correction"):
        correction = feedback["correction"].strip()
        located, _ = locate_answer(correction, answer_at)
        if located is None:  # the answer alone
            return {**row, "answer": correction, "source": "correction"}
        return {**row, "answer": located, "reference": correction, "source": "correction"}
    if criteria.checker:
        from rlvr.verifiers.python_reward import resolve_reward_fn

        try:
            answer = resolve_reward_fn(criteria.checker)(_user_text(prompt))
        except Exception as e:  # noqa: BLE001 - the user's code: its failure is this row's reason
            return Dropped(rid, "checker_error", f"{type(e).__name__}: {e}"[:300])
        if answer is not None:
            return {**row, "answer": str(answer), "source": "checker"}
    if rating == "up":
        answer, status = locate_answer(text, answer_at)
        if answer is None:
            return Dropped(rid, "approved_without_answer", status)
        return {**row, "answer": answer, "reference": text, "source": "approved"}
    if rating == "down":
        return Dropped(rid, "rejected_without_correction")
    return Dropped(rid, "no_reference")


def _line(where: str) -> int:
    return int(where.rsplit(":", 1)[1])


def _problem_reason(message: str) -> str:
    if "also in the eval set" in message:
        return "contaminated"
    if "repeats the prompt" in message:
        return "duplicate"
    return "unverifiable"


def harvest(cfg: HarvestConfig, criteria: Criteria | None = None) -> dict:
    """Harvest ``cfg.traffic`` into ``cfg.out``; the report (also ``OUT/report.json``)."""
    criteria = criteria or load_criteria(cfg.criteria)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    stats = ReadStats()
    responses: dict[str, dict] = {}
    feedback: dict[str, dict] = {}
    wheres: dict[str, str] = {}
    for where, record in read_traffic(cfg.traffic, stats):
        if record["type"] == "response" and record["id"] not in responses:
            responses[record["id"]], wheres[record["id"]] = record, where
        elif record["type"] == "feedback":
            feedback[record["id"]] = record  # the latest judgement wins

    dropped: list[Dropped] = []
    rows: list[dict] = []
    for rid, record in responses.items():
        got = candidate_row(rid, record, feedback.get(rid), criteria)
        (dropped if isinstance(got, Dropped) else rows).append(got)
    candidates = out / "candidates.jsonl"
    write_text_atomic(candidates, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    file_cfg = replace(criteria.file, path=str(candidates))
    reasons: dict[int, tuple[str, str]] = {}
    for problem in validate(file_cfg, cfg.eval_files):
        if problem.where.startswith(f"{candidates}:"):
            reasons.setdefault(_line(problem.where), (_problem_reason(problem.message), problem.message))
        else:  # an eval file's own problem: its items could not be checked against
            raise UserError(f"eval file problem: {problem}")
    parsed, _ = parse_file(file_cfg)
    tasks = {_line(where): task for where, task in parsed}

    evals = NearDuplicateIndex(cfg.near_dup)
    for eval_cfg in cfg.eval_files:
        for where, task in parse_file(eval_cfg)[0]:
            evals.add(f"{task.id} ({where})", contamination_text(task))
    kept_index = NearDuplicateIndex(cfg.near_dup)
    train: list[Task] = []
    heldout: list[Task] = []
    for line, row in enumerate(rows, 1):
        rid = row["id"].removeprefix("traffic:")
        if line in reasons or line not in tasks:
            reason, detail = reasons.get(line, ("unverifiable", "the row did not parse"))
            dropped.append(Dropped(rid, reason, detail))
            continue
        task = tasks[line]
        text = contamination_text(task)
        hit = evals.find(text)
        if hit is not None:
            dropped.append(Dropped(rid, "near_contaminated", f"a near-duplicate of eval item {hit}"))
            continue
        hit = kept_index.find(text)
        if hit is not None:
            dropped.append(Dropped(rid, "near_duplicate", f"a near-duplicate of {hit}"))
            continue
        kept_index.add(task.id, text)
        record = responses[rid]
        meta = {**task.meta, "source": "traffic", "where": wheres[rid], "response_id": rid,
                "reference_from": row["source"],
                "model_version": record.get("model_version"), "captured": record.get("time")}
        task = Task(**{**task.__dict__, "meta": meta})
        (heldout if held_out_side(task, cfg.held_out) else train).append(task)

    export(train, out / "train.jsonl")
    export(heldout, out / "heldout.jsonl")
    write_text_atomic(out / "dropped.jsonl", "".join(json.dumps(d.__dict__, ensure_ascii=False) + "\n"
                                                     for d in dropped))
    counts = Counter(d.reason for d in dropped)
    report = {
        "traffic": str(cfg.traffic), "files": stats.files, "records": stats.records, "torn_lines": stats.torn,
        "responses": len(responses), "feedback": len(feedback), "candidates": len(rows),
        "kept": {"train": len(train), "heldout": len(heldout)},
        "sources": dict(Counter(t.meta["reference_from"] for t in train + heldout)),
        "dropped": {r: counts[r] for r in REASONS if counts[r]},
        "eval_files": [f.path for f in cfg.eval_files],
    }
    write_text_atomic(out / "report.json", json.dumps(report, indent=2))
    return report


def print_report(report: dict, out: str) -> None:
    kept = report["kept"]
    print(f"harvest: {report['responses']} responses ({report['feedback']} with feedback, "
          f"{report['torn_lines']} torn lines skipped) -> {report['candidates']} candidates -> "
          f"{kept['train']} train + {kept['heldout']} held-out tasks in {out}")
    for reason, n in report["dropped"].items():
        print(f"  dropped {n:5d}  {reason}")
