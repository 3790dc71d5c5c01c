"""``rlvr serve``: real server processes on loopback ports, driven by the official ``openai`` client.

The served model is the tiny test model fitted for a second (a plain torch loop) to answer one
question with a tool call, so that chat, streaming and tool calls have a known greedy output.
A second server runs ``--batching none --max-waiting 1``: the one-at-a-time reference for the
equivalence test, and the queue that overflows (429).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
QUESTION = [{"role": "user", "content": "weather in Paris?"}]
REPLY = 'Ok. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
ADMIN = "test-admin-token"


def _fit_tool_model(src: str, dst: Path) -> None:
    """The tiny model, fitted to answer QUESTION (with TOOLS) by REPLY."""
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.model.tokenizer import encode_chat_prompt, encode_completion

    model, tok = load_model_and_tokenizer(src)
    prompt = encode_chat_prompt(tok, QUESTION, TOOLS)
    ids = torch.tensor([prompt + encode_completion(tok, REPLY)])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~2 s; several times that with threads contending for 2 busy cores
    try:
        for _ in range(100):
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.05
    save_model_dir(dst, model.eval(), tok)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rlvr_command() -> str:
    """The ``rlvr`` console script of this environment: servers start the way the README shows."""
    path = Path(sys.executable).parent / "rlvr"
    assert path.is_file(), f"{path} is missing: install rlvr into this environment (make setup)"
    return str(path)


class Server:
    def __init__(self, model_dir: str, *flags: str, port: int | None = None):
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # one torch thread each: two servers and the test process share the CPU cores
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "RLVR_ADMIN_TOKEN": ADMIN, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([rlvr_command(), "serve", "--model", model_dir, "--port",
                                      str(self.port), "--model-name", "tiny", "--device", "cpu", *flags],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def wait_ready(self, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if http(self.url + "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("server not ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def http(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict | str]:
    """(status, JSON body) of a GET, or of a POST of ``body``."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@pytest.fixture(scope="module")
def dirs(tiny_model_dir, tmp_path_factory):
    tool_dir = tmp_path_factory.mktemp("serve") / "tool-model"
    _fit_tool_model(tiny_model_dir, tool_dir)
    return {"tool": str(tool_dir), "random": tiny_model_dir}


@pytest.fixture(scope="module")
def servers(dirs):
    main = Server(dirs["tool"], "--max-batch", "4", "--max-waiting", "16")
    single = Server(dirs["tool"], "--batching", "none", "--max-waiting", "1")
    try:
        main.wait_ready()
        single.wait_ready()
        yield main, single
    finally:
        main.stop()
        single.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def model_and_tok(dirs):
    from rlvr.model.load import load_model_and_tokenizer

    return load_model_and_tokenizer(dirs["tool"])


def test_chat_and_tool_call(server):
    r = server.client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS, temperature=0,
                                              max_tokens=90)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Ok. "
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.usage.completion_tokens > 0 and r.system_fingerprint == "rlvr-v0"
    # without tools (tool_choice none) the same reply is plain text with the tags
    plain = server.client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=20)
    assert plain.choices[0].message.tool_calls is None


