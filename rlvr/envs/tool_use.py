r"""The ``tool.use`` environment: a calculator and SQL over the task's small database.

Tools (offered per task: ``calculator`` always, ``sql`` when the task has a database)::

    calculator(expression)  arithmetic over ints/floats: + - * / // % ** (small exponents),
                            unary minus, parentheses. Parsed with ``ast`` and walked node by
                            node; never ``eval``. Magnitudes are bounded.
    sql(query)              one read-only statement on the table ``items(name, kind, price, qty)``.

Model output never runs outside the sandbox: the query and the rows go (as JSON on stdin) to a
trusted runner program in the sandbox, which builds an in-memory sqlite3 database and runs the
query under an authorizer that allows only SELECT, FUNCTION and READ of ``items`` (so no
ATTACH, PRAGMA, INSERT, DROP, sqlite_master, ...), a progress-handler instruction limit and a
string-length limit. The result is compact: one value as itself, several rows one per line
(columns joined by ``", "``), at most ``MAX_ROWS``.
The calculator runs in-process: it only walks an ``ast`` of numbers and operators.

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

import ast
import json
import math
from typing import Any

from rlvr.envs.base import ENVS, EnvConfig, Step, ToolEnv
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

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 60
MAX_MAGNITUDE = 10**18
MAX_POWER = 64  # largest exponent of **
MAX_QUERY_CHARS = 500
MAX_ROWS = 10  # rows shown in an sql result
MAX_CELL_CHARS = 40
SQL_STEPS = 20_000  # progress-handler calls (every 1000 VM instructions): ~2e7 instructions
MAX_ERROR_CHARS = 160

BATCH_WALL_S = 10.0  # the grounding job (every query on every perturbed copy)

FOUND_SCORE = 0.5  # score of a failed verdict whose tool result alone was the gold value


# ---------------------------------------------------------------- calculator (in-process, ast only)


def format_number(x: float) -> str:
    """``12`` -> ``"12"``, ``5.0`` -> ``"5"``, ``1/3`` -> ``"0.333333"``."""
    if isinstance(x, int):
        return str(x)
    if x.is_integer():
        return str(int(x))
    return repr(round(x, 6))


def _check(x: float) -> float:
    if isinstance(x, float) and not math.isfinite(x):
        raise ToolCallError("error: calculator: the result is not a finite number")
    if abs(x) > MAX_MAGNITUDE:
        raise ToolCallError("error: calculator: number too large")
    return x


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left), _eval(node.right)
        op = node.op
        if isinstance(op, ast.Add):
            return _check(a + b)
        if isinstance(op, ast.Sub):
            return _check(a - b)
        if isinstance(op, ast.Mult):
            return _check(a * b)
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if b == 0:
                raise ToolCallError("error: calculator: division by zero")
            if isinstance(op, ast.Div):
                return _check(a / b)
            return _check(a // b if isinstance(op, ast.FloorDiv) else a % b)
        if isinstance(op, ast.Pow):
            if not isinstance(b, int) or not 0 <= b <= MAX_POWER:
                raise ToolCallError(f"error: calculator: exponent must be an integer 0..{MAX_POWER}")
            if a != 0 and abs(a) != 1 and b * math.log10(abs(a)) > 18:
                raise ToolCallError("error: calculator: number too large")
            return _check(a**b)
    raise ToolCallError("error: calculator: only numbers, + - * / // % **, and parentheses")


def _evaluate(tree: ast.AST) -> str:
    """A parsed expression's value (the calculator without its length limits: replays)."""
    return format_number(_eval(tree))


