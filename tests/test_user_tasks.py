"""The user's task sets: every format, the column mapping, located errors, `rlvr tasks validate`
(the ten defects), stats/export/from-failures, and refusing eval items as training tasks."""

from __future__ import annotations

import csv
import json

import pytest

from rlvr.cli import main
from rlvr.errors import ConfigError, UserError
from rlvr.tasks.files import load_tasks
from rlvr.tasks.rows import TaskFileConfig, parse_map
from rlvr.tasks.validate import export, from_failures, refuse_eval_tasks, stats, validate
from rlvr.types import Spec, Task

ROWS = [{"question": "What is 2 + 3?", "solution": "5", "level": 1, "tags": "easy,add", "split": "train"},
        {"question": "What is 7 * 6?", "solution": "42", "level": 2, "tags": "mult", "split": "train"},
        {"question": "What is 9 - 4?", "solution": "5", "level": 1, "tags": "easy", "split": "eval"}]
MAP = {"prompt": "question", "answer": "solution"}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path, rows):
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_saved_dataset(path, rows):
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def write_data_dir(path, rows):  # a dataset repository's layout of local data files
    (path / "data").mkdir(parents=True)
    write_parquet(path / "data" / "train-00000-of-00001.parquet", rows)
    return path


WRITERS = {"t.jsonl": write_jsonl, "t.csv": write_csv, "t.parquet": write_parquet, "saved": write_saved_dataset,
           "repo": write_data_dir}


@pytest.mark.parametrize("name", list(WRITERS))
def test_every_format_reads_the_same_tasks(tmp_path, name):
    path = WRITERS[name](tmp_path / name, ROWS)
    tasks, dropped = load_tasks(TaskFileConfig(path=str(path), map=MAP, verifier="math"), check_solutions=False)
    assert dropped == [] and len(tasks) == 3
    t = tasks[1]
    assert t.prompt[-1]["role"] == "user" and t.prompt[-1]["content"].startswith("What is 7 * 6?")
    assert t.spec.kind == "math" and t.spec.payload["answer"] == "42"
    assert t.level == 2 and t.meta["tags"] == ["mult"] and t.meta["split"] == "train"
    assert t.domain == "file.math" and t.key == " ".join(t.prompt[-1]["content"].casefold().split())
    assert [x.id for x in tasks] == [f"{path.stem}:1", f"{path.stem}:2", f"{path.stem}:3"]


def test_split_system_prompt_instruction_and_ids(tmp_path):
    rows = [{**r, "id": f"q{i}"} for i, r in enumerate(ROWS)]
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    cfg = TaskFileConfig(path=str(path), map=MAP, split="eval", system_prompt="Be brief.", instruction="End with Answer: N.",
                         domain="arith", level=3)
    (task,), _ = load_tasks(cfg, check_solutions=False)
    assert task.id == "q2" and task.domain == "arith" and task.level == 1  # the row's level wins over the file's
    assert task.prompt == ({"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "What is 9 - 4?\n\nEnd with Answer: N."})
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "system", "content": "S"},
                                                               {"role": "user", "content": "2+2?"}], "answer": 4}])
    (task,), _ = load_tasks(TaskFileConfig(path=str(chat), map={"prompt": "messages"}, instruction="",
                                           system_prompt="ignored: the prompt has one"), check_solutions=False)
    assert task.prompt == ({"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"})
    assert task.spec.payload["answer"] == "4"  # a JSON number becomes the gold string


def test_map_parsing_and_config_errors():
    assert parse_map("prompt=question, answer=solution") == MAP
    with pytest.raises(ConfigError, match="must look like field=column"):
        parse_map("prompt")
    with pytest.raises(ConfigError, match="'map.question' is not a task field"):
        TaskFileConfig(path="x.csv", map={"question": "prompt"})
    with pytest.raises(ConfigError, match="task_files.format"):
        TaskFileConfig(path="x", format="xlsx")


@pytest.mark.parametrize("make, needle", [
    (lambda p: write_csv(p / "t.csv", [{"q": "2+2?", "solution": "4"}]), r"t.csv:2: field 'question' \(mapped to 'prompt'\) is missing"),
    (lambda p: (p / "t.parquet").write_bytes(b"PAR1 not really") and p / "t.parquet", "t.parquet: not a readable Parquet file"),
    (lambda p: (p / "t.csv").write_bytes(b"question,solution\n2+2?,4\n3+3?,\xff6\n") and p / "t.csv", "t.csv:3: not UTF-8"),
    (lambda p: p / "missing.jsonl", "missing.jsonl: no such file or directory"),
    (lambda p: (p / "t.xlsx").write_text("x") and p / "t.xlsx", "cannot tell the format"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "empty: not a readable Hugging Face datasets directory"),
])
def test_bad_input_is_one_located_error(tmp_path, make, needle):
    path = make(tmp_path)
    with pytest.raises(UserError, match=needle):
        load_tasks(TaskFileConfig(path=str(path), map=MAP), check_solutions=False)