def test_streaming_matches_non_streamed(server):
    kw = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 30}
    whole = server.client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(server.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole and len([c for c in chunks if c.choices]) > 3
    assert chunks[-1].usage.completion_tokens > 0
    # with tools: the content streams, the call comes whole in the last chunk
    chunks = list(server.client.chat.completions.create(**{**kw, "max_tokens": 90}, tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Ok. "
    last = chunks[-1].choices[0]
    assert last.finish_reason == "tool_calls" and last.delta.tool_calls[0].function.name == "get_weather"
    # token ids stream too, held-back text or not
    whole = server.client.chat.completions.create(**{**kw, "max_tokens": 90}, tools=TOOLS,
                                                  extra_body={"return_token_ids": True})
    chunks = list(server.client.chat.completions.create(**{**kw, "max_tokens": 90}, tools=TOOLS, stream=True,
                                                        extra_body={"return_token_ids": True}))
    assert [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids") or []] == \
        whole.choices[0].model_extra["token_ids"]
    assert chunks[-1].model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]


def test_tool_history_renders_as_tool_call_text(server, model_and_tok):
    from rlvr.model.tokenizer import encode_chat_prompt

    _, tok = model_and_tok
    messages = [*QUESTION, {"role": "assistant", "content": "Ok. ", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = server.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=2,
                                              extra_body={"return_token_ids": True})
    expected = encode_chat_prompt(tok, [*QUESTION, {"role": "assistant", "content": REPLY},
                                        {"role": "tool", "name": "get_weather", "content": "sunny"}], TOOLS)
    assert r.model_extra["prompt_token_ids"] == expected
    assert len(r.choices[0].model_extra["token_ids"]) == 2


def test_n_seed_and_stop(server):
    kw = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 1.0}
    a = server.client.chat.completions.create(**kw, n=3, seed=7)
    b = server.client.chat.completions.create(**kw, n=3, seed=7)
    c = server.client.chat.completions.create(**kw, n=3, seed=8)
    texts = [x.message.content for x in a.choices]
    assert [x.index for x in a.choices] == [0, 1, 2] and len(set(texts)) > 1
    assert texts == [x.message.content for x in b.choices] != [x.message.content for x in c.choices]
    r = server.client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS, temperature=0,
                                              max_tokens=90, stop=["get_weather"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == 'Ok. <tool_call>{"name": "'


def test_completions_token_ids_and_logprobs(server, model_and_tok):
    from rlvr.model.logprobs import sequence_logprobs

    model, _ = model_and_tok
    prompt = [5, 40, 41, 42, 17, 60]
    r = server.client.completions.create(model="tiny", prompt=[prompt, prompt[:3]], max_tokens=8, logprobs=0,
                                         temperature=1.0, seed=1, extra_body={"return_token_ids": True})
    assert len(r.choices) == 2
    for choice, p in zip(r.choices, [prompt, prompt[:3]]):
        ids = choice.model_extra["token_ids"]
        assert choice.model_extra["prompt_token_ids"] == p and len(ids) == 8
        full = torch.tensor([p + ids])
        with torch.no_grad():
            ref = sequence_logprobs(model, full, torch.ones_like(full))[0, len(p):]
        assert torch.allclose(torch.tensor(choice.logprobs.token_logprobs), ref, atol=1e-4)
    # echo: the prompt's log-probs, as the training forward gives them (the weight canary)
    e = server.client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    lps = e.choices[0].logprobs.token_logprobs
    full = torch.tensor([prompt])
    with torch.no_grad():
        ref = sequence_logprobs(model, full, torch.ones_like(full))[0, 1:]
    assert lps[0] is None and torch.allclose(torch.tensor(lps[1:]), ref, atol=1e-4)
    # ignore_eos: exactly max_tokens, EOS or not; stop_token_ids: stops on the first of them
    fixed = server.client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=1.0, seed=2,
                                             extra_body={"ignore_eos": True, "return_token_ids": True})
    ids = fixed.choices[0].model_extra["token_ids"]
    assert len(ids) == 30 and fixed.choices[0].finish_reason == "length"
    cut = server.client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=1.0, seed=2,
                                           extra_body={"ignore_eos": True, "stop_token_ids": [ids[4]],
                                                       "return_token_ids": True})
    assert cut.choices[0].model_extra["token_ids"] == ids[:ids.index(ids[4]) + 1]
    assert cut.choices[0].finish_reason == "stop"
    # streaming completions reassemble to the same text
    kw = {"model": "tiny", "prompt": "1+2=", "max_tokens": 10, "temperature": 0}
    whole = server.client.completions.create(**kw).choices[0].text
    assert "".join(c.choices[0].text for c in server.client.completions.create(**kw, stream=True)) == whole


def test_models_health_metrics(server):
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    status, body = http(server.url + "/health")
    assert status == 200 and body["status"] == "ok"
    _, text = http(server.url + "/metrics")
    for name in ("rlvr_serve_requests_total", "rlvr_serve_completion_tokens_total", "rlvr_serve_running",
                 "rlvr_serve_waiting", "rlvr_serve_prefix_cache_hits_total", "rlvr_serve_request_latency_seconds"):
        assert name in text
    before = _metric(text, "rlvr_serve_completion_tokens_total")
    server.client.completions.create(model="tiny", prompt="1", max_tokens=3, temperature=0)
    _, text = http(server.url + "/metrics")
    assert _metric(text, "rlvr_serve_completion_tokens_total") == before + 3
    assert 'endpoint="/v1/completions",status="200"' in text


def _metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


@pytest.mark.parametrize("body,param", [
    ({"model": "tiny"}, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]},
     "messages[1].role"),
    ({"model": "tiny", "messages": QUESTION, "temperature": -0.5}, "temperature"),
    ({"model": "tiny", "messages": QUESTION, "n": 0}, "n"),
    ({"model": "tiny", "messages": QUESTION, "max_tokens": 100000}, "max_tokens"),
    ({"model": "tiny", "messages": QUESTION, "stop": 5}, "stop"),
    ({"model": "tiny", "messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_malformed_requests_name_the_field(server, body, param):
    status, out = http(server.url + "/v1/chat/completions", body)
    assert status == 400 and out["error"]["param"] == param, out
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["message"]


def test_unknown_model_bad_json_and_openai_client_errors(server):
    with pytest.raises(openai.NotFoundError) as e:
        server.client.chat.completions.create(model="other", messages=QUESTION)
    assert e.value.body["param"] == "model"
    req = urllib.request.Request(server.url + "/v1/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model="tiny", prompt=[[1, 2, 99999]], max_tokens=1)
    assert e.value.body["param"] == "prompt"



def test_top_logprobs_are_the_policys_most_likely_tokens(server, model_and_tok):
    """Chat ``top_logprobs`` and completions ``logprobs: N``: at each generated position the N most
    likely tokens under the plain policy, most likely first, as a forward pass of the model gives them."""
    model, tok = model_and_tok
    kw = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 6, "logprobs": True,
          "top_logprobs": 3, "extra_body": {"return_token_ids": True}}
    r = server.client.chat.completions.create(**kw)
    prompt, gen = r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]
    with torch.no_grad():
        ref = model(torch.tensor([prompt + gen])).logits[0].float().log_softmax(-1)
    items = r.choices[0].logprobs.content
    assert len(items) == len(gen)
    for j, item in enumerate(items):
        values, ids = ref[len(prompt) - 1 + j].topk(3)
        assert [a.logprob for a in item.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)
        assert [a.token for a in item.top_logprobs] == [tok.decode([t]) for t in ids.tolist()]
        assert item.top_logprobs[0].token == item.token  # greedy: the sampled token is the most likely
    # streamed: the same alternatives, chunk by chunk
    chunks = list(server.client.chat.completions.create(**kw, stream=True))
    streamed = [a for c in chunks if c.choices and c.choices[0].logprobs for a in c.choices[0].logprobs.content]
    assert [[x.logprob for x in a.top_logprobs] for a in streamed] == [[x.logprob for x in a.top_logprobs]
                                                                       for a in items]
    # completions: logprobs N gives {token text: log-prob} of the N most likely per position
    c = server.client.completions.create(model="tiny", prompt="1+2=", max_tokens=4, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) and all(len(d) <= 2 for d in lp.top_logprobs)
    assert all(d[t] == pytest.approx(x, abs=1e-6) for d, t, x in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs))
    # refused: alternatives without logprobs, more than 20
    for bad, param in (({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
                       ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as e:
            server.client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2, **bad)
        assert param in json.dumps(e.value.body)


def test_structured_output_is_refused_not_answered_with_free_text(server):
    """A JSON response_format would need constrained decoding, which is not built: a 400 naming the
    field (never a 200 with text that may not parse); ``text`` is served."""
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}):
        with pytest.raises(openai.BadRequestError) as e:
            server.client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=4, response_format=fmt)
        assert e.value.body["param"] == "response_format" and "constrain" in e.value.body["message"]
    r = server.client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=4,
                                              response_format={"type": "text"})
    assert r.choices[0].message.content is not None


