"""``rollout.engine: remote`` (``rlvr.rollout.remote_engine``) against a real ``rlvr serve`` process.

The server runs on a free loopback port from the tiny model directory the trainer starts from,
with an admin token, on the CPU, as a subprocess (``python -m rlvr.serve.cli``). What is checked:

- greedy (temperature 0) GRPO through the server gives the in-process run's metrics, step by
  step, within 1e-5 (the server's forward and the trainer's are the same float32 kernels on
  rows of different shapes: ~1e-6 apart); the weights differ between steps (weight decay: at
  temperature 0 a group's samples are equal, so its advantages are 0) and are pushed after each
  update, and the server's version counts the pushes;
- at temperature 1 the tokens cannot match the in-process engine (the server samples from its own
  per-request streams, seeded from the run's generator), so what is checked is what should hold:
  a 3-step run's sampled tokens' log-probs are the trainer's forward (``rollout/logprob_mismatch_kl``
  below 1e-6, as in-process), the same seeds give the same tokens (the server's sampling repeats),
  and 64 samples of one prompt from each engine have mean first-token log-probs within 4
  standard errors of each other (a 1-in-15,000 false alarm when both sample one policy);
- a push that did not reach the server fails the canary with ``StaleWeightsError`` right after the
  update (the next batch never starts); weights changed by someone else are refused before a batch;
- the server stops on exactly the ``stop_token_ids`` sent (with ``ignore_eos``), keeping the stop
  token; a server that stops otherwise than asked is refused (``choice_completion``);
- multi-turn episodes through the server are token-faithful (log-probs = a fresh forward);
- ``weight_push: none`` warns, sends nothing, and its canary at start still refuses other weights;
- a server without token ids or log-probs is refused at start naming what is missing; bad
  ``rollout.remote.*`` keys name the key; an unreachable server is one line naming ``base_url``.
"""

from __future__ import annotations

import http.server
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from episode_checks import assert_token_faithful, echo_episodes
from safetensors.torch import load_file

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import rlvr.rollout.remote_engine as re_mod
import rlvr.tasks  # noqa: F401
from rlvr.config import load_config
from rlvr.errors import ConfigError, UserError
from rlvr.model.load import load_model_and_tokenizer
from rlvr.model.logprobs import sequence_logprobs
from rlvr.monitor.metrics import read_metrics
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.rollout.engine_registry import ROLLOUT_ENGINES, EngineSetup
from rlvr.rollout.weights import StaleWeightsError

ADMIN = "test-admin-token"
TIMING = ("time/", "perf/", "mem/")  # prefixes of timings and memory: they differ between any two runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """``rlvr serve`` on the tiny model (the trainer's starting weights), admin token ``ADMIN``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RLVR_ADMIN_TOKEN": ADMIN}
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.serve.cli", "--model", tiny_model_dir, "--port", str(port),
                             "--model-name", "tiny", "--device", "cpu", "--max-batch", "16", "--max-waiting", "160"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 60
        while (h := health(url)) is None or h.get("status") != "ok":
            if proc.poll() is not None:
                raise RuntimeError(f"rlvr serve exited: {proc.stdout.read()}")
            if time.monotonic() > end:
                raise TimeoutError("rlvr serve did not become ready")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def admin(monkeypatch):
    monkeypatch.setenv("RLVR_ADMIN_TOKEN", ADMIN)


def grpo_cfg(*overrides: str):
    from rlvr.train.grpo import GRPOConfig

    return load_config(GRPOConfig, None, ["domains=[math.arith]", *overrides])


def run(model_dir: str, out: Path, *overrides: str) -> list[dict]:
    from rlvr.train.grpo import run_grpo

    cfg = grpo_cfg(f"model={model_dir}", f"out={out}", "steps=3", "rollout.tasks_per_step=3",
                   "rollout.samples_per_task=4", "rollout.max_new_tokens=6", "optim.lr=1e-2", "optim.warmup_steps=0",
                   "optim.weight_decay=0.5", "algo.drop_zero_variance=false", "save_trajectories_every=100",
                   "train_tasks=64", *overrides)
    run_grpo(cfg, progress=False)
    return read_metrics(out)


def comparable(metrics: list[dict]) -> list[dict]:
    """Each step's metrics but timings and memory (they differ between any two runs)."""
    return [{k: v for k, v in m.items()
             if isinstance(v, (int, float)) and not k.startswith(TIMING) and not k.endswith("_s")}
            for m in metrics]


def assert_close(a: list[dict], b: list[dict], tol: float) -> None:
    assert len(a) == len(b) and all(x.keys() == y.keys() for x, y in zip(a, b))
    for step, (x, y) in enumerate(zip(a, b), 1):
        bad = {k: (x[k], y[k]) for k in x if not math.isclose(x[k], y[k], rel_tol=tol, abs_tol=tol)}
        assert not bad, f"step {step}: {bad}"


def server_version(url: str) -> int:
    return health(url)["version"]


