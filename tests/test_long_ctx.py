"""long_ctx.retrieval: documents grow with the level, the gold answer recomputed from the document
itself, the reference passing the ``math`` verifier, and the answers of look-alike records,
sums of wrong records and answers listing several numbers failing."""

from __future__ import annotations

import re
import statistics

import pytest

import rlvr.tasks  # noqa: F401  (registers the built-in domains)
from rlvr.model.tokenizer import train_tokenizer
from rlvr.tasks.base import DOMAINS, check_disjoint, generate_tasks, split_of
from rlvr.tasks.long_ctx import RECORDS, key_of, near_ids, token_lengths
from rlvr.types import Task
from rlvr.verifiers import VERIFIERS

NAME = "long_ctx.retrieval"
DOMAIN = DOMAINS.get(NAME)
VERIFIER = VERIFIERS.get("math")
RECORD = re.compile(r"([A-Z][a-z]+) (\d+)(?: holds|:| has) (\d+)(?: [a-z]+)?")
TARGET = re.compile(r"\b([a-z]+) (\d+)\b")


def _text(task: Task) -> str:
    (message,) = task.prompt
    assert message["role"] == "user"
    return message["content"]


def parse(task: Task) -> tuple[dict[tuple[str, int], int], list[tuple[str, int]], str]:
    """``(values, targets, question)`` read back from the prompt: every line but the last is a record."""
    *lines, question = _text(task).split("\n")
    values = {}
    for line in lines:
        m = RECORD.fullmatch(line)
        assert m, f"not a record: {line!r}"
        values[m.group(1), int(m.group(2))] = int(m.group(3))
    targets = [(kind.capitalize(), int(k)) for kind, k in TARGET.findall(question.removeprefix("How many "))]
    return values, targets, question


def gold(task: Task) -> int:
    """The answer computed from the document and the question's wording alone."""
    values, targets, question = parse(task)
    return combine([values[t] for t in targets], question)


def combine(v: list[int], question: str) -> int:
    """``a + b (+ c)``, or ``a (+ b) - c`` when the question asks how many more."""
    return sum(v) if "more" not in question else sum(v[:-1]) - v[-1]


def _tasks(split: str = "train", per_level: int = 12, seed: int = 0) -> list[Task]:
    return [DOMAIN.generate(split, level, i, seed) for level in DOMAIN.levels for i in range(per_level)]


def _passes(task: Task, completion: str) -> bool:
    return VERIFIER.check(task, completion).passed


# ---------------------------------------------------------------- generation


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_level_generates_documents_of_its_length(split):
    for task in _tasks(split):
        values, targets, _ = parse(task)
        assert len(values) == RECORDS[task.level], task.id
        assert len(set(values.values())) == len(values), f"{task.id}: values repeat"
        assert len(targets) in {1: (1,), 2: (1,), 3: (2,), 4: (2, 3)}[task.level], task.id
        assert all(t in values for t in targets), f"{task.id}: a target is not in the document"
        assert task.spec.kind == "math" and task.spec.payload == {"answer": str(gold(task)), "tolerance": 0.0}
        assert gold(task) >= 0 and split_of(NAME, task.key) == split


def test_lengths_grow_with_the_level():
    by_level = {level: [t for t in _tasks() if t.level == level] for level in DOMAIN.levels}
    chars = [statistics.mean(len(_text(t)) for t in by_level[level]) for level in DOMAIN.levels]
    assert chars == sorted(chars) and len(set(chars)) == len(chars)
    assert [RECORDS[level] for level in DOMAIN.levels] == [6, 12, 24, 40]


def test_token_lengths_grow_with_the_level_and_l4_fits_480_tokens():
    tokenizer = train_tokenizer(DOMAIN.corpus(0, 300), vocab_size=384)
    means, longest = [], 0
    for level in DOMAIN.levels:
        lengths = [p + r for p, r in token_lengths(tokenizer, level, n=40)]
        means.append(statistics.mean(lengths))
        longest = max(longest, *lengths)
    assert means == sorted(means) and means[-1] > 5 * means[0]
    assert longest <= 480, f"an L4 prompt + reference takes {longest} tokens"


def test_every_target_has_look_alikes_in_its_document():
    for task in _tasks(per_level=20):
        values, targets, _ = parse(task)
        for kind, k in targets:
            look_alikes = [r for r in values if r != (kind, k) and (r[1] == k or r[0] == kind and r[1] in near_ids(k))]
            assert look_alikes, f"{task.id}: no look-alike of {kind} {k}"


