r"""The ``tool.use`` environment: a calculator and SQL over the task's small database.

Tools (offered per task: ``calculator`` always, ``sql`` when the task has a database)::

    calculator(expression)  arithmetic over ints/floats: + - * / // % ** (small exponents),
                            unary minus, parentheses. Parsed with ``ast`` and walked node by
                            node; never ``eval``. Magnitudes are bounded.
    sql(query)              one read-only statement on the table ``items(name, kind, price, qty)``.

Both tools run in the sandbox, each under its grant (``grants``; ``rlvr.envs.grants``): their
bodies are ``rlvr.envs.bodies.calculator`` (an ``ast`` walk, never ``eval``) and
``rlvr.envs.bodies.sql`` (an in-memory sqlite3 database built from the task's rows, the query
under an authorizer that allows only SELECT, FUNCTION and READ of ``items``, an instruction
limit, at most ten rows shown). Grounding replays of calculator expressions (verifier
work, numbers only) use the same ``ast`` walker in-process.

An assistant turn without a tool call is the final answer and ends the episode. The verdict:

    ok           the answer (strict extraction, as the ``math`` verifier) equals the gold
                 and is *supported*: it appears as a number in a *grounded* tool result of this
                 episode whose call's arguments do not already contain it. Grounded, in
                 short (the rules: ``rlvr.envs.tool_grounding``): an ``sql`` result of a query
                 that read ``items``, has no literal that is not in the question, and changes on
                 perturbed copies of the table; a ``calculator`` result whose every operand is a
                 number of the question or of an earlier grounded result. The result that shows
                 the answer must also track it: replayed on the copies, it gives the gold of
                 each copy (the expert's calls replayed there).
    unsupported  the right value, but no tool result supports it (e.g. answered from memory)
    mismatch     a wrong answer (or not in final form)
    no_answer    no final answer, or several (``multiple_answers`` is folded into it)

A failed verdict has score ``FOUND_SCORE`` (else 0) when a supporting (so grounded) tool result is
exactly the gold value and nothing else (one number, so listing rows cannot earn it): the right call was made
and its result not carried into the answer. ``passed`` stays False; the score is partial credit
for ``reward.outcome: score`` (the agentic recipe uses it for ``tool.use``).
"""

from __future__ import annotations

import json
from typing import Any

from rlvr.envs.base import ENVS, EnvConfig, Step, ToolEnv
from rlvr.envs.bodies import sql as sql_body
from rlvr.envs.bodies.calculator import calculate, evaluate, format_number
from rlvr.envs.bodies.sql import format_rows
from rlvr.envs.grants import Grant, run_granted
from rlvr.envs.tool_grounding import (
    COPIES,
    MAX_VECTORS,
    NUMBER,
    ROW_COPIES,
    calc_replays,
    calc_tracks,
    numbers_in,
    perturbed_tables,
    question_numbers,
    replay,
    sql_literals_ok,
    sql_vectors,
    tracks,
)
from rlvr.envs.tools import Tool, ToolCallError
from rlvr.types import Verdict
from rlvr.verifiers.answer import extract_final_answer
from rlvr.verifiers.math import answers_equal, is_final_form

TABLE = "items"
COLUMNS = ("name", "kind", "price", "qty")
SCHEMA = f"{TABLE}({', '.join(COLUMNS)})"

BATCH_WALL_S = 10.0  # the grounding job (every query on every perturbed copy)

__all__ = ["FOUND_SCORE", "ToolUseEnv", "calculate"]

FOUND_SCORE = 0.5  # score of a failed verdict whose tool result alone was the gold value


# ---------------------------------------------------------------- the environment


def _contains(text: str, gold: str) -> bool:
    return any(answers_equal(n, gold) for n in numbers_in(text))


def _is(text: str, gold: str) -> bool:
    """``text`` is one number, equal to ``gold``."""
    return NUMBER.fullmatch(text.strip()) is not None and answers_equal(text.strip(), gold)


