"""The operation audit log (``rlvr.oplog``): every tool call and sandbox execution, hash-chained;
an edited, deleted or reordered line breaks the chain at that line; a record cut by a SIGKILL is
dropped on reopening and the chain goes on; ``rlvr audit log`` verifies and summarises."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from rlvr import oplog
from rlvr.cli import main
from rlvr.oplog import OpLog, verify


def _log(path, n: int = 5) -> None:
    log = OpLog(path, actor="test")
    for i in range(n):
        log.write("tool_call", task=f"t{i}", tool="calculator", outcome="ok" if i != 2 else "error")
    log.close()


def test_an_intact_chain_verifies_and_counts_its_operations(tmp_path):
    path = tmp_path / "operations.jsonl"
    _log(path)
    v = verify(path)
    assert v.intact and v.records == 7 and v.ops == {"log_opened": 1, "tool_call": 5, "log_closed": 1}
    assert [r["task"] for r in v.refused] == ["t2"]  # the failed call is listed
    _log(path, 2)  # reopened: the chain goes on from the last record
    assert verify(path).intact and verify(path).records == 11


@pytest.mark.parametrize("tamper", ["edit", "delete", "swap", "append_forged"])
def test_tampering_with_any_line_is_found_at_that_line(tmp_path, tamper):
    path = tmp_path / "operations.jsonl"
    _log(path)
    lines = path.read_text().splitlines()
    if tamper == "edit":
        rec = json.loads(lines[3])
        rec["outcome"] = "ok"  # hide the failed call
        lines[3] = json.dumps(rec, separators=(",", ":"))
        where = 4
    elif tamper == "delete":
        del lines[3]
        where = 4
    elif tamper == "swap":
        lines[2], lines[3] = lines[3], lines[2]
        where = 3
    else:  # a record added by hand, its hash computed without the chain's
        rec = {**json.loads(lines[-1]), "seq": 8, "op": "tool_call", "hash": "0" * 64}
        lines.append(json.dumps(rec))
        where = 8
    path.write_text("\n".join(lines) + "\n")
    v = verify(path)
    assert not v.intact and v.broken_line == where, v


def test_a_record_cut_by_a_kill_is_dropped_and_the_chain_goes_on(tmp_path):
    path = tmp_path / "operations.jsonl"
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from rlvr.oplog import OpLog\n"
        "log = OpLog(sys.argv[1])\n"
        "for i in range(10**9):\n"
        "    log.write('sandbox_exec', task=f't{i}', status='ok', note='x' * 200)\n"), str(path)],
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    while not path.exists() or path.stat().st_size < 200_000:
        pass
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with path.open("ab") as f:
        f.write(b'{"seq":99999,"op":"sandbox_ex')  # as a kill mid-line leaves it
    v = verify(path)
    assert v.intact and v.cut_tail and v.records > 100
    log = OpLog(path)
    log.close()
    after = verify(path)
    assert after.intact and not after.cut_tail and after.records == v.records + 2
    assert after.ops["log_recovered"] == 1


def test_rlvr_audit_log_prints_the_summary_and_exits_1_on_a_broken_chain(tmp_path, capsys):
    path = tmp_path / "operations.jsonl"
    _log(path)
    main(["audit", "log", str(path)])  # intact: returns (exit status 0)
    out = capsys.readouterr().out
    assert "7 records (tool_call 5, log_opened 1, log_closed 1)" in out
    assert "chain intact" in out and "'task': 't2'" in out
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace("calculator", "sql")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit) as e:
        main(["audit", "log", str(path)])
    assert e.value.code == 1 and "chain BROKEN at line 2: its hash does not match" in capsys.readouterr().err


def test_every_tool_call_of_scripted_episodes_is_logged(tmp_path):
    import rlvr.tasks  # noqa: F401
    from rlvr.envs.base import make_env, play
    from rlvr.tasks.base import generate_tasks
    from rlvr.tool_calls import CALL_OPEN

    tasks = generate_tasks(["tool.use"], "train", 6, seed=0)
    oplog.open_log(tmp_path / "operations.jsonl")
    try:
        calls = 0
        for t in tasks:
            env = make_env(t.env)
            actions = list(t.actions) + ['<tool_call>{"name": "calculator"', "<tool_call>[1]</tool_call>"]
            messages, _ = play(env, t, actions)
            calls += sum(1 for m in messages if m["role"] == "assistant" and CALL_OPEN in m["content"])
    finally:
        oplog.close_log()
    v = verify(tmp_path / "operations.jsonl")
    assert v.intact and v.ops["tool_call"] == calls > 0


def test_a_training_runs_log_accounts_for_every_sandbox_execution_and_verifies(tiny_model_dir, tmp_path,
                                                                                monkeypatch):
    # (every tool call of an episode: test_every_tool_call_of_scripted_episodes_is_logged; a random
    # model makes none)
    import rlvr.train.grpo as grpo
    from hack_policy import HackPolicy
    from rlvr.config import load_config
    from rlvr.sandbox.audit import read_audit
    from rlvr.train import sources

    # code answers (programs the sandbox runs) among the random model's samples
    monkeypatch.setattr(sources, "rollout", HackPolicy(["literal_expected"], per_step=2).wrap(sources.rollout))
    cfg = load_config(grpo.GRPOConfig, None, [
        f"model={tiny_model_dir}", f"out={tmp_path}", "domains=[code.gen]", "levels=[1]", "train_tasks=16",
        "rollout.tasks_per_step=4", "rollout.samples_per_task=2", "rollout.max_new_tokens=16", "steps=2",
        "checkpoint_every=100", "sandbox.audit=true"])
    from rlvr.sandbox.config import close_shared_sandbox

    close_shared_sandbox()  # the run opens its own, auditing into its directory
    try:
        grpo.run_grpo(cfg, progress=False)
    finally:
        close_shared_sandbox()
    v = verify(tmp_path / "operations.jsonl")
    assert v.intact and v.ops["log_opened"] == 1 and v.ops["log_closed"] == 1
    assert v.ops["run_config"] == 1 and v.ops["model_load"] == 1  # administrative actions
    assert v.ops["sandbox_exec"] == len(read_audit(tmp_path / "sandbox_audit.jsonl")) >= 4


def test_the_server_logs_every_request_and_the_model_load(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.serve.app import create_app
    from rlvr.tasks.base import DOMAINS
    from test_serve_filter import ScriptedEngine, ready

    tokenizer = train_tokenizer(DOMAINS.get("math.word").corpus(0, 50), vocab_size=320)
    engine = ScriptedEngine(tokenizer, "Answer: 42")
    oplog.open_log(tmp_path / "operations.jsonl", actor="serve")
    try:
        app = create_app(lambda: (engine, tokenizer), model_name="m", api_key="k")
        with TestClient(app) as client:
            ready(client)
            body = {"model": "m", "prompt": [5], "max_tokens": 3}
            assert client.post("/v1/completions", json=body).status_code == 401  # no key
            assert client.post("/v1/completions", json=body, headers={"Authorization": "Bearer k"}).status_code == 200
    finally:
        oplog.close_log()
    v = verify(tmp_path / "operations.jsonl")
    assert v.intact and v.ops["model_load"] == 1
    calls = [r for r in map(json.loads, (tmp_path / "operations.jsonl").read_text().splitlines())
             if r["op"] == "http_request" and r["path"] == "/v1/completions"]
    assert [(r["status"], r["outcome"]) for r in calls] == [(401, "refused"), (200, "ok")]
    assert calls[0]["key_sha256"] is None and calls[1]["key_sha256"] == oplog.digest("k")[:16]  # never the key
    assert "Bearer k" not in (tmp_path / "operations.jsonl").read_text()


def _flagged_log(path, tools=("calculator",) * 4, refused=(("read_file", "path"), ("sql", "network"))):
    log = OpLog(path, actor="test")
    for tool in tools:
        log.write("tool_call", task="t", tool=tool, outcome="ok")
    for tool, violation in refused:
        log.write("tool_call", task="t", tool=tool, outcome="refused", violation=violation)
    log.close()


def test_flags_name_exceeded_grants_undeclared_and_new_tools_and_bursts(tmp_path):
    from rlvr.audit.commands import declared_tools
    from rlvr.oplog import flags

    path = tmp_path / "operations.jsonl"
    _flagged_log(path, tools=("calculator",) * 4 + ("rm_rf",))
    v = verify(path)
    assert v.tools == {"calculator": 4, "rm_rf": 1, "read_file": 1, "sql": 1} and v.violations == {"path": 1, "network": 1}
    found = flags(v, declared_tools(), baseline={"calculator", "sql"})
    assert found[0] == "grants exceeded: 2 tool call(s) refused (path 1, network 1), 29% of all tool calls"
    assert "undeclared tool: rm_rf (1 calls) is not declared by any environment" in found
    assert "new tool: read_file (1 calls) never called in the baseline log" in found
    assert not any("calculator" in line or "sql" in line for line in found)
    healthy = tmp_path / "healthy.jsonl"
    _flagged_log(healthy, tools=("calculator",) * 40, refused=())
    assert flags(verify(healthy), declared_tools(), baseline={"calculator"}) == []  # nothing to flag
    v = verify(healthy)
    v.minutes.update({1000: 10, 1001: 12, 1002: 11, 1003: 400})
    (burst,) = flags(v)
    assert burst.startswith("burst: 400 records in the minute from 1970-01-01 16:43 UTC")


def test_rlvr_audit_log_prints_flags_pushes_them_and_strict_exits_1(tmp_path, capsys):
    from webhook_receiver import Receiver

    path = tmp_path / "operations.jsonl"
    _flagged_log(path)
    receiver = Receiver()
    try:
        with pytest.raises(SystemExit) as e:
            main(["audit", "log", str(path), "--strict", "--push", receiver.url])
    finally:
        receiver.close()
    out = capsys.readouterr().out
    assert e.value.code == 1 and "FLAG grants exceeded: 2 tool call(s) refused" in out and "chain intact; 1 flag(s)" in out
    assert "pushed 1 flag(s)" in out
    (_, body, _), = receiver.bodies
    assert body["run"] == str(path) and body["alert"]["detector"] == "oplog" and "grants exceeded" in body["alert"]["message"]
    main(["audit", "log", str(path)])  # without --strict: flags are printed, the exit is 0


def test_rlvr_eval_with_op_log_records_the_model_load_and_its_tool_calls(tiny_model_dir, tmp_path):
    log = tmp_path / "eval_ops.jsonl"
    assert main(["eval", "--model", tiny_model_dir, "--set", "domains=[tool.use]", "--set", "tasks=2",
                 "--set", "max_new_tokens=4", "--out", str(tmp_path / "eval.json"), "--no-radar",
                 "--op-log", str(log)]) == 0
    v = verify(log)
    assert v.intact and v.ops["model_load"] == 1 and v.ops["log_opened"] == 1 and v.ops["log_closed"] == 1
    assert json.loads((tmp_path / "eval.json").read_text())["overall"]["n_tasks"] == 2


def scripted_turns(model, tokenizer, active, params, cfg, limit, generator, batch_size, reuse_cache=True, engine=None):
    """``rlvr.rollout.episodes._generate_turn`` of a scripted policy: each episode's expert turns,
    with a malformed call in every fifth (row + turn), then a final answer."""
    out = []
    for r, e in enumerate(active):
        turn = sum(m["role"] == "assistant" for m in e.messages)
        actions = list(e.task.actions) + ["The answer is 3."]
        action = '<tool_call>{"name": "calculator"' if (r + turn) % 5 == 4 else actions[min(turn, len(actions) - 1)]
        ids = tokenizer.encode(action, add_special_tokens=False) + [tokenizer.eos_token_id]
        out.append((ids, [-1.0] * len(ids), ""))
    return out


def _calls(conversations) -> int:
    from rlvr.tool_calls import CALL_OPEN

    return sum(m["role"] == "assistant" and CALL_OPEN in m["content"] for messages in conversations for m in messages)


def test_a_rollout_actor_captures_its_tool_calls_and_the_trainer_replays_them(tiny_model_dir, tmp_path, monkeypatch):
    """What a Ray rollout actor does (``RolloutWorker.generate``, here in-process): its tool calls
    come back with the episodes and go into the run's log with their origin."""
    import torch

    import rlvr.rollout.episodes as episodes
    from rlvr.envs.base import EnvConfig
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.rollout.engine import SamplingParams
    from rlvr.sandbox.config import SandboxConfig
    from rlvr.tasks.base import generate_tasks
    from rlvr.workers.actors import RolloutWorker

    monkeypatch.setattr(episodes, "_generate_turn", scripted_turns)
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    worker = RolloutWorker(model, tok, SamplingParams(n=2, max_new_tokens=8), 8,
                           EnvConfig(turn_tokens=512, max_tokens=2048, max_context=4096),
                           SandboxConfig(), str(tmp_path / "worker"), threads=1)
    worker.version = 0
    tasks = generate_tasks(["tool.use"], "train", 3, seed=0)
    played, _, records = worker.generate(tasks, 0, torch.Generator().manual_seed(0).get_state())
    calls = _calls(ep.trajectory.messages for ep in played)
    assert calls >= 3 and sum(r["op"] == "tool_call" for r in records) == calls
    oplog.open_log(tmp_path / "operations.jsonl", actor="grpo")
    try:
        oplog.replay(records, origin="rollout worker 0")
    finally:
        oplog.close_log()
    v = verify(tmp_path / "operations.jsonl")
    assert v.intact and v.ops["tool_call"] == calls and v.ops["sandbox_exec"] == sum(r["op"] == "sandbox_exec" for r in records) > 0