def calculate(expression: str) -> str:
    """Evaluate arithmetic safely (``ast`` walk, bounded); raises ``ToolCallError``."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolCallError("error: calculator: expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolCallError("error: calculator: invalid expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolCallError("error: calculator: expression too long")
    try:
        return format_number(_eval(tree))
    except (OverflowError, RecursionError):
        raise ToolCallError("error: calculator: number too large") from None


# ---------------------------------------------------------------- sql (in the sandbox)

# Trusted program run in the sandbox. stdin {"rows": [...], "query": str}: stdout one JSON line
# {"ok", "rows", "more", "read"} or {"ok": false, "error"}; or stdin {"tables": [rows, ...],
# "runs": [[table index, query], ...]}: stdout {"outs": [one such dict per run]} (grounding).
SQL_RUNNER = r"""
import json, sqlite3, sys
def run(rows, query):
    try:
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE TABLE items(name TEXT, kind TEXT, price INTEGER, qty INTEGER)")
        conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", rows)
        if hasattr(conn, "setlimit"):
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100000)
            conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        allowed = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
        read = [False]
        def authorize(action, arg1, arg2, db, trigger):
            if action == sqlite3.SQLITE_READ:  # columns of the one table only (no sqlite_master)
                read[0] = read[0] or arg1 == "items"
                return sqlite3.SQLITE_OK if arg1 == "items" else sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK if action in allowed else sqlite3.SQLITE_DENY
        conn.set_authorizer(authorize)
        steps = [0]
        def progress():
            steps[0] += 1
            return 1 if steps[0] > STEPS else 0
        conn.set_progress_handler(progress, 1000)
        cur = conn.execute(query)
        rows = cur.fetchmany(MAX_ROWS + 1)
        def cell(v):
            if v is None:
                return "NULL"
            if isinstance(v, float):
                return str(int(v)) if v.is_integer() and abs(v) < 1e18 else repr(round(v, 6))
            if isinstance(v, bytes):
                return "<blob>"
            return str(v)[:MAX_CELL]
        return {"ok": True, "rows": [", ".join(cell(v) for v in r) for r in rows[:MAX_ROWS]],
                "more": len(rows) > MAX_ROWS, "read": read[0]}
    except Exception as e:
        msg = "query too long to run" if "interrupted" in str(e) else str(e)
        return {"ok": False, "error": msg}
req = json.loads(sys.stdin.read())
if "runs" in req:
    out = {"outs": [run(req["tables"][t], q) for t, q in req["runs"]]}
else:
    out = run(req["rows"], req["query"])
sys.stdout.write(json.dumps(out) + "\n")
"""
SQL_RUNNER = (SQL_RUNNER.replace("STEPS", str(SQL_STEPS)).replace("MAX_ROWS", str(MAX_ROWS))
              .replace("MAX_CELL", str(MAX_CELL_CHARS)))


def format_rows(rows: list[str], more: bool) -> str:
    if not rows:
        return "(no rows)"
    return "\n".join(rows) + ("\n..." if more else "")


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
                      {"expression": ("string", "the expression")})]
        if self.task is not None and self.task.spec.payload.get("rows"):
            tools.append(Tool("sql", f"one SELECT on {SCHEMA}", self._sql,
                              {"query": ("string", "the SQL query")}))
        return tools

    def _record(self, name: str, arguments: dict, result: str, ok: bool, read: bool = False) -> None:
        self.log.append({"name": name, "arguments": arguments, "result": result, "ok": ok, "read": read})

    def _calculator(self, expression: str) -> str:
        try:
            result = calculate(expression)
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
        from rlvr.sandbox.types import Job, Limits

        if len(query) > MAX_QUERY_CHARS:
            raise ToolCallError("error: sql: query too long")
        stdin = json.dumps({"rows": self.task.spec.payload["rows"], "query": query})
        job = Job.run_program(SQL_RUNNER, stdin=stdin,
                              limits=Limits(wall_s=3.0, cpu_s=2, memory_mb=1024, output_kb=16))
        r = self._sandbox().run(job)
        if r.status != "ok":
            raise ToolCallError(f"error: sql: the query did not finish ({r.status})")
        try:
            out = json.loads(r.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            raise ToolCallError("error: sql: the query failed") from None
        if not out.get("ok"):
            msg = str(out.get("error", "failed"))[:MAX_ERROR_CHARS]
            raise ToolCallError(f"error: sql: {msg}")
        return format_rows(list(out["rows"]), bool(out.get("more"))), bool(out.get("read"))

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
                replays = calc_replays(entry["arguments"]["expression"], known, copies, _evaluate)
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
        from rlvr.sandbox.types import Job, Limits

        runs = [[k, q] for q in queries for k in range(len(tables))]
        if not runs:
            return []
        wall = min(BATCH_WALL_S, 1.0 + 0.5 * len(runs))
        job = Job.run_program(SQL_RUNNER, stdin=json.dumps({"tables": tables, "runs": runs}),
                              limits=Limits(wall_s=wall, cpu_s=max(1, int(wall)), memory_mb=1024,
                                            output_kb=64))
        r = self._sandbox().run(job)
        try:
            outs = json.loads(r.stdout.strip().splitlines()[-1])["outs"] if r.status == "ok" else []
        except (json.JSONDecodeError, IndexError, KeyError, TypeError):
            outs = []
        if len(outs) != len(runs):
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
