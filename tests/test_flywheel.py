"""The flywheel's parts without a server: the traffic log, near-duplicates, the harvest and the gate."""

from __future__ import annotations

import json
import random

import pytest

from rlvr.content_filter import ContentFilter
from rlvr.errors import ConfigError, UserError
from rlvr.flywheel.cycle import FlywheelConfig, GateConfig, gate
from rlvr.flywheel.harvest import HarvestConfig, harvest, held_out_side, load_criteria
from rlvr.flywheel.near_dup import NearDuplicateIndex, jaccard, numbers, shingles
from rlvr.serve.capture import ReadStats, TrafficLog, read_traffic, traffic_files


def response(rid: str, prompt: str, text: str = "Answer: 1", endpoint: str = "chat", **request) -> dict:
    return {"type": "response", "id": rid, "endpoint": endpoint, "model": "m", "model_version": 0,
            "request": {"messages": [{"role": "user", "content": prompt}], **request},
            "choices": [{"index": 0, "text": text, "token_ids": [1, 2], "finish_reason": "stop"}]}


def feedback(rid: str, **judgement) -> dict:
    return {"type": "feedback", "id": rid, "choice": 0, **judgement}


# -- the traffic log ------------------------------------------------------------------------------------
def test_log_rotates_reads_back_in_order_and_skips_only_a_torn_last_line(tmp_path):
    log = TrafficLog(tmp_path, rotate_bytes=400)
    for i in range(12):
        log.append(response(f"r{i}", f"question {i}"))
    log.close()
    files = traffic_files(tmp_path)
    assert len(files) > 2  # rotated by size
    assert [r["id"] for _, r in read_traffic(tmp_path)] == [f"r{i}" for i in range(12)]
    # a crash mid-record leaves a last line without its newline: skipped, counted
    with files[-1].open("ab") as f:
        f.write(b'{"type": "response", "id": "cut", "choi')
    stats = ReadStats()
    assert [r["id"] for _, r in read_traffic(tmp_path, stats)][-1] == "r11"
    assert stats.torn == 1 and stats.records == 12
    # a reopened log knows the ids already captured (feedback may name them) and appends to a new file
    again = TrafficLog(tmp_path)
    assert {f"r{i}" for i in range(12)} <= again.known and "cut" not in again.known
    again.append(response("r12", "question 12"))
    again.close()
    assert len(traffic_files(tmp_path)) == len(files) + 1
    # a broken line that is not the last one is an error naming the file and line
    lines = files[0].read_text().splitlines(keepends=True)
    files[0].write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(UserError, match=rf"{files[0].name}:2: not a JSON record"):
        list(read_traffic(tmp_path))


def test_log_with_a_filter_stores_redacted_text_and_no_token_ids(tmp_path):
    log = TrafficLog(tmp_path, content_filter=ContentFilter.parse("email"))
    assert log.text("write to bob@example.com now") == "write to [redacted:email] now"
    assert log.ids([1, 2, 3]) is None
    plain = TrafficLog(tmp_path / "plain")
    assert plain.text("bob@example.com") == "bob@example.com" and plain.ids([1]) == [1]


# -- near-duplicates ------------------------------------------------------------------------------------
def test_near_duplicates_need_the_same_numbers_and_similar_text():
    ix = NearDuplicateIndex(0.8)
    ix.add("a", "What is 12 + 35?")
    ix.add("b", "How many legs does Zor have? Zor is a bird.")
    assert ix.find("what is 12+35??") == "a"
    assert ix.find("WHAT  is 12 + 35") == "a"
    assert ix.find("What is 12 + 36?") is None  # another problem, one character apart
    assert ix.find("How many legs does Zor have?  Zor is a bird") == "b"
    assert ix.find("How many legs does Kip have? Kip is a dog.") is None
    with pytest.raises(ValueError):
        NearDuplicateIndex(0.0)


def test_lsh_finds_agree_with_the_exact_rule():
    """Every pair the index reports meets the rule (no false positives), and it finds nearly every
    pair well above the threshold (LSH may miss pairs near it)."""
    rng = random.Random(0)
    words = "the a report quarter revenue of in total how many what is was by for".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + f" {rng.randint(1, 30)}"
             for _ in range(150)]
    variants = [t.upper().replace(" ", "  ") + "?" for t in texts[:50]]
    ix = NearDuplicateIndex(0.8)
    for i, t in enumerate(texts):
        ix.add(str(i), t)
    for text in texts + variants:
        got = ix.find(text)
        if got is not None:
            other = texts[int(got)]
            assert numbers(other) == numbers(text) and jaccard(shingles(other), shingles(text)) >= 0.8
    assert all(ix.find(v) is not None for v in variants)


