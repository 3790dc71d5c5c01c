"""Verifiers a user states without code: number, exact, regex, choice, json, and where the answer
must be (answer_at). Each: the right answers pass, the near misses and stuffed answers fail,
payload errors name the key, and every gold completion passes its own verifier."""

from __future__ import annotations

import json

import pytest

from rlvr.types import Spec, Task
from rlvr.verifiers import VERIFIERS
from rlvr.verifiers.answer import ANSWER_AT, locate_answer, place_answer


def task(kind: str, **payload) -> Task:
    return Task(id=f"t/{kind}", domain="file", level=1, prompt=({"role": "user", "content": "q"},),
                spec=Spec(kind, payload))


def verdict(kind: str, completion: str, **payload):
    return VERIFIERS.get(kind).check(task(kind, **payload), completion)


# ---------------------------------------------------------------- answer_at


@pytest.mark.parametrize("where, text, expected", [
    ("final", "work\nAnswer: 7", ("7", "ok")),
    ("final", "Answer: 7\nmore text", (None, "no_answer")),
    ("final", "\\boxed{7} and \\boxed{8}", (None, "multiple_answers")),
    ("boxed", "so \\boxed{7}.", ("7", "ok")),
    ("boxed", "Answer: 7", (None, "no_answer")),
    ("boxed", "\\boxed{7", (None, "no_answer")),
    ("boxed", "so -\\boxed{7}.", (None, "no_answer")),  # a box inside an expression
    ("boxed", "\\boxed{7} + 1", (None, "no_answer")),
    ("answer_line", "Answer: 7\nAnswer: 8", (None, "multiple_answers")),
    ("answer_line", "x\nAnswer: 7\n\n", ("7", "ok")),
    ("answer_line", "Answer:   \n", (None, "no_answer")),
    ("last_line", "first\n  7  \n\n", ("7", "ok")),
    ("last_line", " \n", (None, "no_answer")),
    ("whole", "  7 ", ("7", "ok")),
    ("whole", "", (None, "no_answer")),
])
def test_answer_at(where, text, expected):
    assert locate_answer(text, where) == expected


def test_place_answer_round_trips_and_unknown_places_are_refused():
    for where in ANSWER_AT:
        assert locate_answer(place_answer("1,250", where), where) == ("1,250", "ok")
    with pytest.raises(ValueError, match="unknown answer_at 'end'"):
        locate_answer("x", "end")
    assert locate_answer("x\n" * 100_000 + "Answer: 1", "final") == ("1", "ok")  # a long trace is fine
    assert locate_answer("Answer: 1" + "x" * 2_000_000, "final") == (None, "no_answer")


# ---------------------------------------------------------------- number


