"""Bad input at scale (hypothesis, a fixed example budget, derandomised so CI repeats it): any task
file (JSONL, CSV, with a column map), any recipe or ``--set`` override, and any assistant text
given to the tool-call parsers yields a valid object or one clear error line — never a traceback
of another kind, never a silent partial load."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr.config import load_config
from rlvr.envs.tools import ToolCall, ToolCallError, parse_tool_call
from rlvr.errors import ConfigError, UserError
from rlvr.serve.chat import parse_reply
from rlvr.tasks.files import load_tasks
from rlvr.tasks.rows import TaskFileConfig
from rlvr.train.grpo_config import GRPOConfig
from rlvr.types import Task

EXAMPLES = 150
PROFILE = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)
field_names = st.sampled_from(["prompt", "question", "answer", "reference", "verifier", "id", "level", "split",
                               "domain", "tags", "choices", "schema", "abs_tol", "system", "meta", "x"])
rows = st.one_of(st.dictionaries(field_names, values, max_size=6), values)
lines = st.one_of(rows.map(json.dumps), st.text(max_size=40))


def _one_clear_line(error: Exception, path: Path) -> None:
    text = str(error)
    assert "\n" not in text and text.strip(), repr(text)
    assert str(path) in text, text  # names the file (and, for a row, its line and field)


def _loaded_whole(tasks: list, n_rows: int) -> None:
    assert tasks and all(isinstance(t, Task) for t in tasks) and len(tasks) <= n_rows


@PROFILE
@given(st.lists(lines, min_size=1, max_size=6), st.sampled_from([{}, {"prompt": "question"}, {"answer": "x"}]))
def test_any_jsonl_task_file_loads_whole_or_fails_in_one_line(tmp_path_factory, content, mapping):
    path = tmp_path_factory.mktemp("jsonl") / "tasks.jsonl"
    path.write_text("\n".join(content) + "\n")
    try:
        tasks, _ = load_tasks(TaskFileConfig(path=str(path), map=mapping), check_solutions=False)
    except UserError as e:  # ConfigError included
        _one_clear_line(e, path)
        return
    parsed = [line for line in content if line.strip()]
    assert len(tasks) == len(parsed)  # every row a task, or the whole file refused: no partial load
    _loaded_whole(tasks, len(parsed))


cells = st.text(alphabet=string.printable, max_size=20)


@PROFILE
@given(st.lists(st.sampled_from(["question", "answer", "verifier", "level", "id", "prompt"]), min_size=1,
                max_size=4, unique=True),
       st.lists(st.lists(cells, min_size=4, max_size=4), min_size=1, max_size=5))
def test_any_csv_task_file_loads_whole_or_fails_in_one_line(tmp_path_factory, header, body):
    import csv

    path = tmp_path_factory.mktemp("csv") / "tasks.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for row in body:
            w.writerow(row[: len(header)])
    try:
        tasks, _ = load_tasks(TaskFileConfig(path=str(path), map={"prompt": "question"} if "question" in header else {}),
                              check_solutions=False)
    except UserError as e:
        _one_clear_line(e, path)
        return
    _loaded_whole(tasks, len(body))


keys = st.sampled_from(["steps", "rollout.tasks_per_step", "optim.lr", "algo.advantage", "lora.enabled",
                        "asynchronous.max_staleness", "curriculum.enabled", "reward.outcome", "nope", "rollout",
                        "algo.kl_coef", "distill.teacher", "backend", "checkpoint_every", "a.b.c"])
override_values = st.one_of(st.text(alphabet=string.printable, max_size=12), st.integers(-5, 10**6).map(str),
                            st.sampled_from(["true", "false", "[1, 2]", "{a: 1}", "null", "1e-3", "gae", "ray"]))


@PROFILE
@given(st.lists(st.tuples(keys, override_values), max_size=4), st.one_of(st.none(), st.text(max_size=60)))
def test_any_recipe_and_overrides_give_a_config_or_one_line_naming_the_key(tmp_path_factory, overrides, recipe):
    model = tmp_path_factory.mktemp("m")
    sets = [f"model={model}", "domains=[math.arith]"] + [f"{k}={v}" for k, v in overrides]
    path = None
    if recipe is not None:
        path = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
        path.write_text(recipe)
    try:
        cfg = load_config(GRPOConfig, path, sets)
    except ConfigError as e:
        text = str(e)
        assert "\n" not in text.strip() and text.strip(), repr(text)
        return
    assert isinstance(cfg, GRPOConfig)


texts = st.one_of(st.text(max_size=80),
                  st.builds(lambda a, body, b: f"{a}<tool_call>{body}</tool_call>{b}", st.text(max_size=10),
                            st.one_of(st.text(max_size=40), values.map(json.dumps)), st.text(max_size=10)),
                  st.builds(lambda body: f"<tool_call>{body}", st.text(max_size=40)))


@PROFILE
@given(texts)
def test_any_assistant_text_gives_a_call_none_or_an_error_the_model_can_read(text):
    try:
        call = parse_tool_call(text)
    except ToolCallError as e:
        assert str(e).startswith("error: ") and "\n" not in str(e)
    else:
        assert call is None or (isinstance(call, ToolCall) and isinstance(call.name, str)
                                and isinstance(call.arguments, dict))
    reply = parse_reply(text)  # the server's parser: never raises; every call it returns is well formed
    for c in reply.tool_calls:
        assert isinstance(c["function"]["name"], str) and isinstance(json.loads(c["function"]["arguments"]), dict)


@pytest.mark.parametrize("content", ['{"prompt": ""}', '{"prompt": [{"role": "user", "content": "  "}]}'])
def test_a_task_whose_only_user_message_is_empty_is_refused_naming_the_field(tmp_path, content):
    path = tmp_path / "t.jsonl"
    path.write_text(content + "\n")
    with pytest.raises(UserError, match=r"t\.jsonl:1.*prompt") as e:
        load_tasks(TaskFileConfig(path=str(path)), check_solutions=False)
    assert "\n" not in str(e.value)
