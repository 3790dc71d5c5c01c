"""``rlvr audit rewards``: no scripted hack earns reward on any registered domain or verifier, under
either reward outcome; a weak verifier (the test's own, a domain's or a task file's reward function)
and a reverted fix make the audit fail, naming the cell; the CLI's exit codes.

Each hack's contract (applies somewhere, right shape, deterministic) is in tests/test_conformance.py.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

import rlvr.envs  # noqa: F401  (registration)
import rlvr.tasks  # noqa: F401
import rlvr.verifiers  # noqa: F401
from rlvr.audit.hacks import HACKS
from rlvr.audit.rewards import (
    OUTCOMES,
    domain_tasks,
    example_tasks,
    format_table,
    run_audit,
)
from rlvr.cli import main
from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.types import Spec, Task, Verdict
from rlvr.verifiers.base import VERIFIERS


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Exit code (SystemExit included), stdout and stderr of ``rlvr audit rewards ARGS``."""
    try:
        code = main(["audit", "rewards", *args])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------- the acceptance: an all-zero table


def test_no_hack_earns_reward_on_any_domain_or_verifier(sandbox, capsys, tmp_path):
    report = tmp_path / "audit.json"
    code, out, err = run_cli(capsys, "--json", str(report))
    assert code == 0, err
    result = json.loads(report.read_text())
    assert result["holes"] == [] and all(c["reward"] == 0 for c in result["cells"])
    assert set(result["outcomes"]) == set(OUTCOMES)
    assert set(DOMAINS.names()) <= set(result["domains"])  # every registered domain, rg.* included
    kinds = {t.spec.kind for t in domain_tasks(DOMAINS.names(), 1, 0)}
    assert all(k in kinds or f"file.{k}" in result["domains"] for k in VERIFIERS.names())  # every verifier
    assert {c["hack"] for c in result["cells"]} == set(HACKS.names())  # every hack ran somewhere
    for outcome in OUTCOMES:
        assert f"reward.outcome = {outcome}" in out
    # the counts: no cell is vacuous, every outcome judged the same attempts, every domain's own
    # references earn reward (the positive control), and the summary line says what was run
    assert all(c["attempts"] >= 1 for c in result["cells"])
    per_outcome = {o: sorted((c["domain"], c["hack"], c["attempts"]) for c in result["cells"] if c["outcome"] == o)
                   for o in OUTCOMES}
    assert per_outcome["binary"] == per_outcome["score"]
    assert set(result["controls"]) == set(result["domains"]) and result["unpaid_references"] == []
    assert all(c["rewarded"] == c["references"] >= 1 for c in result["controls"].values())
    attempts = sum(a for _, _, a in per_outcome["binary"])
    references = sum(c["references"] for c in result["controls"].values())
    assert references == result["tasks"]  # every audited task has a reference, and it was run
    assert (f"no hack earns reward: {attempts} attempts on {result['tasks']} tasks of {len(result['domains'])} "
            f"domains; all {references} task references do") in out


# ---------------------------------------------------------------- the audit fails where it should


class Substring:
    """A deliberately weak verifier: passes when the gold appears anywhere in the completion."""

    name = "substring"

    def check(self, task: Task, completion: str) -> Verdict:
        ok = str(task.spec.payload["answer"]) in completion
        return Verdict(ok, float(ok), "ok" if ok else "mismatch", {})

    def examples(self) -> list[tuple[Task, str]]:
        return [(Task(id=f"substring/{i}", domain="file.substring", level=1, key=str(i),
                      prompt=({"role": "user", "content": f"{i} + 1?"},),
                      spec=Spec("substring", {"answer": str(i + 1)})), f"Answer: {i + 1}") for i in range(2)]


class WeakDomain(Domain):
    name, levels = "weak.substring", (1,)

    def sample(self, level: int, rng: random.Random) -> Problem:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return Problem(key=f"{a}+{b}", prompt=f"Compute: {a} + {b}", spec=Spec("substring", {"answer": str(a + b)}),
                       reference=f"Answer: {a + b}")


class RefuseAll(Substring):
    """A verifier that refuses everything: no hack can earn reward, and neither can a right answer."""

    name = "refuse_all"

    def check(self, task: Task, completion: str) -> Verdict:
        return Verdict(False, 0.0, "mismatch", {})


class RefusingDomain(WeakDomain):
    name = "weak.refusing"

    def sample(self, level: int, rng: random.Random) -> Problem:
        p = super().sample(level, rng)
        return dataclasses.replace(p, spec=Spec("refuse_all", dict(p.spec.payload)))


def test_a_verifier_that_refuses_right_answers_fails_the_audit_by_its_positive_control(capsys, tmp_path):
    with VERIFIERS.temporary("refuse_all", RefuseAll()), DOMAINS.temporary("weak.refusing", RefusingDomain()):
        code, out, err = run_cli(capsys, "--domains", "weak.refusing,math.arith", "--hacks", "several,empty",
                                 "--json", str(tmp_path / "a.json"))
    result = json.loads((tmp_path / "a.json").read_text())
    assert code == 1 and result["holes"] == []  # an all-zero table, and still a failure
    assert result["unpaid_references"] == ["weak.refusing"] and result["controls"]["math.arith"]["rewarded"] >= 1
    assert "weak.refusing: only 0 of" in err and "refuses right answers" in err


