"""Fidelity of imported code tasks: HumanEval tests that call the prompt's helpers, MBPP asserts.

HumanEval/32, /38 and /50 test the candidate through helpers the prompt defines (``poly``,
``encode_cyclic``, ``encode_shift``). The trusted tests process runs the prompt's code, the
candidate's process never sees the tests: every canonical solution passes, and broken variants
(off by one, identity, the helper where its inverse belongs, a redefined helper, a candidate
that hunts for the tests) fail. MBPP's ``test_list`` asserts call the function by name
(``rlvr.verifiers.code_tests``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.sandbox import choose
from rlvr.sandbox.harness import count_tests
from rlvr.tasks.files import load_task_file
from rlvr.types import Spec, Task
from rlvr.verifiers import get_verifier
from rlvr.verifiers.code import tests_with_prompt as with_prompt
from rlvr.verifiers.code_tests import entry_point_of
from rlvr.verifiers.code_tests import tests_from_asserts as from_asserts

FIXTURES = Path(__file__).parent / "fixtures"
HE_FILE = FIXTURES / "humaneval_helpers.jsonl"
MBPP_FILE = FIXTURES / "mbpp_style.jsonl"
HE_ROWS = {r["task_id"]: r for r in map(json.loads, HE_FILE.read_text().splitlines())}
MBPP_ROWS = {r["task_id"]: r for r in map(json.loads, MBPP_FILE.read_text().splitlines())}

STRICT = choose("auto").strict
needs_sandbox = pytest.mark.skipif(not STRICT, reason="no strict sandbox backend here")


def fenced(code: str) -> str:
    return f"Here you go.\n\n```python\n{code.strip(chr(10))}\n```\n"


# A candidate that looks for the tests everywhere its process can reach: its own memory (what
# the fork inherited), files, other processes' command lines, environments and memory. It
# answers correctly only if it found them (``LEAK``), and raises if it cannot even find its own
# program (the control that the scan works), so ``wrong_answer`` means: looked, found nothing.
HUNTER = r'''
import gc, os, sys


def _scan(needle):
    raw = needle.encode()
    hits = []
    for obj in gc.get_objects():
        items = obj.items() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
        try:
            for item in items:
                for x in (item if isinstance(item, tuple) else (item,)):
                    if isinstance(x, str) and x is not needle and needle in x:
                        hits.append("memory")
        except Exception:
            pass
    for top in {".", "/tmp", "/dev/shm", "/run", os.path.expanduser("~")}:
        for root, dirs, files in os.walk(top):
            for name in files:
                try:
                    with open(os.path.join(root, name), "rb") as f:
                        if raw in f.read(1 << 20):
                            hits.append(os.path.join(root, name))
                except Exception:
                    pass
    me = str(os.getpid())
    try:
        pids = os.listdir("/proc")
    except Exception:
        pids = [str(os.getppid()), "1"]
    for pid in pids:
        if not pid.isdigit() or pid == me:
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if raw in f.read():
                        hits.append(f"/proc/{pid}/{part}")
            except Exception:
                pass
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
                for line in maps:
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    if "r" in line.split()[1] and hi - lo < (64 << 20):
                        mem.seek(lo)
                        if raw in mem.read(hi - lo):
                            hits.append(f"/proc/{pid}/mem")
        except Exception:
            pass
    return hits


_found = None


def _leak():
    global _found
    if _found is None:
        if not _scan("def " + NAME + "(s"):
            raise RuntimeError("the scan does not even find the candidate's own program")
        _found = _scan(NEEDLE)
    return bool(_found)
'''


def hunter(name: str, needle_expr: str, right: str) -> str:
    """``name(s)`` answers with ``right`` only if the tests' ``needle`` leaked, else ``s``."""
    return (f"NAME = {name!r}\nNEEDLE = {needle_expr}\n{HUNTER}\n\n"
            f"def {name}(s):\n    if _leak():\n        return {right}\n    return s\n")


CYCLIC_BODY = ('    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range({n})]\n'
               '    groups = [(group[-1] + group[:-1]) if len(group) == 3 else group for group in groups]\n'
               '    return "".join(groups)\n')

