"""reasoning-gym datasets as ``rg.<dataset>`` domains and the strict ``reasoning_gym`` verifier.

The registry-wide conformance suite (tests/test_conformance.py) already checks every registered
``rg.*`` domain and the verifier; these tests cover what is particular to the adapter: levels from
the library's curricula, lazy domains, the missing extra, and the scorer's partial credit, which
rlvr must never pay out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("reasoning_gym", reason="the reasoning_gym extra is not installed (make test installs it)")

import reasoning_gym  # noqa: E402

from rlvr.cli import main  # noqa: E402
from rlvr.errors import UserError  # noqa: E402
from rlvr.tasks import DOMAINS, check_disjoint, generate_tasks  # noqa: E402
from rlvr.tasks.reasoning_gym import ReasoningGymDomain, level_configs, reference_for  # noqa: E402
from rlvr.types import Task  # noqa: E402
from rlvr.verifiers import VERIFIERS  # noqa: E402
from rlvr.verifiers.reasoning_gym import contains_gold, judge  # noqa: E402

# one per kind of answer: an integer, a signed integer from an expression, a list of words, an
# order-free logic statement, a grid over several lines, a polynomial that sympy compares
DATASETS = ["leg_counting", "basic_arithmetic", "word_sorting", "knights_knaves", "mini_sudoku",
            "polynomial_multiplication"]


def task_of(dataset: str, level: int = 1, index: int = 0, split: str = "train") -> Task:
    return DOMAINS.get(f"rg.{dataset}").generate(split, level, index, seed=0)


def verdict(task: Task, completion: str):
    return VERIFIERS.get("reasoning_gym").check(task, completion)


def gold(task: Task) -> str:
    return task.spec.payload["answer"]


def library_score(task: Task, answer: str) -> float:
    """What reasoning-gym's own scorer pays for ``answer``."""
    p = task.spec.payload
    return reasoning_gym.create_dataset(p["dataset"], seed=0, size=1, **p["config"]).score_answer(answer, p["entry"])


# ---------------------------------------------------------------- domains


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_level_generates_tasks_whose_reference_passes(dataset):
    domain = DOMAINS.get(f"rg.{dataset}")  # made on first use when not one of the defaults
    assert domain.levels == tuple(range(1, len(level_configs(dataset)) + 1))
    for level in domain.levels:
        task = domain.generate("train", level, 0, seed=0)
        assert task.domain == f"rg.{dataset}" and task.level == level and task.spec.kind == "reasoning_gym"
        assert task.spec.payload["config"] == domain.config(level)
        assert verdict(task, f"Some working.\n{task.reference}").passed, (level, task.reference)
        assert json.loads(json.dumps(task.to_dict())) == task.to_dict()


def test_levels_follow_the_library_curriculum_from_easy_to_hard():
    configs = level_configs("leg_counting")
    assert 2 <= len(configs) <= 10 and all(a != b for a, b in zip(configs, configs[1:]))
    animals = [c["max_animals"] for c in configs]
    assert animals == sorted(animals) and animals[0] < animals[-1]
    # the problems grow with the level: more kinds of animals named in the question
    easy, hard = (task_of("leg_counting", level, i) for level, i in ((1, 0), (len(configs), 0)))
    assert easy.spec.payload["entry"]["metadata"]["num_animals"] < hard.spec.payload["entry"]["metadata"]["num_animals"]
    # a dataset without a curriculum has its default configuration as its only level
    assert level_configs("gsm_symbolic") == [{}] and DOMAINS.get("rg.gsm_symbolic").levels == (1,)


def test_generation_is_deterministic_and_independent_of_the_instance():
    a = [task_of("word_sorting", 2, i) for i in range(4)]
    fresh = ReasoningGymDomain("word_sorting")  # a new instance: no state carried between them
    b = [fresh.generate("train", 2, i, seed=0) for i in range(4)]
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert len({t.prompt[0]["content"] for t in a}) == 4  # and the indices give different problems
    other_seed = DOMAINS.get("rg.word_sorting").generate("train", 2, 0, seed=1)
    assert other_seed.prompt != a[0].prompt


@pytest.mark.parametrize("dataset", ["leg_counting", "basic_arithmetic", "knights_knaves"])
def test_train_and_eval_splits_are_disjoint(dataset):
    train = generate_tasks(f"rg.{dataset}", "train", 40, seed=0)
    held_out = generate_tasks(f"rg.{dataset}", "eval", 20, seed=0)
    check_disjoint(train, held_out)  # raises on a shared key, prompt or id
    questions = lambda tasks: {t.spec.payload["entry"]["question"] for t in tasks}  # noqa: E731
    assert not questions(train) & questions(held_out)


def test_a_curriculum_the_dataset_rejects_falls_back_to_its_default_level():
    # reasoning-gym 0.1.25: knight_swap's curriculum asks for 4 nodes, its config wants >= 6
    assert level_configs("knight_swap") == [{}]
    task = task_of("knight_swap")
    assert verdict(task, task.reference).passed


