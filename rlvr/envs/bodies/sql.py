"""The ``sql`` tool: one read-only statement on the task's table ``items(name, kind, price, qty)``
(``tool.use``), or on a ``data.analysis`` task's tables (``dataset_sql``).

An in-memory sqlite3 database is built from the task's rows (trusted context) and the query runs
under an authorizer that allows only SELECT, FUNCTION and READ of ``items`` (so no ATTACH,
PRAGMA, INSERT, DROP, sqlite_master, ...), a progress-handler instruction limit and a
string-length limit. The result is compact: one value as itself, several rows one per line
(columns joined by ``", "``), at most ``MAX_ROWS``. Standard library only: it runs in the sandbox
(a tool body); ``batch`` and ``batch_tables`` are the grounding jobs' bodies (every query on
every perturbed copy).
"""

from __future__ import annotations

import json
import sqlite3

MAX_QUERY_CHARS = 500
MAX_ROWS = 10  # rows shown in a result
WIDE_ROWS = 20  # rows shown by data.analysis's sql tool
MAX_CELL_CHARS = 40
SQL_STEPS = 20_000  # progress-handler calls (every 1000 VM instructions): ~2e7 instructions
MAX_ERROR_CHARS = 160


def _cell(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e18 else repr(round(v, 6))
    if isinstance(v, bytes):
        return "<blob>"
    return str(v)[:MAX_CELL_CHARS]


ITEMS_COLUMNS = ["name TEXT", "kind TEXT", "price INTEGER", "qty INTEGER"]


def run(rows: list, query: str) -> dict:
    """``run_tables`` on the one table ``items`` (``tool.use``)."""
    return run_tables({"items": {"columns": ITEMS_COLUMNS, "rows": rows}}, query)


def run_tables(tables: dict, query: str, max_rows: int = MAX_ROWS) -> dict:
    """``query`` over ``tables`` (name -> {"columns": ["name TYPE", ...], "rows": [...]}):
    ``{"ok": True, "rows": [line, ...], "more", "read"}`` or ``{"ok": False, "error"}``;
    ``read``: whether the query read one of the tables."""
    try:
        conn = sqlite3.connect(":memory:")
        for name, table in tables.items():
            conn.execute(f"CREATE TABLE {name}({', '.join(table['columns'])})")
            marks = ", ".join("?" * len(table["columns"]))
            conn.executemany(f"INSERT INTO {name} VALUES ({marks})", table["rows"])
        if hasattr(conn, "setlimit"):
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100000)
            conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        allowed = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
        read = [False]

        def authorize(action, arg1, arg2, db, trigger):
            if action == sqlite3.SQLITE_READ:  # columns of the task's tables only (no sqlite_master)
                read[0] = read[0] or arg1 in tables
                return sqlite3.SQLITE_OK if arg1 in tables else sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK if action in allowed else sqlite3.SQLITE_DENY

        conn.set_authorizer(authorize)
        steps = [0]

        def progress():
            steps[0] += 1
            return 1 if steps[0] > SQL_STEPS else 0

        conn.set_progress_handler(progress, 1000)
        found = conn.execute(query).fetchmany(max_rows + 1)
        return {"ok": True, "rows": [", ".join(_cell(v) for v in r) for r in found[:max_rows]],
                "more": len(found) > max_rows, "read": read[0]}
    except Exception as e:  # noqa: BLE001 - the query's error, shown to the model
        return {"ok": False, "error": "query too long to run" if "interrupted" in str(e) else str(e)}


def format_rows(rows: list[str], more: bool) -> str:
    if not rows:
        return "(no rows)"
    return "\n".join(rows) + ("\n..." if more else "")


def sql(query: str, rows: list) -> str:
    """The tool body: the formatted result, then a line ``read: 0|1`` (whether the query read
    the table, for grounding; the environment strips it)."""
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError("query too long")
    out = run(rows, query)
    if not out["ok"]:
        raise ValueError(str(out["error"])[:MAX_ERROR_CHARS])
    return format_rows(out["rows"], out["more"]) + f"\nread: {int(out['read'])}"


def batch(tables: list, runs: list) -> str:
    """Each ``[table index, query]`` of ``runs`` on its table: a JSON list of ``run`` results."""
    return json.dumps([run(tables[t], q) for t, q in runs])


def dataset_sql(query: str, tables: dict) -> str:
    """The ``data.analysis`` tool body: ``query`` over the task's tables, at most ``WIDE_ROWS``
    rows, then a ``read: 0|1`` line as ``sql``'s."""
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError("query too long")
    out = run_tables(tables, query, WIDE_ROWS)
    if not out["ok"]:
        raise ValueError(str(out["error"])[:MAX_ERROR_CHARS])
    return format_rows(out["rows"], out["more"]) + f"\nread: {int(out['read'])}"


def batch_tables(copies: list, runs: list) -> str:
    """Each ``[copy index, query]`` of ``runs`` on that copy's tables (``data.analysis``'s
    grounding job): a JSON list of ``run_tables`` results."""
    return json.dumps([run_tables(copies[c], q, WIDE_ROWS) for c, q in runs])
