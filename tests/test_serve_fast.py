"""The fast mode's serving engines. ``FastEngine`` (with a draft): greedy tokens equal the
target's own greedy decode with speculation and the prefix cache on, concurrent requests, the
shared system prompt hits the cache, stop strings / cancel / bounds / weight updates, int8 target.
``Batcher`` with the prefix cache and int8 (``--fast`` without a draft): the normal mode's tokens,
fewer prompt tokens prefilled, the cache cleared and the int8 copy rebuilt on a weight update."""

from __future__ import annotations

import threading
import time

import pytest
from fast_models import DRAFT, PAD, TARGET, arith_tokenizer, noisy_model

from rlvr.model.quantize import quantize_int8
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.serve.batcher import Batcher, wait_idle
from rlvr.serve.fast import FastEngine
from rlvr.serve.types import GenRequest, QueueFull, ServingEngine


@pytest.fixture(scope="module")
def tok():
    return arith_tokenizer()


@pytest.fixture(scope="module")
def target(tok):
    return noisy_model(TARGET, tok, 0)


@pytest.fixture(scope="module")
def draft(tok):
    return noisy_model(DRAFT, tok, 1)


def system_prompts(tok) -> list[list[int]]:
    system = tok("You are a careful calculator. Compute each sum and answer with the number. " * 2)["input_ids"]
    return [system + tok(f"Compute: {a} + {b}")["input_ids"] for a, b in ((3, 4), (12, 9), (7, 7), (1, 20))]


def run(engine, requests: list[GenRequest]) -> list[list]:
    """Submit every request from its own thread at once; each thread's events."""
    events: list[list] = [[] for _ in requests]

    def client(i):
        events[i] = list(engine.submit(requests[i]).iter_sync(timeout=60))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return events


def greedy_ref(model, prompts, T):
    return [c.token_ids for c in generate(model, prompts, SamplingParams(max_new_tokens=T, temperature=0.0,
                                                                         stop_token_ids=()), pad_token_id=PAD)]


def test_greedy_tokens_are_the_targets_and_the_system_prompt_hits_the_cache(tok, target, draft):
    engine = FastEngine(target, tok, draft=draft, spec_tokens=3, max_batch=3)
    try:
        assert isinstance(engine, ServingEngine)
        prompts = system_prompts(tok)
        reqs = [GenRequest(p, max_tokens=12 + i, temperature=0.0, stop_token_ids=()) for i, p in enumerate(prompts)]
        ref = greedy_ref(target, prompts, 16)
        for _ in range(2):  # the second pass starts from cached prefixes
            events = run(engine, reqs)
            for i, ev in enumerate(events):
                assert [e.token_id for e in ev] == ref[i][: 12 + i]
                assert ev[-1].finish_reason == "length" and all(e.finish_reason is None for e in ev[:-1])
                assert all(e.logprob is not None and e.logprob <= 0 for e in ev)
        assert wait_idle(engine)
        s = engine.stats()
        assert s["prefix_cache_hits"] >= 4 and s["waves"] >= 2 and s["spec_proposed"] > 0
        assert s["running"] == 0 and s["waiting"] == 0 and s["generated_tokens"] == 2 * sum(12 + i for i in range(4))
    finally:
        engine.close()


def test_stop_strings_zero_tokens_cancel_and_bounds(tok, target, draft):
    engine = FastEngine(target, tok, draft=draft, spec_tokens=2, max_waiting=2, max_context=64)
    try:
        prompt = tok("Compute: 3 + 4")["input_ids"]
        ref = greedy_ref(target, [prompt], 20)[0]
        stop_text = tok.decode(ref[:6])[-2:]
        ev = run(engine, [GenRequest(prompt, max_tokens=20, temperature=0.0, stop_token_ids=(), stop=(stop_text,))])[0]
        assert ev[-1].finish_reason == "stop" and stop_text in tok.decode([e.token_id for e in ev])
        assert [e.token_id for e in ev] == ref[: len(ev)] and len(ev) <= 6
        assert run(engine, [GenRequest(prompt, max_tokens=0)])[0] == [ev[-1].__class__(None, None, "length", 0)]
        with pytest.raises(ValueError, match="exceeds the context"):
            engine.submit(GenRequest(prompt, max_tokens=60))
        h = engine.submit(GenRequest(prompt, max_tokens=40, temperature=1.0, seed=1))
        engine.cancel(h)
        assert list(h.iter_sync(timeout=30))[-1].finish_reason == "abort"
    finally:
        engine.close()
    with pytest.raises(Exception, match="shutting down"):
        engine.submit(GenRequest(prompt, max_tokens=1))