@pytest.mark.parametrize("answer, gold, extra, passed, reason", [
    ("1250", "1250", {}, True, "ok"),
    ("1,250", "1250", {}, True, "ok"),
    ("1{,}250", "1250", {}, True, "ok"),
    ("1,\\!250", "1250", {}, True, "ok"),
    ("$1,250.00", "1250", {}, True, "ok"),
    ("-3/4", "-0.75", {}, True, "ok"),
    ("\\frac{3}{4}", "0.75", {}, True, "ok"),
    ("1.2e3", "1200", {}, True, "ok"),
    ("1250 g", "1250", {"unit": "g"}, True, "ok"),
    ("8 apples", "8", {}, True, "ok"),
    ("1250 kg", "1250", {"unit": "g"}, False, "wrong_unit"),
    ("50%", "50%", {}, True, "ok"),
    ("50", "50%", {}, True, "ok"),
    ("0.5", "50%", {}, False, "mismatch"),
    ("50%", "0.5", {}, False, "wrong_unit"),
    ("3.14", "3.14159", {"abs_tol": 0.01}, True, "ok"),
    ("3.12", "3.14159", {"abs_tol": 0.01}, False, "mismatch"),
    ("101", "100", {"rel_tol": 0.01}, True, "ok"),
    ("102", "100", {"rel_tol": 0.01}, False, "mismatch"),
    ("0.30000000000000004", "0.3", {}, False, "mismatch"),  # exact when no tolerance
    ("12 or 13", "12", {}, False, "multiple_answers"),
    ("12, 13", "12", {}, False, "multiple_answers"),
    ("4 2", "42", {}, False, "multiple_answers"),
    ("1,25", "125", {}, False, "multiple_answers"),
    ("about 12", "12", {}, False, "not_a_number"),
    ("x = 12", "12", {}, False, "not_a_number"),
    ("twelve", "12", {}, False, "not_a_number"),
    ("12" * 80, "12", {}, False, "not_a_number"),
    ("$42$", "42", {}, True, "ok"),  # LaTeX math delimiters
    ("\\(42\\)", "42", {}, True, "ok"),
    ("12\\text{ cm}", "12", {"unit": "cm"}, True, "ok"),
    ("$5", "5", {}, True, "ok"),
    ("$5 and $6$", "5", {}, False, "multiple_answers"),
    ("50%", "50", {}, False, "wrong_unit"),  # a percent is not the plain number
    ("50 percent", "50", {"unit": "%"}, True, "ok"),
    # a word that changes the value or hedges is not a unit
    ("12 million", "12", {}, False, "not_a_number"),
    ("12 thousands", "12", {}, False, "not_a_number"),
    ("12k", "12", {}, False, "not_a_number"),
    ("12M", "12", {}, False, "not_a_number"),
    ("12 squared", "12", {}, False, "not_a_number"),
    ("12 or", "12", {}, False, "not_a_number"),
    ("12 m", "12", {}, True, "ok"),  # metres
    ("12M", "12", {"unit": "M"}, True, "ok"),  # a declared unit is that unit
    ("12k", "12", {"unit": "g"}, False, "wrong_unit"),
    # exact arithmetic: tolerances as written, huge values neither overflow nor hang
    ("1.01", "1", {"abs_tol": 0.01}, True, "ok"),  # float subtraction would say 0.010000000000000009
    ("1.3", "1", {"abs_tol": 0.3}, True, "ok"),
    ("1e400", "1", {"abs_tol": 0.5}, False, "mismatch"),
    ("1e400", "1e400", {}, True, "ok"),
    ("1e9999999", "1", {}, False, "not_a_number"),
    ("1e-9999999", "0", {"abs_tol": 0.1}, False, "not_a_number"),
    ("3/0", "3", {}, False, "not_a_number"),
    # a fraction is final only for a gold that is not an integer: 48/6 echoes "48 shared among 6"
    ("48/6", "8", {}, False, "not_final"),
    ("\\frac{48}{6}", "8", {}, False, "not_final"),
    ("16 / 2 apples", "8", {}, False, "not_final"),
    ("3/4", "3/4", {}, True, "ok"),
    ("12 km/s", "12", {}, True, "ok"),  # a unit with a slash is no fraction
])
def test_number(answer, gold, extra, passed, reason):
    v = verdict("number", f"Working.\nAnswer: {answer}", answer=gold, **extra)
    assert (v.passed, v.reason) == (passed, reason), v


def test_number_huge_exponents_fail_fast():
    import time

    start = time.perf_counter()
    for answer in ("1e9999999", "9" * 99, "-1e-99999999", "1" * 60 + "/" + "3" * 39):
        verdict("number", f"Answer: {answer}", answer="1", rel_tol=0.5)
    assert time.perf_counter() - start < 1.0


def test_number_needs_one_final_answer():
    assert verdict("number", "It is 12, I think.", answer="12").reason == "no_answer"
    assert verdict("number", "Answer: 12\nAnswer: 13", answer="12").reason == "multiple_answers"
    assert verdict("number", "\\boxed{12} \\boxed{12}", answer="12").reason == "multiple_answers"
    assert verdict("number", "12", answer="12", answer_at="whole").passed
    assert not verdict("number", "The answer is 12", answer="12", answer_at="whole").passed


# ---------------------------------------------------------------- exact / regex


