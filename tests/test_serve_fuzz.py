"""The HTTP server fuzzed with generated request bodies (a corpus from hypothesis, 200 derandomised
examples per endpoint; schemathesis would fetch nothing offline, but this corpus covers the same
ground: every field of the OpenAPI request models with right, wrong and absent values, unknown
fields, wrong JSON types and bodies that are not objects). Expected: never a 5xx; every rejection a
4xx whose ``error`` names the field (``param``) or says why in its message."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("httpx")  # (the test client's)

from fastapi.testclient import TestClient  # noqa: E402
from test_architectures import build  # noqa: E402

from rlvr.serve.app import create_app  # noqa: E402
from rlvr.serve.batcher import Batcher  # noqa: E402

EXAMPLES = 200
PROFILE = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

junk = st.one_of(st.none(), st.booleans(), st.integers(-10**9, 10**9), st.floats(allow_nan=False),
                 st.text(max_size=12), st.lists(st.integers(-5, 400), max_size=4), st.dictionaries(st.text(max_size=5),
                                                                                                st.integers(), max_size=2))
messages = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "nobody"]),
                                    "content": st.one_of(st.text(max_size=20), junk)}), max_size=3),
    junk)
common = {"model": st.one_of(st.just("m"), junk), "max_tokens": st.one_of(st.integers(-2, 8), junk),
          "temperature": st.one_of(st.floats(-1, 3, allow_nan=False), junk), "top_p": st.one_of(st.floats(0, 1), junk),
          "n": st.one_of(st.integers(-1, 3), junk), "stream": st.one_of(st.booleans(), junk),
          "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=5), junk),
          "seed": st.one_of(st.integers(-3, 10**12), junk), "logprobs": junk, "unknown_field": junk}
chat_bodies = st.fixed_dictionaries({"messages": messages}, optional={
    **common, "tools": st.one_of(st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.text(max_size=8)})}), max_size=2), junk), "tool_choice": junk, "top_logprobs": junk})
completion_bodies = st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=20), st.lists(st.integers(-3, 400), max_size=6),
                                                               junk)},
                                          optional={**common, "echo": st.one_of(st.booleans(), junk)})
bodies = {"/v1/chat/completions": st.one_of(chat_bodies, junk), "/v1/completions": st.one_of(completion_bodies, junk)}


@pytest.fixture(scope="module")
def client():
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    import rlvr.tasks  # noqa: F401

    tokenizer = train_tokenizer(DOMAINS.get("math.arith").corpus(0, 50), vocab_size=300)
    app = create_app(lambda: (Batcher(build("llama", tokenizer), tokenizer, max_context=64), tokenizer), model_name="m")
    with TestClient(app) as c:
        while c.get("/health").status_code != 200:  # until the engine has loaded
            time.sleep(0.01)
        yield c


def _check(client, path: str, body) -> None:
    r = client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (r.status_code, body, r.text[:300])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["message"] and "\n" not in error["message"], error
        assert error.get("param") or error.get("code"), error


@PROFILE
@given(bodies["/v1/chat/completions"])
def test_chat_completions_never_answers_5xx(client, body):
    _check(client, "/v1/chat/completions", body)


@PROFILE
@given(bodies["/v1/completions"])
def test_completions_never_answers_5xx(client, body):
    _check(client, "/v1/completions", body)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe", b'{"prompt": "x"' + b" " * 10])
def test_bodies_that_are_not_json_objects_are_400(client, raw):
    r = client.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"], r.text