def test_queue_bound(tok, target):
    engine = FastEngine(target, tok, max_waiting=0)
    try:
        with pytest.raises(QueueFull):
            engine.submit(GenRequest([5, 6], max_tokens=2))
    finally:
        engine.close()


def test_sampled_requests_run_with_speculation(tok, target, draft):
    engine = FastEngine(target, tok, draft=draft, spec_tokens=3)
    try:
        events = run(engine, [GenRequest(p, max_tokens=10, temperature=0.9, top_p=0.95, stop_token_ids=(), seed=3)
                              for p in system_prompts(tok)])
        assert all(len(ev) == 10 and ev[-1].finish_reason == "length" for ev in events)
    finally:
        engine.close()


def test_int8_target_runs_on_the_fast_decoder_with_the_cache_and_takes_weight_updates(tok, target, draft, tmp_path):
    engine = FastEngine(target, tok, draft=draft, quantize="int8", spec_tokens=3)
    try:
        assert engine.cache is not None  # the fast decoder runs int8: its K/V are cached
        prompts = system_prompts(tok)[:2]
        ref = greedy_ref(quantize_int8(target), prompts, 8)
        for _ in range(2):  # per-token activation scales: the int8 greedy decode, batched or not, cached or not
            got = [[e.token_id for e in ev] for ev in
                   run(engine, [GenRequest(p, max_tokens=8, temperature=0.0, stop_token_ids=()) for p in prompts])]
            assert got == ref
        assert engine.stats()["prefix_cache_hits"] >= 2
        new = noisy_model(TARGET, tok, 7)
        new.save_pretrained(tmp_path)
        assert engine.load_weights(str(tmp_path)) == 1 and len(engine.cache) == 0
        ev = run(engine, [GenRequest(prompts[0], max_tokens=1, temperature=0.0, stop_token_ids=())])[0]
        assert [e.token_id for e in ev] == greedy_ref(quantize_int8(new), prompts[:1], 1)[0] and ev[0].version == 1
    finally:
        engine.close()


def test_fast_batcher_gives_the_normal_modes_tokens_and_prefills_less(tok, target):
    """``--fast`` without a draft: continuous batching with the prefix cache. Same greedy tokens
    as the normal mode; the second pass prefills only each prompt's tail after the cached
    system-prompt blocks (counted through ``DecodeState.prefill``'s columns)."""
    import rlvr.rollout.kv_cache as kv

    prompts = system_prompts(tok)
    reqs = [GenRequest(p, max_tokens=10, temperature=0.0, stop_token_ids=()) for p in prompts]
    cols: list[int] = []
    real = kv.DecodeState._prefill_layer

    def counting(self, p, x, li, L):
        if li == 0:
            cols.append(x.shape[0] * x.shape[1])
        return real(self, p, x, li, L)

    kv.DecodeState._prefill_layer = counting
    normal, fast = Batcher(target, tok, max_batch=4), Batcher(target, tok, max_batch=4, prefix_cache_bytes=1 << 20)
    try:
        ref = [[e.token_id for e in ev] for ev in run(normal, reqs)]
        assert ref == greedy_ref(target, prompts, 10)
        for rnd in range(2):
            cols.clear()
            got = [[e.token_id for e in ev] for ev in run(fast, reqs)]
            assert got == ref
            if rnd == 1:  # every prompt hit: each runs only its tail (< 2 blocks), not its whole length
                assert sum(cols) < sum(len(p) for p in prompts) // 2
        s = fast.stats()
        assert s["prefix_cache_hits"] >= 4 and s["prefix_cache_entries"] >= 1 and normal.stats()["prefix_cache_hits"] == 0
    finally:
        kv.DecodeState._prefill_layer = real
        normal.close()
        fast.close()


def test_fast_batcher_int8_and_weight_updates(tok, target, tmp_path):
    engine = Batcher(target, tok, max_batch=4, prefix_cache_bytes=1 << 20, quantize="int8")
    try:
        prompts = system_prompts(tok)
        ref = greedy_ref(quantize_int8(target), prompts, 6)
        for _ in range(2):  # cold, then from the cache and the shared prefix: the int8 greedy decode
            got = [[e.token_id for e in ev] for ev in
                   run(engine, [GenRequest(p, max_tokens=6, temperature=0.0, stop_token_ids=()) for p in prompts])]
            assert got == ref
        prompts = prompts[:1]
        assert wait_idle(engine) and len(engine.cache) >= 1
        new = noisy_model(TARGET, tok, 7)
        new.save_pretrained(tmp_path)
        assert engine.load_weights(str(tmp_path)) == 1 and len(engine.cache) == 0
        ev = run(engine, [GenRequest(prompts[0], max_tokens=6, temperature=0.0, stop_token_ids=())])[0]
        assert [e.token_id for e in ev] == greedy_ref(quantize_int8(new), prompts, 6)[0] and ev[-1].version == 1
        assert all(p.dtype.is_floating_point for p in engine.model.parameters())  # updates land in full precision
    finally:
        engine.close()


