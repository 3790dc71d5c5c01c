r"""``docs.tables``: numbers extracted and computed from a generated quarterly report.

The prompt is a company's quarterly report in plain text: an income statement, segment and
regional tables, notes with cross-references (``see Note 4``) and management's discussion, then
one question. The answer is one number checked by the ``number`` verifier within a tolerance, so
a right number in the wrong scale (millions for thousands), a fraction for a percent, or a hedge
listing several numbers fails.

**Units.** The income statement and regional tables are in *thousands* of US dollars (integers),
the segment table in *millions* with one decimal. Each question names the unit of its answer.

**Restated figures.** From L3 one cell of a table is marked ``(a)``: "as originally reported;
see Note N". The note gives the restated figure, and the prompt says to use restated figures.
A question may rest on that cell (the reference quotes the note).

**Levels** (the last two are long-context levels, ready for the long-context work; the default
curriculum and suites use L1-L4):

    L1  income statement only               a value as shown               "What was revenue in Q3 2026?"
    L2  + segment table, notes              a difference or a sum, or thousands -> millions
    L3  + a restated cell, regional tables  growth or margin in percent (one decimal)
    L4  + discussion, more regions          a segment's share of revenue (millions over thousands)
    L5  ~8k tokens of tables and notes      any L3/L4 question, one needle in many sections
    L6  ~32k tokens                         the same, longer

``SECTIONS`` sets the regional tables (and so the length) per level. The key is the facts the
question reads and the question itself (their text, hashed), not the decoration around them.
Answers: integers in thousands are exact; millions get ``rel_tol`` 1e-4; percents are rounded to
one decimal; the gold is the exact value and ``abs_tol`` 0.0501 accepts any rounding of it to one
decimal and nothing further.

The reference quotes the figures the question reads (with the note where one was restated), the
arithmetic, then ``Answer: N``.

Not here: answer checking (the ``number`` verifier).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from fractions import Fraction

from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.types import Spec

NAME = "docs.tables"
INCOME = "Condensed statement of income"
COMPANIES = ("Northwind Tools", "Bluewater Foods", "Keystone Freight", "Alder Medical", "Corvid Software",
             "Harbor Textiles", "Summit Energy", "Lumen Optics")
SEGMENTS = ("Industrial", "Consumer", "Services", "Software", "Retail", "Licensing")
REGIONS = ("North America", "Europe", "Asia Pacific", "Latin America", "Middle East", "Africa", "Nordics",
           "Benelux", "Iberia", "Central Europe", "Japan", "Korea", "India", "Oceania", "Canada", "Mexico",
           "Brazil", "Andes", "Gulf States", "Southern Africa")
REGION_NAMES = REGIONS + tuple(f"{r} {k}" for k in range(2, 30) for r in REGIONS)  # "Europe 7"
SECTIONS = {1: 0, 2: 0, 3: 2, 4: 4, 5: 70, 6: 320}  # regional tables per level (the length)
PERCENT_TOL = 0.0501
MILLIONS_TOL = 1e-4
INSTRUCTION = ("Use restated figures where a note gives them. Give one number in the unit the question asks "
               "for.")


@dataclass
class Table:
    title: str
    name: str  # how prose refers to it ("the North America regional table")
    unit: str  # "thousands" or "millions"
    columns: tuple[str, ...]
    rows: list[tuple[str, list[Fraction]]]
    footnotes: list[str] = field(default_factory=list)
    marks: dict[tuple[int, int], str] = field(default_factory=dict)  # (row, column) -> "(a)"

    def render(self) -> str:
        head = f"{self.title} (in {self.unit} of US dollars)"
        width = max(len(label) for label, _ in self.rows) + 2
        lines = [head, " " * width + "".join(f"{c:>14}" for c in self.columns)]
        for r, (label, values) in enumerate(self.rows):
            cells = [fmt(v, self.unit) + self.marks.get((r, c), "") for c, v in enumerate(values)]
            lines.append(f"{label:<{width}}" + "".join(f"{cell:>14}" for cell in cells))
        return "\n".join(lines + self.footnotes)


def fmt(value: Fraction, unit: str) -> str:
    """A table cell: thousands as integers with separators, millions with one decimal."""
    return f"{float(value):,.1f}" if unit == "millions" else f"{int(value):,}"


def percent(x: Fraction) -> str:
    return f"{float(x):.1f}%"


def pct(x: Fraction) -> dict:
    """The payload of a percent answer: the exact value (4 decimals), so either rounding of a half
    to one decimal is within ``PERCENT_TOL`` and nothing further is."""
    return {"answer": f"{float(x):.4f}%", "abs_tol": PERCENT_TOL, "unit": "%"}


def quarters(rng: random.Random) -> tuple[str, str, str]:
    """(this quarter, the previous one, the same quarter a year earlier)."""
    year, q = rng.randint(2021, 2027), rng.randint(1, 4)
    prev = f"Q{q - 1} {year}" if q > 1 else f"Q4 {year - 1}"
    return f"Q{q} {year}", prev, f"Q{q} {year - 1}"


def income_statement(cols: tuple[str, ...], rng: random.Random) -> Table:
    """Revenue, cost of sales, gross profit, operating expenses, operating income, net income,
    consistent down the column (thousands)."""
    base = rng.randint(20_000, 90_000)
    rows: dict[str, list[Fraction]] = {k: [] for k in ("Revenue", "Cost of sales", "Gross profit",
                                                       "Operating expenses", "Operating income", "Net income")}
    for _ in cols:
        revenue = base + rng.randint(-base // 6, base // 6)
        cost = revenue * rng.randint(45, 65) // 100
        opex = (revenue - cost) * rng.randint(40, 75) // 100
        op_income = revenue - cost - opex
        net = op_income * rng.randint(55, 80) // 100
        for k, v in zip(rows, (revenue, cost, revenue - cost, opex, op_income, net)):
            rows[k].append(Fraction(v))
    return Table(INCOME, "condensed statement of income", "thousands", cols, list(rows.items()))


def segment_table(cols: tuple[str, ...], revenue: list[Fraction], rng: random.Random) -> Table:
    """Revenue by segment in millions (one decimal); segments add up to revenue up to rounding."""
    names = rng.sample(SEGMENTS, rng.randint(3, 4))
    shares = [rng.randint(10, 40) for _ in names]
    rows = []
    for i, name in enumerate(names):
        values = [Fraction(round(float(total) * shares[i] / sum(shares) / 100)) / 10 for total in revenue]
        rows.append((name, values))
    table = Table("Revenue by segment", "segment table", "millions", cols, rows)
    table.footnotes.append("Segment figures may not add up to total revenue because of rounding.")
    return table


def regional_table(cols: tuple[str, ...], region: str, rng: random.Random) -> Table:
    base = rng.randint(1_000, 9_000)
    rows = [(label, [Fraction(base * w // 100 + rng.randint(0, base // 10)) for _ in cols])
            for label, w in (("Sales", 100), ("Returns", 4), ("Marketing spend", 12), ("Freight", 7))]
    return Table(f"Region: {region}", f"{region} regional table", "thousands", cols, rows)


FILLER = (
    "Management believes the quarter reflected {adj} demand in most markets.",
    "Headcount at the end of the quarter was {n} employees.",
    "The company opened {k} new distribution centres and closed {j}.",
    "Capital expenditure was directed mainly at {topic}.",
    "Order backlog remained {adj} compared with the prior quarter.",
    "The board declared no change to the dividend policy.",
)
TOPICS = ("automation", "warehouse capacity", "information systems", "product development", "energy efficiency")
ADJECTIVES = ("steady", "firm", "uneven", "improving", "softer")


def discussion(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        out.append(rng.choice(FILLER).format(adj=rng.choice(ADJECTIVES), n=rng.randint(300, 9000),
                                             k=rng.randint(1, 9), j=rng.randint(0, 3), topic=rng.choice(TOPICS)))
    return " ".join(out)


@dataclass
class Question:
    text: str
    facts: list[tuple[str, str, str, str]]  # (table title, row, column, value as the reference quotes it)
    steps: list[str]
    answer: str
    payload: dict


def cell(table: Table, row: str, col: int, restated: dict, reads: list) -> tuple[Fraction, str]:
    """The value a question must use (the restated one where a note gives it) and how the
    reference quotes it; ``(title, row index, col)`` is appended to ``reads``."""
    r = next(i for i, (label, _) in enumerate(table.rows) if label == row)
    reads.append((table.title, r, col))
    value = table.rows[r][1][col]
    if (table.title, r, col) in restated:
        new, note = restated[table.title, r, col]
        return new, f"{fmt(new, table.unit)} (restated in Note {note})"
    return value, fmt(value, table.unit)


def ask(level: int, tables: dict[str, Table], cols: tuple[str, ...], restated: dict, rng: random.Random,
        reads: list) -> Question:
    """One question of ``level`` over ``tables``; the cells it reads are appended to ``reads``."""
    income = tables["income"]
    kind = rng.choice({1: ("lookup",), 2: ("difference", "sum", "millions"), 3: ("growth", "margin"),
                       4: ("share", "growth"), 5: ("share", "growth", "margin", "regional"),
                       6: ("share", "growth", "margin", "regional")}[level])
    if kind == "regional" or kind == "growth" and level >= 4 and rng.random() < 0.5:
        regions = [t for key, t in tables.items() if key.startswith("region:")]
        table = rng.choice(regions)
        row = rng.choice([label for label, _ in table.rows])
        new, old = (0, 2) if rng.random() < 0.5 else (0, 1)
        a, qa = cell(table, row, new, restated, reads)
        b, qb = cell(table, row, old, restated, reads)
        value = (a - b) / b * 100
        where = table.title.removeprefix("Region: ")
        return Question(f"By what percent did {row.lower()} in {where} change from {cols[old]} to {cols[new]}? "
                        f"Answer in percent to one decimal place.",
                        [(table.title, row, cols[new], qa), (table.title, row, cols[old], qb)],
                        [f"({fmt(a, 'thousands')} - {fmt(b, 'thousands')}) / {fmt(b, 'thousands')} = "
                         f"{percent(value)}"], percent(value), pct(value))
    if kind == "lookup":
        row, col = rng.choice([label for label, _ in income.rows]), rng.randrange(len(cols))
        v, q = cell(income, row, col, restated, reads)
        return Question(f"What was {row.lower()} in {cols[col]}, in thousands of US dollars?",
                        [(income.title, row, cols[col], q)], [], str(int(v)), {})
    if kind in ("difference", "sum"):
        row = rng.choice([label for label, _ in income.rows])
        c1, c2 = rng.sample(range(len(cols)), 2)
        a, qa = cell(income, row, c1, restated, reads)
        b, qb = cell(income, row, c2, restated, reads)
        facts = [(income.title, row, cols[c1], qa), (income.title, row, cols[c2], qb)]
        if kind == "sum":
            return Question(f"What was {row.lower()} in {cols[c1]} and {cols[c2]} together, in thousands of "
                            f"US dollars?", facts, [f"{fmt(a, 'thousands')} + {fmt(b, 'thousands')} = "
                                                    f"{fmt(a + b, 'thousands')}"], str(int(a + b)), {})
        return Question(f"By how much did {row.lower()} in {cols[c1]} differ from {cols[c2]} ({cols[c1]} minus "
                        f"{cols[c2]}), in thousands of US dollars?", facts,
                        [f"{fmt(a, 'thousands')} - {fmt(b, 'thousands')} = {int(a - b):,}"], str(int(a - b)), {})
    if kind == "millions":
        row, col = rng.choice([label for label, _ in income.rows]), rng.randrange(len(cols))
        v, q = cell(income, row, col, restated, reads)
        m = v / 1000
        return Question(f"What was {row.lower()} in {cols[col]}, in millions of US dollars?",
                        [(income.title, row, cols[col], q)], [f"{fmt(v, 'thousands')} thousand = {float(m):g} "
                                                              f"million"], f"{float(m):g}",
                        {"rel_tol": MILLIONS_TOL})
    if kind == "growth":
        row = rng.choice(("Revenue", "Gross profit", "Operating income", "Net income"))
        a, qa = cell(income, row, 0, restated, reads)
        b, qb = cell(income, row, 2, restated, reads)
        value = (a - b) / b * 100
        return Question(f"By what percent did {row.lower()} change from {cols[2]} to {cols[0]}? Answer in percent "
                        f"to one decimal place.", [(income.title, row, cols[0], qa), (income.title, row, cols[2], qb)],
                        [f"({fmt(a, 'thousands')} - {fmt(b, 'thousands')}) / {fmt(b, 'thousands')} = "
                         f"{percent(value)}"], percent(value), pct(value))
    if kind == "margin":
        row, col = rng.choice(("Gross profit", "Operating income", "Net income")), rng.randrange(len(cols))
        a, qa = cell(income, row, col, restated, reads)
        b, qb = cell(income, "Revenue", col, restated, reads)
        value = a / b * 100
        return Question(f"What was {row.lower()} as a percent of revenue in {cols[col]}? Answer in percent to one "
                        f"decimal place.", [(income.title, row, cols[col], qa), (income.title, "Revenue", cols[col], qb)],
                        [f"{fmt(a, 'thousands')} / {fmt(b, 'thousands')} = {percent(value)}"], percent(value),
                        pct(value))
    # share: a segment (millions) over revenue (thousands)
    segments = tables["segments"]
    row, col = rng.choice([label for label, _ in segments.rows]), rng.randrange(len(cols))
    a, qa = cell(segments, row, col, restated, reads)
    b, qb = cell(income, "Revenue", col, restated, reads)
    value = a * 1000 / b * 100
    return Question(f"What share of revenue in {cols[col]} came from the {row} segment? Answer in percent to one "
                    f"decimal place.", [(segments.title, row, cols[col], qa + " million"),
                                        (income.title, "Revenue", cols[col], qb + " thousand")],
                    [f"{qa.split(' ')[0]} million = {float(a * 1000):,.0f} thousand",
                     f"{float(a * 1000):,.0f} / {fmt(b, 'thousands')} = {percent(value)}"], percent(value),
                    pct(value))


def leaf(table: Table, r: int) -> bool:
    """Whether restating row ``r`` leaves the table consistent (no other row is computed from it)."""
    return table.title != INCOME or table.rows[r][0] == "Net income"


def restate(tables: dict[str, Table], reads: list, note: int, rng: random.Random) -> dict:
    """Mark one prior-period leaf cell ``(a)`` (as originally reported): one the question reads
    when it reads any, else any. Returns ``{(title, row, col): (restated value, note)}``."""
    by_title = {t.title: t for t in tables.values()}
    read = [(title, r, c) for title, r, c in reads if c > 0 and leaf(by_title[title], r)]
    every = [(t.title, r, c) for t in tables.values() for r in range(len(t.rows)) for c in range(1, len(t.columns))
             if leaf(t, r)]
    title, r, col = rng.choice(read or every)
    table = by_title[title]
    old = table.rows[r][1][col]
    step = Fraction(1, 10) if table.unit == "millions" else Fraction(1)
    delta = max(step, (old * rng.randint(2, 6) / 100 // step) * step)
    new = old - delta if rng.random() < 0.5 else old + delta
    table.marks[r, col] = " (a)"
    table.footnotes.append(f"(a) As originally reported; see Note {note} for the restated figure.")
    return {(title, r, col): (new, note)}


class DocsTablesDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4, 5, 6)
    corpus_levels = (1, 2, 3, 4)  # an L6 document is ~35k tokens: too long for a pretraining corpus

    def sample(self, level: int, rng: random.Random) -> Problem:
        company = rng.choice(COMPANIES)
        cols = quarters(rng)
        tables: dict[str, Table] = {"income": income_statement(cols, rng)}
        if level >= 2:
            tables["segments"] = segment_table(cols, tables["income"].rows[0][1], rng)
        regions = rng.sample(REGION_NAMES, SECTIONS[level])
        for region in regions:
            tables[f"region:{region}"] = regional_table(cols, region, rng)
        notes: list[str] = ["Note 1 — Basis of presentation. Figures are unaudited. Quarters end on the last "
                            "day of March, June, September and December."]
        state, reads = rng.getstate(), []
        question = ask(level, tables, cols, {}, rng, reads)
        if level >= 3:  # restate a cell, one the question reads where it can, and ask again
            note = rng.randint(2, 6)
            restated = restate(tables, reads if rng.random() < 0.7 else [], note, rng)
            (title, r, col), (new, _) = next(iter(restated.items()))
            table = next(t for t in tables.values() if t.title == title)
            filler = [f"Note {i} — Other matters. {discussion(rng, 2)}" for i in range(2, note)]
            notes += filler + [f"Note {note} — Restatement. {table.rows[r][0]} for {table.columns[col]} in the "
                               f"{table.name} has been restated to {fmt(new, table.unit)} (in {table.unit} of US "
                               f"dollars) after a review of cut-off procedures."]
            after = rng.getstate()
            rng.setstate(state)
            question = ask(level, tables, cols, restated, rng, [])
            rng.setstate(after)
        parts = [f"{company} Inc. — Quarterly report for {cols[0]}"]
        if level >= 4:
            parts.append("Management's discussion. " + discussion(rng, 4 + SECTIONS[level] // 4))
        parts += [t.render() for t in tables.values()] + ["Notes", *notes]
        document = "\n\n".join(parts)
        prompt = f"{document}\n\nQuestion: {question.text}\n{INSTRUCTION}"
        lines = [f"{row} ({title}, {col}): {quoted}" for title, row, col, quoted in question.facts]
        reference = "\n".join([*lines, *question.steps, f"Answer: {question.answer}"])
        facts = "|".join(f"{t}/{r}/{c}={q}" for t, r, c, q in question.facts)
        key = f"L{level}:" + hashlib.sha256(f"{company}|{facts}|{question.text}".encode()).hexdigest()[:24]
        spec = Spec(kind="number", payload={"answer": question.answer, **question.payload})
        return Problem(key=key, prompt=prompt, spec=spec, reference=reference)


DOMAINS.register(NAME)(DocsTablesDomain())