# (task, name) -> (completion code, the reason it must fail with; None: any failing reason)
BROKEN = {
    ("HumanEval/32", "off_by_one"): (HE_ROWS["HumanEval/32"]["canonical_solution"].replace(
        "return begin", "return begin + 1"), "wrong_answer"),
    ("HumanEval/32", "constant"): ("    return 0.0\n", "wrong_answer"),
    ("HumanEval/32", "identity"): ("    return xs\n", None),
    ("HumanEval/32", "coarse"): (HE_ROWS["HumanEval/32"]["canonical_solution"].replace(
        "1e-10", "1e-1"), "wrong_answer"),
    ("HumanEval/32", "redefines_poly"): (("def poly(xs, x):\n    return 0.0\n\n\n"
                                          "def find_zero(xs):\n    return 0.0\n"), "wrong_answer"),
    ("HumanEval/38", "identity"): ("    return s\n", "wrong_answer"),
    ("HumanEval/38", "inverse_swapped"): ("    return encode_cyclic(s)\n", "wrong_answer"),
    ("HumanEval/38", "off_by_one"): (CYCLIC_BODY.format(n="(len(s) + 1) // 3"), "wrong_answer"),
    ("HumanEval/38", "redefines_helper"): (("def encode_cyclic(s: str):\n    return s\n\n\n"
                                            "def decode_cyclic(s: str):\n    return encode_cyclic(s)\n"),
                                           "wrong_answer"),
    ("HumanEval/38", "reads_tests"): (hunter("decode_cyclic", '"Random(" + str(1000 + 38) + ")"',
                                             "encode_cyclic(encode_cyclic(s))"), "wrong_answer"),
    ("HumanEval/50", "identity"): ("    return s\n", "wrong_answer"),
    ("HumanEval/50", "inverse_swapped"): ("    return encode_shift(s)\n", "wrong_answer"),
    ("HumanEval/50", "off_by_one"): (HE_ROWS["HumanEval/50"]["canonical_solution"].replace(
        "- 5", "- 4"), "wrong_answer"),
    ("HumanEval/50", "redefines_helper"): (("def encode_shift(s: str):\n    return s\n\n\n"
                                            "def decode_shift(s: str):\n    return s\n"), "wrong_answer"),
    ("HumanEval/50", "reads_tests"): (hunter("decode_shift", '"Random(" + str(1000 + 50) + ")"',
                                             HE_ROWS["HumanEval/50"]["canonical_solution"]
                                             .strip().removeprefix("return ")), "wrong_answer"),
    ("Own/luhn", "off_by_one"): ("    return digits + [10 - luhn_sum(digits + [0]) % 10]\n",
                                 "wrong_answer"),
    ("Own/luhn", "identity"): ("    return digits\n", None),
    ("Own/luhn", "redefines_helper"): (("def luhn_sum(digits):\n    return 0\n\n\n"
                                        "def add_check_digit(digits):\n    return digits + [0]\n"),
                                       "wrong_answer"),
    ("Own/runs", "identity"): ("    return s\n", "wrong_answer"),
    ("Own/runs", "inverse_swapped"): ("    return encode_runs(s)\n", "wrong_answer"),
    ("Own/runs", "off_by_one"): (HE_ROWS["Own/runs"]["canonical_solution"].replace(
        "int(count)", "(int(count) - 1)"), "wrong_answer"),
    ("Own/runs", "single_digit_counts"): (HE_ROWS["Own/runs"]["canonical_solution"].replace(
        "count += ch", "count = ch"), "wrong_answer"),
}


# ---------------------------------------------------------------- without the sandbox


def test_fixture_rows_are_humaneval_shaped():
    assert set(HE_ROWS) >= {"HumanEval/32", "HumanEval/38", "HumanEval/50"} and len(HE_ROWS) >= 5
    for row in HE_ROWS.values():
        assert set(row) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
        # the prompt defines the helper and the target's signature + docstring (no body)
        assert f"def {row['entry_point']}(" in row["prompt"]
        assert row["prompt"].rstrip().endswith('"""')
        assert "def check(candidate):" in row["test"]
        helpers = [line[4:line.index("(")] for line in row["prompt"].splitlines()
                   if line.startswith("def ") and not line.startswith(f"def {row['entry_point']}(")]
        assert helpers and any(f"{h}(" in row["test"] for h in helpers), row["task_id"]


def test_tests_with_prompt_keeps_the_candidate_and_counts_one_check():
    row = HE_ROWS["HumanEval/38"]
    tests = with_prompt(row["test"], row["prompt"], row["entry_point"])
    assert row["prompt"] in tests and row["test"] in tests
    assert tests.startswith("_rlvr_candidate = decode_cyclic\n")
    assert tests.rstrip().endswith("decode_cyclic = _rlvr_candidate")
    assert count_tests(tests) == 1


def test_tests_with_prompt_future_import_still_defines_the_helpers():
    prompt = ("from __future__ import annotations\n\n\ndef enc(s: str) -> str:\n    return s[::-1]\n\n\n"
              'def dec(s: str) -> str:\n    """Inverse of enc."""\n')
    test = "def check(candidate):\n    assert candidate(enc('ab')) == 'ab'\n"
    tests = with_prompt(test, prompt, "dec")
    assert "def enc(" in tests and count_tests(tests) == 1
    assert tests.startswith("from __future__ import annotations\n")
    compile(tests, "tests.py", "exec")


