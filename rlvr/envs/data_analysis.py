"""The ``data.analysis`` environment: SQL over a task's messy dataset, then a deliverable.

One tool, ``sql(query)``: one read-only SELECT over the task's table (``rlvr.tasks.data_analysis``,
rebuilt from the spec), run in the sandbox under its grant by the body
``rlvr.envs.bodies.sql.dataset_sql`` (sqlite3 under an authorizer that allows only reads of the
task's tables, an instruction limit, at most 20 rows shown). Every call is in the operation log
(``ToolEnv``). An assistant turn without a tool call is the deliverable and ends the episode:

- a number (``kind: number``): the final answer as the ``number`` verifier reads it (``Answer: N``
  or one ``\\boxed{N}``), within the task's ``abs_tol``;
- a table (``kind: table``): one ```` ```csv ```` block, header ``region,orders``, one row per
  region, compared cell by cell (names exactly, counts as numbers).

**Grounding**: the deliverable must come from the data, as ``tool.use``'s does. Every successful
query of the episode is run again on three perturbed copies of the table (``copies``: every
order's values raised, new orders added, both) in one sandbox job, and the gold is recomputed on
each copy in Python. A number is *supported* when some query result shows it at a place where,
on every copy, that query's result shows the copy's gold (``tool_grounding.tracks``); a table when
some query's result equals it cell by cell here and equals the copy's gold table on every copy.
A constant query (``SELECT 412``), an offset (``SELECT COUNT(*) + 5 ...``) or a lucky listing
prints the same or the wrong thing on the copies and supports nothing.

Verdicts: ``ok``; ``unsupported`` (the right deliverable, no query supports it); ``mismatch``
(wrong); ``no_answer`` (no number, several, or no single csv block); ``bad_table`` (a csv block
that is not a ``region,orders`` table).
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

from rlvr.envs.base import ENVS, EnvConfig, Step, ToolEnv
from rlvr.envs.bodies import sql as sql_body
from rlvr.envs.bodies.sql import format_rows
from rlvr.envs.grants import Grant, run_granted
from rlvr.envs.tool_grounding import tracks
from rlvr.envs.tools import Tool, ToolCallError
from rlvr.tasks import data_analysis as data
from rlvr.types import Verdict
from rlvr.verifiers.answer import locate_answer
from rlvr.verifiers.number import parse_number

BATCH_WALL_S = 20.0  # the grounding job: every query on every copy
_CSV = re.compile(r"^```csv[ \t]*\n(.*?)\n```[ \t]*$", re.MULTILINE | re.DOTALL)


def number_equal(tol: float):
    def equal(a: str, b: str) -> bool:
        x, _, _ = parse_number(a)
        y, _, _ = parse_number(b)
        return x is not None and y is not None and abs(x - y) <= Fraction(str(tol))

    return equal


def read_table(text: str) -> list[list] | None | str:
    """The one csv block's rows as ``[[region, n], ...]``; None for no single block; ``"bad"``
    for a block that is not a ``region,orders`` table."""
    blocks = _CSV.findall(text)
    if len(blocks) != 1:
        return None
    lines = [line.strip() for line in blocks[0].strip().splitlines() if line.strip()]
    if not lines or lines[0].replace(" ", "").lower() != "region,orders":
        return "bad"
    rows = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 2 or not re.fullmatch(r"\d+", cells[1]):
            return "bad"
        rows.append([cells[0], int(cells[1])])
    return rows


def result_table(result: str) -> list[list] | None:
    """A query result (``region, n`` lines) as table rows, or None."""
    rows = []
    for line in result.splitlines():
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != 2 or not re.fullmatch(r"\d+", cells[1]):
            return None
        rows.append([cells[0], int(cells[1])])
    return rows


@ENVS.register("data.analysis")
class DataAnalysisEnv(ToolEnv):
    """See the module docstring. ``self.log``: one dict per successful query."""

    name = "data.analysis"
    grants = {"sql": Grant(wall_s=5.0, memory_mb=1024, output_kb=16)}

    def __init__(self, cfg: EnvConfig | None = None, *, sandbox: Any = None) -> None:
        super().__init__(cfg, sandbox=sandbox)
        self.log: list[dict[str, Any]] = []
        self.answer_text = ""
        self._tables: dict | None = None

    def reset(self, task):
        self.log, self.answer_text, self._tables = [], "", None
        return super().reset(task)

    def tools(self) -> list[Tool]:
        return [Tool("sql", f"one SELECT on {data.SCHEMA}", self._sql, {"query": ("string", "the SQL query")},
                     grant=self.grants["sql"])]

    def _sandbox(self):
        if self.sandbox is None:
            from rlvr.verifiers.code import current_sandbox

            return current_sandbox()
        return self.sandbox

    def tables(self) -> dict:
        if self._tables is None:
            self._tables = data.tables(self.task.spec.payload)
        return self._tables

    def _sql(self, query: str) -> str:
        out = run_granted(self._sandbox(), "sql", sql_body.dataset_sql, self.grants["sql"], {"query": query},
                          context={"tables": self.tables()}, task_id=self.task.id)
        text, _, read = out.rpartition("\nread: ")
        if read == "1":
            self.log.append({"query": query, "result": text})
        return text

    def on_text(self, action: str) -> Step | None:
        self.answer_text = action
        self.finish_with("answer")
        return self._end("answer")

    # -- grounding

    def perturbed(self) -> tuple[list[list[str | None]], list]:
        """Each logged query's result on each copy (None where it failed), and the gold on each copy."""
        payload = self.task.spec.payload
        rows = self.tables()[data.TABLE]["rows"]
        copies = data.copies(rows, self.task.key or self.task.id, payload["level"])
        golds = [data.answer(payload["question"], c) for c in copies]
        if not self.log:
            return [], golds
        runs = [[c, e["query"]] for e in self.log for c in range(len(copies))]
        tables = [{data.TABLE: {"columns": list(data.COLUMNS), "rows": c}} for c in copies]
        grant = Grant(wall_s=min(BATCH_WALL_S, 2.0 + 0.5 * len(runs)), memory_mb=1024, output_kb=256)
        try:
            outs = json.loads(run_granted(self._sandbox(), "sql", sql_body.batch_tables, grant, {},
                                          context={"copies": tables, "runs": runs}, task_id=self.task.id))
        except (ToolCallError, json.JSONDecodeError):
            outs = []
        if not isinstance(outs, list) or len(outs) != len(runs):
            outs = [{}] * len(runs)
        texts = [format_rows(list(o["rows"]), bool(o.get("more"))) if o.get("ok") else None for o in outs]
        n = len(copies)
        return [texts[i * n:(i + 1) * n] for i in range(len(self.log))], golds

    def supported(self, deliverable) -> bool:
        per_query, golds = self.perturbed()
        payload = self.task.spec.payload
        for entry, runs in zip(self.log, per_query):
            if any(r is None for r in runs):
                continue
            if payload["kind"] == "table":
                if result_table(entry["result"]) == deliverable and \
                        all(result_table(r) == g for r, g in zip(runs, golds)):
                    return True
            elif tracks(entry["result"], runs, deliverable, [str(g) for g in golds],
                        number_equal(payload.get("abs_tol", 0.0))):
                return True
        return False

    # -- the verdict

    def _verify(self) -> Verdict:
        payload = self.task.spec.payload
        details: dict[str, Any] = {"tool_calls": len(self.log), "kind": payload["kind"]}
        if payload["kind"] == "table":
            table = read_table(self.answer_text)
            details["format_ok"] = isinstance(table, list)
            if table is None:
                return Verdict(False, 0.0, "no_answer", details)
            if table == "bad":
                return Verdict(False, 0.0, "bad_table", details)
            if table != payload["answer"]:
                return Verdict(False, 0.0, "mismatch", {**details, "rows": len(table)})
            return Verdict(True, 1.0, "ok", details) if self.supported(table) else \
                Verdict(False, 0.0, "unsupported", details)
        extracted, status = locate_answer(self.answer_text, "final")
        details.update(extracted=extracted, gold=payload["answer"], format_ok=extracted is not None)
        if extracted is None:
            return Verdict(False, 0.0, "no_answer", {**details, "status": status})
        value, unit, reason = parse_number(extracted)
        if value is None or unit:
            return Verdict(False, 0.0, "no_answer", {**details, "status": reason if value is None else "unit"})
        if not number_equal(payload.get("abs_tol", 0.0))(extracted, str(payload["answer"])):
            return Verdict(False, 0.0, "mismatch", details)
        if not self.supported(extracted):
            return Verdict(False, 0.0, "unsupported", details)
        return Verdict(True, 1.0, "ok", details)
