r"""``data.analysis``: questions about a generated, messy sales dataset, answered by querying it over
several turns in the ``data.analysis`` environment (SQL in the sandbox).

The dataset is one table ``orders(order_id, order_date, region, product, qty, unit_price)``,
rebuilt from the spec's ``seed`` and ``level`` (``tables``), never shown in the prompt:

    L1   200 rows  clean                                  a sum, a count or a maximum with filters
    L2   500 rows  missing cells (qty, unit_price NULL)   count the missing; an average that skips them
    L3  1000 rows  + orders exported twice (duplicates)   count or sum each order once
    L4  2000 rows  + dates in three formats               a month's total, or a small table: the
                   (2026-03-05, 05/03/2026, Mar 5, 2026)  distinct orders per region in a month

The gold is computed here in Python (``answer``), never by running the query; the scripted
expert's query (``expert_sql``) is the one a careful analyst writes, and the conformance suite
plays it. The spec payload::

    {"seed": 123, "level": 3, "question": {...}, "answer": "412" | [["East", 12], ...],
     "kind": "number" | "table", "abs_tol": 0.0, "expert": "SELECT ..."}

The environment re-runs the model's queries on perturbed copies of the table (``copies``: values
raised, rows added, both) and the answer must track the gold recomputed on each copy, so a
constant query that prints a guessed answer fails (``rlvr.envs.data_analysis``).

Not here: running queries (the environment's sandboxed ``sql`` tool).
"""

from __future__ import annotations

import json
import random

from rlvr.tasks.base import DOMAINS, MAX_DRAWS, Domain, Problem, seeded_rng
from rlvr.tool_calls import format_call
from rlvr.types import Spec

NAME = "data.analysis"
TABLE = "orders"
COLUMNS = ("order_id INTEGER", "order_date TEXT", "region TEXT", "product TEXT", "qty INTEGER", "unit_price REAL")
SCHEMA = f"{TABLE}(order_id, order_date, region, product, qty, unit_price)"
REGIONS = ("Central", "East", "North", "South", "West")
PRODUCTS = ("anchor", "bracket", "clamp", "dowel", "hinge", "rivet")
ROWS = {1: 200, 2: 500, 3: 1000, 4: 2000}
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
               "October", "November", "December")
YEAR = 2026
AVG_TOL = 0.0051  # an average rounded to 2 decimals, either way

Row = list  # [order_id, order_date, region, product, qty, unit_price]


def date_text(month: int, day: int, form: int) -> str:
    if form == 0:
        return f"{YEAR}-{month:02d}-{day:02d}"
    if form == 1:
        return f"{day:02d}/{month:02d}/{YEAR}"
    return f"{MONTHS[month - 1]} {day}, {YEAR}"


def month_of(text: str) -> int:
    """The month of a date in any of the three forms."""
    if text[4] == "-":
        return int(text[5:7])
    if text[2] == "/":
        return int(text[3:5])
    return MONTHS.index(text[:3]) + 1


