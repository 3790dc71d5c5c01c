"""An LLM judge served by a real ``rlvr serve`` is a weighted reward source of a real GRPO run; the
judge server is SIGKILLed mid-run and the run follows the declared failure policy without hanging.
Also: the official ``openai`` client's ``response_format`` json_schema request gets a 400 naming the
field (rlvr serve has no constrained decoding)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.flywheel import free_port, start_server  # noqa: E402

RLVR = str(Path(sys.executable).parent / "rlvr")


def config(tiny_model_dir: str, out: Path, url: str, on_failure: str, steps: int) -> Path:
    cfg = {"model": tiny_model_dir, "out": str(out), "domains": ["math.arith"], "train_tasks": 32, "steps": steps,
           "rollout": {"tasks_per_step": 2, "samples_per_task": 4, "max_new_tokens": 8},
           "reward": {"sources": [
               {"kind": "verifier", "weight": 1.0},
               {"kind": "judge", "url": url, "weight": 0.5, "parse": "logprobs", "min_score": 0, "max_score": 9,
                "max_tokens": 1, "timeout_s": 5, "retries": 1, "concurrency": 4, "on_failure": on_failure,
                "rubric": "Score 0-9. Task: {prompt} Answer: {response} Score:"}]},
           "checkpoint_every": 100, "sandbox": {"allow_weak": True}}
    path = out.with_suffix(".yaml")
    path.write_text(json.dumps(cfg))
    return path


def steps_logged(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in open(path)] if path.exists() else []


def hold_dead_port(port: int) -> None:
    """Keep the killed judge's port: accept and close at once (the judge is gone), so that no other
    test's server, started beside this one by pytest-xdist, is handed the freed port and answers the
    run's judge requests in its place (CI saw judge scores after the kill)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(16)

    def refuse():
        while True:
            conn, _ = sock.accept()
            conn.close()

    threading.Thread(target=refuse, daemon=True).start()


def run_and_kill(tiny_model_dir: str, tmp_path: Path, on_failure: str, steps: int = 6):
    """Start the judge, start the run, SIGKILL the judge once step 2 is logged; (run's exit code,
    its output, its metrics rows, seconds from the kill to the run's end, its out dir, rows logged
    when the judge was dead: the run keeps stepping while the test polls and kills, so the kill can
    land a few steps after step 2)."""
    port = free_port()
    server = start_server(tiny_model_dir, tmp_path / f"capture-{on_failure}", port)
    out = tmp_path / f"run-{on_failure}"
    run = subprocess.Popen([RLVR, "train", "-c", str(config(tiny_model_dir, out, f"http://127.0.0.1:{port}",
                                                            on_failure, steps))],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(steps_logged(out)) < 2 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert run.poll() is None and len(steps_logged(out)) >= 2, run.stdout.read() if run.poll() is not None else ""
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        hold_dead_port(port)
        killed = time.monotonic()
        at_kill = len(steps_logged(out))
        text, _ = run.communicate(timeout=240)  # never waits forever: a hang fails the test here
        return run.returncode, text, steps_logged(out), time.monotonic() - killed, out, at_kill
    finally:
        for p in (run, server):
            if p.poll() is None:
                p.kill()


def test_a_killed_judge_scores_zero_and_alerts_under_policy_zero(tiny_model_dir, tmp_path):
    code, text, rows, _, out, at_kill = run_and_kill(tiny_model_dir, tmp_path, "zero", steps=12)
    assert code == 0, text
    assert len(rows) == 12
    # the step in flight at the kill may mix live and failed calls; every later one saw a dead judge
    before, after = rows[:2], rows[at_kill + 1:]
    assert len(after) >= 2, at_kill
    assert all(r["rollout/score/judge_failed"] < 1.0 for r in before)  # the live judge scored samples
    assert all(0.0 <= r["rollout/score/judge"] <= 1.0 for r in before)
    assert any(r["rollout/reward_judge"] > 0 for r in before)  # weighted into the reward
    assert all(r["rollout/score/judge_failed"] == 1.0 and r["rollout/score/judge"] == 0.0 for r in after)
    alerts = [json.loads(line) for line in open(out / "alerts.jsonl")]
    failures = [a for a in alerts if a["detector"] == "reward_source_failure"]
    assert failures and failures[0]["evidence"]["source"] == "judge"
    assert 3 <= failures[0]["step"] <= at_kill + 2
    assert "judge failed" in text


def test_a_killed_judge_ends_the_run_under_policy_fail(tiny_model_dir, tmp_path):
    code, text, rows, seconds, _, _ = run_and_kill(tiny_model_dir, tmp_path, "fail", steps=40)
    assert code != 0 and len(rows) < 40
    assert "reward.sources.judge (judge at http://127.0.0.1:" in text and "on_failure is 'fail'" in text
    assert "Traceback" not in text
    assert seconds < 60  # timeouts and retries bound the wait


def test_response_format_json_schema_from_the_openai_client_is_refused_naming_the_field(tiny_model_dir, tmp_path):
    openai = pytest.importorskip("openai")
    port = free_port()
    server = start_server(tiny_model_dir, tmp_path / "capture", port)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        schema = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="legs", messages=[{"role": "user", "content": "Rate: 1+1=2"}],
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "score", "schema": schema}})
        assert info.value.status_code == 400 and "response_format" in str(info.value)
    finally:
        server.terminate()
        server.wait(timeout=30)
