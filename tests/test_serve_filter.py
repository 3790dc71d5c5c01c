"""``rlvr serve --filter``: what a completion would say passes through the content rules before
it is sent. A planted secret is redacted (or the text cut before it, and generation stopped), in
one response and in a stream whose chunks split the secret; ``finish_reason`` is
``content_filter`` and the response names the rules; token-level output is refused. The engine
here plays a fixed text token by token, so the secret is known to be generated."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from rlvr.content_filter import ContentFilter  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.serve.app import create_app  # noqa: E402
from rlvr.serve.config import ServeConfig  # noqa: E402
from rlvr.serve.types import RequestHandle, TokenEvent  # noqa: E402

KEY, CARD = "AKIAIOSFODNN7EXAMPLE", "4111 1111 1111 1111"
FILLER = "Let me look that up for you, one moment please. " * 4  # longer than what a stream keeps back
TEXT = f"Sure. {FILLER}The key is {KEY} and the owner is jane.doe@example.com; {FILLER}pay with {CARD} today."


@pytest.fixture(scope="module")
def tokenizer():
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    return train_tokenizer(DOMAINS.get("math.word").corpus(0, 100), vocab_size=320)


class ScriptedEngine:
    """Plays ``text``'s tokens as a generation, one every millisecond; a cancel ends it (abort)."""

    max_context, ready, version = 4096, True, 0

    def __init__(self, tokenizer, text: str):
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        self.cancels = 0

    def submit(self, request) -> RequestHandle:
        handle = RequestHandle(request)

        def play():
            for t in self.ids[: request.max_tokens]:
                if handle.cancelled:
                    handle.put(TokenEvent(None, None, "abort"))
                    return
                handle.put(TokenEvent(t, -0.5))
                time.sleep(0.001)
            handle.put(TokenEvent(None, None, "stop"))

        threading.Thread(target=play, daemon=True).start()
        return handle

    def cancel(self, handle: RequestHandle) -> None:
        self.cancels += 1
        handle.cancelled = True

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def client_for(tokenizer, spec: str | None, text: str = TEXT):
    engine = ScriptedEngine(tokenizer, text)
    app = create_app(lambda: (engine, tokenizer), model_name="m", content_filter=ContentFilter.parse(spec or ""))
    return TestClient(app), engine


def ready(client) -> None:
    end = time.monotonic() + 10
    while client.get("/health").status_code != 200 and time.monotonic() < end:
        time.sleep(0.01)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "the key?"}], "max_tokens": 500}


def streamed(client, path: str, body: dict) -> tuple[list[str], list[dict]]:
    """The text pieces and the final choice objects of a streamed response."""
    pieces, finals = [], []
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                piece = choice.get("text") if "text" in choice else choice.get("delta", {}).get("content")
                pieces += [piece] if piece else []
                finals += [choice] if choice.get("finish_reason") else []
    return pieces, finals


def assert_hidden(text: str, secret: str) -> None:
    for k in range(6, len(secret) + 1):  # no part of it either, however the chunks were cut
        assert secret[:k] not in text and secret[-k:] not in text, (secret[:k], text)


def test_without_a_filter_the_secret_is_served_as_generated(tokenizer):
    client, _ = client_for(tokenizer, None)
    with client:
        ready(client)
        r = client.post("/v1/chat/completions", json=CHAT).json()
    assert r["choices"][0]["message"]["content"] == TEXT and r["choices"][0]["finish_reason"] == "stop"


def both_ways(client, path: str, body: dict) -> tuple[dict, list[str], dict]:
    """One response and one stream of the same request: (the response, the streamed pieces, the
    stream's final choice)."""
    r = client.post(path, json=body).json()
    pieces, [final] = streamed(client, path, body)
    return r, pieces, final


def test_redacted_in_one_response_and_in_a_stream_whose_chunks_split_the_secret(tokenizer):
    client, _ = client_for(tokenizer, "all")
    with client:
        ready(client)
        r, pieces, final = both_ways(client, "/v1/chat/completions", CHAT)
        completion, c_pieces, c_final = both_ways(client, "/v1/completions",
                                                  {"model": "m", "prompt": [5], "max_tokens": 500})
    expected = (f"Sure. {FILLER}The key is [redacted:aws_access_key] and the owner is [redacted:email]; "
                f"{FILLER}pay with [redacted:card_number] today.")
    choice = r["choices"][0]
    assert choice["message"]["content"] == expected and choice["finish_reason"] == "content_filter"
    assert choice["content_filter"] == {"action": "redacted", "rules": ["aws_access_key", "email", "card_number"]}
    assert "".join(pieces) == expected and len(pieces) > 20  # token by token, the secrets' tokens among them
    assert final["finish_reason"] == "content_filter" and final["content_filter"]["action"] == "redacted"
    assert completion["choices"][0]["text"] == expected and "".join(c_pieces) == expected
    assert c_final["finish_reason"] == "content_filter"
    for secret in (KEY, CARD, "jane.doe@example.com"):
        assert_hidden("".join(pieces) + "".join(c_pieces), secret)


def test_a_blocked_rule_cuts_the_text_before_it_and_stops_generating(tokenizer):
    client, engine = client_for(tokenizer, "card_number=block,aws_access_key")
    with client:
        ready(client)
        r, pieces, final = both_ways(client, "/v1/chat/completions", CHAT)
    expected = f"Sure. {FILLER}The key is [redacted:aws_access_key] and the owner is jane.doe@example.com; {FILLER}pay with "
    choice = r["choices"][0]
    assert choice["message"]["content"] == expected and choice["finish_reason"] == "content_filter"
    assert choice["content_filter"] == {"action": "blocked", "rules": ["aws_access_key", "card_number"]}
    assert "".join(pieces) == expected and final["content_filter"]["action"] == "blocked"
    assert_hidden("".join(pieces), CARD)
    assert engine.cancels == 2  # each generation was stopped at the blocked match, not played out
    assert r["usage"]["completion_tokens"] < len(engine.ids)


def test_token_level_output_is_refused_with_a_filter(tokenizer):
    client, _ = client_for(tokenizer, "email")
    with client:
        ready(client)
        for path, extra, param in (("/v1/chat/completions", {"logprobs": True}, "logprobs"),
                                   ("/v1/chat/completions", {"return_token_ids": True}, "return_token_ids"),
                                   ("/v1/completions", {"logprobs": 0}, "logprobs"),
                                   ("/v1/completions", {"echo": True}, "echo")):
            body = CHAT if path.endswith("chat/completions") else {"model": "m", "prompt": [5], "max_tokens": 5}
            r = client.post(path, json={**body, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_bad_filter_is_one_config_error():
    with pytest.raises(ConfigError, match="unknown content rule"):
        ServeConfig(model="m", filter="ssn")
    with pytest.raises(ConfigError, match="card_number=hide: the action must be one of redact, block"):
        ServeConfig(model="m", filter="card_number=hide")
    assert ContentFilter.parse("email, card_number=block").actions == {"email": "redact", "card_number": "block"}