def test_items_json_changes_are_scored_against_the_rebuilt_item():
    task = task_of("arc_agi")  # its scorer compares the answer with a tuple grid in the metadata
    payload = task.spec.payload
    assert payload["rebuild"]["index"] >= 0
    assert library_score(task, gold(task)) < 1  # the JSON entry alone underpays the right grid
    assert verdict(task, task.reference).passed
    forged = Task.from_dict(json.loads(json.dumps(task.to_dict())))
    forged.spec.payload["entry"]["question"] += " (edited)"
    assert verdict(forged, task.reference).reason == "entry_mismatch"


def test_a_generator_that_prints_does_not_corrupt_tasks_show(capsys):
    assert main(["tasks", "show", "--domain", "rg.codeio", "--n", "3"]) == 0  # codeio runs code that prints
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(json.loads(line)["domain"] == "rg.codeio" for line in lines)


def test_unknown_and_unsupported_datasets_are_user_errors():
    with pytest.raises(UserError, match="reasoning-gym has no dataset 'no_such_thing'.*leg_counting"):
        DOMAINS.get("rg.no_such_thing")
    with pytest.raises(UserError, match="composite.*not supported"):
        DOMAINS.get("rg.composite")
    with pytest.raises(UserError, match="has no level 99"):
        DOMAINS.get("rg.leg_counting").generate("train", 99, 0, seed=0)


def test_reference_for_multi_line_golds_is_a_box_and_unbalanced_braces_cannot_be_stated():
    assert reference_for("42") == "Answer: 42"
    assert reference_for("1 2\n3 4") == "\\boxed{\n1 2\n3 4\n}"
    assert reference_for("a}\nb{") is None and reference_for("  ") is None