# -- the harvest ----------------------------------------------------------------------------------------
CRITERIA = "verifier: number\ndomain: legs\n"


def write_traffic(directory, records: list[dict]) -> None:
    log = TrafficLog(directory)
    for r in records:
        log.append(r)
    log.close()


def checker(prompt: str):
    """A criteria checker: the answer of 'add A and B', None for other prompts."""
    words = prompt.split()
    if words[:1] == ["add"]:
        if words[1] == "boom":
            raise RuntimeError("the checker broke")
        return str(int(words[1]) + int(words[3]))
    return None


@pytest.fixture()
def harvested(tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"id": "e1", "prompt": "How many legs does Zor have? Zor is a bird.",
                                     "answer": "2"}) + "\n"
                         + json.dumps({"id": "e2", "prompt": "What is 40 + 2?", "answer": "42"}) + "\n")
    records = [
        response("corr", "How many legs does Kip have? Kip is a dog.", "Answer: 2"),
        feedback("corr", rating="down", correction="Answer: 4"),
        response("bare", "How many legs does Mox have? Mox is an ant.", "Answer: 2"),
        feedback("bare", correction="6"),
        response("up", "How many legs does Pel have? Pel is a spider.", "Answer: 8"),
        feedback("up", rating="up"),
        response("down", "How many legs does Ruv have? Ruv is a bird.", "Answer: 4"),
        feedback("down", rating="down"),
        response("none", "How many legs does Sab have? Sab is a dog.", "Answer: 4"),
        response("cmpl", "How many legs", endpoint="completions"),
        response("tool", "weather?", tools=[{"type": "function"}]),
        # an eval item, asked identically and near-identically, with corrections: never a training task
        response("eval-same", "How many legs does Zor have? Zor is a bird.", "Answer: 4"),
        feedback("eval-same", correction="Answer: 2"),
        response("eval-near", "How many legs does Zor have? Zor is a brid.", "Answer: 4"),  # a typo
        feedback("eval-near", correction="Answer: 2"),
        response("eval-sum", "what is 40+2", "Answer: 41"),
        feedback("eval-sum", correction="42"),
        # duplicates of the first kept candidate
        response("dup", "How many legs does Kip have? Kip is a dog.", "Answer: 4"),
        feedback("dup", rating="up"),
        response("near", "how many legs does KIP have?? Kip is a dog", "Answer: 4"),
        feedback("near", rating="up"),
        # a correction the number verifier cannot check
        response("prose", "How many legs does Tiv have? Tiv is a dog.", "Answer: 3"),
        feedback("prose", correction="four, obviously"),
        # the checker's answers (below the correction, above an approval)
        response("chk", "add 3 and 4", "Answer: 9"),
        response("chk-broken", "add boom and 4", "Answer: 9"),
    ]
    # the newest judgement wins: 'corr' was first rated up
    records.insert(1, feedback("corr", rating="up"))
    write_traffic(tmp_path / "traffic", records)
    (tmp_path / "criteria.yaml").write_text(CRITERIA + f"checker: {__file__}:checker\n")
    cfg = HarvestConfig(traffic=str(tmp_path / "traffic"), criteria=str(tmp_path / "criteria.yaml"),
                        out=str(tmp_path / "out"), eval_files=[str(eval_file)], held_out=0.0)
    return tmp_path, harvest(cfg)


def _tasks(path) -> dict:
    return {json.loads(line)["meta"]["response_id"]: json.loads(line) for line in path.read_text().splitlines()}


def test_harvest_keeps_what_has_a_checked_reference_and_says_why_the_rest_went(harvested):
    root, report = harvested
    kept = _tasks(root / "out" / "train.jsonl")
    assert set(kept) == {"corr", "bare", "up", "chk"}
    assert kept["corr"]["spec"]["payload"]["answer"] == "4" and kept["corr"]["reference"] == "Answer: 4"
    assert kept["bare"]["spec"]["payload"]["answer"] == "6" and kept["bare"]["reference"] is None
    assert kept["up"]["spec"]["payload"]["answer"] == "8" and kept["up"]["meta"]["reference_from"] == "approved"
    assert kept["chk"]["spec"]["payload"]["answer"] == "7" and kept["chk"]["meta"]["reference_from"] == "checker"
    assert all(t["domain"] == "legs" and t["prompt"][-1]["role"] == "user" for t in kept.values())
    dropped = {json.loads(line)["id"]: json.loads(line) for line in (root / "out" / "dropped.jsonl").read_text().splitlines()}
    assert {k: d["reason"] for k, d in dropped.items()} == {
        "down": "rejected_without_correction", "none": "no_reference", "cmpl": "completions",
        "tool": "tool_conversation", "eval-same": "contaminated", "eval-near": "near_contaminated",
        "eval-sum": "near_contaminated", "dup": "duplicate", "near": "near_duplicate", "prose": "unverifiable",
        "chk-broken": "checker_error"}
    assert "the checker broke" in dropped["chk-broken"]["detail"]
    assert report["kept"] == {"train": 4, "heldout": 0} and report["responses"] == 15
    assert sum(report["dropped"].values()) == len(dropped)