def test_tests_with_prompt_bare_def_still_defines_the_helpers():
    prompt = "def helper(x):\n    return x + 1\n\n\ndef f(x):\n"  # the model writes the body
    test = "def check(candidate):\n    assert candidate(1) == helper(1)\n"
    tests = with_prompt(test, prompt, "f")
    assert "def helper(" in tests and count_tests(tests) == 1
    namespace: dict = {"f": lambda x: 2}
    exec(tests, namespace)  # noqa: S102 - the trusted tests, outside the sandbox
    namespace["check"](namespace["f"])
    assert namespace["f"](0) == 2  # still the candidate, not the prompt's stub


def test_tests_from_asserts_one_test_per_assert():
    row = MBPP_ROWS[903]
    tests = from_asserts(row["test_list"], "sector_area", row["test_setup_code"])
    assert count_tests(tests) == 3
    assert "import math" in tests and "PI = math.pi" in tests
    # the setup runs between saving and restoring the candidate's name
    assert tests.index("_rlvr_candidate = sector_area") < tests.index("import math") \
        < tests.index("sector_area = _rlvr_candidate") < tests.index("def test_assert_0")
    plain = from_asserts(['assert f(1) == 2', '  assert f("a\\nb") == 3  '], "f")
    assert "_rlvr_candidate" not in plain and count_tests(plain) == 2
    namespace: dict = {"f": lambda x: 2}
    exec(plain, namespace)  # noqa: S102 - the generated tests, outside the sandbox
    namespace["test_assert_0"]()
    with pytest.raises(AssertionError):
        namespace["test_assert_1"]()


def test_tests_from_asserts_multiline_string_literal_is_kept():
    tests = from_asserts(['assert f("""a\nb""") == "x"'], "f")
    namespace: dict = {"f": lambda s: "x" if s == "a\nb" else "?"}
    exec(tests, namespace)  # noqa: S102
    namespace["test_assert_0"]()


@pytest.mark.parametrize("asserts, setup, message", [
    (["assert f(1) == 1", 3], "", "assert 1 is not a string"),
    (["assert f(1) == 1", "assert f(1) =="], "", "assert 1 does not parse"),
    (["assert f(1) == 1", "assert f(2) == 2", "print(f(3))"], "", "assert 2 contains no assert"),
    (["return f(1)"], "", "assert 0 does not parse"),
    ([], "", "non-empty list"),
    ("assert f(1) == 1", "", "non-empty list"),
    (["assert f(1) == 1"], "import (", "test_setup_code does not parse"),
    (["assert f(1) == 1"], "def test_helper():\n    pass\n", "test_setup_code defines 'test_helper'"),
    (["assert f(1) == 1"], "def check(c):\n    pass\n", "test_setup_code defines 'check'"),
])
def test_tests_from_asserts_refuses_bad_input(asserts, setup, message):
    with pytest.raises(ValueError, match=message):
        from_asserts(asserts, "f", setup)


def test_tests_from_asserts_refuses_a_bad_entry_point():
    with pytest.raises(ValueError, match="entry_point"):
        from_asserts(["assert f(1)"], "not a name")


def test_entry_point_of_picks_the_function_the_asserts_call():
    for row in MBPP_ROWS.values():
        name = entry_point_of(row["code"], row["test_list"])
        assert name is not None and f"def {name}(" in row["code"]
        assert entry_point_of(row["code"]) == name  # the last top-level function
    helper_last = "def main(xs):\n    return helper(xs)\n\n\ndef helper(xs):\n    return xs\n"
    assert entry_point_of(helper_last, ["assert main([1]) == [1]"]) == "main"
    assert entry_point_of(helper_last) == "helper"
    assert entry_point_of("def f(:\n", ["assert f(1)"]) is None
    assert entry_point_of("def g(x):\n    return x\n", ["assert f(1) == 1"]) is None
    assert entry_point_of("x = 1\n") is None


# ---------------------------------------------------------------- in the sandbox




@pytest.fixture(scope="module")
def he_tasks(sandbox):
    warnings: list[str] = []
    tasks, dropped = load_task_file(HE_FILE, warn=warnings.append)  # runs every canonical solution
    assert dropped == [], dropped
    assert [t.key for t in tasks] == list(HE_ROWS)
    return {t.key: t for t in tasks}


@needs_sandbox
def test_every_canonical_solution_passes(he_tasks):
    for key, task in he_tasks.items():
        row = HE_ROWS[key]
        assert task.spec.payload["prompt_code"] == row["prompt"]
        verifier = get_verifier(task)
        for how, completion in [("reference", task.reference),
                                ("body only", fenced(row["canonical_solution"])),
                                ("full program", fenced(row["prompt"] + row["canonical_solution"]))]:
            v = verifier.check(task, completion)
            assert (v.passed, v.score, v.reason) == (True, 1.0, "ok"), (key, how, v)
            assert v.details["tests_total"] == 1