def test_without_the_package_nothing_is_registered_and_use_names_the_extra():
    script = """
import sys
sys.modules["reasoning_gym"] = None  # as if not installed: importing it raises ImportError
import rlvr.tasks, rlvr.verifiers
from rlvr.errors import UserError
from rlvr.tasks import DOMAINS
from rlvr.verifiers import VERIFIERS
assert not [n for n in DOMAINS.names() if n.startswith("rg.")], DOMAINS.names()
assert "reasoning_gym" not in VERIFIERS.names()
for get in (lambda: DOMAINS.get("rg.leg_counting"), lambda: VERIFIERS.get("reasoning_gym")):
    try:
        get()
    except UserError as e:
        print(e)
    else:
        raise SystemExit("no UserError")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all("pip install 'rlvr[reasoning_gym]'" in line for line in lines)


# ---------------------------------------------------------------- the verifier


@pytest.mark.parametrize("dataset", ["leg_counting", "basic_arithmetic", "word_sorting"])
def test_the_gold_plus_any_extra_text_fails_though_the_library_pays_for_it(dataset):
    task = task_of(dataset)
    g = gold(task)
    answers = (f"{g} legs", f"The answer is {g}", f"{g} or 7", f"41, {g}, 43")
    assert all(library_score(task, a) > 0 for a in answers[:2])  # the library's default scorer pays
    for answer in answers:
        v = verdict(task, f"Answer: {answer}")
        assert not v.passed and v.score == 0.0 and v.reason == "gold_plus_extra", (answer, v)
    assert verdict(task, f"Answer: {g}").passed


def test_answers_the_library_pays_in_full_for_are_failed():
    # reasoning-gym 0.1.25 pays 1.0 for each of these: its scorers take the first number, skip
    # unknown words or moves, or accept any non-empty answer
    cases = {"gsm_symbolic": "{g} extra", "knights_knaves": "{g} Also, I am not sure.",
             "sokoban": "{g} extra", "game_of_life_halting": "nope"}
    for dataset, template in cases.items():
        for index in range(2):
            task = task_of(dataset, 1, index)
            answer = template.format(g=gold(task))
            assert library_score(task, answer) >= 1.0, dataset
            v = verdict(task, f"Answer: {answer}")
            assert not v.passed and v.reason in ("gold_plus_extra", "bad_shape"), (dataset, v.reason)
            assert verdict(task, task.reference).passed


def test_partial_credit_is_a_failure_with_the_raw_score_kept_for_diagnosis():
    task = task_of("word_sorting")
    words = gold(task).split(", ")
    answer = ", ".join(words[:-1] + [words[-1][:-1] or "x"])  # the last word cut short
    raw = library_score(task, answer)
    assert 0 < raw < 1
    v = verdict(task, f"Answer: {answer}")
    assert not v.passed and v.score == 0.0 and v.reason == "partial_credit"
    assert v.details["rg_score"] == pytest.approx(raw)


def test_the_final_answer_rule_is_rlvrs_strict_one():
    task = task_of("leg_counting")
    g = gold(task)
    assert not verdict(task, f"I think it is {g}.").passed  # no final answer
    assert not verdict(task, f"\\boxed{{{g}}} and \\boxed{{{g}}}0").passed  # two answers
    assert not verdict(task, f"The answer is {g}.\nAnswer: 3").passed  # the gold only in the reasoning
    assert verdict(task, f"\\boxed{{{g}}}").passed and verdict(task, f"work\nAnswer: {g}").passed
    assert verdict(task, "").reason == verdict(task, "no answer").reason


def test_equivalent_answers_the_scorer_checks_exactly_still_pass():
    kk = task_of("knights_knaves")
    statements = [s.strip().rstrip(".") for s in gold(kk).split(", and ")]
    assert verdict(kk, "Answer: " + ", and ".join(reversed(statements)) + ".").passed
    poly = task_of("polynomial_multiplication")
    terms = gold(poly).replace(" - ", " + -").split(" + ")
    reordered = " + ".join(reversed(terms))
    assert reordered != gold(poly) and verdict(poly, f"Answer: {reordered}").passed


def test_answers_a_scorer_would_run_are_refused_before_it_sees_them(tmp_path):
    marker = tmp_path / "ran"
    queens = task_of("n_queens")  # its scorer eval()s the answer
    payloads = [f"__import__('os').system('touch {marker}')", f"open('{marker}', 'w')",
                "[1] * 10**10", "(lambda: 0)()"]
    for answer in payloads:
        v = verdict(queens, f"Answer: {answer}")
        assert not v.passed and v.reason in ("unsafe_answer", "bad_shape"), (answer, v.reason)
    assert not marker.exists()
    letters = task_of("string_insertion")  # eval()s too; a bare name is only looked up
    assert verdict(letters, f"Answer: {gold(letters)}").passed
    assert not verdict(letters, "Answer: exit()").passed
    poly = task_of("polynomial_multiplication")  # its scorer sympy.parse_expr()s the answer
    start = time.perf_counter()
    for bomb in ("9**9**9", "(9**99)**999", "x if 1 else 2", "y.__class__"):
        assert not verdict(poly, f"Answer: {bomb}").passed, bomb
    assert time.perf_counter() - start < 5  # refused by shape, never evaluated


def test_too_long_answers_fail_before_scoring():
    task = task_of("leg_counting")
    v = verdict(task, "Answer: " + "9" * 5000)
    assert v.reason == "too_long" and not v.passed


def test_contains_gold_matches_whole_token_runs_only():
    assert contains_gold("42 legs", "42") and contains_gold("41, 42, 43", "42")
    assert not contains_gold("142", "42") and not contains_gold("42.0", "42") and not contains_gold("42", "42")
    assert contains_gold("The Answer Is  ABC", "abc")


def test_judge_fails_closed_when_the_scorer_raises():
    task = task_of("mini_sudoku")
    reason, _ = judge("mini_sudoku", task.spec.payload["config"], task.spec.payload["entry"], "not a grid {")
    assert reason in ("scorer_error", "mismatch")


# ---------------------------------------------------------------- through the command line


def test_train_and_eval_on_reasoning_gym_domains_from_the_command_line(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    fast = ["--set", "steps=1", "--set", "rollout.tasks_per_step=2", "--set", "rollout.samples_per_task=2",
            "--set", "rollout.max_new_tokens=4", "--set", "checkpoint_every=1"]
    assert main(["train", "--model", tiny_model_dir, "--domains", "rg.leg_counting,rg.basic_arithmetic",
                 "--out", str(run), *fast]) == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(k.startswith("rollout/pass_rate/rg.") for k in steps[0])
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", str(run / "final"), "--domains", "rg.basic_arithmetic", "--out", str(out),
                 "--set", "tasks=6", "--set", "max_new_tokens=4"]) == 0
    report = json.loads(out.read_text())
    assert set(report["by_domain"]) == {"rg.basic_arithmetic"} and report["overall"]["n_tasks"] == 6
    assert "rg.basic_arithmetic" in capsys.readouterr().out


# ---------------------------------------------------------------- every dataset (make test-slow)

NO_GOLD = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}  # reasoning-gym 0.1.25


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dataset", sorted(__import__("reasoning_gym.factory").factory.DATASETS))
def test_every_reasoning_gym_dataset_is_a_domain_or_says_why_not(dataset):
    if dataset == "composite" or dataset in NO_GOLD:
        with pytest.raises(UserError, match="not supported" if dataset == "composite" else "no gold answer"):
            DOMAINS.get(f"rg.{dataset}").generate("train", 1, 0, seed=0)
        return
    domain = DOMAINS.get(f"rg.{dataset}")
    # jugs level 4 (7 jugs, difficulty 20): the library's generator fails after minutes per try
    for level in domain.levels[:3] if dataset == "jugs" else domain.levels:
        task = domain.generate("train", level, 0, seed=0)
        assert verdict(task, task.reference).passed, (level, task.reference[:200])
        assert not verdict(task, "Answer: ").passed
