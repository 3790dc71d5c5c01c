"""math.arith and math.word: determinism, stable ids, split by construction, clean corpus,
independently recomputed answers, and gold references that pass the math verifier."""

from __future__ import annotations

import ast
import dataclasses
import operator
import random
import re

import pytest

from rlvr.tasks.math_arith import one_step_level

import rlvr.tasks  # noqa: F401  (registers the built-in domains)
import rlvr.verifiers  # noqa: F401
from rlvr.errors import UserError
from rlvr.tasks.base import (
    DOMAINS, Domain, Problem, check_disjoint, generate_tasks, seeded_rng, split_of, weighted_counts,
)
from rlvr.tasks.math_word import NAMES
from rlvr.types import Spec
from rlvr.verifiers import get_verifier

MATH = ["math.arith", "math.word"]


def _text(task) -> str:
    (message,) = task.prompt
    assert message["role"] == "user"
    return message["content"]


# ---------------------------------------------------------------- determinism and ids


def test_seeded_rng_hashes_its_parts():
    assert seeded_rng(0, "x", 1).random() == seeded_rng(0, "x", 1).random()
    assert seeded_rng(0, "x", 1).random() != seeded_rng(1, "x", 0).random()  # not seed + index


@pytest.mark.parametrize("name", MATH)
def test_generation_is_deterministic(name):
    d = DOMAINS.get(name)
    first = [d.generate("train", level, i, seed=0) for level in d.levels for i in range(10)]
    again = [d.generate("train", level, i, seed=0) for level in d.levels for i in range(10)]
    other = [d.generate("train", level, i, seed=1) for level in d.levels for i in range(10)]
    assert first == again
    assert [t.key for t in first] != [t.key for t in other]


@pytest.mark.parametrize(
    "name, prompt",
    [
        ("math.arith", "Compute: 82 + 2"),
        ("math.word", "Zoe has 82 dollars and spends 2. How many dollars are left?"),
    ],
)
def test_ids_are_stable_and_versioned(name, prompt):
    d = DOMAINS.get(name)
    task = d.generate("eval", 3, 42, seed=7)
    assert task.id == f"{name}/v1/eval/3/000042" and task.domain == name and task.level == 3
    # Pinned output: a generator change that alters tasks must bump the domain version.
    assert _text(d.generate("train", 1, 0, seed=0)) == prompt


@pytest.mark.parametrize("name", MATH)
def test_every_level_and_split_generates(name):
    d = DOMAINS.get(name)
    assert d.levels == (1, 2, 3, 4)
    for level in d.levels:
        for split in ("train", "eval"):
            for i in range(25):
                task = d.generate(split, level, i, seed=3)
                assert task.level == level and task.spec.kind == "math"
                assert re.fullmatch(r"-?\d+", task.spec.payload["answer"])
                assert task.spec.payload["tolerance"] == 0.0
                assert task.reference.endswith(f"Answer: {task.spec.payload['answer']}")
                assert len(_text(task)) <= (40 if name == "math.arith" else 120)  # ~chars/2 tokens
                assert split_of(name, task.key) == split


@pytest.mark.parametrize("name", MATH)
def test_bad_split_or_level_is_a_user_error(name):
    with pytest.raises(UserError, match="split"):
        DOMAINS.get(name).generate("test", 1, 0, seed=0)
    with pytest.raises(UserError, match="level"):
        DOMAINS.get(name).generate("train", 9, 0, seed=0)


# ---------------------------------------------------------------- splits


def test_split_of_is_about_a_fifth_eval():
    keys = [f"{a}+{b}" for a in range(60) for b in range(60)]
    share = sum(split_of("math.arith", k) == "eval" for k in keys) / len(keys)
    assert 0.17 < share < 0.23


@pytest.fixture(scope="module")
def train_and_eval():
    return generate_tasks(MATH, "train", 2000, seed=0), generate_tasks(MATH, "eval", 500, seed=0)