def test_generation_is_deterministic_seeded_and_pinned():
    assert [t.to_dict() for t in _tasks()] == [t.to_dict() for t in _tasks()]
    assert [t.key for t in _tasks(seed=0)] != [t.key for t in _tasks(seed=1)]
    task = DOMAIN.generate("eval", 3, 42, seed=7)
    assert task.id == f"{NAME}/v1/eval/3/000042" and task.level == 3
    # Pinned output: a generator change that alters tasks must bump the domain version.
    first = DOMAIN.generate("train", 1, 0, seed=0)
    assert _text(first).split("\n")[0] == "Shelf 50: 86" and first.reference == "Case 30: 54\nAnswer: 54"


def test_key_is_the_records_and_the_question_not_their_order():
    values = {("Box", 42): 31, ("Locker", 17): 48, ("Bin", 18): 62}
    reordered = dict(reversed(values.items()))
    assert key_of(values, [("Locker", 17), ("Box", 42)], "+") == key_of(reordered, [("Locker", 17), ("Box", 42)], "+")
    assert key_of(values, [("Locker", 17), ("Box", 42)], "+") == "bin18=62;box42=31;locker17=48|+:locker17,box42"
    assert key_of(values, [("Locker", 17), ("Box", 42)], "-") != key_of(values, [("Box", 42), ("Locker", 17)], "-")
    assert key_of({**values, ("Bin", 18): 63}, [("Locker", 17)], "=") != key_of(values, [("Locker", 17)], "=")


def test_train_and_eval_are_disjoint_and_train_reveals_only_train_facts():
    train, evals = generate_tasks(NAME, "train", 200, 0), generate_tasks(NAME, "eval", 50, 0)
    check_disjoint(train, evals)
    assert all(split_of(domain, key) == "train" for t in train for domain, key in t.reveals)
    assert any(t.reveals for t in train)  # two-digit sums are math.arith facts


# ---------------------------------------------------------------- verification


def test_the_reference_shows_the_facts_then_passes():
    for task in _tasks(per_level=20) + _tasks("eval", per_level=5):
        values, targets, _ = parse(task)
        facts = [f"{kind} {k}: {values[kind, k]}" for kind, k in targets]
        assert task.reference.split("\n")[: len(facts)] == facts
        assert task.reference.endswith(f"\nAnswer: {gold(task)}")
        assert _passes(task, task.reference), task.id
        assert _passes(task, f"Answer: {gold(task)}") and _passes(task, f"\\boxed{{{gold(task)}}}")


def test_the_answer_of_a_distractor_record_fails():
    checked = 0
    for task in _tasks(per_level=20):
        values, targets, _ = parse(task)
        for record, value in values.items():
            if record not in targets and value != gold(task):
                assert not _passes(task, f"{record[0]} {record[1]}: {value}\nAnswer: {value}"), (task.id, record)
                checked += 1
    assert checked > 1000


def test_the_sum_of_wrong_records_fails():
    checked = 0
    for task in [t for t in _tasks(per_level=30) if t.level >= 3]:
        values, targets, question = parse(task)
        for i, (kind, k) in enumerate(targets):
            look_alikes = [r for r in values if r not in targets and (r[1] == k or r[0] == kind)]
            for wrong in look_alikes[:3]:
                answer = combine([values[r] for r in targets[:i] + [wrong] + targets[i + 1:]], question)
                if answer != gold(task):
                    assert not _passes(task, f"Answer: {answer}"), (task.id, wrong)
                    checked += 1
    assert checked > 100


def test_an_answer_listing_several_numbers_fails():
    for task in [t for t in _tasks(per_level=10) if t.level >= 3]:
        values, targets, _ = parse(task)
        numbers = [str(values[t]) for t in targets]
        answer = str(gold(task))
        for listing in (", ".join(numbers), " ".join(numbers), " and ".join(numbers), " + ".join(numbers),
                        f"{' + '.join(numbers)} = {answer}", f"{answer}, {numbers[0]}", f"{numbers[0]} or {answer}"):
            assert not _passes(task, f"{task.reference.rsplit(chr(10), 1)[0]}\nAnswer: {listing}"), (task.id, listing)
        boxed = " ".join(f"\\boxed{{{n}}}" for n in [*numbers, answer])
        assert not _passes(task, boxed)
        assert not _passes(task, "\n".join(f"Answer: {n}" for n in [*numbers, answer]))


def test_the_facts_without_the_answer_fail():
    for task in _tasks(per_level=5):
        *working, _ = task.reference.split("\n")
        assert not _passes(task, "\n".join(working))
        assert not _passes(task, _text(task))  # the document echoed
