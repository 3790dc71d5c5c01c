"""The sandbox attack suite on every strict backend this machine has (forkserver; bubblewrap, which
`make setup` installs as root; forkserver-userns where unprivileged user namespaces exist), plus
a positive control for every attack (``rlvr.sandbox.controls``): with its defence off the attack
works, and its judge says so."""

from __future__ import annotations

import io
import os

import pytest

from rlvr.sandbox import Job, Sandbox, attacks, choose
from rlvr.sandbox.attacks import (
    ATTACKS,
    EXPECTED,
    INPUTS,
    TESTS,
    Context,
    run_unsandboxed,
)
from rlvr.sandbox.controls import CONTROLS, naive_verdict, run_control
from rlvr.sandbox.detect import available

if not choose("auto").strict:
    pytest.skip(f"no strict sandbox backend here ({choose('auto').describe()})",
                allow_module_level=True)

BY_NAME = {a.name: a for a in ATTACKS}
CORRECT_ADD = "def add(a, b):\n    return a + b\n"


# a missing backend skips with the reason the CI switches know: "bubblewrap" fails under
# RLVR_REQUIRE_STRICT_SANDBOX; the user-namespace one is on ALLOWED_SKIPS (absent as root)
BACKENDS = [pytest.param("forkserver", marks=pytest.mark.skipif(not available("forkserver"),
                                                                reason="no strict sandbox backend here (forkserver)")),
            pytest.param("bwrap", marks=pytest.mark.skipif(not available("bwrap"),
                                                           reason="bubblewrap (as root) not available")),
            pytest.param("forkserver-userns", marks=pytest.mark.skipif(not available("forkserver-userns"),
                                                                       reason="no forkserver-userns backend here"))]


@pytest.fixture(scope="module", params=BACKENDS)
def sb(request):
    with Sandbox(workers=2, backend=request.param) as s:
        yield s


@pytest.fixture(scope="module")
def ctx():
    with Context() as c:
        yield c


def test_attack_names_are_unique():
    assert len(BY_NAME) == len(ATTACKS)
    for required in ("tcp-localhost", "udp-localhost", "dns", "read-host-file", "write-outside",
                     "tamper-test-file", "tamper-tests-memory", "fork-bomb", "memory-20gb",
                     "infinite-loop", "setsid-grandchild", "stdout-flood", "kill-parent",
                     "sys-exit", "os-exit", "forge-report", "patch-builtins", "always-equal",
                     "steal-nonce", "leftover-daemon"):
        assert required in BY_NAME


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_blocked(sb, ctx, attack):
    outcome = attack.run(sb, ctx)
    attacks.sweep(ctx.marker)
    assert outcome.blocked, f"{attack.name} NOT blocked: {outcome.detail}"


# ---- controls: the judges can fail ------------------------------------------------------------

def test_every_attack_has_a_positive_control():
    assert set(CONTROLS) == set(BY_NAME)


@pytest.fixture(scope="module")
def default_sb():
    with Sandbox(workers=2) as s:
        yield s


@pytest.mark.parametrize("name", list(BY_NAME))
def test_the_attack_works_and_its_judge_sees_it_with_the_defence_off(default_sb, name):
    if name == "read-etc-shadow" and not os.access("/etc/shadow", os.R_OK):
        pytest.skip("not root: /etc/shadow is unreadable here even without a sandbox")
    with Context() as c:  # its own: the unsandboxed run really does write and connect
        outcome = run_control(default_sb, c, name)
        left = attacks.still_alive(lambda: attacks.marker_pids(c.marker), grace=3.0)
        attacks.sweep(c.marker)
    assert not left, f"the {name} control left processes behind: {left}"
    assert not outcome.blocked, f"{name} with its defence off was not seen to work: {outcome.detail}"


def test_a_naive_harness_passes_no_honest_wrong_solution_and_every_right_one():
    for judge in ("exit", "first", "nonce"):
        assert not naive_verdict(attacks.WRONG_ADD, judge)[0]
        assert naive_verdict(CORRECT_ADD, judge)[0] is (judge != "exit")  # a report is no exit-only pass


def test_verdict_judges_accept_a_correct_solution(sb):
    tests, io_job = sb.map([Job.with_tests(CORRECT_ADD, TESTS, "add"),
                            Job.io(CORRECT_ADD, "add", INPUTS)])
    assert tests.passed
    assert io_job.compare(EXPECTED) == len(EXPECTED)


def test_host_process_helpers_see_a_leftover():
    with Context() as c:
        result = run_unsandboxed(attacks._daemon_prog(c))
        marker = c.marker + "-daemon"
        # "ok": it returned while its daemons still held its output (no run into the 10 s timeout)
        assert result.status == "ok"
        assert len(attacks.marker_pids(marker)) == 2
        assert attacks.sweep(marker)
        # killed daemons disappear; the grace only bounds the wait (it ends as soon as they are gone)
        assert not attacks.still_alive(lambda: attacks.marker_pids(marker), grace=30.0)


# ---- check() -------------------------------------------------------------------------------

def test_check_prints_backend_and_table_for_selected_attacks():
    out = io.StringIO()
    rc = attacks.check(names=["tcp-localhost", "sys-exit"], out=out)
    text = out.getvalue()
    assert "forkserver" in text or "bwrap" in text
    assert "never guaranteed" in text
    assert "tcp-localhost" in text and "sys-exit" in text and "2/2 blocked" in text
    assert rc == 0, text


@pytest.mark.slow
def test_check_runs_every_attack_and_returns_zero():
    out = io.StringIO()
    rc = attacks.check(out=out)
    text = out.getvalue()
    for attack in ATTACKS:
        assert attack.name in text
    assert rc == 0, text