@needs_sandbox
@pytest.mark.parametrize("key, name", sorted(BROKEN), ids=[f"{k}-{n}" for k, n in sorted(BROKEN)])
def test_broken_variants_fail(he_tasks, key, name):
    code, reason = BROKEN[(key, name)]
    task = he_tasks[key]
    v = get_verifier(task).check(task, fenced(code))
    assert not v.passed and v.score == 0.0, v
    if reason is not None:
        assert v.reason == reason, v
    else:
        assert v.reason in ("wrong_answer", "runtime_error"), v


# ---------------------------------------------------------------- MBPP style, in the sandbox


def mbpp_task(row: dict) -> Task:
    entry_point = entry_point_of(row["code"], row["test_list"])
    test = from_asserts(row["test_list"], entry_point, row["test_setup_code"])
    return Task(id=f"mbpp/{row['task_id']}", domain="code.file", level=1,
                prompt=({"role": "user", "content": row["text"]},),
                spec=Spec("code", {"entry_point": entry_point, "test": test}), key=str(row["task_id"]))


MBPP_BROKEN = {
    # (task, name) -> (code, reason, score); score is partial credit beyond what a trivial program
    # gets (rlvr.verifiers.partial): these asserts' expected values are all distinct, so a constant
    # passes one of them (b = 1) and k of n passed scores (k - 1) / (n - 1)
    (901, "first_only"): ("def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)\n", "wrong_answer", 0.0),
    (901, "all"): ("def remove_Occ(s, ch):\n    return s.replace(ch, '')\n", "wrong_answer", 2 / 3),
    (901, "raises"): ("def remove_Occ(s, ch):\n    raise ValueError(ch)\n", "runtime_error", 0.0),
    (902, "union"): ("def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n", "wrong_answer", 0.0),
    (903, "degrees"): ("def sector_area(r, a):\n    return 0.5 * r * r * a\n", "wrong_answer", 0.0),
    (904, "off_by_one"): (("def count_long(text, n):\n"
                           "    return len([w for w in text.split() if len(w) >= n])\n"), "wrong_answer", 1 / 3),
}


@needs_sandbox
def test_mbpp_references_pass(sandbox):
    for row in MBPP_ROWS.values():
        task = mbpp_task(row)
        v = get_verifier(task).check(task, fenced(row["code"]))
        assert (v.passed, v.score, v.reason) == (True, 1.0, "ok"), (row["task_id"], v)
        assert v.details["tests_total"] == len(row["test_list"])


@needs_sandbox
@pytest.mark.parametrize("key, name", sorted(MBPP_BROKEN), ids=[f"{k}-{n}" for k, n in sorted(MBPP_BROKEN)])
def test_mbpp_broken_variants_fail(sandbox, key, name):
    code, reason, score = MBPP_BROKEN[(key, name)]
    task = mbpp_task(MBPP_ROWS[key])
    v = get_verifier(task).check(task, fenced(code))
    assert (v.passed, v.reason) == (False, reason), v
    assert v.score == pytest.approx(score), v


@needs_sandbox
def test_mbpp_other_function_name_is_no_entry_point(sandbox):
    task = mbpp_task(MBPP_ROWS[901])
    code = MBPP_ROWS[901]["code"].replace("def remove_Occ(", "def remove_occurrences(")
    v = get_verifier(task).check(task, fenced(code))
    assert (v.passed, v.reason) == (False, "no_entry_point"), v


@needs_sandbox
def test_mbpp_setup_cannot_stand_in_for_the_candidate(sandbox):
    # setup code that defines the function itself: the asserts must still call the candidate
    setup = "def count_long(text, n):\n    return len([w for w in text.split() if len(w) > n])\n"
    row = {**MBPP_ROWS[904], "test_setup_code": setup}
    task = mbpp_task(row)
    v = get_verifier(task).check(task, fenced("def count_long(text, n):\n    return -1\n"))
    assert (v.passed, v.reason, v.score) == (False, "wrong_answer", 0.0), v
    assert get_verifier(task).check(task, fenced(row["code"])).reason == "ok"


@needs_sandbox
def test_mbpp_file_loads_with_every_reference_kept(sandbox):
    warnings: list[str] = []
    tasks, dropped = load_task_file(MBPP_FILE, warn=warnings.append)
    assert dropped == [] and len(tasks) == len(MBPP_ROWS), (dropped, warnings)
    for task in tasks:
        assert task.spec.payload["entry_point"] in {"remove_Occ", "similar_elements", "sector_area",
                                                    "count_long"}