def test_no_eval_item_becomes_a_training_task_even_from_the_candidates_file(harvested):
    """Acceptance 3: identical and near-identical eval items are in the candidates, and in no output."""
    from rlvr.tasks.files import load_task_file
    from rlvr.tasks.validate import contamination

    root, _ = harvested
    candidates = (root / "out" / "candidates.jsonl").read_text()
    assert "eval-same" in candidates and "eval-near" in candidates
    train, _ = load_task_file(root / "out" / "train.jsonl", check_solutions=False, warn=lambda *_: None)
    evals, _ = load_task_file(root / "eval.jsonl", check_solutions=False, warn=lambda *_: None)
    assert not contamination(train, evals)
    ix = NearDuplicateIndex(0.8)
    for t in evals:
        ix.add(t.id, t.prompt[-1]["content"])
    assert all(ix.find(t.prompt[-1]["content"]) is None for t in train)


def test_the_split_is_stable_and_near_its_share(tmp_path):
    records = []
    for i in range(200):
        records += [response(f"r{i}", f"What is {i} + {i + 1}?"), feedback(f"r{i}", correction=str(2 * i + 1))]
    write_traffic(tmp_path / "traffic", records)
    (tmp_path / "c.yaml").write_text(CRITERIA)
    reports = [harvest(HarvestConfig(traffic=str(tmp_path / "traffic"), criteria=str(tmp_path / "c.yaml"),
                                     out=str(tmp_path / name), held_out=0.25)) for name in ("a", "b")]
    assert reports[0]["kept"] == reports[1]["kept"] and 30 <= reports[0]["kept"]["heldout"] <= 70
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    from rlvr.types import Task

    held = [Task.from_dict(json.loads(line)) for line in (tmp_path / "a" / "heldout.jsonl").read_text().splitlines()]
    assert all(held_out_side(t, 0.25) for t in held)