def test_serve_config_picks_the_fast_engine(tok, target):
    from rlvr.serve.config import SERVING_ENGINES, ServeConfig

    engine = SERVING_ENGINES.get("fast")(ServeConfig(model="unused", fast=True, quantize="int8"), target, tok)
    try:
        assert isinstance(engine, Batcher) and engine.cache is not None and engine.quantize == "int8"
    finally:
        engine.close()


def test_load_weights_bumps_the_version_and_clears_the_cache(tok, target, tmp_path):
    new = noisy_model(TARGET, tok, 7)
    new.save_pretrained(tmp_path)
    engine = FastEngine(noisy_model(TARGET, tok, 0), tok)
    try:
        prompts = system_prompts(tok)[:1]
        run(engine, [GenRequest(prompts[0], max_tokens=4, temperature=0.0, stop_token_ids=())])
        assert wait_idle(engine) and len(engine.cache) == 1
        assert engine.load_weights(str(tmp_path)) == 1 and len(engine.cache) == 0
        ev = run(engine, [GenRequest(prompts[0], max_tokens=6, temperature=0.0, stop_token_ids=())])[0]
        assert [e.token_id for e in ev] == greedy_ref(new, prompts, 6)[0] and ev[-1].version == 1
    finally:
        engine.close()


def test_serve_config_factory_loads_the_draft(tok, target, draft, tmp_path):
    from types import SimpleNamespace

    from rlvr.serve.fast import from_serve_config

    draft.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = SimpleNamespace(draft=str(tmp_path), quantize="", spec_tokens=2, max_batch=4, max_waiting=8,
                          max_context=0, seed=0)
    engine = from_serve_config(cfg, target, tok)
    try:
        assert engine.draft is not None and engine.k == 2 and engine.quantize is None and engine.max_batch == 4
        prompt = system_prompts(tok)[0]
        ev = run(engine, [GenRequest(prompt, max_tokens=5, temperature=0.0, stop_token_ids=())])[0]
        assert [e.token_id for e in ev] == greedy_ref(target, [prompt], 5)[0]
    finally:
        engine.close()


def test_ngram_draft_greedy_tokens_are_the_targets(tok, target):
    from types import SimpleNamespace

    from rlvr.serve.fast import from_serve_config

    cfg = SimpleNamespace(draft="ngram", quantize="", spec_tokens=3, max_batch=4, max_waiting=8, max_context=0, seed=0)
    engine = from_serve_config(cfg, target, tok)
    try:
        assert engine.draft is not None and engine.draft_cache is None and engine.k == 3
        prompts = system_prompts(tok) + [tok("1 2 3 1 2 3 1 2 3 1 2")["input_ids"]]
        ref = greedy_ref(target, prompts, 20)
        events = run(engine, [GenRequest(p, max_tokens=20, temperature=0.0, stop_token_ids=()) for p in prompts])
        for i, ev in enumerate(events):
            assert [e.token_id for e in ev] == ref[i]
        assert wait_idle(engine)
        s = engine.stats()
        assert s["spec_accepted"] > 0 and s["spec_proposed"] > 0
    finally:
        engine.close()
    with pytest.raises(ValueError, match="ngram"):
        FastEngine(target, tok, draft="bigram")


def test_the_speculative_engine_refuses_alternatives_by_name(tok, target, draft):
    """``--fast --draft`` samples through speculation, with no per-step top-k: a request for
    alternatives gets a 400 naming the field; the continuous batcher serves them."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from rlvr.serve.app import create_app
    from rlvr.serve.batcher import Batcher

    prompt = tok.decode(system_prompts(tok)[0])
    for engine, served in ((FastEngine(target, tok, draft=draft, spec_tokens=3), False),
                           (Batcher(target, tok, max_batch=2), True)):
        with TestClient(create_app(lambda engine=engine: (engine, tok), model_name="m")) as client:
            while client.get("/health").status_code != 200:
                time.sleep(0.02)
            r = client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 3, "logprobs": 2})
            assert r.status_code == (200 if served else 400), r.text
            if not served:
                assert r.json()["error"]["param"] == "logprobs"
            r = client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 3, "logprobs": 0})
            assert r.status_code == 200