def test_greedy_grpo_through_rlvr_serve_gives_the_in_process_metrics(server, tiny_model_dir, tmp_path, admin):
    local = run(tiny_model_dir, tmp_path / "local", "rollout.temperature=0")
    before = server_version(server)
    remote = run(tiny_model_dir, tmp_path / "remote", "rollout.temperature=0", "rollout.engine=remote",
                 f"rollout.remote.base_url={server}", "rollout.remote.canary_tolerance=1e-4")
    assert server_version(server) == before + 4  # the starting weights, then after each of 3 updates
    assert (tmp_path / "remote" / "remote_weights" / "config.json").exists()
    assert len(remote) == 3
    assert_close(comparable(local), comparable(remote), 1e-5)
    weights = {name: load_file(str(tmp_path / name / "model.safetensors"))
               for name in ("local/final", "remote/final", "remote/remote_weights")}
    start = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    for k, w in weights["remote/final"].items():
        assert torch.allclose(w, weights["local/final"][k], atol=1e-6)
        assert torch.equal(w, weights["remote/remote_weights"][k])  # the last push: the final weights
    assert any(not torch.equal(w, start[k]) for k, w in weights["remote/final"].items())  # the weights moved


def test_sampled_grpo_through_rlvr_serve_samples_the_trainers_policy_reproducibly(server, tiny_model_dir, tmp_path,
                                                                                 admin):
    remote = run(tiny_model_dir, tmp_path / "run", "rollout.engine=remote", f"rollout.remote.base_url={server}",
                 "rollout.remote.canary_tolerance=1e-4")
    assert len(remote) == 3 and all(abs(m["rollout/logprob_mismatch_kl"]) < 1e-6 for m in remote)

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    cfg = grpo_cfg(f"model={tiny_model_dir}", "rollout.engine=remote", f"rollout.remote.base_url={server}")
    engine = ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))
    prompts = [tok("12+7=", add_special_tokens=False)["input_ids"], [5, 6]]
    params = SamplingParams(n=64, max_new_tokens=4, stop_token_ids=tuple(range(40, 90)))  # some stop, some not
    twice = [engine.generate(model, prompts, params, generator=torch.Generator().manual_seed(1), pad_token_id=0)
             for _ in range(2)]
    assert [c.token_ids for c in twice[0]] == [c.token_ids for c in twice[1]]  # the server's seeded sampling
    assert [c.prompt_index for c in twice[0]] == [0] * 64 + [1] * 64
    assert {c.finish_reason for c in twice[0]} == {"stop", "length"}  # checked exact by choice_completion
    local = generate(model, prompts, params, generator=torch.Generator().manual_seed(1), pad_token_id=0)
    engine.close()
    for out in (twice[0], local):  # every sampled token's log-prob is the trainer's forward
        for c in out[::16]:
            ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
            with torch.no_grad():
                lp = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(prompts[c.prompt_index]):]
            assert torch.allclose(lp, torch.tensor(c.logprobs), atol=1e-5)
    means = []
    for out in (twice[0], local):  # each first token: one draw from the same distribution per sample
        lp = torch.tensor([c.logprobs[0] for c in out if c.prompt_index == 0])
        means.append((float(lp.mean()), float(lp.std()) / math.sqrt(len(lp))))
    (m1, s1), (m2, s2) = means
    assert abs(m1 - m2) < 4 * math.sqrt(s1**2 + s2**2), means


def test_a_skipped_push_fails_the_canary_before_the_next_batch(server, tiny_model_dir, tmp_path, admin, monkeypatch):
    real = re_mod.RemoteEngine.upload
    calls = []

    def skip_after_start(self, directory):
        calls.append(directory)
        return real(self, directory) if len(calls) == 1 else self.server_version  # the weights never leave

    monkeypatch.setattr(re_mod.RemoteEngine, "upload", skip_after_start)
    with pytest.raises(StaleWeightsError, match="stale weights: trainer pushed version 1"):
        run(tiny_model_dir, tmp_path / "run", "rollout.engine=remote", f"rollout.remote.base_url={server}",
            "rollout.remote.canary_tolerance=1e-4", "optim.lr=0.1")
    assert len(calls) == 2 and len(read_metrics(tmp_path / "run")) <= 1  # no batch after the failed push


def test_weights_changed_behind_the_trainers_back_are_refused_before_a_batch(server, tiny_model_dir, tmp_path,
                                                                               admin):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    cfg = grpo_cfg(f"model={tiny_model_dir}", "rollout.engine=remote", f"rollout.remote.base_url={server}")
    engine = ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))
    params = SamplingParams(n=2, max_new_tokens=3)
    assert len(engine.generate(model, [[5, 6, 7]], params, pad_token_id=0)) == 2
    engine.client.call("/v1/weights", {"path": tiny_model_dir}, token=ADMIN)  # another client's push
    with pytest.raises(StaleWeightsError, match="someone else"):
        engine.generate(model, [[5, 6, 7]], params, pad_token_id=0)
    engine.close()