@ENVS.register("tool.use")
class ToolUseEnv(ToolEnv):
    """See the module docstring. ``self.log``: one dict per call that reached a tool."""

    name = "tool.use"
    grants = {"calculator": Grant(wall_s=1.0, memory_mb=512, output_kb=1),
              "sql": Grant(wall_s=3.0, memory_mb=1024, output_kb=16)}

    def __init__(self, cfg: EnvConfig | None = None, *, sandbox: Any = None) -> None:
        super().__init__(cfg, sandbox=sandbox)
        self.log: list[dict[str, Any]] = []
        self.answer_text = ""
        self._grounding: tuple[int, Any] | None = None  # (log length, _perturbed's answer)

    def reset(self, task):
        self.log, self.answer_text, self._grounding = [], "", None
        return super().reset(task)

    # -- tools

    def tools(self) -> list[Tool]:
        tools = [Tool("calculator", "arithmetic, e.g. 12 * (3 + 4)", self._calculator,
                      {"expression": ("string", "the expression")}, grant=self.grants["calculator"])]
        if self.task is not None and self.task.spec.payload.get("rows"):
            tools.append(Tool("sql", f"one SELECT on {SCHEMA}", self._sql,
                              {"query": ("string", "the SQL query")}, grant=self.grants["sql"]))
        return tools

    def _record(self, name: str, arguments: dict, result: str, ok: bool, read: bool = False) -> None:
        self.log.append({"name": name, "arguments": arguments, "result": result, "ok": ok, "read": read})

    def _calculator(self, expression: str) -> str:
        try:
            result = run_granted(self._sandbox(), "calculator", calculate, self.grants["calculator"],
                                 {"expression": expression}, task_id=self.task.id)
        except ToolCallError as e:
            self._record("calculator", {"expression": expression}, str(e), False)
            raise
        self._record("calculator", {"expression": expression}, result, True)
        return result

    def _sandbox(self):
        if self.sandbox is None:
            from rlvr.verifiers.code import current_sandbox

            return current_sandbox()
        return self.sandbox

    def _sql(self, query: str) -> str:
        args = {"query": query}
        try:
            result, read = self._run_sql(query)
        except ToolCallError as e:
            self._record("sql", args, str(e), False)
            raise
        self._record("sql", args, result, True, read)
        return result

    def _run_sql(self, query: str) -> tuple[str, bool]:
        out = run_granted(self._sandbox(), "sql", sql_body.sql, self.grants["sql"], {"query": query},
                          context={"rows": self.task.spec.payload["rows"]}, task_id=self.task.id)
        text, _, read = out.rpartition("\nread: ")
        return text, read == "1"

    # -- episode

    def on_text(self, action: str) -> Step | None:
        self.answer_text = action
        self.finish_with("answer")
        return self._end("answer")

    def supported(self, gold: str, *, alone: bool = False) -> bool:
        """Whether some successful tool result this episode supports ``gold`` (module docstring);
        ``alone``: a result that is exactly one number, equal to ``gold``. Grounding rules:
        ``rlvr.envs.tool_grounding``."""
        if not any(e["ok"] and _contains(e["result"], gold) for e in self.log):
            return False  # nothing to ground: no sandbox run
        has_db = bool(self.task.spec.payload.get("rows"))
        prompt = " ".join(m["content"] for m in self.task.prompt if m.get("role") == "user")
        perturbed, golds = self._perturbed(prompt) if has_db else ({}, None)
        copies = len(COPIES) if has_db else 0
        # numbers an expression may use, each with its value on every copy (rule 4)
        known: dict[float, list[tuple]] = {q: [(format_number(q),) * copies] for q in question_numbers(prompt)}
        for i, entry in enumerate(self.log):
            if not entry["ok"]:
                continue
            result = entry["result"]
            if entry["name"] == "sql":
                runs = perturbed.get(i)
                if runs is None or any(runs[k] == result for k in ROW_COPIES):
                    continue  # not a literal-clean query of the table, or its result ignores the data
                tracked = golds is None or tracks(result, runs, gold, golds, answers_equal)
                new = sql_vectors(result, runs)
            else:
                replays = calc_replays(entry["arguments"]["expression"], known, copies, evaluate)
                if replays is None:
                    continue  # a number from neither the question nor a grounded result
                tracked = not has_db or calc_tracks(replays, gold, golds, answers_equal)
                new = {float(n): replays for n in numbers_in(result)}
            for value, vectors in new.items():
                have = known.setdefault(value, [])
                have += [v for v in vectors if v not in have][:MAX_VECTORS - len(have)]
            args_text = " ".join(str(v) for v in entry["arguments"].values())
            if not tracked or _contains(args_text, gold):
                continue
            if _is(result, gold) if alone else _contains(result, gold):
                return True
        return False

    def _perturbed(self, prompt: str) -> tuple[dict[int, list[str]], list[str | None] | None]:
        """For each literal-clean sql call that read the table (log index), its results on the
        perturbed copies; and the gold on each copy (the expert replayed; None when the task has
        no expert calls). One sandbox job, cached per episode."""
        if self._grounding is not None and self._grounding[0] == len(self.log):
            return self._grounding[1]
        payload = self.task.spec.payload
        tables = perturbed_tables(payload["rows"], self.task.key or self.task.id)
        mine = [i for i, e in enumerate(self.log) if e["name"] == "sql" and e["ok"] and e["read"]
                and sql_literals_ok(e["arguments"]["query"], prompt)]
        calls = [(n, a) for n, a in payload.get("calls") or []]
        expert = [a["query"] for n, a in calls if n == "sql"]
        queries = [self.log[i]["arguments"]["query"] for i in mine] + expert
        outs = self._run_batch(tables, queries)
        per = len(tables)
        perturbed: dict[int, list[str]] = {}
        for n, i in enumerate(mine):
            runs = outs[n * per:(n + 1) * per]
            if all(r is not None for r in runs):
                perturbed[i] = runs
        golds: list[str | None] | None = None
        if calls:
            base = len(mine) * per
            golds = [replay(calls, payload.get("results") or [],
                            [outs[base + q * per + k] for q in range(len(expert))], calculate)
                     for k in range(per)]
        self._grounding = (len(self.log), (perturbed, golds))
        return perturbed, golds

    def _run_batch(self, tables: list[list[list]], queries: list[str]) -> list[str | None]:
        """Each query on each table (query-major), in one sandbox job: the formatted result, or
        None where it failed. All None if the job itself failed (fail closed)."""
        runs = [[k, q] for q in queries for k in range(len(tables))]
        if not runs:
            return []
        wall = min(BATCH_WALL_S, 1.0 + 0.5 * len(runs))
        grant = Grant(wall_s=wall, memory_mb=1024, output_kb=64)
        try:
            outs = json.loads(run_granted(self._sandbox(), "sql", sql_body.batch, grant, {},
                                          context={"tables": tables, "runs": runs}, task_id=self.task.id))
        except (ToolCallError, json.JSONDecodeError):
            outs = []
        if not isinstance(outs, list) or len(outs) != len(runs):
            return [None] * len(runs)
        return [format_rows(list(o["rows"]), bool(o.get("more"))) if o.get("ok") else None
                for o in outs]

    def _verify(self) -> Verdict:
        gold = str(self.task.spec.payload["answer"])
        extracted, status = extract_final_answer(self.answer_text)
        details: dict[str, Any] = {"extracted": extracted, "gold": gold, "tool_calls": len(self.log),
                                   "format_ok": extracted is not None}
        found = lambda: FOUND_SCORE if self.supported(gold, alone=True) else 0.0
        if extracted is None:
            return Verdict(False, found(), "no_answer", {**details, "status": status})
        if not (is_final_form(extracted, gold) and answers_equal(extracted, gold)):
            return Verdict(False, found(), "mismatch", details)
        if not self.supported(gold):
            return Verdict(False, 0.0, "unsupported", details)
        return Verdict(True, 1.0, "ok", details)
