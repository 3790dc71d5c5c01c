"""``rlvr serve`` in process: the continuous batcher against the rollout engine (other families,
GQA, a cache that fills and shifts), and the pure pieces (per-row sampling, text streaming,
tool-call parsing, error field paths)."""

from __future__ import annotations

import time

import pytest
import torch
from test_architectures import build

from rlvr.errors import UserError
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.serve.batcher import Batcher
from rlvr.serve.types import GenRequest


@pytest.fixture(scope="module")
def tokenizer():
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 100) + DOMAINS.get("math.word").corpus(0, 100)
    return train_tokenizer(docs, vocab_size=320)


PROMPTS = [[5, 40, 41, 42], [7, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59], [9], [11, 12, 13, 14, 15, 16]]
LENGTHS = [30, 12, 40, 20]


def _batched(engine: Batcher, gap: float = 0.002) -> list[list[int]]:
    """The prompts' greedy tokens, submitted a little apart (they join a batch already decoding)."""
    handles = []
    for p, n in zip(PROMPTS, LENGTHS):
        handles.append(engine.submit(GenRequest(p, n, temperature=0, stop_token_ids=())))
        time.sleep(gap)
    return [[e.token_id for e in h.iter_sync(timeout=30)] for h in handles]


def _reference(model, tokenizer, backend: str = "auto") -> list[list[int]]:
    """The rollout engine's greedy tokens for the prompts, each cut to its length."""
    out = generate(model, PROMPTS, SamplingParams(max_new_tokens=max(LENGTHS), temperature=0, stop_token_ids=()),
                   pad_token_id=tokenizer.pad_token_id, backend=backend)
    return [c.token_ids[:n] for c, n in zip(out, LENGTHS)]


def test_continuous_batching_matches_the_engine(tokenizer):
    """Rows joining and leaving (and, with a 48-token cache, shifting left) give each request the
    greedy tokens the rollout engine gives it (Qwen3: grouped-query attention and q/k norms)."""
    model = build("qwen3", tokenizer)
    ref = _reference(model, tokenizer)
    for context in (256, 48):
        engine = Batcher(model, tokenizer, max_batch=3, max_context=context)
        try:
            assert _batched(engine) == ref
            assert engine.stats()["steps"] < sum(LENGTHS)  # rows did share steps
        finally:
            engine.close()
    # admitted together, repeated prompts among them: one prefill, each distinct prompt once
    engine = Batcher(model, tokenizer, max_batch=8, max_context=64)
    try:
        with engine._lock:  # (held: all six wait, then join in one turn)
            handles = [engine.submit(GenRequest(p, n, temperature=0, stop_token_ids=()))
                       for p, n in [*zip(PROMPTS, LENGTHS), *zip(PROMPTS[:2], LENGTHS[:2])]]
        out = [[e.token_id for e in h.iter_sync(timeout=30)] for h in handles]
        assert out == [*ref, *ref[:2]] and engine.stats()["steps"] == max(LENGTHS) - 1
    finally:
        engine.close()


def test_a_model_the_fast_decoder_refuses_runs_one_at_a_time(tokenizer):
    model = build("gemma2", tokenizer)
    with pytest.raises(UserError, match="--batching none"):
        Batcher(model, tokenizer, batching="continuous")
    engine = Batcher(model, tokenizer, batching="none", max_context=64)
    try:
        assert engine.backend == "hf"
        assert _batched(engine) == _reference(model, tokenizer, "hf")
    finally:
        engine.close()


