r"""What makes a ``tool.use`` tool result *grounded*: derived from the data, not laundered.

Pure rules (no sandbox, no environment state); ``rlvr.envs.tool_use`` runs the queries.

A policy that already "knows" an answer can make a tool print it without doing the work:
``SELECT 238 FROM items``, ``SELECT MAX(price)*0+238 FROM items``, ``SELECT 232 + COUNT(*)
FROM items`` (after a first query said there are 6 rows), a calculator expression with numbers
from nowhere. The rules that close these:

1. **Literals come from the question.** Every number and every string literal in a query must
   appear in the question (``'toy'``, ``30``); a ``LIMIT``/``OFFSET`` count is the only
   exception (it picks rows, it computes nothing). So an answer cannot be typed into a query,
   spelled as a string (``CAST('238' AS INT)``) or hex (``0xEE``).
2. **The result depends on the data.** The query is run again on ``N_PERTURBED`` perturbed
   copies of the table (``perturbed_tables``: every price and qty raised by a seeded 1..9, plus
   one new row of each kind priced above all others; names and kinds are kept, so filters still
   select). Its result must differ on every copy. Constant expressions dressed as queries
   (``SELECT 200+38 FROM items``, ``SELECT 238 + price - price``, ``SELECT (qty/qty+qty/qty)
   * ...``, ``SELECT 238 WHERE EXISTS (...)``) give the same text and fail. Every honest query
   of the generator changes on every copy: its counts, sums, minima, maxima and lookups all grow
   strictly under these changes (new rows raise each kind's count and maximum, the shifts raise
   each value, and so each minimum).
3. **An sql result that is the answer tracks the answer.** The expert's own calls
   (``payload["calls"]``) are replayed on each copy (``replay``), which gives the gold on that
   copy; the result supports the answer only if, at a position where it shows the gold, the
   re-run shows the copy's gold. So listing rows and finding the gold among them by
   coincidence (``SELECT qty FROM items``) fails, while ``SELECT kind, COUNT(*) FROM items GROUP
   BY kind`` for a count question, or ``SELECT price * 7 ...`` for "7 lamps", passes.
4. **A calculator expression uses known numbers.** Each number in it (an ``ast`` constant, so
   ``-5`` is ``5``) equals a number of the question or of an earlier grounded result (an sql
   result by 1-2, or a calculator result by this rule). There are no free constants: no level
   says "twice" or "percent" (every operand of the expert's calls is in the question or a
   result), so a ``2`` or ``100`` must come from somewhere too.

Not covered (documented in docs/environments.md): a calculator expression over grounded numbers
is not replayed on the copies, so fishing two data values that happen to combine into the gold
(``SELECT qty FROM items`` then ``1 + 2`` for a count of 3) still counts.
"""

from __future__ import annotations

import ast
import random
import re
from typing import Any

N_PERTURBED = 2  # perturbed copies of the table each grounded query is re-run on
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")  # numbers as results show them
_QUOTED = re.compile(r"'((?:[^']|'')*)'")
_LIMIT = re.compile(r"\b(?:LIMIT|OFFSET)\s+\d+(?:\s*,\s*\d+)?", re.IGNORECASE)
_NUMERIC_TOKEN = re.compile(r"(?<![\w.])(?:\d[\w.]*|\.\d[\w.]*)")  # 12, 1.5, 0x1F, 1e3, .5


def numbers_in(text: str) -> list[str]:
    """Numbers as tool results and answers show them: ``"lamp, 34"`` -> ``["34"]``."""
    return NUMBER.findall(text)


def question_numbers(prompt: str) -> set[float]:
    return {float(n) for n in re.findall(r"\d+(?:\.\d+)?", prompt)}


def question_strings(prompt: str) -> set[str]:
    return {s.replace("''", "'") for s in _QUOTED.findall(prompt)}


