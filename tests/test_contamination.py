"""Contamination: a training task that is an eval task, by id, canonical key or normalised prompt,
is found (``contamination``), stops training (``refuse_eval_tasks``, also through ``rlvr train``)
and is reported by ``rlvr eval contamination``; distinct problems are never confused."""

from __future__ import annotations

import csv
import dataclasses

import pytest

import rlvr.tasks  # noqa: F401  (registers the built-in domains)
from rlvr.cli import main
from rlvr.errors import UserError
from rlvr.tasks.base import DOMAINS, generate_tasks
from rlvr.tasks.validate import (
    contamination,
    contamination_text,
    normalise_text,
    refuse_eval_tasks,
)
from rlvr.types import Spec, Task


def task(i: int, text: str, *, domain: str = "file.math", key: str = "", kind: str = "math", **extra) -> Task:
    return Task(id=f"t{i}", domain=domain, level=1, prompt=({"role": "user", "content": text},),
                spec=Spec(kind, {"answer": "1"}), key=key or text, **extra)


@pytest.mark.parametrize("a, b", [
    ("Compute: 3 + 4", "compute 3 + 4."),
    ("What is the total qty of the 'food' items?", "what is   the total qty of the \u2018food\u2019 items"),
    ("Tom has 5 apples.\nHow many?", "TOM HAS 5 APPLES how many"),
])
def test_one_prompt_however_it_is_punctuated_cased_or_spaced(a, b):
    assert normalise_text(a) == normalise_text(b)


@pytest.mark.parametrize("a, b", [
    ("Compute: 3 + 4", "Compute: 3 - 4"),
    ("Compute: 3.5 + 1", "Compute: 35 + 1"),
    ("Compute: 12 + 4", "Compute: 1 2 + 4"),
    ("return os.path", "return os path"),
])
def test_different_problems_stay_different(a, b):
    assert normalise_text(a) != normalise_text(b)


def test_the_same_prompt_under_another_key_is_found():
    eval_ = [task(1, "What is 9 - 4?", key="k1"), task(2, "What is 8 - 4?", key="k2")]
    train = [task(3, "what is 9 - 4", key="other"), task(4, "What is 7 - 4?", key="k4")]
    found = contamination(train, eval_)
    assert [(c.train.id, c.eval.id, c.how) for c in found] == [("t3", "t1", "prompt")]
    with pytest.raises(UserError) as e:
        refuse_eval_tasks(train, eval_, allowed=False, key="allow_eval_tasks")
    message = str(e.value)
    assert message.startswith("1 training task(s) are also eval tasks (first: t3")
    assert "same prompt as eval task t1 of file.math: 'what is 9 - 4'" in message
    assert "eval tasks hit per domain: file.math 1" in message and "allow_eval_tasks=true" in message
    refuse_eval_tasks(train, eval_, allowed=True, key="allow_eval_tasks")


def test_the_same_key_under_another_prompt_is_found():
    eval_ = [task(1, "Compute: 20 + 4", domain="math.arith", key="20+4")]
    train = [task(2, "Add twenty and four.", domain="math.arith", key="20+4")]
    assert [c.how for c in contamination(train, eval_)] == ["key"]
    # a train task whose reference states the result of the eval problem counts too
    revealing = task(3, "Sam has 20 pens and gets 4 more.", domain="math.word", reveals=(("math.arith", "20+4"),))
    assert [c.how for c in contamination([revealing], eval_)] == ["key"]
    with pytest.raises(UserError, match="same key as eval task t1 of math.arith"):
        refuse_eval_tasks([revealing], eval_, allowed=False, key="allow_eval_tasks")


def test_a_file_task_with_its_verifiers_instruction_matches_the_builtin_prompt():
    builtin = generate_tasks("math.arith", "eval", 3, seed=0)
    from rlvr.verifiers import VERIFIERS

    instruction = VERIFIERS.get("number").instruction({})
    text = builtin[1].prompt[0]["content"].upper() + "\n\n" + instruction
    mine = Task(id="row-7", domain="file.number", level=1, prompt=({"role": "system", "content": "Be brief."},
                                                                   {"role": "user", "content": text}),
                spec=Spec("number", {"answer": "1"}), key=text)
    assert contamination_text(mine) == contamination_text(builtin[1])
    assert [(c.eval.id, c.how) for c in contamination([mine], builtin)] == [(builtin[1].id, "prompt")]