class FakeServer:
    """A stand-in OpenAI server (stdlib) whose completions lack what ``drop`` names."""

    def __init__(self, drop: str) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply({"object": "list", "data": [{"id": "m", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                choice = {"index": 0, "text": "x", "finish_reason": "length", "token_ids": [3],
                          "logprobs": {"tokens": ["x"], "token_logprobs": [-1.0]}}
                if outer.drop == "token_ids":
                    del choice["token_ids"]
                else:
                    choice["logprobs"] = None
                self.reply({"choices": [dict(choice, index=i) for i in range(body.get("n", 1))]})

        self.drop = drop
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("drop, named", [("token_ids", "token_ids"), ("logprobs", "logprobs.token_logprobs")])
def test_a_server_without_token_ids_or_logprobs_is_refused_at_start_naming_it(tiny_model_dir, tmp_path, drop, named):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    fake = FakeServer(drop)
    try:
        cfg = grpo_cfg("rollout.engine=remote", f"rollout.remote.base_url={fake.url}",
                       "rollout.remote.weight_push=none")
        with pytest.raises(UserError, match=named) as e:
            ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))
        assert fake.url in str(e.value) and "\n" not in str(e.value)
    finally:
        fake.close()


def test_bad_remote_keys_name_the_key():
    with pytest.raises(ConfigError, match="rollout.remote.base_url"):
        grpo_cfg("rollout.engine=remote")
    for key, value in (("weight_push", "ftp"), ("max_concurrency", "0"), ("timeout_s", "0"),
                       ("canary_tolerance", "-1"), ("base_url", "localhost:8000")):
        with pytest.raises(ConfigError, match=f"rollout.remote.{key}"):
            grpo_cfg("rollout.engine=remote", "rollout.remote.base_url=http://127.0.0.1:1",
                     f"rollout.remote.{key}={value}")
    with pytest.raises(ConfigError, match="rollout.remote.bogus"):
        grpo_cfg("rollout.engine=remote", "rollout.remote.base_url=http://127.0.0.1:1", "rollout.remote.bogus=1")
    with pytest.raises(ConfigError, match="rollout.precision"):
        grpo_cfg("rollout.engine=remote", "rollout.remote.base_url=http://127.0.0.1:1", "rollout.precision=bf16")
    with pytest.raises(ConfigError, match="'backend' does not work with rollout.engine: remote"):
        grpo_cfg("rollout.engine=remote", "rollout.remote.base_url=http://127.0.0.1:1", "backend=ray")


def test_an_unreachable_server_is_one_line_naming_base_url(tiny_model_dir, tmp_path):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    url = f"http://127.0.0.1:{free_port()}"
    cfg = grpo_cfg("rollout.engine=remote", f"rollout.remote.base_url={url}", "rollout.remote.timeout_s=5")
    with pytest.raises(UserError, match="cannot reach") as e:
        ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))
    assert url in str(e.value) and "\n" not in str(e.value)


def test_without_an_admin_token_the_disk_push_says_which_key(server, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("RLVR_ADMIN_TOKEN", raising=False)
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    cfg = grpo_cfg("rollout.engine=remote", f"rollout.remote.base_url={server}")
    with pytest.raises(ConfigError, match="rollout.remote.admin_token"):
        ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))
    cfg = grpo_cfg("rollout.engine=remote", f"rollout.remote.base_url={server}", "rollout.remote.admin_token=wrong")
    with pytest.raises(UserError, match="HTTP 403"):
        ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))


def test_weight_push_none_serves_a_fixed_policy_and_says_so(server, tiny_model_dir, tmp_path, admin):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    cfg = grpo_cfg("rollout.engine=remote", f"rollout.remote.base_url={server}")
    ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0)).close()  # start weights
    before = server_version(server)
    cfg = grpo_cfg("rollout.engine=remote", f"rollout.remote.base_url={server}", "rollout.remote.weight_push=none")
    with pytest.warns(UserWarning, match="off-policy"):
        engine = ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    engine.push(model, 1)  # nothing is sent: the version follows the trainer, the server keeps its weights
    assert engine.version == 1 and server_version(server) == before
    assert len(engine.generate(model, [[5, 6, 7]], SamplingParams(n=2, max_new_tokens=3), pad_token_id=0)) == 2
    engine.close()
    # the canary at start: the server does not serve the halved weights
    with pytest.raises(StaleWeightsError), pytest.warns(UserWarning):
        ROLLOUT_ENGINES.get("remote")(EngineSetup(model, tok, cfg.rollout, tmp_path, tiny_model_dir, 1, 0))


def test_multi_turn_episodes_through_the_server_are_token_faithful(server, tiny_model_dir, tmp_path, admin):
    """Episodes through the seam: each turn one request per prompt (no K/V handed over), the
    policy's log-probs equal a fresh forward over the whole trajectory, the segments make its ids."""
    trainer, tok = load_model_and_tokenizer(tiny_model_dir)
    cfg = grpo_cfg("rollout.engine=remote", f"rollout.remote.base_url={server}")
    engine = ROLLOUT_ENGINES.get("remote")(EngineSetup(trainer, tok, cfg.rollout, tmp_path, tiny_model_dir, 0, 0))
    try:
        assert_token_faithful(trainer, echo_episodes(trainer, tok, engine))
    finally:
        engine.close()