def test_a_multi_turn_training_runs_log_accounts_for_every_tool_call(tiny_model_dir, tmp_path, monkeypatch):
    """GRPO on tool.use with a scripted policy (the expert's calls, and malformed ones, as its
    turns; a random model makes none): the log's tool calls are the saved trajectories' calls."""
    import rlvr.rollout.episodes as episodes
    import rlvr.train.grpo as grpo
    from rlvr.config import load_config
    from rlvr.sandbox.config import close_shared_sandbox
    from rlvr.train import sources

    monkeypatch.setattr(episodes, "_generate_turn", scripted_turns)
    played = []

    def counted(rollout):
        def run(*args, **kw):
            out = rollout(*args, **kw)
            played.extend(e.trajectory.messages for e in out)
            return out
        return run

    monkeypatch.setattr(sources, "rollout", counted(sources.rollout))
    cfg = load_config(grpo.GRPOConfig, None, [
        f"model={tiny_model_dir}", f"out={tmp_path}", "domains=[tool.use]", "levels=[1]", "train_tasks=8",
        "rollout.tasks_per_step=2", "rollout.samples_per_task=2", "env.turn_tokens=512", "env.max_tokens=2048",
        "env.max_context=4096", "steps=2", "checkpoint_every=100"])
    close_shared_sandbox()
    try:
        grpo.run_grpo(cfg, progress=False)
    finally:
        close_shared_sandbox()
    calls = _calls(played)
    assert len(played) == 8  # 2 steps x 2 tasks x 2 samples
    v = verify(tmp_path / "operations.jsonl")
    assert v.intact and v.ops["tool_call"] == calls and calls >= 8, (v.ops, calls)
    assert v.tools["(malformed)"] >= 1 and v.tools["calculator"] + v.tools.get("sql", 0) >= 4