def test_multi_turn_tasks_are_matched_by_key_not_by_their_shared_prompt():
    goal = "test_ops.py fails. Files: ops.py, test_ops.py. Fix the bug, then submit."
    a = task(1, goal, domain="code.repair", key="repo-a", env="code.repair")
    b = task(2, goal, domain="code.repair", key="repo-b", env="code.repair")
    assert contamination([a], [b]) == []
    assert [c.how for c in contamination([a], [dataclasses.replace(b, key="repo-a")])] == ["key"]


def test_builtin_train_and_eval_splits_are_clean():
    """No false alarm on the built-in domains (reasoning-gym's too, where installed): their train
    split is never an eval task, by key or by normalised prompt."""
    names = list(DOMAINS.names())

    def size(name: str, split: str, n: int) -> int:  # a fixed set (repo.fix): all of it
        domain = DOMAINS.get(name)
        return min(n, domain.count(split)) if hasattr(domain, "count") else n

    train = [t for n in names for t in generate_tasks(n, "train", size(n, "train", 400), seed=0)]
    eval_ = [t for n in names for t in generate_tasks(n, "eval", size(n, "eval", 100), seed=1234)]
    assert contamination(train, eval_) == []
    refuse_eval_tasks(train, eval_, allowed=False, key="allow_eval_tasks")


def write_csv(path, questions):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["question", "answer"])
        w.writerows([q, "1"] for q in questions)
    return str(path)


def test_rlvr_eval_contamination(tmp_path, capsys):
    builtin = generate_tasks(["math.arith", "math.word"], "eval", 500, seed=1234, levels=[1, 2, 3, 4])
    leaked = builtin[3].prompt[0]["content"].rstrip("?") + "  ?"
    dirty = write_csv(tmp_path / "dirty.csv", ["How many legs do 3 spiders have?", leaked])
    flags = ["--map", "prompt=question", "--verifier", "number"]
    with pytest.raises(SystemExit) as exit_:  # against the default suite
        main(["eval", "contamination", "--train", dirty, *flags])
    assert exit_.value.code == 1
    out = capsys.readouterr().out
    assert "1 of 2 training tasks are eval tasks; per eval domain: " + builtin[3].domain in out
    assert f"same prompt as {builtin[3].id}" in out

    clean = write_csv(tmp_path / "clean.csv", ["How many legs do 3 spiders have?"])
    assert main(["eval", "contamination", "--train", clean, *flags, "--suite", "math"]) == 0
    assert "clean: none of 1 training tasks is among the 1000 eval tasks" in capsys.readouterr().out
    held_out = write_csv(tmp_path / "eval.csv", ["HOW MANY LEGS DO 3 SPIDERS HAVE"])
    with pytest.raises(SystemExit):
        main(["eval", "contamination", "--train", clean, "--eval", held_out, *flags])
    assert "per eval domain: file.number 1" in capsys.readouterr().out
    assert main(["eval", "contamination", *flags]) == 2
    assert "needs --train FILE" in capsys.readouterr().err


def test_training_refuses_an_eval_prompt_written_differently(tiny_model_dir, tmp_path, capsys):
    train = write_csv(tmp_path / "train.csv", ["Tom has 3 apples. How many now?", "What is 7 + 1?"])
    held_out = write_csv(tmp_path / "eval.csv", ["tom has 3 apples, how many now", "What is 9 + 1?"])
    args = ["train", "--model", tiny_model_dir, "--tasks", train, "--eval-tasks", held_out, "--map",
            "prompt=question", "--verifier", "number", "--out", str(tmp_path / "run"), "--set", "steps=1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "1 training task(s) are also eval tasks" in err and "file.number" in err
    assert "'tom has 3 apples how many now'" in err and "allow_eval_tasks=true" in err
