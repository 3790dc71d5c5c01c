"""Task files: both JSONL schemas, precise errors, and tasks whose own solution fails are dropped."""

from __future__ import annotations

import json

import pytest

from rlvr.errors import UserError
from rlvr.sandbox import choose, plaindata
from rlvr.tasks.files import INSTRUCTION, load_task_file
from rlvr.types import Spec, Task
from rlvr.verifiers import get_verifier

needs_sandbox = pytest.mark.skipif(not choose("auto").strict, reason="no strict sandbox backend here")

HE = [
    {"task_id": "HE/0", "entry_point": "total",
     "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
     "canonical_solution": "    return sum(xs)\n",
     "test": "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 2]) == 3\n"
             "    assert candidate([]) == 0\n"},
    {"task_id": "HE/cyclic", "entry_point": "decode",  # the test calls a helper of the prompt
     "prompt": 'def encode(s: str) -> str:\n    return s[1:] + s[:1]\n\n\n'
               'def decode(s: str) -> str:\n    """Inverse of encode."""\n',
     "canonical_solution": "    return s[-1:] + s[:-1]\n",
     "test": "def check(candidate):\n    for s in ('abc', 'x', ''):\n"
             "        assert candidate(encode(s)) == s\n"},
    {"task_id": "HE/1", "entry_point": "shout", "level": 2, "domain": "code.strings",
     "prompt": 'def _upper(s):\n    return s.upper()\n\n\ndef shout(s: str) -> str:\n'
               '    """Upper-case s and add "!"."""\n',
     "canonical_solution": "    return _upper(s) + '!'\n",
     "test": "def check(candidate):\n    assert candidate('hi') == 'HI!'\n"},
]
BROKEN = {"task_id": "HE/2", "entry_point": "half", "prompt": "def half(n):\n",
          "canonical_solution": "    return n / 2\n",  # 3 / 2 == 1.5, the test wants 1
          "test": "def check(candidate):\n    assert candidate(4) == 2\n    assert candidate(3) == 1\n"}


def io_task(i: int, reference: str | None = None) -> Task:
    inputs = [(1,), (5,), (-2,)]
    return Task(id=f"code.gen/v1/train/1/{i:06d}", domain="code.gen", level=1,
                prompt=({"role": "system", "content": "Be brief."},
                        {"role": "user", "content": f"Write add_k(x) returning x plus {i}."}),
                spec=Spec("code", {"entry_point": "add_k", "inputs": plaindata.encode(inputs),
                                   "expected": plaindata.encode([x + i for (x,) in inputs]),
                                   "timeout": 5.0}),
                key=f"add{i}", reference=reference)


MATH = Task(id="math.arith/v1/train/1/000003", domain="math.arith", level=1,
            prompt=({"role": "user", "content": "Compute 2 + 3."},),
            spec=Spec("math", {"answer": "5", "tolerance": 0.0}), key="2+3", reference="Answer: 5")


