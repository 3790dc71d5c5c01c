"""``docs.tables``: generated quarterly reports, questions read from their tables and notes, answers
checked by the ``number`` verifier (wrong scale, wrong unit, the unrestated figure and hedges fail)."""

from __future__ import annotations

import re
from fractions import Fraction


import rlvr.tasks  # noqa: F401  (registration)
import rlvr.verifiers  # noqa: F401
from rlvr.tasks.base import DOMAINS
from rlvr.tasks.docs_tables import INCOME, PERCENT_TOL
from rlvr.types import Task
from rlvr.verifiers.base import get_verifier

DOMAIN = DOMAINS.get("docs.tables")


def tasks(level: int, n: int = 30, split: str = "train") -> list[Task]:
    return [DOMAIN.generate(split, level, i, 0) for i in range(n)]


def check(task: Task, answer: str):
    return get_verifier(task).check(task, f"Working.\nAnswer: {answer}")


def gold(task: Task) -> Fraction:
    return Fraction(task.spec.payload["answer"].rstrip("%"))


def table_rows(prompt: str, title: str) -> dict[str, list[int]]:
    """The rows of the table ``title`` in a rendered document, values as integers."""
    block = prompt.split(title, 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in block.splitlines()[2:]:
        m = re.match(r"(\D+?)\s{2,}([\d,\s()a]+)$", line)
        if m:
            rows[m.group(1).strip()] = [int(v.replace(",", "")) for v in re.findall(r"[\d,]+", m.group(2))]
    return rows


def test_every_reference_passes_and_quotes_figures_the_document_shows():
    for level in DOMAIN.levels:
        for task in tasks(level, 10 if level >= 5 else 30):
            assert check(task, task.reference.rsplit("Answer: ", 1)[1]).passed, task.reference
            assert get_verifier(task).check(task, task.reference).passed
            prompt = task.prompt[0]["content"]
            for line in task.reference.splitlines():
                m = re.match(r".*\): ([\d,.]+)", line)
                if m:
                    assert m.group(1) in prompt, (line, task.id)


def test_the_income_statement_adds_up():
    for task in tasks(2):
        rows = table_rows(task.prompt[0]["content"], INCOME)
        for c in range(3):
            assert rows["Revenue"][c] - rows["Cost of sales"][c] == rows["Gross profit"][c]
            assert rows["Gross profit"][c] - rows["Operating expenses"][c] == rows["Operating income"][c]


def test_document_length_grows_with_the_level_to_long_context():
    sizes = {level: sum(len(t.prompt[0]["content"]) for t in tasks(level, 5)) / 5 for level in DOMAIN.levels}
    assert [sizes[level] for level in DOMAIN.levels] == sorted(sizes.values())
    assert sizes[5] > 25_000 and sizes[6] > 100_000  # about 8k and 35k tokens (docs/domains.md)


def test_a_right_number_in_the_wrong_scale_fails():
    thousands = [t for t in tasks(1) if "thousands of US dollars?" in t.prompt[0]["content"]]
    assert thousands
    for task in thousands:
        value = int(task.spec.payload["answer"])
        assert not check(task, f"{value / 1000:g}").passed  # millions, not thousands
        assert not check(task, f"{value * 1000}").passed  # dollars
        assert not check(task, f"{value / 1000:g} million").passed
        assert not check(task, f"{value}%").passed
        assert check(task, f"{value:,}").passed and check(task, f"${value:,}").passed


def test_millions_answers_are_checked_to_the_thousand():
    millions = [t for t in tasks(2, 60) if "in millions of US dollars?" in t.prompt[0]["content"]]
    assert millions
    for task in millions:
        value = gold(task)
        assert check(task, f"{float(value):.3f}").passed
        assert not check(task, f"{float(value) + 0.01:.3f}").passed
        assert not check(task, str(int(value * 1000))).passed  # still in thousands


def test_percent_answers_accept_either_rounding_and_nothing_else():
    percents = [t for level in (3, 4) for t in tasks(level) if t.spec.payload.get("unit") == "%"]
    assert len(percents) > 20
    for task in percents:
        exact = float(gold(task))
        down, up = (f"{int(exact * 10 + k * (1 if exact >= 0 else -1)) / 10:.1f}" for k in (0, 1))
        assert check(task, f"{exact:.1f}%").passed and check(task, f"{exact:.1f}").passed
        assert check(task, f"{exact:.2f}%").passed
        assert [check(task, f"{x}%").passed for x in (down, up)].count(True) >= 1
        assert not check(task, f"{exact + 2 * PERCENT_TOL + 0.05:.1f}%").passed
        assert not check(task, f"{exact / 100:.4f}").passed  # a fraction is not the percent
        assert not check(task, f"{exact:.1f}% or {exact + 1:.1f}%").passed  # a hedge
        assert not check(task, f"\\boxed{{{exact:.1f}}} \\boxed{{{exact + 1:.1f}}}").passed


def test_questions_that_read_a_restated_figure_fail_with_the_original_one():
    restated = [t for level in (3, 4, 5) for t in tasks(level, 40) if "(restated in Note" in t.reference]
    assert len(restated) >= 10
    checked = 0
    for task in restated:
        prompt = task.prompt[0]["content"]
        note = re.search(r"\(restated in Note (\d+)\)", task.reference).group(1)
        assert f"Note {note} — Restatement." in prompt and " (a)" in prompt
        # the same arithmetic on the figure as originally reported (the table's ``(a)`` cell)
        line = next(s for s in task.reference.splitlines() if "(restated in Note" in s)
        label, rest = line.split(" (", 1)
        title, period = rest.split("): ", 1)[0].rsplit(", ", 1)
        rows = table_rows(prompt, title) if "segment" not in title else None
        if rows is None:
            continue
        column = re.search(r"^\s+(.*)$", prompt.split(title, 1)[1].splitlines()[1]).group(1)
        periods = re.findall(r"Q\d \d{4}", column)
        original = rows[label][periods.index(period)]
        restated_value = int(line.split("): ", 1)[1].split(" ")[0].replace(",", ""))
        assert original != restated_value
        wrong = task.reference.replace(f"{restated_value:,}", f"{original:,}")
        steps = [s for s in wrong.splitlines() if "=" in s]
        if not steps:  # a lookup: the answer is the figure itself
            assert not check(task, str(original)).passed
            continue
        expression = steps[-1].split(" = ")[0].replace(",", "")
        value = eval(expression, {"__builtins__": {}})  # our own arithmetic, numbers and + - / only
        answer = f"{value * 100:.1f}%" if "%" in task.spec.payload.get("unit", "") else str(value)
        assert not check(task, answer).passed, (task.reference, answer)
        checked += 1
    assert checked >= 10


def test_train_and_eval_documents_are_disjoint_problems():
    train = {t.key for level in (1, 2, 3) for t in tasks(level, 60)}
    held = {t.key for level in (1, 2, 3) for t in tasks(level, 30, split="eval")}
    assert train and held and not train & held


def test_long_levels_are_left_out_of_the_pretraining_corpus():
    docs = DOMAIN.corpus(0, 3)
    assert docs and max(len(d) for d in docs) < 8 * 5_000
