"""Preference-pair files (DPO): every accepted shape in every format, the column mapping, the system
prompt, the JSONL round trip, and one located error (file, line, field) for each defect."""

from __future__ import annotations

import json

import pytest

from rlvr.errors import ConfigError, UserError
from rlvr.tasks.pairs import (PairFileConfig, PreferencePair, as_pair_file_config, load_pairs, pair_problem,
                              parse_pairs, write_pairs)

from test_user_tasks import write_csv, write_jsonl, write_parquet, write_saved_dataset  # the same file writers


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "Be brief."}
TEXT_ROWS = [{"prompt": "What is 2 + 3?", "chosen": "5", "rejected": "6"},
             {"prompt": "Capital of France?", "chosen": "Paris", "rejected": "Lyon"}]
MESSAGE_ROWS = [{"prompt": [SYSTEM, user(row["prompt"])], "chosen": row["chosen"], "rejected": row["rejected"]}
                for row in TEXT_ROWS]
ONE_MESSAGE_ROWS = [{**row, "chosen": assistant(row["chosen"]), "rejected": assistant(row["rejected"])}
                    for row in MESSAGE_ROWS]
ONE_MESSAGE_LIST_ROWS = [{**row, "chosen": [row["chosen"]], "rejected": [row["rejected"]]} for row in ONE_MESSAGE_ROWS]
TRL_ROWS = [{"chosen": [SYSTEM, user("What is 2 + 3?"), assistant("5")],
             "rejected": [SYSTEM, user("What is 2 + 3?"), assistant("6")]},
            {"chosen": [SYSTEM, user("Capital of France?"), assistant("Paris")],
             "rejected": [SYSTEM, user("Capital of France?"), assistant("Lyon")]}]
EXPLICIT_TRL_ROWS = [{"prompt": row["chosen"][:-1], **row} for row in TRL_ROWS]


def expected(system=True):
    prompts = [[user("What is 2 + 3?")], [user("Capital of France?")]]
    return [(tuple(([SYSTEM] if system else []) + p), chosen, rejected)
            for p, chosen, rejected in zip(prompts, ("5", "Paris"), ("6", "Lyon"))]


WRITERS = {"p.jsonl": write_jsonl, "p.csv": write_csv, "p.parquet": write_parquet, "saved": write_saved_dataset}
SHAPES = {"text": (TEXT_ROWS, False), "messages": (MESSAGE_ROWS, True), "message": (ONE_MESSAGE_ROWS, True),
          "message-list": (ONE_MESSAGE_LIST_ROWS, True), "trl": (TRL_ROWS, True),
          "trl-with-prompt": (EXPLICIT_TRL_ROWS, True)}


def triples(pairs):
    return [(p.prompt, p.chosen, p.rejected) for p in pairs]


@pytest.mark.parametrize("name, shape", [(name, shape) for name in WRITERS for shape in SHAPES
                                         if name != "p.csv" or shape == "text"])  # CSV cells are text
def test_every_shape_in_every_format_reads_the_same_pairs(tmp_path, name, shape):
    rows, system = SHAPES[shape]
    path = WRITERS[name](tmp_path / name, rows)
    pairs = load_pairs(str(path))
    assert triples(pairs) == expected(system)
    where = [f"{path}:2", f"{path}:3"] if name == "p.csv" else (
        [f"{path}:1", f"{path}:2"] if name == "p.jsonl" else [f"{path}:row 1", f"{path}:row 2"])
    assert [p.meta for p in pairs] == [{"where": w} for w in where]
    stem = path.stem
    assert [p.id for p in pairs] == [f"{stem}:1", f"{stem}:2"]