def test_seeded_request_ignores_its_batch_and_weights_swap(tokenizer, tmp_path):
    from rlvr.model.checkpoint import save_model_dir

    model = build("llama", tokenizer)
    engine = Batcher(model, tokenizer, max_batch=4)

    def run(others: int, seed: int) -> list[int]:
        extra = [engine.submit(GenRequest(PROMPTS[1], 20, temperature=1.0, stop_token_ids=())) for _ in range(others)]
        h = engine.submit(GenRequest(PROMPTS[0], 20, temperature=0.8, top_p=0.9, seed=seed, stop_token_ids=()))
        out = [e.token_id for e in h.iter_sync(timeout=30)]
        for x in extra:
            list(x.iter_sync(timeout=30))
        return out

    try:
        alone = run(0, 3)
        assert run(3, 3) == alone and run(0, 4) != alone
        other = build("llama", tokenizer)
        with torch.no_grad():
            for p in other.parameters():
                p.mul_(1.5)
        save_model_dir(tmp_path / "other", other, tokenizer)
        assert engine.load_weights(str(tmp_path / "other")) == 1
        h = engine.submit(GenRequest(PROMPTS[0], 5, temperature=0, stop_token_ids=()))
        events = list(h.iter_sync(timeout=30))
        ref = generate(other, [PROMPTS[0]], SamplingParams(max_new_tokens=5, temperature=0, stop_token_ids=()),
                       pad_token_id=tokenizer.pad_token_id)[0].token_ids
        assert [e.token_id for e in events] == ref and {e.version for e in events} == {1}
        save_model_dir(tmp_path / "wrong", build("llama", tokenizer, head_dim=4), tokenizer)
        with pytest.raises(ValueError, match="shape"):
            engine.load_weights(str(tmp_path / "wrong"))
    finally:
        engine.close()


def test_queue_bound_cancel_and_context_limit(tokenizer):
    from rlvr.serve.types import QueueFull

    engine = Batcher(build("llama", tokenizer), tokenizer, max_batch=1, max_waiting=1, max_context=64)
    step = engine._step
    engine._step = lambda: (time.sleep(0.01), step())  # 60 steps outlast the submits and cancels below
    try:
        with pytest.raises(ValueError, match="max_tokens"):
            engine.submit(GenRequest(PROMPTS[0], 61))
        running = engine.submit(GenRequest(PROMPTS[0], 60, temperature=0, stop_token_ids=()))
        first = next(running.iter_sync(timeout=10))  # it has a row and decodes: the next one waits
        assert first.token_id is not None and engine.stats()["running"] == 1
        waiting = engine.submit(GenRequest(PROMPTS[0], 60, stop_token_ids=()))
        with pytest.raises(QueueFull):
            engine.submit(GenRequest(PROMPTS[0], 60))
        engine.cancel(running)
        engine.cancel(waiting)
        assert [e for e in running.iter_sync(timeout=10)][-1].finish_reason == "abort"
        assert [e.finish_reason for e in waiting.iter_sync(timeout=10)][-1] == "abort"
    finally:
        engine.close()


def test_sample_rows_uses_each_rows_own_stream():
    from rlvr.serve.sampling import request_generator, sample_rows

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    a, lp = sample_rows(logits, [0.0, 1.0, 0.7], [1.0, 1.0, 0.5], [request_generator(i) for i in range(3)])
    b, _ = sample_rows(logits[2:], [0.7], [0.5], [request_generator(2)])
    assert a[0] == logits[0].argmax() and a[2] == b[0]
    assert torch.allclose(lp, logits.log_softmax(-1).gather(-1, a[:, None]).squeeze(-1))


def test_text_stream_holds_back_stop_strings_and_tool_calls(tokenizer):
    from rlvr.serve.text import TextStream

    ids = tokenizer("abc STOP def", add_special_tokens=False)["input_ids"]
    s = TextStream(tokenizer, stop=("STOP",))
    sent = "".join(s.add(t) for t in ids)
    assert sent == "abc " and s.text() == "abc "
    ids = tokenizer('Hi <tool_call>{"name": "f"}</tool_call>', add_special_tokens=False)["input_ids"]
    s = TextStream(tokenizer, hold=("<tool_call>",))
    assert "".join(s.add(t) for t in ids) == "Hi "