def test_criteria_refuse_unknown_keys_and_checkers_that_do_not_import(tmp_path):
    (tmp_path / "c.yaml").write_text("verifier: number\nanswer_at: final\n")
    with pytest.raises(ConfigError, match="unknown key.*answer_at.*takes: verifier"):
        load_criteria(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text("verifier: numbr\n")
    with pytest.raises(ConfigError, match="numbr"):
        load_criteria(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text("verifier: number\nchecker: no_such_module:fn\n")
    with pytest.raises(UserError, match="no_such_module"):
        load_criteria(tmp_path / "c.yaml")
    assert load_criteria(_write(tmp_path / "ok.yaml", "verifier: number\n")).file.instruction == ""


def _write(path, text):
    path.write_text(text)
    return path


# -- the gate -------------------------------------------------------------------------------------------
def _report(by_domain: dict[str, float], n: int = 40) -> dict:
    overall = sum(by_domain.values()) / len(by_domain)
    return {"fingerprint": "f", "overall": {"pass@1": overall, "n_tasks": n * len(by_domain)},
            "by_domain": {d: {"pass@1": v, "n_tasks": n} for d, v in by_domain.items()}}


def test_gate_asks_for_the_margin_and_no_regression_anywhere(tmp_path):
    cfg = FlywheelConfig(traffic="t", criteria="c", gate=GateConfig(margin=5.0, tolerance=2.0))
    good = gate(cfg, {"baseline": {"acceptance": _report({"users": 0.2, "legs": 0.3}), "regression": _report({"math": 0.5})},
                      "candidate": {"acceptance": _report({"users": 0.6, "legs": 0.5}), "regression": _report({"math": 0.49})}})
    assert good["passed"] and good["acceptance"]["change_pts"] == pytest.approx(30.0)
    small = gate(cfg, {"baseline": {"acceptance": _report({"users": 0.2})}, "candidate": {"acceptance": _report({"users": 0.23})}})
    assert not small["passed"] and small["failures"] == ["acceptance suite: pass@1 20.0% -> 23.0% (+3.0 pts; the gate asks for +5)"]
    regressed = gate(cfg, {"baseline": {"acceptance": _report({"users": 0.8, "legs": 0.1}), "regression": _report({"math": 0.5})},
                           "candidate": {"acceptance": _report({"users": 0.5, "legs": 0.9}), "regression": _report({"math": 0.4})}})
    assert not regressed["passed"]
    assert any(f.startswith("acceptance suite: users: pass@1 80.0% -> 50.0%") for f in regressed["failures"])
    assert any(f.startswith("regression suite: math: pass@1 50.0% -> 40.0%") for f in regressed["failures"])


def test_flywheel_config_refuses_keys_the_cycle_sets():
    with pytest.raises(ConfigError, match="train.model"):
        FlywheelConfig(traffic="t", criteria="c", train={"model": "x"})
    with pytest.raises(ConfigError, match="eval.domains"):
        FlywheelConfig(traffic="t", criteria="c", eval={"domains": ["math.arith"]})
    with pytest.raises(ConfigError, match="'traffic'"):
        FlywheelConfig(criteria="c")
    with pytest.raises(ConfigError, match="lora.save must be 'merged'"):
        FlywheelConfig(traffic="t", criteria="c", train={"lora": {"enabled": True, "save": "adapter"}})
    assert FlywheelConfig(traffic="t", criteria="c", train={"lora": {"enabled": True}}).grpo_config("m", "o", "t").lora.enabled


def test_the_shipped_flywheel_recipe_and_criteria_parse():
    from pathlib import Path

    from rlvr.config import from_dict, read_yaml

    configs = Path(__file__).resolve().parents[1] / "configs"
    cfg = from_dict(FlywheelConfig, read_yaml(configs / "flywheel.yaml"))
    assert cfg.grpo_config("m", "o", "t.jsonl").steps == 50 and cfg.eval_config().max_new_tokens == 64
    assert load_criteria(configs / "flywheel_criteria.yaml").file.verifier == "math"
    with pytest.raises(ConfigError, match="train.rollout"):
        FlywheelConfig(traffic="t", criteria="c", train={"rollout": {"tasks_per_stp": 8}})


def test_a_cycle_cut_after_its_own_push_records_it_and_a_changed_server_refuses(tmp_path, monkeypatch):
    from rlvr.flywheel import cycle
    from rlvr.flywheel.server import Served

    pushes = []
    monkeypatch.setattr(cycle, "push_weights", lambda server, path, token: pushes.append(path) or 7)
    cfg = FlywheelConfig(traffic="t", criteria="c", admin_token="a")
    state = {"served": {"path": str(tmp_path / "base"), "version": 3}, "done": ["harvest", "train"]}
    (tmp_path / "cycle").mkdir()
    # the server still serves the baseline: pushed, the push recorded in the state first
    monkeypatch.setattr(cycle, "served", lambda *_: Served(str(tmp_path / "base"), 3, "m"))
    result, verdict = {}, {"passed": True, "failures": []}
    cycle._push(cfg, tmp_path / "cycle", state, str(tmp_path / "cand"), result, verdict)
    assert result["pushed"] and result["after"]["version"] == 7 and pushes == [str(tmp_path / "cand")]
    assert "push" in json.loads((tmp_path / "cycle" / "cycle.json").read_text())["done"]
    # cut after that push, resumed: the server serves the candidate, so it is recorded, not pushed again
    monkeypatch.setattr(cycle, "served", lambda *_: Served(str(tmp_path / "cand"), 4, "m"))
    result = {}
    cycle._push(cfg, tmp_path / "cycle", state, str(tmp_path / "cand"), result, verdict)
    assert result["pushed"] and result["after"]["version"] == 4 and len(pushes) == 1
    # someone else changed the server mid-cycle: refused, nothing pushed
    state = {"served": {"path": str(tmp_path / "base"), "version": 3}, "done": ["harvest", "train"]}
    monkeypatch.setattr(cycle, "served", lambda *_: Served(str(tmp_path / "other"), 4, "m"))
    result, verdict = {}, {"passed": True, "failures": []}
    cycle._push(cfg, tmp_path / "cycle", state, str(tmp_path / "cand"), result, verdict)
    assert not verdict["passed"] and "the server changed during the cycle" in verdict["failures"][0]
    assert "pushed" not in result and len(pushes) == 1