def test_column_mapping_ids_extra_columns_and_the_system_prompt(tmp_path):
    rows = [{"question": "What is 2 + 3?", "good": "5", "bad": "6", "qid": "q1", "model": "tiny",
             "chosen_verdict": "ok", "sys": ""},
            {"question": "Capital of France?", "good": "Paris", "bad": "Lyon", "qid": "q2", "model": "",
             "chosen_verdict": "", "sys": "Answer in French."}]
    path = write_csv(tmp_path / "p.csv", rows)
    cfg = as_pair_file_config({"path": str(path), "map": "prompt=question,chosen=good,rejected=bad,id=qid,system=sys",
                               "system_prompt": "Be brief."})
    pairs = load_pairs(cfg)
    assert [p.id for p in pairs] == ["q1", "q2"]
    assert pairs[0].prompt == (SYSTEM, user("What is 2 + 3?"))  # the file's system prompt
    assert pairs[1].prompt == ({"role": "system", "content": "Answer in French."},  # the row's own
                               user("Capital of France?"))
    assert (pairs[1].chosen, pairs[1].rejected) == ("Paris", "Lyon")
    # other columns are meta; CSV's empty cells are missing values
    assert pairs[0].meta == {"model": "tiny", "chosen_verdict": "ok", "where": f"{path}:2"}
    # a prompt with its own system message keeps it
    own = write_jsonl(tmp_path / "own.jsonl", MESSAGE_ROWS)
    assert triples(load_pairs(PairFileConfig(path=str(own), system_prompt="Other."))) == expected(True)
    # conversations are matched against the prompt as written, then the system prompt is added
    bare = [{"prompt": row["chosen"][1:-1], "chosen": row["chosen"][1:], "rejected": row["rejected"][1:]}
            for row in TRL_ROWS]
    path = write_jsonl(tmp_path / "bare.jsonl", bare)
    assert triples(load_pairs(PairFileConfig(path=str(path), system_prompt="Be brief."))) == expected(True)


@pytest.mark.parametrize("entry, message", [
    ({"path": "p.jsonl", "map": {"answer": "x"}},
     "config key 'map.answer' is not a pair field; map one of: prompt, chosen, rejected, id, system"),
    ({"path": "p.jsonl", "map": "chosen=resp,rejected=resp"}, "chosen and rejected name the same column 'resp'"),
    ({"path": "p.jsonl", "map": "chosen"}, "'chosen' must look like field=column"),
    ({"path": "p.jsonl", "instruction": ""}, "unknown config key 'pairs.instruction'"),
    ({"path": "p.jsonl", "format": "xml"}, "pairs.format"),
])
def test_config_errors(entry, message):
    with pytest.raises(ConfigError) as e:
        as_pair_file_config(entry)
    assert message in str(e.value)


def test_round_trip_keeps_pairs_and_extra_fields(tmp_path):
    rows = [{**TRL_ROWS[0], "id": "t1", "task_id": "math/1", "model": "tiny", "chosen_verdict": {"passed": True},
             "rejected_verdict": {"passed": False, "reason": "mismatch"}},
            {**ONE_MESSAGE_LIST_ROWS[1], "id": 7, "meta": {"model": "tiny"}}]  # a to_dict()-style nested meta is merged
    first = load_pairs(str(write_jsonl(tmp_path / "a.jsonl", rows)))
    assert first[0].meta["rejected_verdict"] == {"passed": False, "reason": "mismatch"}
    assert first[1].id == "7" and first[1].meta["model"] == "tiny"
    out = write_pairs(tmp_path / "deep" / "b.jsonl", first)
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.jsonl"]  # no temporary file left
    again = load_pairs(str(out))

    def without_where(pairs):
        return [PreferencePair(p.prompt, p.chosen, p.rejected, p.id, {k: v for k, v in p.meta.items() if k != "where"})
                for p in pairs]

    assert without_where(again) == without_where(first)
    assert [p.meta["where"] for p in again] == [f"{out}:1", f"{out}:2"]
    assert [PreferencePair.from_dict(p.to_dict()) for p in again] == again
    assert json.loads(out.read_text().splitlines()[0])["task_id"] == "math/1"  # extra fields are plain columns


def test_writer_refuses_what_would_not_load_back_and_leaves_the_old_file(tmp_path):
    good = PreferencePair((user("Q"),), "A", "B", "p1", {"model": "tiny"})
    out = write_pairs(tmp_path / "p.jsonl", [good])
    before = out.read_text()
    bad = [(PreferencePair((user("Q"),), "A", "  ", "p2"), "field 'rejected' is empty"),
           (PreferencePair((user("Q"),), "A", "A", "p2"), "field 'chosen' and 'rejected' are the same response"),
           (PreferencePair((user("Q"), assistant("x")), "A", "B", "p2"),
            "field 'prompt' does not end with a user message"),
           (PreferencePair((user("Q"),), "A", "B", "p2", {"chosen": "x"}), "meta key 'chosen'"),
           (PreferencePair((user("Q"),), "A", "B", "p2", {"when": object()}), "not JSON serializable"),
           (PreferencePair((user("Q"),), "A", "B", "p1"), "its id is used by an earlier pair")]
    for pair, message in bad:
        with pytest.raises(ValueError) as e:
            write_pairs(out, [good, pair])
        assert f"{out}: pair 2 (id {pair.id!r}): " in str(e.value) and message in str(e.value)
        assert out.read_text() == before
    assert pair_problem(good) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