def test_continuous_batching_equals_one_at_a_time(servers):
    main, single = servers
    prompts = ["1+2=", "what is 3*4? ", "the answer is", "9", "12+30=", "hello there"]
    lengths = [30, 12, 25, 40, 8, 20]

    def ids(server, i):
        r = server.client.completions.create(model="tiny", prompt=prompts[i], max_tokens=lengths[i], temperature=0,
                                             extra_body={"return_token_ids": True})
        return r.choices[0].model_extra["token_ids"]

    out: dict[int, list[int]] = {}
    _, text = http(main.url + "/metrics")
    steps0, tokens0 = _metric(text, "rlvr_serve_steps_total"), _metric(text, "rlvr_serve_generated_tokens_total")
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, ids(main, i))) for i in range(len(prompts))]
    for t in threads:
        t.start()
        time.sleep(0.01)  # staggered: requests join a batch already decoding
    for t in threads:
        t.join(60)
    _, text = http(main.url + "/metrics")
    steps = _metric(text, "rlvr_serve_steps_total") - steps0
    tokens = _metric(text, "rlvr_serve_generated_tokens_total") - tokens0
    assert steps < tokens - len(prompts)  # one at a time, each request takes (its tokens - 1) steps
    assert [out[i] for i in range(len(prompts))] == [ids(single, i) for i in range(len(prompts))]