def test_generated_train_and_eval_are_disjoint(train_and_eval):
    train, eval_ = train_and_eval
    assert len(train) == 2000 and len(eval_) == 500
    for tasks, split in ((train, "train"), (eval_, "eval")):
        keys = [(t.domain, t.key) for t in tasks]
        assert len(set(keys)) == len(keys)
        assert all(split_of(d, k) == split for d, k in keys)
        assert len({t.id for t in tasks}) == len(tasks)
        per_slot = {(t.domain, t.level) for t in tasks}
        assert len(per_slot) == 8  # round-robin reaches every domain and level
    check_disjoint(train, eval_)


def test_train_references_reveal_no_eval_fact(train_and_eval):
        # Each step "x op y = z" of a train reference that is itself an arith problem of some
        # level ("34 + 5"; not "3 * 8", which no level asks) must be a train problem.
        train, _ = train_and_eval
        checked = 0
        for t in train:
            for x, op, y in re.findall(r"^(\d+) ([-+*/]) (\d+) = -?\d+$", t.reference, re.M):
                if one_step_level(int(x), op, int(y)) is not None:
                    checked += 1
                    assert split_of("math.arith", f"{x}{op}{y}") == "train", t.id
        assert checked > 100


def test_check_disjoint_names_an_overlapping_key():
    train = generate_tasks("math.arith", "train", 5, seed=0)
    leaked = dataclasses.replace(train[2], id="math.arith/v1/eval/1/000000")
    with pytest.raises(ValueError, match=re.escape(train[2].key)):
        check_disjoint(train, [leaked])


class _TinyDomain(Domain):
    """Level 1 has only three problems; level 2 has plenty."""

    name = "test.tiny"
    levels = (1, 2)

    def sample(self, level, rng):
        key = str(rng.randrange(3) if level == 1 else 100 + rng.randrange(10**6))
        return Problem(key=key, prompt=key, spec=Spec("math", {"answer": key}), reference=f"Answer: {key}")

    def in_split(self, problem, split):
        return True  # the split rule is tested above; here only de-duplication matters


@pytest.fixture
def tiny_domain():
    with DOMAINS.temporary("test.tiny", _TinyDomain()) as domain:
        yield domain


def test_generate_tasks_fills_an_exhausted_level_from_the_others(tiny_domain):
    tasks = generate_tasks("test.tiny", "train", 20, seed=0)
    assert sorted(int(t.key) for t in tasks if t.level == 1) == [0, 1, 2]
    assert len({t.key for t in tasks}) == 20
    assert generate_tasks("test.tiny", "train", 20, seed=0) == tasks
    with pytest.raises(UserError, match="only 3 unique"):
        generate_tasks("test.tiny", "train", 4, seed=0, levels=[1])


def test_generate_tasks_levels_filter():
    tasks = generate_tasks(MATH, "eval", 12, seed=0, levels=[2, 4])
    assert {t.level for t in tasks} == {2, 4} and {t.domain for t in tasks} == set(MATH)
    with pytest.raises(UserError):
        generate_tasks(MATH, "eval", 4, seed=0, levels=[7])


def test_generate_tasks_weights_split_the_pool_between_domains():
    tasks = generate_tasks(MATH, "train", 40, seed=0, weights={"math.arith": 3})
    arith = [t for t in tasks if t.domain == "math.arith"]
    assert len(arith) == 30 and len(tasks) == 40
    # each domain's share is what it gives alone: the weights never change which tasks exist
    assert arith == generate_tasks("math.arith", "train", 30, seed=0)
    assert [t for t in tasks if t.domain == "math.word"] == generate_tasks("math.word", "train", 10, seed=0)
    assert not [t for t in generate_tasks(MATH, "train", 8, seed=0, weights={"math.word": 0})
                if t.domain == "math.word"]


def test_weighted_counts_sum_to_n_by_largest_remainder():
    assert weighted_counts(10, [1, 1, 1]) == [4, 3, 3]
    assert weighted_counts(6400, [3, 1]) == [4800, 1600]
    assert weighted_counts(7, [0, 2, 5]) == [0, 2, 5]
    assert weighted_counts(5, [1, 2]) == [2, 3]
    for bad in ([0, 0], [2, -1], []):  # a clear error, not a ZeroDivisionError or a silent wrong split
        with pytest.raises(ValueError, match="positive sum"):
            weighted_counts(4, bad)


