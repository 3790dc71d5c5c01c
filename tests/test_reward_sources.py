"""reward.sources: config checks, the weighted reward with logged-only sources, the judge's parsing,
timeouts and failure policies (a stub OpenAI-compatible server), and the detectors that watch them."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlvr.errors import ConfigError, UserError
from rlvr.monitor.config import OveroptimizationConfig, RewardSourceFailureConfig
from rlvr.monitor.detectors import overoptimization, reward_source_failure
from rlvr.reward_sources.base import apply_sources, forget_sources
from rlvr.reward_sources.judge import JudgeSource, parse_logprobs
from rlvr.reward_source_config import SourceConfig
from rlvr.rewards import RewardConfig
from rlvr.tasks import generate_tasks
from rlvr.train.step_metrics import rollout_metrics
from rlvr.types import Scored, Trajectory, Verdict


def scored(completions: list[str], passed: list[bool]) -> list[Scored]:
    tasks = generate_tasks(["math.arith"], "train", len(completions), seed=0)
    out = []
    for i, (task, text, ok) in enumerate(zip(tasks, completions, passed)):
        traj = Trajectory(task_id=task.id, group_id=i, messages=(), completion=text, token_ids=(1, 2),
                          loss_mask=(0, 1), logprobs=(0.0, -1.0), finish_reason="stop")
        out.append(Scored(task=task, trajectory=traj, verdict=Verdict(ok, float(ok), "ok" if ok else "mismatch"),
                          reward=float(ok), terms={"outcome": float(ok)}))
    return out


@pytest.fixture()
def reward_fns(tmp_path):
    path = tmp_path / "fns.py"
    path.write_text(
        "def length(prompts, completions, **kw):\n"
        "    return [len(c) / 10 for c in completions]\n"
        "def flaky(prompts, completions, **kw):\n"
        "    return [None if 'x' in c else 1.0 for c in completions]\n")
    forget_sources()
    yield str(path)
    forget_sources()


def test_config_refuses_what_a_source_cannot_use():
    with pytest.raises(ConfigError, match="kind"):
        RewardConfig(sources=[{"kind": "oracle"}])
    with pytest.raises(ConfigError, match=r"reward.sources\[0\].url' does not apply to a reward_model source"):
        RewardConfig(sources=[{"kind": "reward_model", "path": "x", "url": "http://h"}])
    with pytest.raises(ConfigError, match="'reward.sources.reward_model.path' is required"):
        RewardConfig(sources=[{"kind": "reward_model"}])
    with pytest.raises(ConfigError, match="two sources are named 'a'"):
        RewardConfig(sources=[{"kind": "python", "function": "m:f", "name": "a"},
                              {"kind": "python", "function": "m:g", "name": "a"}])
    with pytest.raises(ConfigError, match="not one of proxy, gold"):
        RewardConfig(sources=[{"kind": "python", "function": "m:f", "name": "gold"}])
    with pytest.raises(ConfigError, match="integers within 0-9"):
        RewardConfig(sources=[{"kind": "judge", "url": "http://h", "parse": "logprobs", "max_score": 10}])
    with pytest.raises(ConfigError, match="'reward.gold' must name a source"):
        RewardConfig(sources=[{"kind": "python", "function": "m:f"}], gold="judge")
    with pytest.raises(ConfigError, match="weight"):
        RewardConfig(sources=[{"kind": "python", "function": "m:f", "weight": -1}])
    # a written-out config (every key at its default) reads back
    cfg = RewardConfig(sources=[{"kind": "python", "function": "m:f"}])
    from dataclasses import asdict
    assert RewardConfig(sources=[asdict(s) for s in cfg.sources]).sources == cfg.sources


def test_weights_terms_and_logged_only_sources(reward_fns):
    batch = scored(["1 + 1 = 2\nAnswer: 2", "Answer: 9"], [True, False])
    cfg = RewardConfig(sources=[{"kind": "verifier", "weight": 0},
                                {"kind": "python", "function": f"{reward_fns}:length", "name": "len", "weight": 0.5},
                                {"kind": "python", "function": f"{reward_fns}:flaky", "name": "shadow", "weight": 0}])
    out = apply_sources(batch, cfg)
    a, b = out
    assert "outcome" not in a.terms  # the verifier at weight 0: logged, not trained on
    assert a.terms == {"len": pytest.approx(0.5 * len(batch[0].trajectory.completion) / 10)}
    assert a.reward == pytest.approx(sum(a.terms.values()))
    assert a.scores["verifier"] == 1.0 and b.scores["verifier"] == 0.0
    assert a.scores["gold"] == 1.0 and b.scores["gold"] == 0.0
    assert a.scores["proxy"] == pytest.approx(a.terms["len"])
    assert a.scores["shadow"] == 1.0 and "shadow" not in a.terms
    metrics = rollout_metrics(out, out)
    assert metrics["rollout/score/gold"] == 0.5 and metrics["rollout/score/verifier"] == 0.5
    assert metrics["rollout/score/shadow_failed"] == 0.0
    # a value that is no number scores 0 and is counted as failed
    bad = apply_sources(scored(["x"], [True]), cfg)[0]
    assert bad.scores["shadow"] == 0.0 and bad.scores["shadow_failed"] == 1.0
    # no sources: nothing changes
    assert apply_sources(batch, RewardConfig()) is batch


# --------------------------------------------------------------------------- the judge, against a stub server


class Stub:
    """An OpenAI-compatible stub: answers ``reply(body)`` (a dict), or sleeps ``delay`` first."""

    def __init__(self, reply, delay: float = 0.0) -> None:
        self.reply, self.delay, self.calls, self.active, self.max_active = reply, delay, 0, 0, 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # /v1/models: the judge asks which model to name when it has none
                data = json.dumps({"object": "list", "data": [{"id": "stub-judge", "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.calls += 1
                    stub.active += 1
                    stub.max_active = max(stub.max_active, stub.active)
                try:
                    time.sleep(stub.delay)
                    status, payload = stub.reply(body, self.headers)
                finally:  # no longer active before the reply leaves: the client's next request
                    with stub.lock:  # may arrive before this thread would get back here
                        stub.active -= 1
                try:
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def text_reply(text: str):
    return lambda body, headers: (200, {"choices": [{"message": {"role": "assistant", "content": text}}]})


def judge(url: str, **kw) -> JudgeSource:
    return JudgeSource(SourceConfig(kind="judge", url=url, **{"retries": 0, "timeout_s": 2.0, **kw}))


def test_judge_parses_a_number_and_maps_the_score_range(monkeypatch):
    seen = {}

    def reply(body, headers):
        seen.update(body=body, auth=headers.get("Authorization"))
        return 200, {"choices": [{"message": {"content": " 7/10, mostly right"}}]}

    stub = Stub(reply)
    monkeypatch.setenv("JUDGE_KEY", "s3cret")
    try:
        s = judge(stub.url, api_key_env="JUDGE_KEY", rubric="Q: {prompt}\nA: {response}\nScore {min_score}-{max_score}:")
        batch = scored(["Answer: 2"], [True])
        assert s.score(batch) == [pytest.approx(0.7)]
        assert seen["auth"] == "Bearer s3cret" and seen["body"]["temperature"] == 0.0
        assert seen["body"]["model"] == "stub-judge"  # no model set: the first one the server lists
        message = seen["body"]["messages"][0]["content"]
        assert message == f"Q: {batch[0].task.prompt[0]['content']}\nA: Answer: 2\nScore 0-10:"
    finally:
        stub.close()


def test_judge_logprobs_reads_the_expected_digit():
    choice = {"logprobs": {"content": [{"token": "7", "logprob": -0.1, "top_logprobs": [
        {"token": "7", "logprob": -0.5}, {"token": "3", "logprob": -1.5}, {"token": "x", "logprob": -0.1},
        {"token": " 9", "logprob": -3.0}]}]}}
    import math
    w = {7: math.exp(-0.5), 3: math.exp(-1.5), 9: math.exp(-3.0)}
    assert parse_logprobs(choice, 0, 9) == pytest.approx(sum(d * p for d, p in w.items()) / sum(w.values()))
    assert parse_logprobs(choice, 0, 5) == pytest.approx(3.0)  # digits out of range are ignored


@pytest.mark.parametrize("case", ["no_number", "out_of_range", "http_500", "not_json_choices"])
def test_judge_failures_follow_the_policy(case):
    replies = {"no_number": text_reply("I cannot say"), "out_of_range": text_reply("42"),
               "http_500": lambda b, h: (500, {"error": {"message": "boom"}}),
               "not_json_choices": lambda b, h: (200, {"choices": "nope"})}
    stub = Stub(replies[case])
    try:
        batch = scored(["Answer: 2", "Answer: 3"], [True, False])
        assert judge(stub.url, on_failure="zero", retries=1).score(batch) == [None, None]
        assert stub.calls == 4  # each sample tried twice
        with pytest.raises(UserError, match=r"reward.sources.judge \(judge at http://127.0.0.1:\d+\).*on_failure is 'fail'"):
            judge(stub.url, on_failure="fail").score(batch)
    finally:
        stub.close()


def test_a_dead_or_hanging_judge_never_stalls_the_step():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    start = time.monotonic()
    assert judge(dead, on_failure="zero", retries=1).score(scored(["a", "b"], [True, True])) == [None, None]
    assert time.monotonic() - start < 5
    stub = Stub(text_reply("5"), delay=3.0)
    try:
        start = time.monotonic()
        with pytest.raises(UserError, match="timed out|cannot reach"):
            judge(stub.url, timeout_s=0.5, on_failure="fail").score(scored(["a"], [True]))
        assert time.monotonic() - start < 2.5
    finally:
        stub.close()


def test_judge_keeps_to_its_concurrency_limit():
    stub = Stub(text_reply("5"), delay=0.2)
    try:
        out = judge(stub.url, concurrency=2).score(scored(["a"] * 6, [True] * 6))
        assert out == [pytest.approx(0.5)] * 6 and stub.max_active == 2
    finally:
        stub.close()


def test_a_missing_api_key_variable_is_named():
    with pytest.raises(UserError, match="NO_SUCH_KEY is not set"):
        judge("http://127.0.0.1:1", api_key_env="NO_SUCH_KEY")


# --------------------------------------------------------------------------- detectors


def history(proxy: list[float], gold: list[float], kl: float | None = None) -> list[dict]:
    rows = [{"step": i + 1, "rollout/score/proxy": p, "rollout/score/gold": g} for i, (p, g) in enumerate(zip(proxy, gold))]
    if kl is not None:
        rows[-1]["train/kl"] = kl
    return rows


def test_overoptimization_fires_when_proxy_rises_as_gold_falls():
    cfg = OveroptimizationConfig(window=3, min_rise=0.1, min_drop=0.1)
    up = [0.1 * i for i in range(12)]
    gold_peaks = [0.5, 0.6, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.3, 0.3, 0.2, 0.2]
    found = overoptimization(history(up, gold_peaks, kl=0.25), cfg)
    assert found and found[0].evidence["sqrt_kl"] == 0.5
    assert found[0].evidence["gold"][0] > found[0].evidence["gold"][1]
    assert not overoptimization(history(up, [0.5 + 0.02 * i for i in range(12)]), cfg)  # both rise: fine
    assert not overoptimization(history([0.5] * 12, gold_peaks), cfg)  # gold falls, proxy flat: not this detector
    assert not overoptimization([{"step": 1, "rollout/reward_mean": 1.0}], cfg)  # no sources: nothing to watch


def test_reward_source_failure_names_the_source():
    cfg = RewardSourceFailureConfig()
    found = reward_source_failure([{"step": 3, "rollout/score/judge_failed": 0.25, "rollout/score/judge": 0.1}], cfg)
    assert [f.evidence["source"] for f in found] == ["judge"]
    assert not reward_source_failure([{"step": 3, "rollout/score/judge_failed": 0.0}], cfg)
