"""RLVR_REQUIRE_STRICT_SANDBOX (tests/conftest.py): where CI expects a strict sandbox, the tests
that would skip for want of one fail instead, with a message naming what is missing; unset, they
skip. RLVR_FAIL_ON_SKIP: every skip not on the conftest's ALLOWED_SKIPS fails (a missing optional
dependency included). Run on a throwaway test tree, with this suite's own conftest, on a machine made to look as
if it had no strict backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.sandbox import detect

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py").read_text()

SANDBOX_TESTS = '''
import pytest
from rlvr.sandbox import choose

strict = pytest.mark.skipif(not choose("auto").strict, reason="no strict sandbox backend here")


@pytest.fixture(scope="module")
def sb():
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    yield "box"


def test_inline_skip():
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")


@strict
def test_marked():
    pass


def test_fixture_one(sb):
    pass


def test_fixture_two(sb):
    pass


def test_bwrap():
    pytest.skip("bubblewrap (as root) not available")


def test_unrelated_skip_stays_a_skip():
    pytest.skip("needs a CUDA device")


@pytest.mark.xfail(reason="an expected failure, not a skip (strict sandbox)")
def test_xfail():
    assert False


def test_plain():
    pass
'''

MODULE_SKIP = '''
import pytest
from rlvr.sandbox import choose

if not choose("auto").strict:
    pytest.skip(f"no strict sandbox backend here ({choose('auto').describe()})",
                allow_module_level=True)


def test_attack_one():
    pass


def test_attack_two():
    pass
'''

NO_STRICT = detect.Capabilities(platform="linux", root=False, user_namespaces=False,
                                landlock_abi=0, seccomp=False, bwrap=None)


@pytest.fixture
def tree(pytester, monkeypatch):
    monkeypatch.delenv("RLVR_FAIL_ON_SKIP", raising=False)  # (CI sets it; its own tests are below)
    monkeypatch.setattr(detect, "capabilities", lambda: NO_STRICT)
    assert not detect.choose("auto").strict
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sandbox_like=SANDBOX_TESTS, test_module_skip=MODULE_SKIP)
    return pytester


def test_without_the_switch_sandbox_tests_skip(tree, monkeypatch):
    monkeypatch.delenv("RLVR_REQUIRE_STRICT_SANDBOX", raising=False)
    result = tree.runpytest("-rs", "-p", "no:cacheprovider")
    # 5 sandbox skips + the CUDA skip + the module that skipped at import
    result.assert_outcomes(passed=1, skipped=7, xfailed=1)
    result.stdout.fnmatch_lines(["*strict sandbox optional*", "*no strict sandbox backend here*"])


@pytest.mark.parametrize("value", ["1", "true"])
def test_with_the_switch_sandbox_skips_fail_and_say_what_is_missing(tree, monkeypatch, value):
    monkeypatch.setenv("RLVR_REQUIRE_STRICT_SANDBOX", value)
    result = tree.runpytest("-rsfE", "-p", "no:cacheprovider")
    # skips in the test body -> failed; skips in setup (skipif marker, module fixture) -> errors;
    # the module that skipped at import -> one failing stand-in; the CUDA skip stays a skip
    result.assert_outcomes(passed=1, failed=3, errors=3, skipped=1, xfailed=1)
    out = result.stdout.str()
    assert "strict sandbox required" in out
    assert "FAILED test_module_skip.py::strict_sandbox_required" in out
    for name in ("test_inline_skip", "test_bwrap"):
        assert f"FAILED test_sandbox_like.py::{name}" in out
    for name in ("test_marked", "test_fixture_one", "test_fixture_two"):
        assert f"ERROR test_sandbox_like.py::{name}" in out
    assert "SKIPPED [1] test_sandbox_like.py" in out and "needs a CUDA device" in out
    # the message names the switch, the backend chosen here and what is missing
    assert out.count("RLVR_REQUIRE_STRICT_SANDBOX=1 expects a strict sandbox") >= 6
    assert "would skip: no strict sandbox backend here. backend here: weak (WEAK)" in out and "no landlock" in out
    assert "seccomp=False" in out and "landlock_abi=0" in out and "bwrap=None" in out


def test_switch_off_values(tree, monkeypatch):
    for value in ("0", "", "false"):
        monkeypatch.setenv("RLVR_REQUIRE_STRICT_SANDBOX", value)
        tree.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, skipped=7, xfailed=1)


OPTIONAL_DEPS = '''
import pytest

missing = pytest.importorskip("a_module_nobody_installed")


def test_uses_it():
    pass
'''

SKIPS = '''
import pytest


def test_without_a_dependency():
    pytest.skip("openai is not installed")


@pytest.mark.skipif(True, reason="this machine has a GPU")
def test_allowed():
    pass


def test_plain():
    pass
'''


@pytest.fixture
def skip_tree(pytester, monkeypatch):
    monkeypatch.delenv("RLVR_REQUIRE_STRICT_SANDBOX", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_optional=OPTIONAL_DEPS, test_skips=SKIPS)
    return pytester


def test_with_fail_on_skip_a_skip_off_the_allow_list_fails_naming_its_reason(skip_tree, monkeypatch):
    monkeypatch.setenv("RLVR_FAIL_ON_SKIP", "1")
    result = skip_tree.runpytest("-rsf", "-p", "no:cacheprovider")
    # the module skipped at import -> one failing stand-in; the inline skip -> failed; the allowed one stays
    result.assert_outcomes(passed=1, failed=2, skipped=1)
    out = result.stdout.str()
    assert "FAILED test_optional.py::skip_not_allowed" in out and "FAILED test_skips.py::test_without_a_dependency" in out
    assert "a_module_nobody_installed" in out and "openai is not installed" in out
    assert out.count("is not on tests/conftest.py's ALLOWED_SKIPS") >= 2
    assert "SKIPPED [1] test_skips.py" in out and "this machine has a GPU" in out


def test_without_fail_on_skip_they_skip(skip_tree, monkeypatch):
    monkeypatch.delenv("RLVR_FAIL_ON_SKIP", raising=False)
    skip_tree.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, skipped=3)