def rows_for(seed: int, level: int) -> list[Row]:
    """The dataset of a task: deterministic in (seed, level)."""
    rng = seeded_rng("data.analysis.rows", seed, level)
    rows: list[Row] = []
    for i in range(ROWS[level]):
        month, day = rng.randint(1, 6), rng.randint(1, 28)
        qty = rng.randint(1, 40)
        price = round(rng.uniform(2, 60), 2)
        if level >= 2 and rng.random() < 0.06:
            qty = None
        if level >= 2 and rng.random() < 0.06:
            price = None
        form = rng.randrange(3) if level >= 4 else 0
        rows.append([1000 + i, date_text(month, day, form), rng.choice(REGIONS), rng.choice(PRODUCTS), qty, price])
    if level >= 3:  # some orders exported twice
        for row in rng.sample(rows, len(rows) // 12):
            rows.insert(rng.randrange(len(rows) + 1), list(row))
    return rows


def tables(payload: dict) -> dict:
    """The task's tables as the ``sql`` tool body takes them."""
    return {TABLE: {"columns": list(COLUMNS), "rows": rows_for(payload["seed"], payload["level"])}}


def copies(rows: list[Row], key: str, level: int) -> list[list[Row]]:
    """Perturbed copies for grounding: every order's qty and price raised (duplicates alike), new
    orders added for every region and product (in every date form, one with missing cells, one
    exported twice), and both."""
    rng = random.Random(key)
    raise_by = {r[0]: (rng.randint(1, 9), rng.randint(1, 9)) for r in rows}

    def raised(row: Row) -> Row:
        dq, dp = raise_by[row[0]]
        return [*row[:4], None if row[4] is None else row[4] + dq, None if row[5] is None else round(row[5] + dp, 2)]

    added, next_id = [], max(r[0] for r in rows) + 1
    for region in REGIONS:
        for product in PRODUCTS:
            for month in range(1, 7):
                form = rng.randrange(3) if level >= 4 else 0
                added.append([next_id, date_text(month, rng.randint(1, 28), form), region, product,
                              rng.randint(41, 60), round(rng.uniform(61, 90), 2)])
                next_id += 1
            if level >= 2:
                added.append([next_id, date_text(1, 1, 0), region, product, None, None])
                next_id += 1
    if level >= 3:
        added += [list(r) for r in added[::7]]
    raised_rows = [raised(r) for r in rows]
    return [raised_rows, rows + added, raised_rows + added]


def distinct(rows: list[Row]) -> list[Row]:
    seen, out = set(), []
    for r in rows:
        t = tuple(r)
        if t not in seen:
            seen.add(t)
            out.append(r)
    return out


def answer(question: dict, rows: list[Row]):
    """The gold of ``question`` on ``rows``: a number (as text) or a table (list of [region, n])."""
    kind, f = question["kind"], question
    pick = [r for r in (distinct(rows) if f.get("once") else rows)
            if (f.get("product") is None or r[3] == f["product"]) and (f.get("region") is None or r[2] == f["region"])
            and (f.get("month") is None or month_of(r[1]) == f["month"])]
    if kind == "sum_qty":
        return str(sum(r[4] for r in pick if r[4] is not None))
    if kind == "count":
        return str(len(pick))
    if kind == "max_price":
        return format_price(max(r[5] for r in pick if r[5] is not None))
    if kind == "missing_qty":
        return str(sum(r[4] is None for r in pick))
    if kind == "avg_price":
        prices = [r[5] for r in pick if r[5] is not None]
        return f"{sum(prices) / len(prices):.4f}"
    if kind == "distinct_orders":
        return str(len({r[0] for r in pick}))
    if kind == "table":
        return [[region, len({r[0] for r in pick if r[2] == region})] for region in REGIONS
                if any(r[2] == region for r in pick)]
    raise ValueError(f"unknown question kind {kind!r}")


def format_price(x: float) -> str:
    return f"{x:.2f}"


def month_condition(month: int) -> str:
    return (f"(order_date LIKE '{YEAR}-{month:02d}-%' OR order_date LIKE '__/{month:02d}/{YEAR}' "
            f"OR order_date LIKE '{MONTHS[month - 1]} %, {YEAR}')")


def expert_sql(q: dict) -> str:
    """The analyst's query for ``q``."""
    source = f"(SELECT DISTINCT * FROM {TABLE})" if q.get("once") else TABLE
    where = [f"product = '{q['product']}'" if q.get("product") else "", f"region = '{q['region']}'" if q.get("region") else "",
             month_condition(q["month"]) if q.get("month") else ""]
    if q["kind"] == "missing_qty":
        where.append("qty IS NULL")
    cond = " AND ".join(w for w in where if w)
    tail = f" WHERE {cond}" if cond else ""
    select = {"sum_qty": "SUM(qty)", "count": "COUNT(*)", "max_price": "MAX(unit_price)",
              "missing_qty": "COUNT(*)", "avg_price": "ROUND(AVG(unit_price), 2)",
              "distinct_orders": "COUNT(DISTINCT order_id)"}
    if q["kind"] == "table":
        return f"SELECT region, COUNT(DISTINCT order_id) FROM {TABLE}{tail} GROUP BY region ORDER BY region"
    return f"SELECT {select[q['kind']]} FROM {source}{tail}"


def question_text(q: dict) -> str:
    product, region = q.get("product"), q.get("region")
    of = f" of product '{product}'" if product else ""
    in_region = f" in region '{region}'" if region else ""
    month = f" in {MONTH_NAMES[q['month'] - 1]} {YEAR}" if q.get("month") else ""
    once = " Some orders were exported twice: count each order once." if q.get("once") else ""
    kind = q["kind"]
    if kind == "sum_qty":
        text = f"What is the total quantity (qty) ordered{of}{in_region}{month}? Ignore missing quantities."
    elif kind == "count":
        text = f"How many orders{of} are there{in_region}?"
    elif kind == "max_price":
        text = f"What is the highest unit_price{of}{in_region}?"
    elif kind == "missing_qty":
        text = f"How many orders{of}{in_region} have no recorded quantity?"
    elif kind == "avg_price":
        text = f"What is the average unit_price{of}{in_region}, ignoring missing prices, rounded to 2 decimals?"
    elif kind == "distinct_orders":
        text = f"How many distinct orders{of}{in_region}{month} are there?"
    else:
        text = (f"For each region, how many distinct orders were placed{month}? Answer with one ```csv block "
                f"with the header region,orders and one row per region that has any, sorted by region.")
    return text + once


def question_for(level: int, rng: random.Random) -> dict:
    product, region = rng.choice(PRODUCTS), rng.choice(REGIONS)
    if level == 1:
        return rng.choice(({"kind": "sum_qty", "product": product, "region": region},
                           {"kind": "count", "region": region, "product": product},
                           {"kind": "max_price", "product": product}))
    if level == 2:
        return rng.choice(({"kind": "missing_qty", "region": region},
                           {"kind": "avg_price", "product": product},
                           {"kind": "sum_qty", "product": product}))
    if level == 3:
        return rng.choice(({"kind": "distinct_orders", "product": product, "once": True},
                           {"kind": "sum_qty", "product": product, "region": region, "once": True}))
    month = rng.randint(1, 6)
    return rng.choice(({"kind": "sum_qty", "product": product, "month": month, "once": True},
                       {"kind": "table", "month": month}))


def tool_text(gold, q: dict) -> str:
    """The expert query's result as the ``sql`` tool shows it (for the corpus's transcripts)."""
    if isinstance(gold, list):
        return "\n".join(f"{region}, {n}" for region, n in gold)
    return repr(round(float(gold), 2)) if q["kind"] == "avg_price" else gold


def render_answer(gold) -> str:
    if isinstance(gold, list):
        body = "\n".join(f"{region},{n}" for region, n in gold)
        return f"```csv\nregion,orders\n{body}\n```"
    return f"Answer: {gold}"


class DataAnalysisDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)
    needs_sandbox = True  # the sql tool runs model-written queries in the sandbox
    env = NAME

    def sample(self, level: int, rng: random.Random) -> Problem:
        seed = rng.randrange(2**31)
        return self.problem(level, seed, question_for(level, rng))

    def draw(self, split: str, level: int, *rng_parts: object) -> Problem:
        """``Domain.draw``, with each candidate's split read from its key before its dataset is
        built: an eval draw rejects most candidates, and a dataset is up to 2,166 rows."""
        for attempt in range(MAX_DRAWS):
            rng = seeded_rng(*rng_parts, attempt)
            seed = rng.randrange(2**31)
            q = question_for(level, rng)
            if self.in_split(Problem(key=problem_key(level, seed, q), prompt="", spec=Spec(NAME, {}), reference=""), split):
                return self.problem(level, seed, q)
        raise RuntimeError(f"{self.name}: no {split} problem at level {level} in {MAX_DRAWS} draws")

    def problem(self, level: int, seed: int, q: dict) -> Problem:
        rows = rows_for(seed, level)
        gold = answer(q, rows)
        expert = expert_sql(q)
        shown = format_price(float(gold)) if q["kind"] == "avg_price" else gold
        payload = {"seed": seed, "level": level, "question": q, "answer": gold,
                   "kind": "table" if q["kind"] == "table" else "number",
                   "abs_tol": AVG_TOL if q["kind"] == "avg_price" else 0.0, "expert": expert}
        prompt = (f"The table {SCHEMA} holds {len(rows)} sales records; query it with the sql tool "
                  f"(one SELECT per call, at most 20 rows shown). The data is messy: look before you aggregate."
                  f"\n{question_text(q)}")
        actions = (format_call("sql", {"query": expert}), render_answer(shown))
        return Problem(key=problem_key(level, seed, q), prompt=prompt, spec=Spec(kind=NAME, payload=payload),
                       reference=f"{actions[0]}\ntool: {tool_text(gold, q)}\n{actions[1]}", actions=actions)


def problem_key(level: int, seed: int, q: dict) -> str:
    return f"L{level}:{seed}:" + json.dumps(q, sort_keys=True)


DOMAINS.register(NAME)(DataAnalysisDomain())
