"""``benchmarks/math_agreement.py``: Math-Verify's test tables read as rows (default settings only),
each judged by rlvr's math verifier through its own answer locator; the outside set itself
(downloaded from PyPI) in the slow tier, where agreement must stay >= 90% with no false positive."""

from __future__ import annotations

import json
import textwrap

import pytest

from benchmarks.math_agreement import Row, gold_answer, judge, main, table_rows

TABLE = '''
import pytest
from tests.test_all import compare_strings

@pytest.mark.parametrize("gold,pred,expected", [
    ("$\\\\frac{1}{2}$", "0.5", 1),
    ("$3$", "$\\\\boxed{4}$", 0),
    ("$42$", "The answer is 42, I think.", 1),
    ("$7$", "\\\\boxed{7} or \\\\boxed{8}", 1),
])
def test_default(gold, pred, expected):
    assert compare_strings(gold, pred, match_types=["latex", "expr"]) == expected

@pytest.mark.parametrize("gold, pred, expected, precision", [("$1.0001$", "1", 1, 3), ("$2$", "2", 1, 6)])
def test_precision(gold, pred, expected, precision):
    assert compare_strings(gold, pred, match_types=["latex"], precision=precision) == expected

@pytest.mark.parametrize("gold,pred,strict,expected", [("$x$", "$y$", False, 1)])
def test_not_strict(gold, pred, strict, expected):
    assert compare_strings(gold, pred, strict=strict) == expected

def test_no_table():
    return None
'''


@pytest.fixture()
def source(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_table.py").write_text(textwrap.dedent(TABLE))
    return tmp_path


def test_rows_with_default_settings_are_read_and_the_others_counted(source):
    rows, left_out = table_rows(source / "tests")
    assert [(r.pred, r.expected) for r in rows] == [
        ("0.5", 1), ("$\\boxed{4}$", 0), ("The answer is 42, I think.", 1), ("\\boxed{7} or \\boxed{8}", 1), ("2", 1)]
    assert left_out == 2  # precision 3, strict=False


def test_gold_is_what_math_verify_extracts_and_pred_is_read_by_rlvr():
    assert gold_answer("So the answer is: \\[ 32349 \\]") == "32349"
    assert judge(Row("r", "$x \\ge 2$", "$\\boxed{x \\geq 2}$", 1)) | {"pred": ""} == {
        "source": "r", "gold": "x \\ge 2", "answer": "x \\geq 2", "pred": "", "expected": 1, "passed": True,
        "kind": "final", "why": "ok"}
    assert judge(Row("r", "$42$", "I'd say 42", 1))["kind"] == "pred: prose"
    assert judge(Row("r", "$7$", "\\boxed{7} \\boxed{8}", 1))["kind"] == "pred: multiple answers"
    assert judge(Row("r", "$2$", "$\\frac{4}{2}$", 1))["why"] == "not in final form"


def test_report_counts_agreement_false_positives_and_misses_by_kind(source, tmp_path, capsys):
    assert main(["--source", str(source), "--json", str(tmp_path / "out.json")]) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["left_out_for_settings"] == 2
    assert report["final_answer_pairs"] == {"rows": 3, "equivalent": 2, "agree": 3, "agreement": 1.0,
                                            "false_positives": 0, "misses": 0}
    assert report["all"]["rows"] == 5 and report["all"]["misses"] == 2 and report["all"]["false_positives"] == 0
    assert {d["kind"] for d in report["disagreements"]} == {"pred: prose", "pred: multiple answers"}
    assert "final_answer_pairs    3 rows" in capsys.readouterr().out


@pytest.mark.slow
def test_outside_set_agreement_holds(tmp_path):
    # Math-Verify's own tables (its PyPI sdist): the acceptance of issue 48
    assert main(["--json", str(tmp_path / "out.json")]) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["final_answer_pairs"]["rows"] >= 150
    assert report["final_answer_pairs"]["agreement"] >= 0.90
    assert report["all"]["false_positives"] == 0