def test_queue_full_is_429_not_a_hang(servers):
    _, single = servers
    codes: list[int] = []

    def one():
        status, _ = http(single.url + "/v1/completions", {"model": "tiny", "prompt": "1", "max_tokens": 200,
                                                          "temperature": 0})
        codes.append(status)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(codes) == 6 and 429 in codes and 200 in codes and set(codes) <= {200, 429}


def test_client_disconnect_cancels(server):
    _, text = http(server.url + "/metrics")
    before = _metric(text, "rlvr_serve_generated_tokens_total")
    stream = server.client.completions.create(model="tiny", prompt=[5], max_tokens=250, temperature=0, stream=True,
                                              extra_body={"ignore_eos": True})
    cancelled = _metric(text, "rlvr_serve_cancelled_total")
    next(iter(stream))
    stream.close()
    end = time.monotonic() + 30
    while time.monotonic() < end:  # until the server has seen the disconnect (no fixed wait)
        _, text = http(server.url + "/metrics")
        if _metric(text, "rlvr_serve_cancelled_total") > cancelled and _metric(text, "rlvr_serve_running") == 0:
            break
    assert _metric(text, "rlvr_serve_cancelled_total") == cancelled + 1 and _metric(text, "rlvr_serve_running") == 0
    assert _metric(text, "rlvr_serve_generated_tokens_total") - before < 250  # stopped before its length


def test_weight_update_auth_and_version(server, dirs):
    url = server.url + "/v1/weights"
    assert http(url, {"path": dirs["random"]})[0] == 401
    assert http(url, {"path": dirs["random"]}, {"Authorization": "Bearer wrong"})[0] == 403
    status, out = http(url, {"path": "/nonexistent"}, {"Authorization": f"Bearer {ADMIN}"})
    assert status == 400 and out["error"]["param"] == "path"
    kw = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 20}
    before = server.client.chat.completions.create(**kw).choices[0].message.content
    status, out = http(url, {"path": dirs["random"]}, {"Authorization": f"Bearer {ADMIN}"})
    assert status == 200 and out["version"] == 1
    after = server.client.chat.completions.create(**kw)
    assert after.choices[0].message.content != before and after.system_fingerprint == "rlvr-v1"
    assert server.client.models.list().data[0].model_extra["version"] == 1
    status, out = http(url, {"path": dirs["tool"]}, {"Authorization": f"Bearer {ADMIN}"})
    assert out["version"] == 2
    assert server.client.chat.completions.create(**kw).choices[0].message.content == before


def test_health_is_503_while_loading():
    from fastapi.testclient import TestClient

    from rlvr.serve.app import create_app

    gate, failed = threading.Event(), threading.Event()

    def load():
        gate.wait(10)
        raise RuntimeError("no model here")

    app = create_app(load, model_name="m", on_load_error=lambda e: failed.set())
    with TestClient(app) as client:
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert client.post("/v1/completions", json={"model": "m", "prompt": "x"}).status_code == 503
        gate.set()
        assert failed.wait(10)  # the load has failed and said so
        r = client.get("/health")
        assert r.status_code == 503 and "no model here" in r.json()["error"]