MISSING = "field 'rejected' is missing (the row has: chosen, prompt)"
ERRORS = [
    ({"prompt": "Q", "chosen": "A"}, MISSING),
    ({"prompt": "Q", "chosen": "", "rejected": "B"}, "field 'chosen' is empty"),
    ({"prompt": "Q", "chosen": " \n\t", "rejected": "B"}, "field 'chosen' is empty"),  # whitespace only
    ({"prompt": "Q", "chosen": "A", "rejected": assistant("  ")}, "field 'rejected' is empty"),
    ({"prompt": "Q", "chosen": [], "rejected": "B"}, "field 'chosen' is empty"),
    ({"prompt": "  ", "chosen": "A", "rejected": "B"}, "field 'prompt' is empty"),
    ({"prompt": "Q", "chosen": "same", "rejected": " same\n"}, "field 'chosen' and 'rejected' are the same response"),
    ({"prompt": "Q", "chosen": [user("Other"), assistant("A")], "rejected": "B"},
     "field 'chosen': its conversation does not start with the prompt (message 1 differs)"),
    ({"prompt": [SYSTEM, user("Q")], "chosen": "A", "rejected": [SYSTEM, user("Q2"), assistant("B")]},
     "field 'rejected': its conversation does not start with the prompt (message 2 differs)"),
    ({"chosen": [user("Q"), assistant("A")], "rejected": [user("R"), assistant("B")]},  # TRL form, prompts differ
     "field 'rejected': its conversation does not start with the prompt (message 1 differs)"),
    ({"prompt": "Q", "chosen": [user("Q"), assistant("A"), user("More"), assistant("B")], "rejected": "C"},
     "field 'chosen': its conversation has 2 message(s) between the prompt and the response"),
    ({"chosen": [user("Q"), assistant("A"), assistant("A, again")], "rejected": [user("Q"), assistant("B")]},
     "field 'chosen' ends with 2 assistant messages; a response is one assistant message"),  # two final turns: refused
    ({"chosen": [user("Q"), {"role": "tool", "content": "42"}, assistant("A")], "rejected": "B"},
     "field 'chosen' has a 'tool' message before its response; the prompt must end with a user message"),
    ({"prompt": [user("Q"), assistant("A")], "chosen": "B", "rejected": "C"},
     "field 'prompt' does not end with a user message"),
    ({"prompt": [SYSTEM], "chosen": "B", "rejected": "C"}, "field 'prompt' does not end with a user message"),
    ({"prompt": [assistant("A"), user("Q")], "chosen": "B", "rejected": "C"},
     "field 'prompt' has no user message before the first assistant message"),
    ({"prompt": [SYSTEM, user(" ")], "chosen": "B", "rejected": "C"}, "field 'prompt' ends with an empty user message"),
    ({"prompt": 5, "chosen": "B", "rejected": "C"}, "field 'prompt' is not text or a list of messages"),
    ({"prompt": "Q", "chosen": "A", "rejected": [user("Q"), {"role": "robot", "content": "B"}]},
     "field 'rejected[1]' is not a message with a role (system, user, assistant, tool) and string content"),
    ({"prompt": "Q", "chosen": {"role": "robot", "content": "A"}, "rejected": "B"},
     "field 'chosen' is a message with role 'robot'; roles are: system, user, assistant, tool"),
    ({"prompt": "Q", "chosen": user("A"), "rejected": "B"},
     "field 'chosen' is a 'user' message; a response is an assistant message"),
    ({"prompt": "Q", "chosen": {"role": "assistant", "content": 5}, "rejected": "B"},
     "field 'chosen' is a message whose content is not a string"),
    ({"prompt": [{"role": "user", "content": ["Q"]}], "chosen": "A", "rejected": "B"},
     "field 'prompt[0]' is not a message with a role (system, user, assistant, tool) and string content"),
    ({"prompt": "Q", "chosen": 5, "rejected": "B"},
     "field 'chosen' is not text, an assistant message or a list of messages"),
    ({"chosen": "A", "rejected": "B"}, ("field 'prompt' is missing (the row has: chosen, rejected); name its column "
                                        "with --map prompt=COLUMN, or give chosen and rejected as whole conversations")),
    ({"prompt": "Q", "chosen": "A", "rejected": "B", "id": True}, "field 'id' is not a non-empty string or integer"),
    ({"prompt": "Q", "chosen": "A", "rejected": "B", "system": ["S"]}, "field 'system' is not a string"),
    ('{"prompt": "Q", "chosen": "A",',
     "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 31 (char 30)"),
]