def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys):
    path = write_csv(tmp_path / "t.csv", [{"q": "2+2?", "solution": "4"}])
    assert main(["tasks", "stats", str(path), "--map", "prompt=question,answer=solution"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "t.csv:2: field 'question' (mapped to 'prompt') is missing" in err


# ---------------------------------------------------------------- validate: the ten defects

CLEAN = [{"id": "a1", "question": "What is 2 + 3?", "answer": "5"},
         {"id": "a2", "question": "What is 7 * 6?", "answer": "42"}]
DEFECTS = {  # defect -> (row or raw line, expected field/message)
    "types": ({"id": "b1", "question": 5, "answer": "1"}, r"field 'question' \(mapped to 'prompt'\) is not text"),
    "schema": ({"id": "b2", "question": "What is 1 + 1?"}, "math spec: .*answer"),
    "gold fails its verifier": ({"id": "b3", "question": "What is 3 + 3?", "answer": "6\n7"},  # no one-line answer
                                "gold answer fails its own verifier"),
    "duplicate id": ({"id": "a1", "question": "What is 4 + 4?", "answer": "8"}, "field 'id' repeats task 'a1' \\(line 1\\)"),
    "duplicate prompt": ({"id": "b5", "question": "what  is 2 + 3?", "answer": "5"}, "repeats the prompt of .*:1"),
    "eval overlap": ({"id": "b6", "question": "What is 9 - 4?", "answer": "5"}, "is also in the eval set"),
    "unknown verifier": ({"id": "b7", "question": "What is 5 + 5?", "answer": "10", "verifier": "nope"},
                         "field 'verifier' names no verifier 'nope'"),
    "empty prompt": ({"id": "b8", "question": "   ", "answer": "1"}, r"field 'question' \(mapped to 'prompt'\) is empty"),
    "not UTF-8": (b'{"id": "b9", "question": "\xff", "answer": "1"}', "not UTF-8"),
}


def _write_lines(path, rows):
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_validate_reports_each_defect_with_its_line(tmp_path, defect, capsys):
    row, needle = DEFECTS[defect]
    path = _write_lines(tmp_path / "train.jsonl", [*CLEAN, row])
    eval_path = write_jsonl(tmp_path / "eval.jsonl", [{"id": "e1", "question": "What is 9 - 4?", "answer": "5"}])
    args = ["tasks", "validate", str(path), "--map", "prompt=question", "--eval", str(eval_path)]
    assert main(args) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    assert out[0].startswith(f"{path}:3: ")
    import re

    assert re.search(needle, out[0]), out[0]


def test_validate_reports_all_defects_at_once_and_an_unreadable_file(tmp_path, capsys):
    rows = [*CLEAN, *(r for r, _ in DEFECTS.values())]
    path = _write_lines(tmp_path / "train.jsonl", rows)
    eval_path = write_jsonl(tmp_path / "eval.jsonl", [{"id": "e1", "question": "What is 9 - 4?", "answer": "5"}])
    problems = validate(TaskFileConfig(path=str(path), map={"prompt": "question"}), [TaskFileConfig(
        path=str(eval_path), map={"prompt": "question"})])
    assert [p.where for p in problems] == [f"{path}:{i}" for i in range(3, 3 + len(DEFECTS))]
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"\x00" * 64)
    (problem,) = validate(str(bad))
    assert problem.where == str(bad) and "not a readable Parquet file" in problem.message


def test_a_clean_file_validates(tmp_path, capsys):
    path = write_csv(tmp_path / "clean.csv", [{"question": r["question"], "answer": r["answer"]} for r in CLEAN])
    assert main(["tasks", "validate", str(path), "--map", "prompt=question"]) == 0
    assert "no problems" in capsys.readouterr().out


# ---------------------------------------------------------------- stats, export, flywheel


def test_stats_and_export_round_trip(tmp_path, capsys):
    path = write_csv(tmp_path / "t.csv", ROWS)
    tasks, _ = load_tasks(TaskFileConfig(path=str(path), map=MAP), check_solutions=False)
    s = stats(tasks)
    assert s["tasks"] == 3 and s["by_level"] == {"1": 2, "2": 1} and s["by_verifier"] == {"math": 3}
    assert s["by_tag"] == {"add": 1, "easy": 2, "mult": 1} and s["answer_chars"]["max"] == 2
    out = export(tasks, tmp_path / "out.jsonl")
    assert load_tasks(str(out), check_solutions=False)[0] == tasks
    assert main(["tasks", "export", str(path), "--map", "prompt=question,answer=solution", "--out",
                 str(tmp_path / "cli.jsonl")]) == 0
    assert load_tasks(str(tmp_path / "cli.jsonl"), check_solutions=False)[0] == tasks


def _task(i: int, **meta) -> Task:
    return Task(id=f"t{i}", domain="file.math", level=1, prompt=({"role": "user", "content": f"What is {i} + 1?"},),
                spec=Spec("math", {"answer": str(i + 1)}), meta=meta)


def test_from_failures_writes_failed_items_that_training_refuses(tmp_path):
    report = {"tasks": [{"id": f"t{i}", "correct": c, "samples": 2, "task": _task(i).to_dict()}
                        for i, c in enumerate([2, 0, 1])]}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(report))
    failed = from_failures(path)
    assert [t.id for t in failed] == ["t1", "t2"] and failed[0].meta["from_eval"] == str(path)
    assert [t.id for t in from_failures(path, below=0.5)] == ["t1"]
    out = export(failed, tmp_path / "next.jsonl")
    again, _ = load_tasks(str(out), check_solutions=False)
    with pytest.raises(UserError, match="came from an eval result.*allow_eval_tasks=true"):
        refuse_eval_tasks(again, [], allowed=False, key="allow_eval_tasks")
    refuse_eval_tasks(again, [], allowed=True, key="allow_eval_tasks")


def test_training_tasks_that_are_eval_tasks_are_refused():
    train, eval_ = [_task(1), _task(2)], [_task(2)]
    with pytest.raises(UserError, match="1 training task\\(s\\) are also eval tasks \\(first: t2"):
        refuse_eval_tasks(train, eval_, allowed=False, key="allow_eval_tasks")
    renamed = Task(**{**_task(2).__dict__, "id": "other"})  # same prompt, another id
    with pytest.raises(UserError, match="also eval tasks"):
        refuse_eval_tasks([renamed], eval_, allowed=False, key="allow_eval_tasks")
    refuse_eval_tasks([_task(1)], eval_, allowed=False, key="allow_eval_tasks")
