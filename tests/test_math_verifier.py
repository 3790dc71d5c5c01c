"""The math verifier, adversarially: one final answer or nothing, equivalence via math-verify,
no credit for echoing the question, and bounded work on hostile input."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import rlvr.verifiers  # noqa: F401
from rlvr.errors import UserError
from rlvr.types import Spec, Task
from rlvr.verifiers import get_verifier
from rlvr.verifiers.math import answers_equal, extract_final_answer


def _task(answer: str, tolerance: float = 0.0) -> Task:
    return Task(id="t/v1/eval/1/000000", domain="t", level=1,
                prompt=({"role": "user", "content": "Compute: 6 * 7"},),
                spec=Spec("math", {"answer": answer, "tolerance": tolerance}))


def _check(completion: str, answer: str = "42", tolerance: float = 0.0):
    task = _task(answer, tolerance)
    return get_verifier(task).check(task, completion)


def test_registered_by_spec_kind():
    assert get_verifier(_task("1")).name == "math"
    with pytest.raises(UserError, match="math"):
        get_verifier(Task(id="x", domain="x", level=1, prompt=(), spec=Spec("nope")))


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: 42", ("42", "ok")),
        ("6 * 7 = 42\nAnswer: 42\n\n", ("42", "ok")),
        ("so it is \\boxed{\\frac{1}{2}}.", ("\\frac{1}{2}", "ok")),
        ("Answer: \\boxed{42}", ("42", "ok")),
        ("\\boxed{42}\nAnswer: 42", ("42", "ok")),  # both forms, same content
        ("", (None, "no_answer")),
        ("42", (None, "no_answer")),
        ("Answer:", (None, "no_answer")),
        ("\\boxed{}", (None, "no_answer")),
        ("\\boxed{42", (None, "no_answer")),  # truncated
        ("Answer: 42\nor maybe not", (None, "no_answer")),  # Answer line must be the last line
        ("answer: 42", (None, "no_answer")),  # the form is exactly "Answer:"
        ("Answer: 41\nAnswer: 42", (None, "multiple_answers")),
        ("\\boxed{42} or \\boxed{42}", (None, "multiple_answers")),
        ("\\boxed{\\boxed{42}}", (None, "multiple_answers")),
        ("\\boxed{41}\nAnswer: 42", (None, "multiple_answers")),
        # a box inside an expression is no answer (a reader of the box alone would see 42)
        ("Answer: -\\boxed{42}", (None, "no_answer")),
        ("The answer is -\\boxed{42}.", (None, "no_answer")),
        ("Answer: 2 \\cdot \\boxed{42}", (None, "no_answer")),
        ("\\boxed{42}^2", (None, "no_answer")),
        ("Answer: \\boxed{42} + 1", (None, "no_answer")),
        ("\\frac{\\boxed{42}}{2}", (None, "no_answer")),
        ("-(\\boxed{42})", (None, "no_answer")),
        ("2 ** \\boxed{42}", (None, "no_answer")),
        # ... but punctuation, math delimiters, "=" and markdown emphasis around it are not an expression
        ("**Answer: \\boxed{42}**", ("42", "ok")),
        ("$\\boxed{42}$.", ("42", "ok")),
        ("so x = \\boxed{42}", ("42", "ok")),
        ("\\boxed{42}\\text{ apples}", ("42", "ok")),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


# ---------------------------------------------------------------- verdicts


def test_gold_passes_in_both_forms():
    for completion in ("6 * 7 = 42\nAnswer: 42", "The product is \\boxed{42}."):
        verdict = _check(completion)
        assert (verdict.passed, verdict.score, verdict.reason) == (True, 1.0, "ok")
        assert verdict.details == {"extracted": "42", "gold": "42", "format_ok": True}


@pytest.mark.parametrize(
    "completion, reason",
    [
        ("Answer: 41", "mismatch"),
        ("", "no_answer"),
        ("   \n  ", "no_answer"),
        ("The answer is 42.", "no_answer"),
        ("Answer: 42\nAnswer: 41", "multiple_answers"),
        ("\\boxed{42} \\boxed{41}", "multiple_answers"),
        ("6 * 7 = 42, so\nAnswer: 41", "mismatch"),  # gold only in the reasoning
        ("It is \\boxed{42}? No.\nAnswer: 41", "multiple_answers"),
        ("Answer: 41 or 42", "mismatch"),
        ("Answer: 40, 41, 42, 43", "mismatch"),  # stuffing candidates
        ("Answer: 40 41 42 43", "mismatch"),
        ("Answer: 6 * 7", "mismatch"),  # echoing the question
        ("Answer: 40 + 2", "mismatch"),
        ("Answer: 84/2", "mismatch"),
        ("Answer: 1 + 1 = 42", "mismatch"),
        ("Answer: -42", "mismatch"),
        ("Answer: 420", "mismatch"),
        ("Answer: 41 \\to 42", "mismatch"),  # math-verify alone reads the last side
        ("Answer: 41 \\vee 42", "mismatch"),
        ("Answer: 41, \\ldots, 42", "mismatch"),
        ("Answer: 41 \\; 42", "mismatch"),  # math-verify alone reads 41 + 42
    ],
)
def test_wrong_or_malformed_fails(completion, reason):
    verdict = _check(completion)
    assert (verdict.passed, verdict.score, verdict.reason) == (False, 0.0, reason)
    assert verdict.details["format_ok"] == (reason == "mismatch")


@pytest.mark.parametrize("completion", ["Answer: 42.0", "Answer: +42", "Answer: x = 42", "Answer: $42$", "Answer: 42 apples"])
def test_harmless_variants_of_the_gold_pass(completion):
    assert _check(completion).passed


def test_fraction_is_final_when_gold_is_not_an_integer():
    assert _check("Answer: 1/2", answer="0.5").passed
    assert _check("\\boxed{\\dfrac{1}{2}}", answer="0.5").passed


def test_tolerance_is_absolute_and_opt_in():
    assert not _check("Answer: 3.14", answer="3.14159").passed
    assert _check("Answer: 3.14", answer="3.14159", tolerance=0.01).passed
    assert _check("Answer: x = 3.145", answer="3.14159", tolerance=0.01).passed
    assert not _check("Answer: 3.1", answer="3.14159", tolerance=0.01).passed
    assert not _check("Answer: pi", answer="3.14159", tolerance=0.01).passed


# ---------------------------------------------------------------- equivalence


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("0.5", "\\frac{1}{2}"), ("1/2", "\\frac{1}{2}"), ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "0.75"),
        ("2.50", "2.5"), ("50%", "50\\%"), ("50\\%", "0.5"), ("0.5", "50%"),
        ("1,000", "1000"), ("1{,}000", "1000"), ("1 000", "1000"), ("12,345,678", "12345678"),
        ("{2,1}", "\\{1,2\\}"), ("\\{2, 1\\}", "\\{1,2\\}"), ("(0,1]", "(0, 1]"), ("[0,1)", "[0,1)"),
        ("x=3", "3"), ("3", "x = 3"), ("y = 2x + 1", "2x+1"), ("-7", "-7"), ("$5", "5"), ("\\$5", "5"),
        ("\\sqrt{8}", "2\\sqrt{2}"), ("42.", "42"), ("1\\,000", "1000"), ("42~\\text{cm}", "42"),
    ],
)
def test_equivalent_forms(pred, gold):
    assert answers_equal(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("\\frac{1}{3}", "0.5"), ("0.3333", "1/3"), ("0.5", "50"), ("100", "1,000"), ("1,2", "12"),
        ("1.000", "1000"), ("{1,2,3}", "\\{1,2\\}"), ("(0,1)", "(0,1]"), ("[0,1]", "(0,1]"),
        ("x=4", "3"), ("3=x", "3"), ("12 + 7 = 42", "42"), ("4 2", "6"), ("-3", "3"), ("x", "3"),
        ("\\infty", "3"), ("", "3"), ("3", ""),
    ],
)
def test_non_equivalent_forms(pred, gold):
    assert not answers_equal(pred, gold)


def test_answers_equal_is_pure_equivalence_the_verifier_adds_final_form():
    assert answers_equal("6 * 7", "42")  # mathematically equal ...
    assert not _check("Answer: 6 * 7").passed  # ... but not an answer to "Compute: 6 * 7"


def test_works_off_the_main_thread():
    # math-verify's signal-based timeouts raise in threads; ours are off, so this must just work.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: answers_equal(*p), [("1/2", "0.5"), ("2", "3")] * 4))
    assert results == [True, False] * 4


@pytest.mark.parametrize(
    "hostile",
    [
        "10^{10^{10}}", "9^9^9", "9^{999999999}", "(9^{9999})^{9999}", "2^{-999999999}", "9!!!!",
        "\\binom{1000000}{500000}", "(" * 40 + "1" + ")" * 40, "\\frac{1}{" * 30 + "2" + "}" * 30,
        "1" * 100_000, "x^{x^{x^{x}}}", "9**999999999",
    ],
)
def test_hostile_answers_fail_fast(hostile):
    # CPU time of this process (the verifier runs in it): a loaded machine stretches wall time,
    # not this; a blow-up (a huge power, factorial or nesting evaluated) would take far longer
    start, wall = time.process_time(), time.perf_counter()
    assert not _check(f"Answer: {hostile}").passed
    assert not _check(f"\\boxed{{{hostile}}}").passed
    assert time.process_time() - start < 2.0
    assert time.perf_counter() - wall < 60.0  # and nothing waits instead of computing


def test_huge_garbage_completion_fails_fast():
    start, wall = time.process_time(), time.perf_counter()  # CPU time, as above
    garbage = ("\\boxed{" * 1000 + "Answer: 1\n" * 1000 + "{}()[]^" * 100_000)
    assert not _check(garbage).passed
    assert not _check("x" * 2_000_000 + "\nAnswer: " + "9" * 1_000_000).passed
    assert time.process_time() - start < 2.0
    assert time.perf_counter() - wall < 60.0


# ---------------------------------------------------------------- relations, named parts, 1,\!250 (issue 28)


@pytest.mark.parametrize(
    "a, b",
    [
        ("y \\leq -2", "y <= -2"), ("y \\le -2", "y ≤ -2"), ("y<=-2", "y ≤ -2"),
        ("y \\leqslant -2", "y <= -2"),
        ("x \\geq 3", "x >= 3"), ("x \\ge 3", "x ≥ 3"), ("x \\ne 3", "x != 3"), ("x \\neq 3", "x ≠ 3"),
        ("x \\not= 3", "x != 3"), ("x!=3", "x \\neq 3"), ("x \\lt 3", "x < 3"), ("x \\gt 3", "x > 3"),
        ("1 \\le x \\le 2", "1 <= x <= 2"), ("-2 \\ge y", "y <= -2"),
    ],
)
def test_a_relation_in_latex_ascii_or_unicode_is_that_relation(a, b):
    assert answers_equal(a, b) and answers_equal(b, a)


@pytest.mark.parametrize(
    "a, b",
    [
        ("x < 3", "x > 3"), ("y \\leq -2", "y \\leq -3"), ("y <= -2", "y < -2"), ("x >= 3", "x > 3"),
        ("x \\ne 3", "x = 3"), ("x != 3", "x \\ne -3"), ("x \\le -2", "y \\le -2"), ("y \\leq -2", "-2"),
        ("x \\ge 3", "3"), ("x > 3", "3"), ("x \\ne 3", "3"), ("x => 3", "3"), ("x =< 3", "3"),
        ("x = \\leq 3", "3"), ("5!=120", "120"), ("5!=120", "5 \\ne 120"),
        ("1 \\le x \\le 2", "1 \\le x \\le 3"),
    ],
)
def test_different_relations_or_a_relation_and_a_number_differ(a, b):
    assert not answers_equal(a, b) and not answers_equal(b, a)


def test_an_interval_answers_a_relation_but_not_the_reverse():
    assert answers_equal("(-\\infty, -2]", "y \\le -2")
    assert answers_equal("[1,2]", "1 \\le x \\le 2")
    assert answers_equal("(-\\infty,3) \\cup (3,\\infty)", "x \\ne 3")
    assert not answers_equal("(-\\infty, -2)", "y \\le -2")
    assert not answers_equal("y \\le -2", "(-\\infty, -2]")  # a gold (a, b) may be a point


@pytest.mark.parametrize(
    "a, b",
    [
        ("(a,b)=(1,5)", "(1,5)"), ("(a,b)=(1,5)", "1, 5"), ("(a, b) = \\left(1, 5\\right)", "(1,5)"),
        ("m=2, n=7", "2, 7"), ("m=2, n=7", "(2,7)"), ("m=2, n=7", "\\left(2, 7\\right)"),
        ("a=1, b=5", "(a,b)=(1,5)"), ("m=2, n=7", "n=7, m=2"), ("m=2, n=7", "(m,n)=(2,7)"),
        ("x_1 = 2, x_2 = 7", "2, 7"), ("x_{1} = 2, x_2 = 7", "x_1=2, x_{2}=7"),
        ("m=\\frac{1}{2}, n=7", "0.5, 7"),
        ("m=1,\\!250, n=7", "1250, 7"),
    ],
)
def test_named_parts_match_the_bare_values_in_order(a, b):
    assert answers_equal(a, b) and answers_equal(b, a)


@pytest.mark.parametrize(
    "a, b",
    [
        ("m=2, n=7", "7, 2"), ("(m,n)=(2,7)", "7, 2"), ("(a,b)=(1,5)", "(5,1)"), ("m=2, n=7", "m=7, n=2"),
        ("(a,b)=(1,5)", "[1,5]"), ("(a,b)=(1,5)", "\\{1,5\\}"), ("(a,b)=(1,5)", "(1,5]"),
        ("(a,b)=(1,5)", "1, 5, 6"), ("(a,b,c)=(1,5)", "(1,5)"), ("m=2, n=7", "2, 7, 9"), ("m=2, n=7", "9"),
        ("m=2, n=7", "2"), ("m=2, n=7", "(x,y)=(2,7)"), ("m=2, m=7", "2, 7"), ("a = 1, b = x = 5", "1, 5"),
        ("m=2, n=7", "x = 2, 7"), ("m = 4 2, n=7", "42, 7"), ("m=2, n=7", "(2,7)=(m,n)"),
    ],
)
def test_named_parts_near_misses_fail(a, b):
    assert not answers_equal(a, b) and not answers_equal(b, a)


def test_named_parts_keep_the_other_rules():
    assert not answers_equal("m = 41 \\to 42, n=7", "42, 7")  # a chain only the answer has
    assert _check("\\boxed{(a,b)=(1,5)}", answer="(1,5)").passed
    assert _check("Answer: m=2, n=-7", answer="2, -7").passed
    assert not _check("Answer: m=1+1, n=7", answer="2, 7").passed  # not in final form
    assert _check("Answer: x = 42").passed and not _check("Answer: 1 + 1 = 42").passed


@pytest.mark.parametrize(
    "a, b",
    [("1,\\!250", "1250"), ("1,\\!250", "1{,}250"), ("12,\\!345.5", "12345.5"),
     ("1,\\!234,\\!567", "1234567"),
     ("-1,\\!250", "-1250"), ("\\$1,\\!250", "1250"), ("1,\\!25", "\\{1, 25\\}"), ("1,2", "\\{1,2\\}")],
)
def test_thin_space_thousands_separator_is_a_number(a, b):
    assert answers_equal(a, b) and answers_equal(b, a)


@pytest.mark.parametrize(
    "a, b",
    [("1,\\!25", "125"), ("1,\\!2500", "12500"), ("1,\\!250", "1.25"), ("1,\\!250", "250"),
     ("1,\\!250", "1,\\!251"),
     ("1,2", "12")],
)
def test_thin_space_near_misses_fail(a, b):
    assert not answers_equal(a, b) and not answers_equal(b, a)


def test_relations_and_separators_pass_the_verifier():
    assert _check("Answer: y \\leq -2", answer="y <= -2").passed
    assert _check("Answer: x != 3", answer="x \\neq 3").passed
    assert _check("Answer: x \\geq -2", answer="-2 \\le x").passed
    assert _check("\\boxed{1,\\!250}", answer="1250").passed
    assert not _check("Answer: y \\leq -2", answer="-2").passed


@pytest.mark.parametrize("pred, gold, equal", [
    ("The answer is 1", "1", False),  # math-verify would read the number out of the sentence
    ("about 12", "12", False),
    ("is 12", "12", False),
    ("it is 12 apples", "12", False),
    ("12 apples", "12", True),  # a unit after the number is not prose
    ("12\\text{ cm}", "12", True),
    ("2\\pi", "2\\pi", True),
    ("\\sqrt{2}", "\\sqrt{2}", True),
    ("\\text{odd}", "\\text{odd}", True),  # a gold made of words is compared as it is
    ("84 (or 85)", "85", False),  # a hedge: math-verify reads the 85
    ("85 \\text{ (not 84)}", "85", False),
    ("84\\text{ or }", "84", False),
    ("12 or", "12", False),
])
def test_prose_around_a_number_is_not_an_answer(pred, gold, equal):
    assert answers_equal(pred, gold) is equal
    task = Task(id="t", domain="math", level=1, prompt=({"role": "user", "content": "q"},), spec=Spec("math", {"answer": gold}))
    assert get_verifier(task).check(task, f"Answer: {pred}").passed is equal


HEDGES = ["{a} ⇒ {b}", "{a} ≈ {b}", "{a} ≡ {b}", "{a} ∨ {b}", "{a} ⟹ {b}", "{a} \\iff {b}", "{a} \\Leftarrow {b}",
          "{a} \\cong {b}", "{a} \\simeq {b}", "{a} \\land {b}", "{a} \\wedge {b}", "{a} \\cup {b}", "{a} \\in {b}",
          "{a} \\oplus {b}", "{a} \\mid {b}", "{a} \\bmod {b}", "{a}|{b}", "{a}_{{{b}}}", "\\max({a},{b})",
          "\\min({a},{b})", "{a} \\circ {b}", "{a} ° {b}", "{a} {{}} {b}", "{a} \\text{{,}} {b}",
          "{a} \\operatorname{{or}} {b}", "{a} \\# {b}", "{a} ⊕ {b}", "{a} … {b}"]


@pytest.mark.parametrize("form", HEDGES)
def test_two_numbers_in_notation_the_gold_does_not_use_match_neither(form):
    # math-verify reads one side of what it does not know: "84 ⇒ 85" would be 85, "84 ≈ 85" 84
    completion = "Answer: " + form.format(a=84, b=85)
    assert not _check(completion, answer="84").passed and not _check(completion, answer="85").passed


@pytest.mark.parametrize("pred, gold", [("30^\\circ", "30"), ("30°", "30"), ("\\mathbf{84}", "84"),
                                        ("(-\\infty,3) \\cup (3,\\infty)", "x \\ne 3"), ("A \\cup B", "A \\cup B"),
                                        ("x_1", "x_1"), ("12\\text{ cm}", "12")])
def test_notation_of_the_gold_or_a_unit_at_the_end_is_allowed(pred, gold):
    assert answers_equal(pred, gold)


# ---------------------------------------------------------------- notation normalised, strictness kept
# (the spellings found on Math-Verify's own test tables: benchmarks/math_agreement.py)


@pytest.mark.parametrize(
    "a, b",
    [
        ("\\cfrac{1}{3}", "\\frac{1}{3}"), ("\\frac94", "\\frac{9}{4}"), ("\\frac94", "2.25"), ("\\frac{1}2", "0.5"),
        ("\\tfrac12", "1/2"), ("32,\\! 349", "32349"), ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
        ("125\\textnormal{ miles}", "125"), ("15\\mbox{ cm}^2", "15"), ("12\\textrm{ kg}", "12"),
        ("x \\in [-2,7]", "[-2, 7]"), ("x \\in (2,12) \\cup (12,102)",
                                                                           "(2, 12) \\cup (12, 102)"),
        ("V_{1}:V_{2}=11:21", "11:21"), ("S_{MBCN}:S=7:32", "7:32"), ("\\frac{NO}{BO}=\\frac{1}{\\sqrt{6}}",
                                                                       "\\frac{1}{\\sqrt{6}}"),
        ("f(x)=1", "1"), ("|AB|=1", "1"), ("A:B=1", "1"), ("AB=4,CD=5", "4, 5"), ("AB=4, CD=5", "(4, 5)"),
        ("p=5,q=2;p=7,q=2", "(5,2),(7,2)"), ("p=5,q=2;p=7,q=2", "(7,2),(5,2)"),
        ("6 \\text{ and } 8", "6, 8"), ("19, 46, \\text{ and } 82", "19, 46, 82"), ("1 and -2", "-2, 1"),
        ("\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}", "\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}"),
    ],
)
def test_notation_is_normalised_before_the_strictness_rules(a, b):
    assert answers_equal(a, b) and answers_equal(b, a)


@pytest.mark.parametrize(
    "pred, gold",
    [("1000,99", "1000.99"), ("1,22", "1.22"), ("0,111", "0.111"), ("-2,5", "-2.5"), ("2,5", "\\frac{5}{2}")],
)
def test_a_decimal_comma_answers_a_single_value(pred, gold):
    assert answers_equal(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("1,2", "12"), ("2,5", "2"), ("2,5", "5"), ("1,000", "1"), ("0,111", "111"),  # a decimal comma is one value
        ("1.5", "1,5"),  # a gold comma is the author's: a list, never read as a decimal
        ("\\frac94", "\\frac{4}{9}"), ("\\frac123", "\\frac{1}{23}"), ("\\cfrac{1}{3}", "3"),
        ("84 \\in 85", "85"), ("x \\in 85", "85"), ("x \\in [1,2]", "[1,3]"), ("x \\in (1,2)", "[1,2]"),
        ("1 + 1 = 42", "42"), ("x = 5+5+1 = 11", "11"), ("f(41) = 42", "42"), ("the answer = 42", "42"), ("x y = 42", "42"),
        ("AB=4,CD=5", "5, 4"), ("AB=4,CD=5", "4"), ("p=5,q=2;p=7,q=2", "(5,2)"), ("p=5,q=2;p=7,r=2", "(5,2),(7,2)"),
        ("6 \\text{ and } 8", "6"), ("6 and 8", "8"), ("6 \\text{ or } 8", "6, 8"), ("6 and 8", "6, 9"),
        ("15\\text{ cm}^4", "15"), ("15^2", "15"),
        ("\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}", "\\begin{pmatrix}1 & 0 \\\\ 0 & 2\\end{pmatrix}"),
        ("\\begin{pmatrix}1 \\end{pmatrix}", "1"),
    ],
)
def test_normalised_notation_near_misses_fail(pred, gold):
    assert not answers_equal(pred, gold)


def test_normalised_notation_passes_the_verifier_and_final_form_holds():
    assert _check("\\boxed{\\cfrac{1}{3}}", answer="1/3").passed
    assert _check("Answer: 1000,99", answer="1000.99").passed
    assert _check("\\boxed{x \\in [-2,7]}", answer="-2 \\le x \\le 7").passed  # a set answers a relation
    assert not _check("\\boxed{-2 \\le x \\le 7}", answer="x \\in (-2,7]").passed  # not the reverse
    assert not _check("\\boxed{\\frac{6}{3}}", answer="2").passed  # a fraction for a whole number is not final
    assert not _check("\\boxed{\\frac63}", answer="2").passed
    assert not _check("Answer: f(x) = 40 + 2").passed  # a name on the left, but not in final form
    assert not _check("Answer: x = 5+5+1 = 11", answer="x = 11").passed  # a chain: not in final form