def sql_literals_ok(query: str, prompt: str) -> bool:
    """Rule 1: every literal of ``query`` appears in the question (``LIMIT``/``OFFSET`` aside)."""
    strings = question_strings(prompt)
    if any(s.replace("''", "'") not in strings for s in _QUOTED.findall(query)):
        return False
    rest = _LIMIT.sub(" ", _QUOTED.sub(" ", query))
    if '"' in rest or "`" in rest or "[" in rest:  # quoted identifiers could hide a literal
        return False
    allowed = question_numbers(prompt)
    for token in _NUMERIC_TOKEN.findall(rest):
        try:
            if float(token) not in allowed:
                return False
        except ValueError:  # 0x1F, 1e3x, ...: not a plain decimal from the question
            return False
    return True


def perturbed_tables(rows: list[list], seed: str, n: int = N_PERTURBED) -> list[list[list]]:
    """Rule 2's copies of ``rows``: prices and quantities raised by a seeded 1..9, and one new
    row per kind (named ``extra<j>``) priced above every other row. Deterministic in ``seed``."""
    tables = []
    for k in range(n):
        rng = random.Random(f"{seed}:perturb:{k}")
        table = [[name, kind, _raise(price, rng), _raise(qty, rng)] for name, kind, price, qty in rows]
        top = max((r[2] for r in table if _is_number(r[2])), default=0)
        for j, kind in enumerate(sorted({str(r[1]) for r in rows})):
            table.append([f"extra{j}", kind, top + rng.randint(1, 9), rng.randint(1, 9)])
        tables.append(table)
    return tables


def _is_number(v: Any) -> bool:
    return type(v) in (int, float)


def _raise(v: Any, rng: random.Random) -> Any:
    step = rng.randint(1, 9)
    return v + step if _is_number(v) else v


def positions_of(result: str, gold: str, equal) -> list[tuple[int, int]]:
    """(line, index among the line's numbers) of each number in ``result`` equal to ``gold``."""
    return [(i, j) for i, line in enumerate(result.split("\n"))
            for j, n in enumerate(numbers_in(line)) if equal(n, gold)]


def number_at(result: str, pos: tuple[int, int]) -> str | None:
    lines = result.split("\n")
    if pos[0] >= len(lines):
        return None
    nums = numbers_in(lines[pos[0]])
    return nums[pos[1]] if pos[1] < len(nums) else None


def tracks(result: str, perturbed: list[str], gold: str, golds: list[str], equal) -> bool:
    """Rule 3: on every copy, some position where ``result`` shows ``gold`` shows that copy's
    gold (``golds[k]``, from ``replay``)."""
    spots = positions_of(result, gold, equal)
    return bool(spots) and len(perturbed) == len(golds) and all(
        any((got := number_at(p, pos)) is not None and equal(got, g) for pos in spots)
        for p, g in zip(perturbed, golds))


def calc_operands(expression: str) -> list[float] | None:
    """The numbers of a calculator expression (``ast`` constants), or None if it does not parse."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return [float(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and type(n.value) in (int, float)]


def replay(calls: list, results: list[str], sql_outputs: list[str | None], calculate) -> str | None:
    """The expert's final result on a perturbed copy, or None when it cannot be replayed.

    ``calls``/``results``: the expert's calls and their results on the real table;
    ``sql_outputs``: its sql calls' results on the copy, in order. A calculator call is
    re-evaluated with each operand that was an earlier result replaced by that result on the
    copy (left to right, each earlier result used once).
    """
    outputs = iter(sql_outputs)
    done: list[tuple[str, str]] = []  # (result on the real table, result on the copy)
    for (name, args), original in zip(calls, results):
        if name == "sql":
            now = next(outputs, None)
        else:
            now = _substitute(args["expression"], done, calculate)
        if now is None:
            return None
        done.append((str(original), now))
    return done[-1][1] if done else None


def _substitute(expression: str, done: list[tuple[str, str]], calculate) -> str | None:
    unused = list(done)

    def swap(m: re.Match) -> str:
        for i, (before, after) in enumerate(unused):
            if m.group(0) == before:
                del unused[i]
                return after
        return m.group(0)

    try:
        return calculate(re.sub(r"\d+(?:\.\d+)?", swap, expression))
    except Exception:  # noqa: BLE001 - a copy the expert's arithmetic cannot handle: no gold
        return None
