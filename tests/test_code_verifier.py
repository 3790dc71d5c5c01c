"""The code verifier: extraction, reasons, and adversarial candidates that must never pass."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from rlvr.errors import UserError
from rlvr.sandbox import ExecResult, choose, plaindata
from rlvr.types import Spec, Task, Verdict
from rlvr.verifiers import check_all, get_verifier
from rlvr.verifiers.code import (
    assemble_program,
    check_program,
    check_spec,
    extract_code,
    use_sandbox,
)
from rlvr.verifiers.partial import asserted_baseline, chance_corrected, trivial_baseline

STRICT = choose("auto").strict
needs_sandbox = pytest.mark.skipif(not STRICT, reason="no strict sandbox backend here")

VISIBLE = [(1,), (2,)]  # shown in the prompt; the hidden cases below are disjoint from them
HIDDEN = [(0,), (5,), (10,), (-3,), (17,), (100,)]


def io_task(timeout: float = 5.0, **extra) -> Task:
    payload = {"entry_point": "add_k", "inputs": plaindata.encode(HIDDEN),
               "expected": plaindata.encode([x + 7 for (x,) in HIDDEN]), "timeout": timeout, **extra}
    return Task(id="code.test/v1/train/1/000000", domain="code.test", level=1,
                prompt=({"role": "user", "content": "Write add_k(x): x plus 7. add_k(1) == 8."},),
                spec=Spec("code", payload), key="add7")


HE_PROMPT = ('from typing import List\n\n\ndef total(xs: List[int]) -> int:\n'
             '    """Sum of xs. total([1, 2]) == 3"""\n')
HE_TEST = ("METADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 2]) == 3\n"
           "    assert candidate([]) == 0\n    assert candidate([5, -5, 4]) == 4\n")


def he_task(timeout: float = 5.0) -> Task:
    payload = {"entry_point": "total", "test": HE_TEST, "prompt_code": HE_PROMPT, "timeout": timeout}
    return Task(id="file:he/0", domain="code.file", level=1,
                prompt=({"role": "user", "content": "Complete:\n" + HE_PROMPT},),
                spec=Spec("code", payload), key="0")


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n\n```{tag}\n{code.strip(chr(10))}\n```\n"


GOLD = "def add_k(x):\n    return x + 7\n"
CHEATS = {
    "wrong": ("def add_k(x):\n    return x + 6\n", "wrong_answer"),
    "pass_body": ("def add_k(x):\n    pass\n", "wrong_answer"),
    "return_none": ("def add_k(x):\n    return None\n", "wrong_answer"),
    "constant": ("def add_k(x):\n    return 8\n", "wrong_answer"),
    "lookup_visible": ("def add_k(x):\n    return {1: 8, 2: 9}.get(x, 0)\n", "wrong_answer"),
    "bool_for_int": ("def add_k(x):\n    return True\n", "wrong_answer"),
    "float_for_int": ("def add_k(x):\n    return x + 7.0\n", "wrong_answer"),
    "sys_exit_top": ("import sys\nsys.exit(0)\ndef add_k(x):\n    return 0\n", "runtime_error"),
    "sys_exit_call": ("import sys\ndef add_k(x):\n    sys.exit(0)\n", "runtime_error"),
    "os_exit_top": ("import os\nos._exit(0)\ndef add_k(x):\n    return 0\n", "tampered"),
    "os_exit_call": ("import os\ndef add_k(x):\n    os._exit(0)\n", "tampered"),
    "always_equal": (("class AE:\n    def __eq__(self, other):\n        return True\n"
                      "    __hash__ = object.__hash__\n"
                      "def add_k(x):\n    return AE()\n"), "runtime_error"),
    "int_subclass": (("class I(int):\n    def __eq__(self, other):\n        return True\n"
                      "def add_k(x):\n    return I(0)\n"), "runtime_error"),
    # builtins the harness also uses: the shared io process breaks, its report is incomplete
    "patched_builtins": (("import builtins\nbuiltins.isinstance = lambda *a: True\n"
                          "builtins.len = lambda *a: 0\nbuiltins.type = lambda *a: int\n"
                          "def add_k(x):\n    return 0\n"), "tampered"),
    "patched_repr": (("import builtins\nbuiltins.repr = lambda x: '8'\nbuiltins.abs = lambda x: 0\n"
                      "def add_k(x):\n    return 0\n"), "wrong_answer"),
    "forged_report": (("import os\nfor fd in range(3, 64):\n    try:\n"
                       "        os.write(fd, b'deadbeef {\"i\": 0, \"ok\": [\"i\", \"7\"]}\\n"
                       "deadbeef {\"done\": 6}\\n')\n    except OSError:\n        pass\n"
                       "print('{\"passed\": 6, \"failed\": 0}')\n"
                       "def add_k(x):\n    return 0\n"), "tampered"),
    "raises": ("def add_k(x):\n    raise ValueError('no')\n", "runtime_error"),
    "load_error": ("raise ImportError('nope')\ndef add_k(x):\n    return x + 7\n", "runtime_error"),
    "missing_entry_point": ("def add_seven(x):\n    return x + 7\n", "no_entry_point"),
    "syntax_error": ("def add_k(x)\n    return x + 7\n", "syntax_error"),
}


# ---------------------------------------------------------------- pure parts (no sandbox)


class NoSandbox:
    def submit(self, job):
        raise AssertionError(f"must not reach the sandbox: {job.program[:40]!r}")


@pytest.mark.parametrize("text", [
    "def add_k(x):\n    return x + 7\n",  # no fence
    fenced(GOLD) + fenced(GOLD),  # two blocks
    "```python\ndef add_k(x):\n    return x + 7\n",  # unclosed
    "```python\n\n   \n```",  # empty
    fenced(GOLD, "javascript"),  # another language
    fenced(GOLD, "text") + fenced(GOLD),  # any second block counts
    "```python\ndef add_k(x):\n```python\n    return x + 7\n```",  # tagged fence inside a block
    "Inline ```python def add_k(x): return x + 7``` only",
    "",
])
def test_extraction_is_strict(text):
    assert extract_code(text) is None


@pytest.mark.parametrize("tag", ["python", "py", "", "Python", "python3"])
def test_extraction_reads_one_block(tag):
    assert extract_code("Sure.\n" + fenced(GOLD, tag) + "Done.") == GOLD


@pytest.mark.parametrize("text", [
    "def add_k(x):\n    return x + 7\n", fenced(GOLD) + fenced(GOLD), "```python\n" + GOLD, "",
])
def test_no_code_never_reaches_the_sandbox(text):
    previous = use_sandbox(NoSandbox())
    try:
        v = get_verifier(io_task()).check(io_task(), text)
    finally:
        use_sandbox(previous)
    assert (v.passed, v.score, v.reason, v.details["format_ok"]) == (False, 0.0, "no_code", False)


def test_syntax_error_is_found_before_the_sandbox():
    previous = use_sandbox(NoSandbox())
    try:
        for code in ("def add_k(x)\n    return 1\n", "x = (" * 300 + ")" * 300, "a = 1\x00\n"):
            v = get_verifier(io_task()).check(io_task(), fenced(code) if "\x00" not in code
                                              else "```\n" + code + "```")
            assert v.reason == "syntax_error" and v.details["format_ok"], (code[:20], v)
        verdicts = get_verifier(io_task()).check_many([(io_task(), fenced("def add_k(:"))] * 3)
        assert [v.reason for v in verdicts] == ["syntax_error"] * 3
    finally:
        use_sandbox(previous)


def _fake(status="ok", **kw):
    class FakeSandbox:
        def submit(self, job):
            future = Future()
            future.set_result(ExecResult(status=status, backend="fake", **kw))
            return future

    return FakeSandbox()


@pytest.mark.parametrize("result, reason", [
    ({"status": "error", "error": "sandbox worker died"}, "sandbox_error"),
    ({"status": "timeout"}, "timeout"),
    ({"status": "killed", "signal": 24}, "timeout"),
    ({"status": "killed", "signal": 11}, "runtime_error"),
    ({"status": "output_limit"}, "runtime_error"),
    ({"status": "ok", "report_ok": True, "tampered": ["x.py"],
      "outputs": [{"ok": x + 7} for (x,) in HIDDEN]}, "tampered"),
])
def test_run_failures_map_to_reasons(result, reason):
    previous = use_sandbox(_fake(**result))
    try:
        v = get_verifier(io_task()).check(io_task(), fenced(GOLD))
    finally:
        use_sandbox(previous)
    assert (v.passed, v.score, v.reason) == (False, 0.0, reason)
    assert v.details["status"] == result["status"] and v.details["backend"] == "fake"


def test_assemble_program():
    body = "    return sum(xs)\n"
    assert assemble_program(body, HE_PROMPT, "total") == HE_PROMPT + body
    full = "def total(xs):\n    return sum(xs)\n"
    assert assemble_program(full, HE_PROMPT, "total") == HE_PROMPT + "\n\n" + full
    future = "from __future__ import annotations\n" + full
    assert assemble_program(future, HE_PROMPT, "total") == future
    assert assemble_program(full, "", "total") == full


def test_malformed_specs_raise_user_errors():
    bad = [
        {"inputs": plaindata.encode([(1,)]), "expected": plaindata.encode([8])},  # no entry point
        {"entry_point": "f"},  # neither form
        {"entry_point": "f", "inputs": [[1]], "expected": [8]},  # not plaindata
        {"entry_point": "f", "inputs": plaindata.encode([(1,)]), "expected": plaindata.encode([])},
        {"entry_point": "f", "test": "def check(candidate:\n"},
        {"entry_point": "f", "test": "def helper():\n    pass\n"},
        {"entry_point": "f", "test": HE_TEST, "timeout": 0},
    ]
    for payload in bad:
        task = Task(id="t", domain="d", level=1, prompt=(), spec=Spec("code", payload))
        with pytest.raises(UserError, match="task t"):
            check_spec(task)
    check_spec(io_task())
    check_spec(he_task())


def test_chance_corrected_rule():
    assert trivial_baseline([(1,), (2,), (3,), (4,)], [0, 0, 0, 9], plaindata.same) == 3
    assert trivial_baseline([(1, 5), (2, 6), (3, 0)], [5, 6, 1], plaindata.same) == 2  # 2nd argument
    assert trivial_baseline([(1,), (2,)], [0.1, 0.1 + 1e-12], plaindata.same) == 2  # the tolerance
    assert trivial_baseline([(1,), (2,)], [1.0, 2.0], plaindata.same) == 1  # type-strict, as compare is
    assert chance_corrected(3, 4, 3) == 0.0 and chance_corrected(4, 4, 3) == 1.0
    assert chance_corrected(2, 4, 3) == 0.0 and chance_corrected(3, 5, 1) == 0.5
    assert chance_corrected(2, 2, 2) == 1.0 and chance_corrected(1, 2, 2) == 0.0
    test = ("def test_a():\n    assert f(1) == 0\n\n\ndef test_b():\n    assert 0 == f(2)\n\n\n"
            "def test_c():\n    assert f(3) == 3\n\n\ndef test_d():\n    assert abs(f(4) - 1) < 1\n")
    assert asserted_baseline(test, "f") == 2  # return 0; test_d's shape is not read
    assert asserted_baseline("def check(candidate):\n    assert candidate(1) == 0\n", "f") == 0
    assert asserted_baseline("def test_x(:\n", "f") == 0


# ---------------------------------------------------------------- in the sandbox




@needs_sandbox
def test_gold_passes(sandbox):
    v = get_verifier(io_task()).check(io_task(), fenced(GOLD))
    assert (v.passed, v.score, v.reason) == (True, 1.0, "ok")
    assert v.details["tests_passed"] == v.details["tests_total"] == len(HIDDEN)
    assert v.details["format_ok"] and v.details["backend"] == sandbox.name
    assert v.details["code"] == GOLD


@needs_sandbox
@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheats_fail(sandbox, name):
    code, reason = CHEATS[name]
    v = get_verifier(io_task()).check(io_task(), fenced(code))
    assert not v.passed and v.score < 1.0, v
    assert v.reason == reason, v


# A task whose hidden outputs mostly coincide (6 of 8 are 0) and whose inputs are often the
# answer of another task: where ``passed / total`` paid trivial programs most of the reward.
BIG_INPUTS = [([1, 2],), ([5],), ([],), ([7, 3],), ([0],), ([9, 9],), ([150, 3, 200],), ([100, 101],)]
BIG_TASK = Task(id="code.test/v1/train/1/000001", domain="code.test", level=1,
                prompt=({"role": "user", "content": "count_big(xs): how many xs are over 100."},),
                spec=Spec("code", {"entry_point": "count_big", "inputs": plaindata.encode(BIG_INPUTS),
                                   "expected": plaindata.encode([sum(x > 100 for x in xs)
                                                                 for (xs,) in BIG_INPUTS]),
                                   "timeout": 5.0}), key="big")


@needs_sandbox
@pytest.mark.parametrize("task, code, score", [
    # honest and almost right: paid for the cases beyond what a constant gets (5 right, 1 by chance)
    (io_task(), "def add_k(x):\n    return x + 7 if x < 50 else x + 6\n", 4 / 5),
    (BIG_TASK, "def count_big(xs):\n    return sum(x >= 100 for x in xs)\n", 1 / 2),  # 7 of 8
    # trivial programs: a constant (the majority output or another), the input, nothing
    (BIG_TASK, "def count_big(xs):\n    return 0\n", 0.0),  # 6 of 8 right, paid 6/8 before
    (BIG_TASK, "def count_big(xs):\n    return 1\n", 0.0),
    (io_task(), "def add_k(x):\n    return 7 if x == 0 else x + 6\n", 0.0),  # 1 of 6: a constant's share
    # input-dependent and right on one case beyond the constant's: paid for that one case only
    (BIG_TASK, "def count_big(xs):\n    return 0 if len(xs) < 3 else 2\n", 1 / 2),
])
def test_partial_credit_is_beyond_trivial_programs(sandbox, task, code, score):
    v = get_verifier(task).check(task, fenced(code))
    assert not v.passed and v.reason == "wrong_answer" and v.score == pytest.approx(score), v


IDENT_INPUTS = [([1, 2],), ([3],), ([],), ([4, 5, 6],), ([7, 8],), ([1, 1],), ([2, 3, 2],)]
IDENT_TASK = Task(id="code.test/v1/train/1/000002", domain="code.test", level=1,
                  prompt=({"role": "user", "content": "dedupe(xs): xs without repeats, in order."},),
                  spec=Spec("code", {"entry_point": "dedupe", "inputs": plaindata.encode(IDENT_INPUTS),
                                     "expected": plaindata.encode([list(dict.fromkeys(xs))
                                                                   for (xs,) in IDENT_INPUTS])}),
                  key="dedupe")


@needs_sandbox
def test_returning_the_input_earns_no_partial_credit(sandbox):
    v = get_verifier(IDENT_TASK).check(IDENT_TASK, fenced("def dedupe(xs):\n    return xs\n"))
    assert (v.passed, v.score, v.details["tests_passed"], v.details["trivial_baseline"]) == (False, 0.0, 5, 5)
    v = get_verifier(IDENT_TASK).check(IDENT_TASK, fenced("def dedupe(xs):\n    return sorted(set(xs))\n"))
    assert v.passed  # every hidden input is sorted: the task cannot tell, the rule does not need to
    wrong_once = "def dedupe(xs):\n    return list(dict.fromkeys(xs)) if len(xs) != 3 else xs\n"
    v = get_verifier(IDENT_TASK).check(IDENT_TASK, fenced(wrong_once))
    assert v.details["tests_passed"] == 6 and v.score == pytest.approx(1 / 2)


MBPP_ASSERTS = ["assert is_big(150) == True", "assert is_big(3) == False", "assert is_big(50) == False",
                "assert not is_big(7)", "assert is_big(101)"]


def mbpp_task() -> Task:
    from rlvr.verifiers.code_tests import tests_from_asserts

    return Task(id="file:mbpp/1", domain="code.file", level=1,
                prompt=({"role": "user", "content": "is_big(x): x over 100."},),
                spec=Spec("code", {"entry_point": "is_big", "test": tests_from_asserts(MBPP_ASSERTS, "is_big"),
                                   "timeout": 5.0}), key="mbpp1")


@needs_sandbox
@pytest.mark.parametrize("code, passed, score", [
    ("def is_big(x):\n    return False\n", 3, 0.0),  # 3 of 5 asserts, paid 3/5 before
    ("def is_big(x):\n    return True\n", 2, 0.0),
    ("def is_big(x):\n    return x > 100 or x == 50\n", 4, 1 / 2),
])
def test_tests_form_partial_credit_is_beyond_trivial_programs(sandbox, code, passed, score):
    v = get_verifier(mbpp_task()).check(mbpp_task(), fenced(code))
    assert v.details["tests_passed"] == passed and v.score == pytest.approx(score), v


@needs_sandbox
def test_infinite_loop_times_out(sandbox):
    v = get_verifier(io_task()).check(io_task(timeout=0.5), fenced("def add_k(x):\n    while True:\n        pass\n"))
    assert (v.passed, v.reason) == (False, "timeout")


@needs_sandbox
@pytest.mark.parametrize("completion", [
    fenced("    return sum(xs)\n"),  # the body only, completing the prompt
    fenced("def total(xs: List[int]) -> int:\n    return sum(xs)\n"),  # uses the prompt's import
    fenced("from typing import List\n\ndef total(xs: List[int]) -> int:\n    s = 0\n"
           "    for x in xs:\n        s += x\n    return s\n"),
])
def test_tests_form_passes_gold_completions(sandbox, completion):
    v = get_verifier(he_task()).check(he_task(), completion)
    assert (v.passed, v.score, v.reason) == (True, 1.0, "ok"), v


@needs_sandbox
@pytest.mark.parametrize("code, reason", [
    ("def total(xs):\n    return sum(xs) + 1\n", "wrong_answer"),
    ("def total(xs):\n    pass\n", "wrong_answer"),
    ("import sys\ndef total(xs):\n    sys.exit(0)\n", "runtime_error"),
    ("import os\ndef total(xs):\n    os._exit(0)\n", "runtime_error"),
    ("import sys\nsys.exit(0)\n", "runtime_error"),  # body-only reading: exits at load
    ("class AE:\n    def __eq__(self, o):\n        return True\ndef total(xs):\n    return AE()\n",
     "runtime_error"),
    (("import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
      "def total(xs):\n    return 0\n"), "wrong_answer"),
    (("print('{\"passed\": 1, \"failed\": 0}')\nimport sys\nprint('ok', file=sys.stderr)\n"
      "def total(xs):\n    return 0\n"), "wrong_answer"),
])
def test_tests_form_cheats_fail(sandbox, code, reason):
    v = get_verifier(he_task()).check(he_task(), fenced(code))
    assert (v.passed, v.score, v.reason) == (False, 0.0, reason), v


@needs_sandbox
def test_tests_form_infinite_loop_times_out(sandbox):
    v = get_verifier(he_task()).check(he_task(timeout=0.5), fenced("def total(xs):\n    while True:\n        pass\n"))
    assert (v.passed, v.reason) == (False, "timeout")


@needs_sandbox
def test_check_program(sandbox):
    gold = HE_PROMPT + "    return sum(xs)\n"
    v = check_program(gold, HE_TEST, "total")
    assert (v.passed, v.score, v.reason) == (True, 1.0, "ok")
    v = check_program(HE_PROMPT + "    return sum(xs) - 1\n", HE_TEST, "total", timeout=5.0)
    assert (v.passed, v.reason) == (False, "wrong_answer")
    v = check_program("def summe(xs):\n    return sum(xs)\n", HE_TEST, "total")
    assert (v.passed, v.reason) == (False, "no_entry_point") and "'total'" in v.details["error"]
    v = check_program("def total(xs):\n    while True:\n        pass\n", HE_TEST, "total", timeout=0.5)
    assert v.reason == "timeout"
    assert check_program("", HE_TEST, "total").reason == "no_code"
    assert check_program("def total(xs)\n", HE_TEST, "total").reason == "syntax_error"


@needs_sandbox
def test_check_many_keeps_order_and_equals_check(sandbox):
    verifier = get_verifier(io_task())
    pairs = [(io_task(), fenced(GOLD)), (he_task(), fenced("    return sum(xs)\n"))]
    pairs += [(io_task(), fenced(code)) for code, _ in CHEATS.values()]
    pairs += [(io_task(), "no code"), (he_task(), fenced("def total(xs):\n    return 1\n"))]
    many = verifier.check_many(pairs)
    one_by_one = [verifier.check(task, completion) for task, completion in pairs]

    def key(v):
        return v.passed, v.score, v.reason, v.details.get("tests_passed")

    assert [key(v) for v in many] == [key(v) for v in one_by_one]
    assert [v.reason for v in many[:2]] == ["ok", "ok"]
    assert [v.reason for v in many[2:-2]] == [reason for _, reason in CHEATS.values()]


@needs_sandbox
def test_check_all_mixes_verifiers_in_order(sandbox):
    import rlvr.verifiers  # noqa: F401  (math is registered)

    math_task = Task(id="m", domain="math.arith", level=1, prompt=(), spec=Spec("math", {"answer": "42"}))
    pairs = [(math_task, "Answer: 42"), (io_task(), fenced(GOLD)), (math_task, "Answer: 41"),
             (io_task(), fenced(CHEATS["wrong"][0])), (math_task, "no")]
    verdicts = check_all(pairs)
    assert all(isinstance(v, Verdict) for v in verdicts)
    assert [v.reason for v in verdicts] == ["ok", "ok", "mismatch", "wrong_answer", "no_answer"]
    assert check_all([]) == []


@needs_sandbox
def test_shared_sandbox_is_one_per_process():
    from rlvr.sandbox.config import SandboxConfig, close_shared_sandbox, shared_sandbox

    close_shared_sandbox()
    first = shared_sandbox(SandboxConfig(workers=1, audit=False))
    try:
        assert shared_sandbox() is first
        assert shared_sandbox(SandboxConfig(workers=2)) is first  # cfg is ignored once open
        close_shared_sandbox()
        close_shared_sandbox()  # idempotent
        second = shared_sandbox(SandboxConfig(workers=1, audit=False))
        assert second is not first and shared_sandbox() is second
        from rlvr.sandbox import Job

        assert second.run(Job.io("def f(a):\n    return a\n", "f", [(1,)])).compare([1]) == 1
    finally:
        close_shared_sandbox()


@needs_sandbox
def test_tests_see_prompt_helpers_but_call_the_candidate(sandbox):
    prompt = ('def encode(s):\n    return s[1:] + s[:1]\n\n\ndef decode(s):\n'
              '    """Inverse of encode."""\n')
    test = ("def check(candidate):\n    assert candidate(encode('abc')) == 'abc'\n"
            "    assert decode(encode('xy')) == 'xy'\n")  # by name too: must be the candidate
    task = Task(id="t", domain="code.file", level=1, prompt=(),
                spec=Spec("code", {"entry_point": "decode", "test": test, "prompt_code": prompt}))
    verifier = get_verifier(task)
    assert verifier.check(task, fenced("    return s[-1:] + s[:-1]\n")).reason == "ok"
    assert verifier.check(task, fenced("def decode(s):\n    return s\n")).reason == "wrong_answer"
    assert verifier.check(task, fenced("    pass\n")).reason == "wrong_answer"


@needs_sandbox
def test_a_debug_task_pays_nothing_for_the_program_it_showed(sandbox):
    """``code.debug``'s spec carries the shown program's outputs (``given``): sending that program
    back unchanged is trivial, so its matches are the floor of partial credit (it earned up to 0.4)."""
    import rlvr.tasks  # noqa: F401  (registers the built-in domains)
    from rlvr.tasks.base import generate_tasks
    from rlvr.verifiers.code import extract_code

    tasks = [t for seed in (1, 2) for t in generate_tasks("code.debug", "train", 24, seed=seed)]
    echoes = [(t, fenced(extract_code(t.prompt[-1]["content"]))) for t in tasks]  # the one block shown
    verdicts = check_all(echoes)
    matched = [v.details["tests_passed"] for v in verdicts]
    assert all(not v.passed and v.score == 0.0 for v in verdicts), [(t.id, v.score) for (t, _), v in zip(echoes, verdicts)]
    assert max(matched) > 0  # the shown program does match some hidden outputs: the floor is doing the work
    assert all(v.details["trivial_baseline"] >= n for v, n in zip(verdicts, matched))
    gold = check_all([(t, t.reference) for t in tasks])
    assert all(v.passed and v.score == 1.0 for v in gold)


def test_given_outputs_raise_the_baseline():
    assert trivial_baseline([(1,), (2,), (3,)], [5, 6, 9], plaindata.same) == 1
    assert trivial_baseline([(1,), (2,), (3,)], [5, 6, 9], plaindata.same, given=[5, 6, 7]) == 2
