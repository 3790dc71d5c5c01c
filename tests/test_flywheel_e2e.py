"""The flywheel with real servers: capture and feedback over HTTP, a server SIGKILLed with requests
in flight, and the whole loop (``benchmarks/flywheel.py``'s scenario, smaller): users ask and
judge, a cycle killed mid-training resumes, gates and pushes, the users' held-out accuracy rises, a
cycle on sabotaged feedback is refused, and a rollback puts the first weights back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from benchmarks.flywheel import (  # noqa: E402
    ADMIN,
    LEGS,
    WRONG,
    accuracy,
    fit_prior,
    flywheel_yaml,
    free_port,
    judge,
    names,
    post,
    questions,
    rlvr,
    start_server,
    tiny_base,
    users,
    write_eval_file,
)
from rlvr.serve.capture import ReadStats, TrafficLog, read_traffic  # noqa: E402


def log_file(directory: Path) -> str:
    from rlvr.serve.capture import traffic_files

    return traffic_files(directory)[-1].name


def _models(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]


def _stream(url: str, body: dict) -> tuple[str, str]:
    """(id, text) of a streamed chat completion."""
    import urllib.request

    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert events[-1] == "[DONE]"
    return chunks[0]["id"], "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_feedback_endpoint_checks_its_token_the_id_and_the_judgement(tmp_path):
    from fastapi.testclient import TestClient

    from rlvr.serve.app import create_app

    def no_engine():
        raise RuntimeError("no engine in this test")

    log = TrafficLog(tmp_path / "traffic")
    log.append({"type": "response", "id": "chatcmpl-1", "choices": []})
    with TestClient(create_app(no_engine, model_name="m", admin_token="adm", capture=log,
                               feedback_token="fb")) as client:
        url = "/v1/feedback"
        assert client.post(url, json={"id": "chatcmpl-1", "rating": "up"}).status_code == 401
        assert client.post(url, json={"id": "chatcmpl-1", "rating": "up"},
                           headers={"Authorization": "Bearer adm"}).status_code == 403  # the feedback token's
        ok = {"Authorization": "Bearer fb"}
        assert client.post(url, json={"id": "chatcmpl-9", "rating": "up"}, headers=ok).status_code == 404
        r = client.post(url, json={"id": "chatcmpl-1"}, headers=ok)
        assert r.status_code == 400 and "rating" in r.json()["error"]["message"]
        assert client.post(url, json={"id": "chatcmpl-1", "rating": "meh"}, headers=ok).status_code == 400
        r = client.post(url, json={"id": "chatcmpl-1", "rating": "down", "correction": "Answer: 4",
                                   "reason": "dogs have four"}, headers=ok)
        assert r.status_code == 200 and r.json() == {"id": "chatcmpl-1", "recorded": True}
    log.close()
    records = [r for _, r in read_traffic(tmp_path / "traffic")]
    assert records[-1]["type"] == "feedback" and records[-1]["correction"] == "Answer: 4"
    with TestClient(create_app(no_engine, model_name="m", admin_token="adm")) as client:  # no --capture
        r = client.post("/v1/feedback", json={"id": "x", "rating": "up"}, headers={"Authorization": "Bearer adm"})
        assert r.status_code == 404 and "--capture" in r.json()["error"]["message"]


def test_completions_are_captured_and_a_failed_write_is_counted_not_fatal(tiny_model_dir, tmp_path):
    import errno

    from fastapi.testclient import TestClient

    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.serve.app import create_app
    from rlvr.serve.batcher import Batcher

    def load():
        model, tok = load_model_and_tokenizer(tiny_model_dir)
        return Batcher(model, tok, max_batch=4, max_waiting=8), tok

    log = TrafficLog(tmp_path / "traffic")
    with TestClient(create_app(load, model_name="m", capture=log)) as client:
        end = time.monotonic() + 60
        while client.get("/health").status_code != 200 and time.monotonic() < end:
            time.sleep(0.05)
        r = client.post("/v1/completions", json={"model": "m", "prompt": ["1 + 2 =", "3 + 4 ="], "max_tokens": 4,
                                                 "temperature": 0})
        assert r.status_code == 200
        record = [r for _, r in read_traffic(tmp_path / "traffic")][-1]
        assert record["endpoint"] == "completions" and record["request"]["prompt"] == ["1 + 2 =", "3 + 4 ="]
        assert len(record["prompt_token_ids"]) == 2 and len(record["choices"]) == 2
        assert record["usage"]["prompt_tokens"] == sum(len(p) for p in record["prompt_token_ids"])

        def full(_record):
            raise OSError(errno.ENOSPC, "No space left on device")

        log.append = full  # the disk fills up: the request is served, the failure counted
        for _ in range(2):
            r = client.post("/v1/chat/completions", json={"model": "m", "max_tokens": 4,
                                                          "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        metrics = client.get("/metrics").text
        assert 'rlvr_serve_captured_total{outcome="error"} 2.0' in metrics
        assert 'rlvr_serve_captured_total{outcome="ok"} 1.0' in metrics
    assert log.failed == 2
    # with --filter, what is stored is redacted and holds no token ids
    from rlvr.content_filter import ContentFilter

    rules = ContentFilter.parse("email")
    log = TrafficLog(tmp_path / "filtered", content_filter=rules)
    with TestClient(create_app(load, model_name="m", capture=log, content_filter=rules)) as client:
        end = time.monotonic() + 60
        while client.get("/health").status_code != 200 and time.monotonic() < end:
            time.sleep(0.05)
        r = client.post("/v1/chat/completions", json={"model": "m", "max_tokens": 4, "messages": [
            {"role": "user", "content": "mail bob@example.com the sum of 2 and 3"}]})
        assert r.status_code == 200
    record = [r for _, r in read_traffic(tmp_path / "filtered")][-1]
    assert record["request"]["messages"][0]["content"] == "mail [redacted:email] the sum of 2 and 3"
    assert record["prompt_token_ids"] is None and record["choices"][0]["token_ids"] is None and record["redacted"]
    assert "bob@example.com" not in (tmp_path / "filtered").joinpath(log_file(tmp_path / "filtered")).read_text()


def test_a_server_killed_with_requests_in_flight_keeps_every_completed_response(tiny_model_dir, tmp_path):
    """Acceptance 2: SIGKILL while requests decode; each response a client got whole is in the
    log with its text and token ids, and no line but a last one cut by the kill is broken."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(tiny_model_dir, tmp_path / "traffic", port)
    done: dict[str, dict] = {}
    lock = threading.Lock()

    def client(i: int) -> None:
        try:
            status, body = post(url + "/v1/chat/completions", {
                "model": "legs", "messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": 48,
                "ignore_eos": True, "temperature": 1.0, "seed": i, "stream": False})
        except OSError:  # the server died under this request
            return
        if status == 200:
            with lock:
                done[body["id"]] = body

    try:
        streamed = _stream(url, {"model": "legs", "max_tokens": 8, "temperature": 0, "stream": True,
                                 "messages": [{"role": "user", "content": "hi"}]})
        threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        end = time.monotonic() + 120
        while len(done) < 10 and time.monotonic() < end:
            time.sleep(0.02)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        for t in threads:
            t.join(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert 10 <= len(done) < 40, len(done)  # killed with requests in flight
    stats = ReadStats()
    logged = {r["id"]: r for _, r in read_traffic(tmp_path / "traffic", stats)}  # raises on a broken line
    assert stats.torn <= 1
    assert logged[streamed[0]]["choices"][0]["text"] == streamed[1] and logged[streamed[0]]["params"]["stream"]
    for rid, answer in done.items():
        record = logged[rid]
        assert record["choices"][0]["text"] == answer["choices"][0]["message"]["content"]
        assert len(record["choices"][0]["token_ids"]) == answer["usage"]["completion_tokens"] == 48
        assert record["params"]["seed"] is not None and record["prompt_token_ids"]


def test_the_loop_trains_gates_pushes_refuses_sabotage_and_rolls_back(tmp_path):
    root = tmp_path
    asked = questions(64, seed=1)
    held = questions(32, seed=2, exclude=set(names(64, seed=1)))
    fit_prior(tiny_base(root), root / "prior", asked[:16])
    heldout = root / "heldout.jsonl"
    write_eval_file(heldout, held)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = flywheel_yaml(root / "flywheel.yaml", root=root, port=port, heldout=heldout, steps=40,
                           regression_tasks=40)
    server = start_server(str(root / "prior"), root / "traffic", port)
    try:
        before = accuracy(url, held)
        users(url, asked, LEGS, seed=1)
        # cycle 1, killed mid-training (as step 13 starts; checkpoints every 5 steps) ...
        env = {**os.environ, "RLVR_FAULT": "rollout@13:kill", "OMP_NUM_THREADS": "1"}
        killed = subprocess.run([str(Path(sys.executable).parent / "rlvr"), "flywheel", "cycle", "-c", str(config)],
                                env=env, capture_output=True, text=True, timeout=600)
        assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
        cycle1 = root / "flywheel" / "cycles" / "0001"
        assert not (cycle1 / "result.json").exists() and (cycle1 / "train" / "checkpoints" / "step_10").is_dir()
        assert _models(url)["version"] == 0
        # ... resumes from its checkpoint, passes the gate and is pushed
        assert rlvr(["flywheel", "cycle", "-c", str(config)]) == 0
        ops = [json.loads(line) for line in (cycle1 / "train" / "operations.jsonl").read_text().splitlines()]
        assert [o.get("resumed_at") for o in ops if o.get("op") == "run_config"] == [None, 10]
        result = json.loads((cycle1 / "result.json").read_text())
        assert result["pushed"] and result["gate"]["passed"]
        assert result["harvest"]["kept"]["train"] >= 30 and result["harvest"]["dropped"]["no_reference"] == len(held)
        served = _models(url)
        assert served["version"] == 1 and served["root"] == result["after"]["path"]
        after = accuracy(url, held)
        assert after >= before + 0.25, (before, after)

        # a compromised labeller re-labels every response with a wrong count: the newest judgement wins
        for _, record in read_traffic(root / "traffic"):
            if record["type"] == "response":
                animal = record["request"]["messages"][-1]["content"].rsplit(" ", 1)[-1].rstrip(".")
                judge(url, record["id"], record["choices"][0]["text"], WRONG[animal])
        assert rlvr(["flywheel", "cycle", "-c", str(config)]) == 1
        refused = json.loads((root / "flywheel" / "cycles" / "0002" / "result.json").read_text())
        assert not refused["pushed"] and any("users.heldout" in f for f in refused["gate"]["failures"])
        assert _models(url) == served and accuracy(url, held) == after  # the server kept its weights

        # rollback: the prior is served again; a second rollback has nothing left
        assert rlvr(["flywheel", "rollback", "--dir", str(root / "flywheel"), "--server", url,
                     "--admin-token", ADMIN]) == 0
        assert _models(url)["root"] == str((root / "prior").resolve()) and _models(url)["version"] == 2
        assert accuracy(url, held) == before
        assert rlvr(["flywheel", "rollback", "--dir", str(root / "flywheel"), "--server", url,
                     "--admin-token", ADMIN]) == 2
    finally:
        server.terminate()
        server.wait(timeout=30)
    history = [json.loads(line) for line in (root / "flywheel" / "history.jsonl").read_text().splitlines()]
    assert [(h["type"], h["cycle"]) for h in history] == [("cycle", 1), ("cycle", 2), ("rollback", 1)]