# ---------------------------------------------------------------- corpus


_NAMES = re.compile(r"\b(" + "|".join(NAMES) + r")\b")


def _leaks(docs: list[str], eval_tasks) -> list[str]:
    """Eval problems visible in ``docs``: an arith equation or prompt line, or a word-problem
    narrative with the names masked (a name is decoration, not part of the problem)."""
    text = _NAMES.sub("N", "\n".join(docs))
    lines = set(text.split("\n"))
    found = []
    for t in eval_tasks:
        prompt, gold = _NAMES.sub("N", _text(t)), t.spec.payload["answer"]
        leaked = prompt in lines
        if t.domain == "math.arith":
            equation = f"{prompt.removeprefix('Compute: ')} = {gold}"
            bounded = r"(?<![\d.])" + re.escape(equation) + r"(?!\d)"
            leaked = leaked or (equation in text and re.search(bounded, text) is not None)
        if leaked:
            found.append(t.key)
    return found


@pytest.mark.parametrize("name", MATH)
def test_corpus_holds_only_train_problems(name):
    d = DOMAINS.get(name)
    eval_tasks = generate_tasks(MATH, "eval", 400, seed=0)  # both domains: word steps are arith facts
    docs = d.corpus(seed=0, n_docs=150)
    assert len(docs) == 150 and d.corpus(seed=0, n_docs=150) == docs
    assert all(doc.strip() and "user" not in doc for doc in docs)
    assert _leaks(docs, eval_tasks) == []
    # Negative control: the same check does catch a corpus drawn from the eval split.
    assert len(_leaks(d._documents(0, 150, "eval"), eval_tasks)) > 10


# ---------------------------------------------------------------- answers and references

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node):
    if isinstance(node, ast.Constant):
        return node.value
    return _BINOPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))


_WORD_FORMULAS = {
    "buy": lambda a, b: a + b,
    "join": lambda a, b: a + b,
    "eat": lambda a, b: a - b,
    "spend": lambda a, b: a - b,
    "buy_eat": lambda a, b, c: a + b - c,
    "spend2": lambda a, b, c: a - b - c,
    "bus": lambda a, b, c: a - b + c,
    "boxes": lambda a, b, c: a * b - c,
    "bags": lambda a, b, c: a * b + c,
    "share": lambda a, b, c: (a + b) / c,
    "split": lambda a, b, c: a / b + c,
}


@pytest.mark.parametrize("name", MATH)
def test_gold_answer_recomputed_independently(name):
    d = DOMAINS.get(name)
    for level in d.levels:
        for i in range(40):
            task = d.generate(random.Random(i).choice(["train", "eval"]), level, i, seed=5)
            gold = int(task.spec.payload["answer"])
            if name == "math.arith":
                expr = _text(task).removeprefix("Compute: ")
                assert _evaluate(ast.parse(expr, mode="eval").body) == gold
            else:
                template, *numbers = task.key.split(":")
                numbers = [int(x) for x in numbers]
                assert [int(x) for x in re.findall(r"\d+", _text(task))] == numbers
                assert _WORD_FORMULAS[template](*numbers) == gold
            assert gold >= 0


@pytest.mark.parametrize("name", MATH)
def test_reference_passes_the_verifier_and_wrong_answers_fail(name):
    d = DOMAINS.get(name)
    for level in d.levels:
        for i in range(15):
            task = d.generate("eval", level, i, seed=11)
            verifier = get_verifier(task)
            reference, gold = task.reference, int(task.spec.payload["answer"])
            assert verifier.check(task, reference).passed, task.id
            steps = reference.rsplit("\n", 1)[0] if "\n" in reference else ""
            wrong = (steps + "\n" if steps else "") + f"Answer: {gold + 1}"
            assert verifier.check(task, wrong).reason == "mismatch"
            assert verifier.check(task, "").reason == "no_answer"
            assert not verifier.check(task, str(gold)).passed  # bare number: no final-answer line
            if name == "math.arith":  # echoing the question is not an answer
                echo = f"Answer: {_text(task).removeprefix('Compute: ')}"
                assert verifier.check(task, echo).reason == "mismatch"