def test_exact_applies_only_the_declared_normalisation():
    assert verdict("exact", "Answer: Paris", answer="Paris").passed
    assert not verdict("exact", "Answer: paris", answer="Paris").passed
    assert verdict("exact", "Answer: paris", answer="Paris", normalize=["case"]).passed
    assert not verdict("exact", "Answer: Paris.", answer="Paris", normalize=["case"]).passed
    assert verdict("exact", "Answer: 'Paris.'", answer="Paris", normalize=["punctuation"]).passed
    assert verdict("exact", "Answer: New   York", answer="new york", normalize=["whitespace", "case"]).passed
    assert verdict("exact", "Answer: $\\text{Au}$", answer="Au", normalize=["latex"]).passed
    assert verdict("exact", "Answer: down", answer=["up", "down"]).passed
    assert not verdict("exact", "Answer: Paris, London", answer="Paris").passed  # gold inside a longer answer
    assert not verdict("exact", "Paris is the answer.", answer="Paris").passed  # gold in the reasoning only
    assert verdict("exact", "Answer: " + "a" * 3000, answer="a").reason == "too_long"
    assert verdict("exact", "Answer: **Paris**", answer="Paris", normalize=["punctuation"]).passed
    # punctuation never strips a sign or symbol: they carry meaning
    assert not verdict("exact", "Answer: 5", answer="-5", normalize=["punctuation"]).passed
    assert not verdict("exact", "Answer: C", answer="C++", normalize=["punctuation"]).passed
    assert not verdict("exact", "Answer: a1b2c3", answer="#a1b2c3", normalize=["punctuation", "case"]).passed


def test_regex_matches_the_whole_answer():
    assert verdict("regex", "Answer: 90210", pattern=r"\d{5}").passed
    assert not verdict("regex", "Answer: 902101", pattern=r"\d{5}").passed  # search would match
    assert not verdict("regex", "Answer: zip 90210", pattern=r"\d{5}").passed
    assert verdict("regex", "Answer: YES", pattern="yes|no", flags=["ignorecase"]).passed
    assert not verdict("regex", "Answer: yes no", pattern="yes|no", flags=["ignorecase"]).passed
    # a backtracking pattern never sees long model output
    assert verdict("regex", "Answer: " + "a" * 5000 + "!", pattern=r"(a+)+$").reason == "too_long"


# ---------------------------------------------------------------- choice

CHOICES = ["Mars", "Jupiter", "Venus"]


@pytest.mark.parametrize("answer, passed", [
    ("B", True), ("(B)", True), ("B.", True), ("B)", True), ("[B]", True), ("b", True), ("Jupiter", True),
    ("jupiter.", True), ("B. Jupiter", True), ("(B) Jupiter", True),
    ("A", False), ("B, C", False), ("B or C", False), ("B. Mars", False), ("D", False), ("Jupiter or Mars", False),
    ("The answer is B", False), ("BC", False), ("(B", False), ("B]", False), ("(B) Mars", False),
])
def test_choice(answer, passed):
    v = verdict("choice", f"Thinking.\nAnswer: {answer}", answer="B", choices=CHOICES)
    assert v.passed is passed, (answer, v)


def test_choice_gold_may_be_the_option_text():
    assert verdict("choice", "Answer: B", answer="Jupiter", choices=CHOICES).passed
    assert not verdict("choice", "Answer: A", answer="Jupiter", choices=CHOICES).passed


def test_choice_a_letter_that_is_another_options_text_is_ambiguous():
    options = ["B", "A", "neither"]  # "B" is option B's letter and option A's text
    assert verdict("choice", "Answer: B", answer="C", choices=options).reason == "not_a_choice"
    assert verdict("choice", "Answer: C", answer="C", choices=options).passed
    assert verdict("choice", "Answer: neither", answer="C", choices=options).passed
    with pytest.raises(ValueError, match="ambiguous"):
        VERIFIERS.get("choice").validate_payload({"answer": "B", "choices": options})


def test_choice_without_choices_reads_the_letter_only():
    assert verdict("choice", "Answer: (D)", answer="D").passed
    assert verdict("choice", "Answer: I think D", answer="D").reason == "not_a_choice"
    assert verdict("choice", "Answer: D\n", answer="d").passed


# ---------------------------------------------------------------- json

PERSON = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}}