def test_non_loopback_host_needs_an_api_key(monkeypatch):
    from rlvr.errors import ConfigError
    from rlvr.serve.config import ServeConfig

    monkeypatch.delenv("RLVR_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="--api-key"):
        ServeConfig(model="m", host="0.0.0.0")
    assert ServeConfig(model="m", host="0.0.0.0", api_key="k").api_key == "k"


def test_fast_mode_serves_what_the_normal_mode_serves(servers, dirs):
    """``rlvr serve --fast`` (prefix cache + speculative decoding; the draft here is the model
    itself, so every proposal is accepted): the same greedy tool call and token ids as the normal
    server, the second request with the same system prompt hitting the prefix cache."""
    main, _ = servers
    fast = Server(dirs["tool"], "--fast", "--draft", dirs["tool"], "--spec-tokens", "3")
    try:
        fast.wait_ready()
        r = fast.client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS, temperature=0,
                                                max_tokens=90)
        assert r.choices[0].finish_reason == "tool_calls"
        assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
        system = [{"role": "system", "content": "You are a careful assistant. " * 6}]

        def ids(server, text):
            out = server.client.chat.completions.create(
                model="tiny", messages=system + [{"role": "user", "content": text}], temperature=0, max_tokens=12,
                extra_body={"return_token_ids": True})
            return out.choices[0].model_extra["token_ids"]

        for text in ("1+2=", "what is 3*4?"):
            assert ids(fast, text) == ids(main, text)
        _, metrics = http(fast.url + "/metrics")
        assert _metric(metrics, "rlvr_serve_prefix_cache_hits_total") >= 1
        assert _metric(metrics, "rlvr_serve_prefix_cache_tokens_reused_total") >= 16
        proposed = _metric(metrics, "rlvr_serve_spec_proposed_total")
        assert 0 < _metric(metrics, "rlvr_serve_spec_accepted_total") <= proposed
    finally:
        fast.stop()


@pytest.mark.parametrize("broken", ["missing", "no_tokenizer", "bad_config"])
def test_rlvr_serve_refuses_a_missing_or_broken_model_in_one_line(dirs, tmp_path, broken):
    model = tmp_path / "model"
    if broken != "missing":
        shutil.copytree(dirs["tool"], model)
        if broken == "no_tokenizer":
            for name in ("tokenizer.json", "tokenizer_config.json"):
                (model / name).unlink()
        else:
            (model / "config.json").write_text("{not json")
    proc = subprocess.run([rlvr_command(), "serve", "--model", str(model), "--port", str(_free_port())],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith("rlvr: error: "), proc.stderr
    assert str(model) in errors[0]


def test_a_prompt_longer_than_the_context_is_a_400_naming_it(server):
    status, body = http(server.url + "/v1/completions", {"model": "tiny", "prompt": "7 " * 5000, "max_tokens": 4})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert body["error"]["param"] == "prompt" and "the context is" in body["error"]["message"]
    status, body = http(server.url + "/v1/chat/completions",
                        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "max_tokens"


def test_a_server_killed_with_requests_in_flight_fails_them_fast_and_a_restart_serves(dirs):
    """SIGKILL while 4 streams are mid-generation: every client gets an error at once (none hangs
    to its timeout), nothing of the server outlives it, and a server started again on the same
    port answers."""
    import signal

    from procs import descendants

    server = Server(dirs["tool"], "--max-batch", "4")
    try:
        server.wait_ready()
        streams = [server.client.completions.create(model="tiny", prompt=[5], max_tokens=250, temperature=0,
                                                    stream=True, extra_body={"ignore_eos": True}) for _ in range(4)]
        for s in streams:
            next(iter(s))  # each is generating
        family = [server.proc.pid, *descendants(server.proc.pid)]
        start = time.monotonic()
        os.kill(server.proc.pid, signal.SIGKILL)
        outcomes = []
        for s in streams:
            try:
                for _ in s:
                    pass
                outcomes.append("finished")
            except Exception as e:  # noqa: BLE001 - what the openai client raises on a dropped connection
                outcomes.append(type(e).__name__)
        assert "finished" not in outcomes and time.monotonic() - start < 10, outcomes
        server.proc.wait(timeout=10)
        assert not [p for p in family if Path(f"/proc/{p}").exists() and
                    Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"], family
    finally:
        server.stop()
    again = Server(dirs["tool"], port=server.port)  # the same port: the killed one freed it
    try:
        again.wait_ready()
        assert again.client.completions.create(model="tiny", prompt=[5], max_tokens=3).usage.completion_tokens == 3
    finally:
        again.stop()