@pytest.mark.parametrize("row, message", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_each_defect_is_one_line_naming_file_line_and_field(tmp_path, row, message):
    path = write_jsonl(tmp_path / "pairs.jsonl", [TEXT_ROWS[0], "", row])  # a blank line still counts
    with pytest.raises(UserError) as e:
        load_pairs(str(path))
    assert str(e.value) == f"{path}:3: {message}"


@pytest.mark.parametrize("map_, row, message", [
    ("chosen=good,rejected=bad", {"prompt": "Q", "good": "A"},
     "field 'bad' (mapped to 'rejected') is missing (the row has: good, prompt)"),
    ("prompt=question", {"chosen": [user("Q"), assistant("A")], "rejected": [user("Q"), assistant("B")]},
     "field 'question' (mapped to 'prompt') is missing (the row has: chosen, rejected)"),
    ("id=qid", {"prompt": "Q", "chosen": "A", "rejected": "B"},
     "field 'qid' (mapped to 'id') is missing (the row has: chosen, prompt, rejected)"),
    ("chosen=good,rejected=bad", {"prompt": "Q", "good": "A", "bad": "A"},
     "field 'good' (mapped to 'chosen') and 'bad' (mapped to 'rejected') are the same response"),
    ("chosen=good", {"prompt": "Q", "good": [user("P"), assistant("A")], "rejected": "B"},
     "field 'good' (mapped to 'chosen'): its conversation does not start with the prompt (message 1 differs)"),
])
def test_mapped_columns_are_named_in_errors(tmp_path, map_, row, message):
    path = write_jsonl(tmp_path / "pairs.jsonl", [row])
    with pytest.raises(UserError) as e:
        load_pairs({"path": str(path), "map": map_})
    assert str(e.value) == f"{path}:1: {message}"


def test_a_mapped_system_column_may_be_absent_from_a_row(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", TEXT_ROWS)
    assert triples(load_pairs({"path": str(path), "map": "system=sys"})) == expected(False)


def test_parquet_errors_name_the_row(tmp_path):
    path = write_parquet(tmp_path / "p.parquet", [TEXT_ROWS[0], {**TEXT_ROWS[1], "rejected": " "}])
    with pytest.raises(UserError) as e:
        load_pairs(str(path))
    assert str(e.value) == f"{path}:row 2: field 'rejected' is empty"


def test_every_problem_is_found_and_the_first_reported(tmp_path):
    rows = [TEXT_ROWS[0], {"prompt": "Q", "chosen": "A"}, "not json", {"prompt": "Q", "chosen": "A", "rejected": "A"}]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    pairs, problems = parse_pairs(str(path))
    assert len(pairs) == 1
    assert [(p.where, p.field) for p in problems] == [(f"{path}:2", "rejected"), (f"{path}:3", ""),
                                                       (f"{path}:4", "chosen")]
    with pytest.raises(UserError) as e:
        load_pairs(str(path))
    assert str(e.value) == f"{path}:2: {MISSING} (2 more problem(s) in this file)"


@pytest.mark.parametrize("rows", [[], ["", "  "]])
def test_a_file_without_pairs_is_named(tmp_path, rows):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(rows), encoding="utf-8")
    with pytest.raises(UserError) as e:
        load_pairs(str(path))
    assert str(e.value) == f"{path}: no preference pairs"


def test_duplicate_ids_name_both_lines(tmp_path):
    rows = [{**TEXT_ROWS[0], "id": "a"}, {**TEXT_ROWS[1], "id": "b"}, {**TEXT_ROWS[1], "id": "a"}]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.raises(UserError) as e:
        load_pairs(str(path))
    assert str(e.value) == f"{path}:3: field 'id' repeats pair 'a' (line 1)"


def test_unreadable_files_are_one_located_error(tmp_path):
    with pytest.raises(UserError, match="no such file or directory"):
        load_pairs(str(tmp_path / "absent.jsonl"))
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"prompt": "Q", "chosen": "A", "rejected": "B"}\n{"prompt": "\xff"}\n')
    with pytest.raises(UserError) as e:
        load_pairs(str(bad))
    assert str(e.value).startswith(f"{bad}:2: not UTF-8")