@pytest.mark.parametrize("completion, extra, reason", [
    ('{"name": "Ada", "age": 36}', {}, "ok"),
    ('```json\n{"name": "Ada", "age": 36}\n```', {}, "ok"),
    ('{"name": "Ada", "age": 36}', {"answer": {"age": 36}}, "ok"),
    ('{"name": "Ada", "age": 37}', {"answer": {"age": 36}}, "mismatch"),
    ('{"name": "Ada", "age": 36.0}', {"answer": {"age": 36}}, "mismatch"),  # JSON Schema counts 36.0 as an integer; the value must be 36
    ('{"name": "Ada", "age": 36}', {"answer": {"nick": None}}, "mismatch"),  # a missing key is not null
    ('[{"name": "Ada", "age": 36}]', {}, "schema_violation"),
    ('```json\n{"name": "Ada", "age": 36}\n```\n```json\n{"name": "Bob", "age": 7}\n```', {}, "invalid_json"),
    ('{"name": "Ada", "age": 36}\nAnswer: done', {}, "invalid_json"),
    ('{"name": "Ada", "age": "36"}', {}, "schema_violation"),
    ('{"name": "Ada", "age": 36, "extra": 1}', {}, "schema_violation"),
    ('{"name": "Ada", "age": -1}', {}, "schema_violation"),
    ('{"name": "Ada", "age": 36} {"name": "Bob", "age": 7}', {}, "invalid_json"),
    ('Here you go: {"name": "Ada", "age": 36}', {}, "invalid_json"),
    ('{"name": "Ada", "age": NaN}', {}, "invalid_json"),
    ('{"name": "Ada", "age": 35, "age": 36}', {"answer": {"age": 36}}, "invalid_json"),  # a hedge: json keeps the last
    ('{"name": "Ada", "age": 36, "extra": {"k": 1, "k": 2}}', {}, "invalid_json"),  # at any depth
    ('{"name": "Ada", "age": 36', {}, "invalid_json"),
    ("", {}, "no_answer"),
])
def test_json(completion, extra, reason):
    v = verdict("json", completion, schema=PERSON, **extra)
    assert v.reason == reason and v.passed is (reason == "ok"), v


def test_json_field_values_compare_types_at_every_depth():
    schema = {"type": "object"}
    assert verdict("json", '{"a": {"b": [1, true]}}', schema=schema, answer={"a": {"b": [1, True]}}).passed
    assert not verdict("json", '{"a": {"b": [1, 1]}}', schema=schema, answer={"a": {"b": [1, True]}}).passed
    assert not verdict("json", '{"a": {"b": [1.0, true]}}', schema=schema, answer={"a": {"b": [1, True]}}).passed
    assert not verdict("json", '{"a": {"b": [1, true], "c": 0}}', schema=schema, answer={"a": {"b": [1, True]}}).passed


def test_json_gold_is_the_example_or_a_whole_answer():
    v = VERIFIERS.get("json")
    assert v.gold_completion({"schema": PERSON, "answer": {"age": 36}}) is None  # field values alone fail the schema
    whole = {"name": "Ada", "age": 36}
    gold = v.gold_completion({"schema": PERSON, "answer": whole})
    assert v.check(task("json", schema=PERSON, answer=whole), gold).passed
    assert "boxed" in v.instruction({"schema": PERSON, "answer_at": "boxed"})


def test_json_deeply_nested_input_fails_closed():
    assert verdict("json", "[" * 50_000 + "]" * 50_000, schema={"type": "array"}).reason in ("invalid_json", "too_long")


TRICKY = ["", "\\boxed{", "\\boxed{}", "Answer:", "Answer: \\boxed{\\boxed{1}}", "}" * 50, "{" * 5000,
          "Answer: 1e99999999", "Answer: 1/0", "Answer: \\frac{1}{0}", "Answer: −", "Answer: .", "Answer: $",
          "Answer: ```json\n```", "Answer: (", "Answer: [B", "\x00\ud800", "Answer: 1,\\!", "9" * 5000,
          "Answer: " + "(" * 3000, "```json\n" + "[" * 3000 + "\n```"]


@pytest.mark.parametrize("where", ANSWER_AT)
def test_no_verifier_raises_on_model_output(where):
    payloads = {"math": {"answer": "1"}, "number": {"answer": "1", "rel_tol": 0.1}, "exact": {"answer": "1"},
                "regex": {"pattern": r"(a|aa)*b"}, "choice": {"answer": "B", "choices": CHOICES},
                "json": {"schema": PERSON, "answer": {"age": 1}}}
    for kind, payload in payloads.items():
        for text in TRICKY:
            v = verdict(kind, text, **payload, answer_at=where)
            assert v.passed is (v.score == 1.0) and v.reason, (kind, text[:30], v)
            if kind != "math":  # math's equivalence (math-verify) is tested in test_math_verifier.py
                assert not v.passed, (kind, where, text[:30], v)


