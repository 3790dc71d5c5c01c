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
2. **The result depends on the data.** Each query is run again on perturbed copies of the table
   (``perturbed_tables``, seeded by the task): two ``rows`` copies (every price and qty raised
   by a seeded 1..9, plus one new row of each kind priced above all others) and two ``values``
   copies (the raises only). Names and kinds are kept, so filters still select. A result must
   differ on every ``rows`` copy. Constant expressions dressed as queries (``SELECT 200+38 FROM
   items``, ``SELECT 238 + price - price``, ``SELECT (qty/qty+qty/qty)*...``, ``SELECT 238
   WHERE EXISTS (...)``) print the same text and fail. Every honest query of the generator
   changes on every ``rows`` copy: its counts, sums, minima, maxima and lookups all grow
   strictly (new rows raise each kind's count and maximum, the raises each value and minimum).
3. **An answer tracks the answer.** The expert's own calls (``payload["calls"]``) are replayed on
   each copy (``replay``), which gives the gold there. An sql result supports the answer only if,
   at a place where it shows the gold, each copy's result shows that copy's gold: listing rows
   and finding the gold among them by coincidence (``SELECT qty FROM items``) fails, while
   ``SELECT kind, COUNT(*) ... GROUP BY kind`` for a count, or ``SELECT price * 7 ...`` for
   "7 lamps", passes. A calculator result supports it only if its expression, replayed on each
   ``values`` copy with every operand taken from where it came (``calc_replays``: the same
   place of the same sql result, the same earlier calculator result, or the question), gives
   that copy's gold, and that gold moved. So summing data values that happen to add up to the
   gold fails; so does any calculator answer to a question the ``values`` copies leave alone (a
   count): answer those with sql.
4. **A calculator expression uses known numbers.** Each number in it (an ``ast`` constant, so
   ``-5`` is ``5``) is a number of the question or of an earlier grounded result (an sql result
   by 1-2, a calculator result by this rule). There are no free constants: no level says
   "twice" or "percent" (every operand of the expert's calls is in the question or a result),
   so a ``2`` or ``100`` must come from somewhere too. On calculator-only levels (no table)
   this is the whole rule: numbers from the question, and results computed from them.

Limits: ``ORDER BY`` a value can reorder rows on the copies, so an honest calculation over a
sorted listing may fail to track (sort-free listings or aggregates track). A task without expert
calls (none are generated that way) has no copy golds: then an sql answer needs only rule 2 and a
calculator answer must move on every ``values`` copy.
"""

from __future__ import annotations

import ast
import itertools
import random
import re
from collections.abc import Callable
from typing import Any

COPIES = ("rows", "rows", "values", "values")  # the perturbed copies (``perturbed_tables``)
ROW_COPIES = [k for k, c in enumerate(COPIES) if c == "rows"]
VALUE_COPIES = [k for k, c in enumerate(COPIES) if c == "values"]
MAX_VECTORS = 8  # replays kept per known number (its possible sources)
MAX_COMBOS = 64  # source combinations tried per calculator expression
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


def perturbed_tables(rows: list[list], seed: str) -> list[list[list]]:
    """The copies of ``rows`` (``COPIES`` says which is which), deterministic in ``seed``.

    ``rows`` copies: every price and qty raised by a seeded 1..9, and one new row per kind
    (named ``extra<j>``) priced above every other row. ``values`` copies: the raises only, same
    rows in the same order (a calculation over rows the policy read can be replayed there)."""
    tables = []
    for k, what in enumerate(COPIES):
        rng = random.Random(f"{seed}:perturb:{k}")
        table = [[name, kind, _raise(price, rng), _raise(qty, rng)] for name, kind, price, qty in rows]
        if what == "rows":
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


def tracks(result: str, perturbed: list[str], gold: str, golds: list[str | None], equal) -> bool:
    """Rule 3 for an sql answer: on every copy, some position where ``result`` shows ``gold``
    shows that copy's gold (``golds[k]``, from ``replay``)."""
    spots = positions_of(result, gold, equal)
    return bool(spots) and len(perturbed) == len(golds) and all(
        g is not None and any((got := number_at(p, pos)) is not None and equal(got, g) for pos in spots)
        for p, g in zip(perturbed, golds))


Vector = tuple  # a number's value on each copy (str, or None where it has none)


def sql_vectors(result: str, runs: list[str]) -> dict[float, list[Vector]]:
    """For each number of an sql ``result``: its value on each copy, read at the same place in
    the copy's result (``runs``)."""
    out: dict[float, list[Vector]] = {}
    for i, line in enumerate(result.split("\n")):
        for j, n in enumerate(numbers_in(line)):
            out.setdefault(float(n), []).append(tuple(number_at(r, (i, j)) for r in runs))
    return out


def calc_replays(expression: str, known: dict[float, list[Vector]], copies: int,
                 evaluate: Callable[[ast.AST], str]) -> list[Vector] | None:
    """The calculator ``expression`` on each copy: every operand replaced by its value there
    (a known number may have several sources; up to ``MAX_COMBOS`` combinations are tried).
    None when an operand is not a known number (rule 4); ``evaluate`` raises on failure."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    consts = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) in (int, float)]
    options = []
    for node in consts:
        vectors = known.get(float(node.value))
        if not vectors:
            return None
        options.append(vectors[:MAX_VECTORS])
    out: list[Vector] = []
    for combo in itertools.islice(itertools.product(*options), MAX_COMBOS):
        vector = []
        for k in range(copies):
            try:
                for node, v in zip(consts, combo):
                    node.value = _parse_number(v[k])
                vector.append(evaluate(tree))
            except Exception:  # noqa: BLE001 - no value on this copy
                vector.append(None)
        if tuple(vector) not in out:
            out.append(tuple(vector))
    return out


def _parse_number(text: str | None) -> int | float:
    if text is None:
        raise ValueError("no value")
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def calc_tracks(replays: list[Vector], gold: str, golds: list[str] | None, equal) -> bool:
    """Rule 3 for a calculator answer, on the ``values`` copies: some replay equals each copy's
    gold, and that gold moved (so the answer depends on the data). Without golds: some replay
    moves on every ``values`` copy."""
    def ok(v: Vector, k: int) -> bool:
        if v[k] is None or equal(v[k], gold):
            return False
        return golds is None or (golds[k] is not None and equal(v[k], golds[k]))

    return any(all(ok(v, k) for k in VALUE_COPIES) for v in replays)


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