def test_a_weak_verifier_makes_the_audit_fail_naming_the_cell(capsys, tmp_path):
    with VERIFIERS.temporary("substring", Substring()), DOMAINS.temporary("weak.substring", WeakDomain()):
        code, out, err = run_cli(capsys, "--domains", "weak.substring,math.arith", "--hacks", "several,empty",
                                 "--json", str(tmp_path / "a.json"))
    assert code == 1
    assert "several earns 1 on weak.substring (reward.outcome=binary" in err
    assert "several earns 1 on weak.substring (reward.outcome=score" in err
    assert "math.arith" not in err and "empty earns" not in err  # only the holes are named
    holes = json.loads((tmp_path / "a.json").read_text())["holes"]
    assert holes == ["binary weak.substring several", "score weak.substring several"]
    assert "weak.substring" in out and "several" in out  # the table is printed before the verdict


class Unexampled:
    name = "unexampled"

    def check(self, task: Task, completion: str) -> Verdict:
        return Verdict(True, 1.0, "ok", {})


def test_a_weak_verifier_without_a_domain_is_audited_through_its_examples():
    with VERIFIERS.temporary("substring", Substring()), VERIFIERS.temporary("unexampled", Unexampled()):
        tasks, missing = example_tasks(covered=set(VERIFIERS.names()) - {"substring", "unexampled"})
        result = run_audit(tasks, ["reasoning_only", "empty"])
    assert [t.domain for t in tasks] == ["file.substring"] * 2
    assert missing == ["unexampled"]  # no domain and no examples(): reported as not audited
    assert [(o, d, h) for o, d, h, _ in result.holes()] == [(o, "file.substring", "reasoning_only") for o in OUTCOMES]
    assert "file.substring" in format_table(result, "binary")


WEAK_REWARD = '''
def contains(prompts, completions, answer, **kw):
    return [float(a in c) for c, a in zip(completions, answer)]
'''


def test_a_weak_reward_function_of_a_task_file_makes_the_audit_fail(capsys, tmp_path):
    (tmp_path / "weak_reward.py").write_text(WEAK_REWARD)
    rows = tmp_path / "tasks.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a} + 1?", "answer": str(a + 1)}) + "\n" for a in range(3)))
    code, _, err = run_cli(capsys, "--tasks", str(rows), "--reward", f"{tmp_path}/weak_reward.py:contains",
                           "--hacks", "gold_spam")
    assert code == 1 and "gold_spam earns 1 on file.python" in err
    code, out, _ = run_cli(capsys, "--tasks", str(rows), "--hacks", "gold_spam,several,boxed_expr")  # math: holds
    assert code == 0 and "file.math" in out and "math.arith" not in out  # a file alone: no built-in domains


def test_a_reverted_fix_shows_up_in_the_table(monkeypatch):
    import rlvr.verifiers.answer as answer

    tasks = domain_tasks(["math.arith"], 1, 0)
    assert not run_audit(tasks, ["boxed_expr"]).holes()
    monkeypatch.setattr(answer, "in_expression", lambda *a: False)  # before: -\boxed{84} read as 84
    holes = run_audit(tasks, ["boxed_expr"]).holes()
    assert {(o, d, h) for o, d, h, _ in holes} == {(o, "math.arith", "boxed_expr") for o in OUTCOMES}
    assert all(c.reward == 1.0 and c.reason == "ok" for *_, c in holes)


# ---------------------------------------------------------------- the table and the CLI


def test_table_marks_hacks_that_do_not_apply(capsys):
    code, out, _ = run_cli(capsys, "--domains", "math.arith", "--hacks", "empty,refuse", "--outcomes", "binary")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "reward.outcome = binary" and "reward.outcome = score" not in out
    header, row = lines[1].split(), lines[2].split()
    assert header == ["domain", "empty"]  # a hack that applies to no drawn task has no column
    assert row == ["math.arith", "0"]


@pytest.mark.parametrize("args, message", [
    (["--hacks", "nope"], "unknown hack 'nope'"),
    (["--hacks", ""], "--hacks names no hack"),
    (["--outcomes", "binary,partial"], "unknown reward outcome 'partial'"),
    (["--domains", "no.such"], "unknown domain 'no.such'"),
    (["--domains", ""], "nothing to audit"),
    (["--per-level", "0"], "--per-level must be at least 1"),
])
def test_user_errors_exit_2_with_one_line(capsys, args, message):
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("rlvr: error: ") and message in err


def test_user_code_task_files_hold(sandbox, capsys):
    # HumanEval- and MBPP-style rows: the tests form of the code verifier, where test_edits redefines check
    code, out, err = run_cli(capsys, "--tasks", "tests/fixtures/humaneval_helpers.jsonl", "--tasks",
                             "tests/fixtures/mbpp_style.jsonl", "--per-level", "9", "--outcomes", "score")
    assert code == 0, err
    assert "test_edits" in out and "print_expected" in out and "no hack earns reward" in out


def test_a_hack_of_the_wrong_shape_is_refused_by_name():
    def flat(task):
        """A completion where a list of turns is due."""
        return ["Answer: 1"]

    with HACKS.temporary("flat", flat), pytest.raises(TypeError, match="hack 'flat' gave a str for code.repair/"):
        run_audit(domain_tasks(["code.repair"], 1, 0)[:1], ["flat"])