@pytest.mark.parametrize("where", ["answer_line", "last_line", "whole"])
def test_math_unwraps_a_box_that_is_the_whole_answer_only(where):
    assert verdict("math", "Answer: \\boxed{1}", answer="1", answer_at=where).passed is (where == "answer_line")
    assert verdict("math", "\\boxed{\\frac{1}{2}}", answer="0.5", answer_at="whole").passed
    for text in ("I guess \\boxed{1}", "\\boxed{\\boxed{1}}", "\\boxed{1} \\boxed{1}", "\\boxed{1} or 2"):
        v = verdict("math", ("Answer: " if where == "answer_line" else "") + text, answer="1", answer_at=where)
        assert not v.passed and v.reason == "mismatch", (text, v)


# ---------------------------------------------------------------- payloads and golds


@pytest.mark.parametrize("kind, payload, needle", [
    ("number", {}, "'answer' is missing"),
    ("number", {"answer": "twelve"}, "is not one number"),
    ("number", {"answer": "12", "abs_tol": -1}, "'abs_tol' must be a finite number >= 0"),
    ("number", {"answer": "12", "rel_tol": float("inf")}, "'rel_tol' must be a finite number >= 0"),
    ("number", {"answer": "12 million"}, "write the number in full"),
    ("number", {"answer": "12", "tolerance": 1}, "unknown key 'tolerance'"),
    ("number", {"answer": "12", "answer_at": "end"}, "'answer_at'"),
    ("exact", {"answer": ""}, "'answer' must be a non-empty string"),
    ("exact", {"answer": "x", "normalize": ["lower"]}, "'normalize' must be a list of"),
    ("regex", {"pattern": "(unclosed"}, "'pattern' does not compile"),
    ("regex", {"pattern": "x", "flags": ["global"]}, "'flags' must be a list of"),
    ("choice", {"answer": "E", "choices": CHOICES}, "not among the 3 choices"),
    ("choice", {"answer": "Saturn", "choices": CHOICES}, "neither a letter nor the text"),
    ("choice", {"answer": "A", "choices": ["x", "X"]}, "repeats an option"),
    ("json", {"schema": {"type": "objekt"}}, "not a valid JSON Schema"),
    ("json", {}, "'schema' is missing"),
    ("math", {"answer": "1", "tolerance": "a"}, "'tolerance' must be a number"),
])
def test_payload_errors_name_the_key(kind, payload, needle):
    with pytest.raises(ValueError, match=needle):
        VERIFIERS.get(kind).validate_payload(payload)


@pytest.mark.parametrize("where", ANSWER_AT)
@pytest.mark.parametrize("kind, payload", [
    ("math", {"answer": "\\frac{1}{2}"}), ("number", {"answer": "1,250", "unit": "g"}),
    ("exact", {"answer": ["Paris", "paris"], "normalize": ["case"]}), ("regex", {"pattern": r"\d+", "example": "12"}),
    ("choice", {"answer": "Venus", "choices": CHOICES}),
    ("json", {"schema": PERSON, "example": {"name": "Ada", "age": 1}}),
])
def test_every_gold_completion_passes_its_own_verifier(kind, payload, where):
    payload = {**payload, "answer_at": where}
    if kind == "json" and where in ("final", "answer_line"):
        payload["answer_at"] = "whole"  # a JSON object on an Answer: line is allowed, but the default is whole
    v = VERIFIERS.get(kind)
    v.validate_payload(payload)
    gold = v.gold_completion(payload)
    assert v.check(task(kind, **payload), gold).passed, (kind, where, gold)
    assert isinstance(v.instruction(payload), str) and v.instruction(payload)


def test_json_instruction_carries_the_schema():
    assert json.dumps(PERSON) in VERIFIERS.get("json").instruction({"schema": PERSON})
    assert "B. Jupiter" in VERIFIERS.get("choice").instruction({"answer": "B", "choices": CHOICES})