def write(tmp_path, rows, name="tasks.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_humaneval_schema_maps_to_code_tasks(tmp_path):
    path = write(tmp_path, HE + [""])  # a blank line is skipped
    tasks, dropped = load_task_file(path, check_solutions=False)
    assert dropped == [] and [t.id for t in tasks] == ["file:tasks/HE/0", "file:tasks/HE/cyclic",
                                                       "file:tasks/HE/1"]
    t0, t1 = tasks[0], tasks[2]
    assert (t0.domain, t0.level, t1.domain, t1.level) == ("code.file", 1, "code.strings", 2)
    assert t0.prompt == ({"role": "user", "content": INSTRUCTION.format(prompt=HE[0]["prompt"])},)
    assert t0.prompt[0]["content"].endswith('"""Sum of xs."""\n```')
    assert t0.spec == Spec("code", {"entry_point": "total", "test": HE[0]["test"],
                                    "prompt_code": HE[0]["prompt"]})
    assert (t0.key, t0.meta) == ("HE/0", {"source": path})
    assert t0.reference == "```python\n" + HE[0]["prompt"] + HE[0]["canonical_solution"] + "```"


def test_rlvr_schema_round_trips(tmp_path):
    tasks = [io_task(3, "```python\ndef add_k(x):\n    return x + 3\n```"), MATH, io_task(4)]
    path = write(tmp_path, [t.to_dict() for t in tasks])
    loaded, dropped = load_task_file(path, check_solutions=False)
    assert loaded == tasks and dropped == []
    again = write(tmp_path, [t.to_dict() for t in loaded], "again.jsonl")
    assert load_task_file(again, check_solutions=False)[0] == tasks


def test_episode_tasks_of_every_environment_round_trip(tmp_path):
    import rlvr.tasks  # noqa: F401  (registration)
    from rlvr.tasks.base import DOMAINS

    tasks = [DOMAINS.get(d).generate("train", 1, i, 0) for d in ("data.analysis", "tool.use", "code.repair")
             for i in range(2)]
    path = write(tmp_path, [t.to_dict() for t in tasks])
    loaded, dropped = load_task_file(path, check_solutions=True)
    assert loaded == tasks and dropped == []


@pytest.mark.parametrize("line, message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ({"task_id": "x", "prompt": "def f():\n", "canonical_solution": "    pass\n", "test": "def check(c):\n    pass\n"},
     "field 'entry_point' is missing"),
    ({**HE[0], "test": ["assert 1"]}, "field 'test' is not a string"),
    ({**HE[0], "entry_point": "not a name"}, "field 'entry_point' is not a Python name"),
    ({**HE[0], "level": "2"}, "field 'level' is not a positive integer"),
    ({**HE[0], "level": 0}, "field 'level' is not a positive integer"),
    # without a spec the row reads as a question row, whose math spec then lacks a gold answer
    ({k: v for k, v in MATH.to_dict().items() if k != "spec"}, "math spec: .*answer"),
    ({**MATH.to_dict(), "level": 1.5}, "field 'level' is not a positive integer"),
    ({**MATH.to_dict(), "prompt": "Compute 2 + 3."}, "field 'prompt' is not a non-empty list"),
    ({**MATH.to_dict(), "spec": {"kind": "nope", "payload": {}}}, "field 'spec.kind' names no verifier 'nope'"),
    ({"question": "2+2?"}, "field 'prompt' is missing; name the prompt column with --map prompt=COLUMN"),
    ({**MATH.to_dict(), "env": "nope"}, "field 'env' names no environment 'nope'; choose one of: code.repair, data.analysis, repo.fix, tool.use"),
    ({**MATH.to_dict(), "env": "tool.use"}, "field 'spec.kind' is 'math'; a task of environment 'tool.use' has spec kind"),
    (HE[0], "field 'id' repeats task 'file:tasks/HE/0' \\(line 1\\)"),
])
def test_malformed_lines_name_file_line_and_field(tmp_path, line, message):
    path = write(tmp_path, [HE[0], MATH.to_dict(), line])
    with pytest.raises(UserError, match=f"tasks.jsonl:3: {message}"):
        load_task_file(path, check_solutions=False)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="nope.jsonl: no such file or directory"):
        load_task_file(tmp_path / "nope.jsonl")


@needs_sandbox
def test_broken_solutions_are_dropped_and_the_rest_kept(tmp_path):
    broken_io = io_task(5, "```python\ndef add_k(x):\n    return x + 6\n```")
    bad_spec = Task(id="code.gen/v1/train/1/000009", domain="code.gen", level=1,
                    prompt=({"role": "user", "content": "?"},),
                    spec=Spec("code", {"entry_point": "f", "test": "def helper():\n    pass\n"}),
                    reference="```python\ndef f():\n    pass\n```")
    rows = HE + [BROKEN, io_task(3, "```python\ndef add_k(x):\n    return x + 3\n```").to_dict(),
                 broken_io.to_dict(), MATH.to_dict(), bad_spec.to_dict()]
    path = write(tmp_path, rows)
    lines: list[str] = []
    tasks, dropped = load_task_file(path, warn=lines.append)
    assert [t.id for t in tasks] == ["file:tasks/HE/0", "file:tasks/HE/cyclic", "file:tasks/HE/1",
                                     "code.gen/v1/train/1/000003", MATH.id]
    assert len(dropped) == 3
    assert dropped[0].startswith("task file:tasks/HE/2: reference solution fails its tests: wrong_answer")
    assert "AssertionError" in dropped[0]
    assert dropped[1].startswith(f"task {broken_io.id}: reference solution fails its tests: wrong_answer")
    assert "neither check(candidate) nor test_*" in dropped[2]
    assert len(lines) == 1 and lines[0].startswith(f"kept 5 of 8 tasks from {path}; dropped 3: task file:tasks/HE/2")
    # what is kept passes the verifier from its own reference (the SFT demonstration)
    for task in tasks[:4]:
        assert get_verifier(task).check(task, task.reference).passed
        assert not get_verifier(task).check(task, "```python\ndef wrong(): pass\n```").passed


@needs_sandbox
def test_all_good_file_reports_nothing_dropped(tmp_path):
    lines: list[str] = []
    tasks, dropped = load_task_file(write(tmp_path, HE), warn=lines.append)
    assert len(tasks) == 3 and dropped == [] and lines == [f"kept 3 of 3 tasks from {tmp_path / 'tasks.jsonl'}"]