def test_parse_reply_maps_tool_calls():
    import json

    from rlvr.serve.chat import parse_reply

    r = parse_reply('Sure. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    assert r.content == "Sure. " and r.tool_calls[0]["function"] == {"name": "f", "arguments": json.dumps({"x": 1})}
    assert r.tool_calls[0]["id"].startswith("call_") and r.tool_calls[0]["type"] == "function"
    assert parse_reply('<tool_call>{"name": "f"}</tool_call>').content is None
    bad = parse_reply("<tool_call>{oops}</tool_call>")
    assert bad.tool_calls == [] and bad.content == "<tool_call>{oops}</tool_call>"


def test_field_path():
    from rlvr.serve.errors import field_path

    assert field_path(("body", "messages", 1, "role")) == "messages[1].role"
    assert field_path(("body", "stop", "list[str]", 0)) == "stop[0]"
    assert field_path(("body",)) is None


def test_api_key_guards_the_v1_endpoints(tokenizer):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")  # (the test client's)
    from fastapi.testclient import TestClient

    from rlvr.serve.app import create_app

    model = build("llama", tokenizer)
    app = create_app(lambda: (Batcher(model, tokenizer, max_context=64), tokenizer), model_name="m", api_key="k")
    with TestClient(app) as client:
        end = time.monotonic() + 10
        while client.get("/health").status_code != 200 and time.monotonic() < end:
            time.sleep(0.01)  # until the engine has loaded
        body = {"model": "m", "prompt": [5, 6], "max_tokens": 2}
        assert client.post("/v1/completions", json=body).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        r = client.post("/v1/completions", json=body, headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_a_missing_extra_is_named(monkeypatch, tmp_path):
    import sys

    from rlvr.serve.cli import serve
    from rlvr.serve.config import ServeConfig

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(UserError, match=r"pip install 'rlvr\[fastapi\]' \(missing: uvicorn\)"):
        serve(ServeConfig(model=str(tmp_path)))


def test_a_failed_step_aborts_its_requests_and_the_server_goes_on(tokenizer, monkeypatch):
    engine = Batcher(build("llama", tokenizer), tokenizer, max_batch=2, max_context=64)
    try:
        monkeypatch.setattr(engine.rows, "step", lambda tokens: (_ for _ in ()).throw(RuntimeError("boom")))
        h = engine.submit(GenRequest(PROMPTS[0], 10, temperature=0, stop_token_ids=()))
        assert [e.finish_reason for e in h.iter_sync(timeout=10)][-1] == "abort"
        assert engine.rows.n == 0
        h = engine.submit(GenRequest(PROMPTS[0], 10, temperature=0, stop_token_ids=()))
        assert len([e.token_id for e in h.iter_sync(timeout=10)]) == 10  # a fresh batch after the failure
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_continuous_batching(tokenizer, dtype):
    """On CUDA (the decode step's SDPA path with a boolean mask): fp32 greedy tokens equal the
    engine's; in bf16 the sampled tokens' log-probs stay near the training forward's."""
    from rlvr.model.logprobs import sequence_logprobs

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = build("qwen3", tokenizer).to("cuda", dtype)
    engine = Batcher(model, tokenizer, max_batch=3, max_context=48)
    try:
        got = _batched(engine)
        if dtype == torch.float32:
            assert got == _reference(model, tokenizer)
        handles = [engine.submit(GenRequest(p, n, temperature=1.0, seed=i, stop_token_ids=()))
                   for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
        for p, h in zip(PROMPTS, handles):
            events = list(h.iter_sync(timeout=60))
            ids = torch.tensor([p + [e.token_id for e in events]], device="cuda")
            with torch.no_grad():
                ref = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(p):].float().cpu()
            diff = (ref - torch.tensor([e.logprob for e in events])).abs()
            assert diff.max() < (1e-3 if dtype == torch.float32 else 0.1), diff.max()
    finally:
        engine.close()
