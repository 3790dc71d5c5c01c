"""``/v1/chat/completions`` and ``/v1/completions``: requests to ``GenRequest``s, engine events
to OpenAI responses (one JSON body, or server-sent events ending ``data: [DONE]``).

Each choice is one ``GenRequest`` (``n`` choices of ``p`` prompts: ``n * p`` of them, submitted
together; if the queue refuses one, the others are cancelled and the request gets 429). A request
``seed`` gives choice ``i`` the stream of key ``(seed, i)``, so a seeded request repeats exactly.
Streaming with tools: text before a ``<tool_call>`` streams as content; the calls come whole in
the last chunk of the choice, with finish_reason ``tool_calls``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import StreamingResponse

from rlvr import oplog
from rlvr.serve.chat import TOOL_MARKERS, BadField, encode_chat, parse_reply
from rlvr.serve.capture import utc_now as capture_time
from rlvr.serve.errors import ApiError
from rlvr.serve.protocol import ChatCompletionRequest, CompletionRequest
from rlvr.serve.text import TextStream
from rlvr.serve.types import GenRequest, NotReady, QueueFull, RequestHandle, TokenEvent


@dataclass
class Choice:
    """One choice while its events arrive."""

    index: int
    prompt_ids: list[int]
    handle: RequestHandle
    text: TextStream
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    versions: list[int] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    """Per generated token, the most likely alternatives asked for (``top_logprobs``)."""

    def take(self, ev: TokenEvent) -> str:
        """Record one event; the newly safe text."""
        if ev.token_id is not None:
            self.token_ids.append(ev.token_id)
            self.logprobs.append(ev.logprob)
            self.tops.append(ev.top)
        if ev.version not in self.versions:
            self.versions.append(ev.version)
        delta = self.text.add(ev.token_id)
        self.finish = ev.finish_reason or self.finish
        if self.finish and self.text.content is not None:
            self.text.text()  # the whole text's verdict (a match in the kept-back tail too)
            if self.text.blocked or self.text.redacted:
                self.finish = "content_filter"
        return delta

    def filtered(self) -> dict:
        """``{"content_filter": {"action", "rules"}}`` when the filter acted on this choice, else {}."""
        if not (self.text.blocked or self.text.redacted):
            return {}
        rules = self.text.redacted + ([self.text.blocked] if self.text.blocked else [])
        return {"content_filter": {"action": "blocked" if self.text.blocked else "redacted", "rules": rules}}


@dataclass
class Call:
    """What both endpoints need from the server (``rlvr/serve/app.py`` builds it)."""

    engine: object
    tokenizer: object
    model_name: str
    metrics: object
    http: Request
    endpoint: str
    started: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    content: object = None
    """``rlvr.content_filter.ContentFilter`` of ``--filter``, or None."""
    capture: object = None
    """``rlvr.serve.capture.TrafficLog`` of ``--capture``, or None."""

    def refuse_token_output(self, **asked: bool) -> None:
        """With a content filter, token-level output (log-probs, token ids, an echo) would show
        what the filter hides: a 400 naming the field."""
        for param, wanted in asked.items():
            if self.content is not None and wanted:
                raise ApiError(400, f"'{param}' is not available on a server with --filter: token-level output "
                                    "would bypass the content filter", param=param)


# -- building and submitting the choices ------------------------------------------------------------
def _check_top(call: Call, k: int, param: str) -> int:
    """``k`` alternatives per token, or a 400 naming ``param`` on an engine that cannot give them."""
    if k and not getattr(call.engine, "serves_top_logprobs", False):
        raise ApiError(400, f"'{param}' > 0 is not served by this engine (the fast mode's speculative decoding); "
                            "send 0, or serve without --draft", param=param)
    return k


def _gen_request(call: Call, body, prompt_ids: list[int], i: int, max_tokens: int | None, prompt_param: str,
                 prompt_logprobs: bool = False, top: int = 0) -> GenRequest:
    limit = call.engine.max_context
    if len(prompt_ids) >= limit:
        raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens; the context is {limit}", param=prompt_param,
                       code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = limit - len(prompt_ids)
    elif len(prompt_ids) + max_tokens > limit:
        raise ApiError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the context of "
                            f"{limit} tokens", param="max_tokens", code="context_length_exceeded")
    temperature = 1.0 if body.temperature is None else body.temperature
    return GenRequest(prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=temperature,
                      top_p=1.0 if body.top_p is None else body.top_p,
                      seed=None if body.seed is None else hash_seed(body.seed, i), stop=body.stop_strings(),
                      stop_token_ids=_stop_ids(call.tokenizer, body),
                      logprobs=True, prompt_logprobs=prompt_logprobs, top_logprobs=top,
                      request_id=f"{call.endpoint}-{i}")


def _stop_ids(tokenizer, body) -> tuple[int, ...] | None:
    """None (the engine stops on the model's EOS ids) unless ``ignore_eos`` or ``stop_token_ids``
    is sent: then those ids, plus the tokenizer's EOS without ``ignore_eos``."""
    if not body.ignore_eos and not body.stop_token_ids:
        return None
    eos = () if body.ignore_eos or tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    return (*eos, *(body.stop_token_ids or ()))


def hash_seed(seed: int, i: int) -> int:
    """Choice ``i``'s seed: a fixed function of (seed, i) (``request_generator`` hashes it again)."""
    return seed * 1_000_003 + i


def submit_all(engine, requests: list[GenRequest]) -> list[RequestHandle]:
    """Submit every choice, or none: on a refusal the ones already in are cancelled."""
    handles: list[RequestHandle] = []
    try:
        for r in requests:
            handles.append(engine.submit(r))
    except (QueueFull, NotReady, ValueError) as e:
        for h in handles:
            engine.cancel(h)
        if isinstance(e, QueueFull):
            raise ApiError(429, f"server busy: {e}", type="rate_limit_error", code="queue_full") from None
        if isinstance(e, NotReady):
            raise ApiError(503, str(e), type="server_error", code="not_ready") from None
        raise ApiError(400, str(e), param="max_tokens") from None
    return handles


async def _events(call: Call, choices: list[Choice]) -> AsyncIterator[tuple[Choice, TokenEvent]]:
    """Every choice's events as they come; cancels them all when the consumer stops early."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
        async for ev in c.handle:
            await queue.put((c, ev))

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    left = len(choices)
    try:
        while left:
            c, ev = await queue.get()
            if ev.token_id is not None and call.first_token is None:
                call.first_token = time.monotonic()
                call.metrics.ttft.observe(call.first_token - call.started)
            left -= ev.finish_reason is not None
            yield c, ev
            if c.text.blocked and c.finish is None and not c.handle.cancelled:
                call.engine.cancel(c.handle)  # a blocked match: nothing more of this choice is shown
    finally:
        for c in choices:
            if c.finish is None:
                call.engine.cancel(c.handle)
        for t in tasks:
            t.cancel()


async def _collect(call: Call, choices: list[Choice]) -> None:
    """Wait for every choice to finish; a client that disconnects cancels them."""
    async def run() -> None:
        async for c, ev in _events(call, choices):
            c.take(ev)

    task = asyncio.create_task(run())
    while not task.done():
        await asyncio.wait({task}, timeout=0.25)
        if not task.done() and await call.http.is_disconnected():
            task.cancel()
            raise ApiError(499, "client disconnected", code="client_closed")
    task.result()
    if any(c.finish == "abort" for c in choices):
        raise ApiError(503, "generation was aborted: the server is shutting down or a decode step failed",
                       type="server_error", code="aborted")


def _fingerprint(choices: list[Choice]) -> str:
    versions = sorted({v for c in choices for v in c.versions})
    return "rlvr-v" + "-v".join(map(str, versions)) if versions else "rlvr"


def _usage(prompt_tokens: int, choices: list[Choice]) -> dict:
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _count(call: Call, prompt_tokens: int, choices: list[Choice]) -> None:
    """Tokens and latency of a request that completed (streamed or not)."""
    call.metrics.latency.labels(call.endpoint).observe(time.monotonic() - call.started)
    call.metrics.prompt_tokens.inc(prompt_tokens)
    call.metrics.completion_tokens.inc(sum(len(c.token_ids) for c in choices))


def _capture(call: Call, body, rid: str, request: dict, prompt_ids: list[int] | list[list[int]], n_prompt: int,
             choices: list[Choice], finishes: list[str | None] | None = None) -> None:
    """Append the completed request to the traffic log (``--capture``), before its response ends.
    A write that fails (a full disk) is counted (``rlvr_serve_captured{outcome="error"}``), written
    to the operation log and to stderr once, and the request is served anyway."""
    log = call.capture
    if log is None:
        return
    versions = sorted({v for c in choices for v in c.versions})
    try:
        _append(call, log, body, rid, request, prompt_ids, n_prompt, choices, versions, finishes)
    except OSError as e:
        call.metrics.captured.labels("error").inc()
        oplog.write("capture", outcome="error", error=str(e)[:300])
        if not log.failed:
            print(f"rlvr serve: the traffic log could not be written ({e}); serving on, counting failures in "
                  "rlvr_serve_captured{outcome=\"error\"}", file=sys.stderr, flush=True)
        log.failed += 1
        return
    call.metrics.captured.labels("ok").inc()


def _append(call: Call, log, body, rid: str, request: dict, prompt_ids, n_prompt: int, choices: list[Choice],
            versions: list[int], finishes: list[str | None] | None) -> None:
    log.append({
        "type": "response", "id": rid, "time": capture_time(), "endpoint": call.endpoint, "model": call.model_name,
        "model_version": versions[-1] if versions else call.engine.version, "request": request,
        "params": {"temperature": body.temperature, "top_p": body.top_p, "max_tokens": body.max_tokens,
                   "seed": body.seed, "n": body.n, "stop": body.stop_strings() or None, "stream": body.stream},
        "prompt_token_ids": log.ids(prompt_ids),
        "choices": [{"index": c.index, "text": log.text(c.text.text()), "token_ids": log.ids(c.token_ids),
                     "finish_reason": finishes[k] if finishes else c.finish} for k, c in enumerate(choices)],
        "usage": _usage(n_prompt, choices), "latency_s": round(time.monotonic() - call.started, 4),
        "redacted": log.redacting,
    })


def _chat_request(call: Call, body: ChatCompletionRequest) -> dict:
    messages = []
    for m in body.messages:
        stored = m.model_dump(exclude_none=True)
        stored["content"] = call.capture.text(m.text())
        messages.append(stored)
    return {"messages": messages, **({"tools": [t.model_dump() for t in body.tools]} if body.tools else {})}


def _completion_request(call: Call, body: CompletionRequest) -> dict:
    prompt = body.prompt
    if isinstance(prompt, str):
        return {"prompt": call.capture.text(prompt)}
    if prompt and all(isinstance(p, str) for p in prompt):
        return {"prompt": [call.capture.text(p) for p in prompt]}
    return {"prompt": None if call.capture.redacting else prompt}  # token ids


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def _stream(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# -- chat ------------------------------------------------------------------------------------------
async def chat_completion(call: Call, body: ChatCompletionRequest):
    if body.response_format is not None and body.response_format.type != "text":
        raise ApiError(400, f"response_format {body.response_format.type!r} is not supported: this server does not "
                            "constrain decoding to a JSON grammar, so the reply could not be guaranteed to parse; ask "
                            "for JSON in the prompt and validate it, or send response_format text", param="response_format")
    tools = body.tools if body.tool_choice != "none" else None
    try:
        prompt = encode_chat(call.tokenizer, body.messages, tools)
    except BadField as e:
        raise ApiError(400, str(e), param=e.param) from None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    if body.top_logprobs and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    top = _check_top(call, body.top_logprobs or 0, "top_logprobs")
    try:
        reqs = [_gen_request(call, body, prompt, i, max_tokens, "messages", top=top) for i in range(body.n)]
    except ApiError as e:
        e.param = param if e.param == "max_tokens" else e.param
        raise
    call.refuse_token_output(logprobs=body.logprobs, return_token_ids=body.return_token_ids)
    hold = TOOL_MARKERS if tools else ()
    choices = [Choice(i, prompt, h, TextStream(call.tokenizer, r.stop, hold, call.content))
               for i, (r, h) in enumerate(zip(reqs, submit_all(call.engine, reqs)))]
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    head = {"id": rid, "created": created, "model": call.model_name}
    if body.stream:
        return _stream(_chat_chunks(call, body, choices, head, bool(tools)))
    await _collect(call, choices)
    _count(call, len(prompt), choices)
    out = {**head, "object": "chat.completion", "system_fingerprint": _fingerprint(choices),
           "choices": [_chat_choice(call, body, c, bool(tools)) for c in choices],
           "usage": _usage(len(prompt), choices)}
    if call.capture is not None:
        _capture(call, body, rid, _chat_request(call, body), prompt, len(prompt), choices,
                 [c["finish_reason"] for c in out["choices"]])
    if body.return_token_ids:
        out["prompt_token_ids"] = prompt
    return out


def _chat_finish(c: Choice, calls: list) -> str:
    return "tool_calls" if calls else c.finish


def _chat_choice(call: Call, body: ChatCompletionRequest, c: Choice, tools: bool) -> dict:
    text = c.text.text()
    reply = parse_reply(text) if tools else None
    message = {"role": "assistant", "content": reply.content if reply else text}
    if reply and reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    out = {"index": c.index, "message": message, "finish_reason": _chat_finish(c, reply.tool_calls if reply else []),
           "logprobs": {"content": _chat_logprobs(call, c.token_ids, c.logprobs, c.tops)} if body.logprobs else None,
           **c.filtered()}
    if body.return_token_ids:
        out["token_ids"] = c.token_ids
    return out


def _chat_logprobs(call: Call, ids: list[int], lps: list[float], tops: list[tuple]) -> list[dict]:
    def entry(t: int, lp: float) -> dict:
        s = _token_text(call.tokenizer, t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode())}

    return [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]} for t, lp, top in zip(ids, lps, tops)]


async def _chat_chunks(call: Call, body: ChatCompletionRequest, choices: list[Choice], head: dict,
                       tools: bool) -> AsyncIterator[str]:
    base = {**head, "object": "chat.completion.chunk"}

    def chunk(c: Choice, delta: dict, finish=None, logprobs=None, **extra) -> str:
        choice = {"index": c.index, "delta": delta, "finish_reason": finish, "logprobs": logprobs, **extra}
        return _sse({**base, "system_fingerprint": _fingerprint([c]), "choices": [choice]})

    finishes: list[str | None] = [None] * len(choices)
    for c in choices:
        yield chunk(c, {"role": "assistant", "content": ""})
    async for c, ev in _events(call, choices):
        before = len(c.token_ids)
        delta = c.take(ev)
        lps = None
        if body.logprobs and len(c.token_ids) > before:
            lps = {"content": _chat_logprobs(call, c.token_ids[before:], c.logprobs[before:], c.tops[before:])}
        ids = {"token_ids": c.token_ids[before:]} if body.return_token_ids else {}
        if ev.finish_reason is None:
            if delta or lps or ids:
                yield chunk(c, {"content": delta} if delta else {}, logprobs=lps, **ids)
            continue
        text = c.text.text()
        reply = parse_reply(text) if tools else None
        rest = (reply.content or "") if reply else text
        delta += rest[c.text.sent:] if len(rest) > c.text.sent else ""
        final: dict = {"content": delta} if delta else {}
        if reply and reply.tool_calls:
            final["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(reply.tool_calls)]
        finishes[c.index] = _chat_finish(c, reply.tool_calls if reply else [])
        yield chunk(c, final, finishes[c.index], lps, **ids, **c.filtered())
    _count(call, len(choices[0].prompt_ids), choices)
    if call.capture is not None:
        _capture(call, body, head["id"], _chat_request(call, body), choices[0].prompt_ids,
                 len(choices[0].prompt_ids), choices, finishes)
    if body.stream_options and body.stream_options.include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(len(choices[0].prompt_ids), choices)})
    if body.return_token_ids:
        yield _sse({**base, "choices": [], "prompt_token_ids": choices[0].prompt_ids})
    yield _sse("[DONE]")


# -- completions -----------------------------------------------------------------------------------
def _prompts(tokenizer, prompt) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    return [p if isinstance(p, list) else list(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompt]


async def completion(call: Call, body: CompletionRequest):
    prompts = _prompts(call.tokenizer, body.prompt)
    vocab = len(call.tokenizer)
    for k, p in enumerate(prompts):
        if any(t < 0 or t >= vocab for t in p):
            raise ApiError(400, f"token ids must be in [0, {vocab})", param="prompt")
        if not p:
            raise ApiError(400, "a prompt has no tokens", param="prompt")
    want_lp = body.logprobs is not None
    call.refuse_token_output(logprobs=want_lp, return_token_ids=body.return_token_ids, echo=body.echo)
    top = _check_top(call, body.logprobs or 0, "logprobs")
    reqs = [_gen_request(call, body, p, k * body.n + i, body.max_tokens, "prompt", body.echo and want_lp, top)
            for k, p in enumerate(prompts) for i in range(body.n)]
    choices = [Choice(j, r.prompt_ids, h, TextStream(call.tokenizer, r.stop, content=call.content))
               for j, (r, h) in enumerate(zip(reqs, submit_all(call.engine, reqs)))]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": call.model_name}
    n_prompt = sum(len(p) for p in prompts)
    if body.stream:
        return _stream(_completion_chunks(call, body, choices, head, n_prompt))
    await _collect(call, choices)
    _count(call, n_prompt, choices)
    if call.capture is not None:
        _capture(call, body, head["id"], _completion_request(call, body), prompts[0] if len(prompts) == 1 else prompts,
                 n_prompt, choices)
    return {**head, "object": "text_completion", "system_fingerprint": _fingerprint(choices),
            "choices": [_completion_choice(call, body, c) for c in choices], "usage": _usage(n_prompt, choices)}


def _completion_logprobs(call: Call, ids: list[int], lps: list, offset: int, tops: list | None = None) -> dict:
    """OpenAI's completions log-probs; ``tops`` (with ``logprobs`` > 0): per token the alternatives
    as ``{text: log-prob}`` (None at echoed prompt positions)."""
    tokens = [_token_text(call.tokenizer, t) for t in ids]
    offsets, at = [], offset
    for s in tokens:
        offsets.append(at)
        at += len(s)
    top = None if tops is None else [None if t is None else {_token_text(call.tokenizer, a): lp for a, lp in t}
                                     for t in tops]
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}


def _completion_choice(call: Call, body: CompletionRequest, c: Choice) -> dict:
    text = c.text.text()
    ids, lps, tops = c.token_ids, list(c.logprobs), list(c.tops)
    if body.echo:
        prompt_text = call.tokenizer.decode(c.prompt_ids, skip_special_tokens=False)
        text = prompt_text + text
        if c.handle.prompt_logprobs is not None:
            ids, lps = c.prompt_ids + ids, [None, *c.handle.prompt_logprobs[1:]] + lps
            tops = [None] * len(c.prompt_ids) + tops
    out = {"index": c.index, "text": text, "finish_reason": c.finish,
           "logprobs": _completion_logprobs(call, ids, lps, 0, tops if body.logprobs else None)
           if body.logprobs is not None else None,
           **c.filtered()}
    if body.return_token_ids:
        out["prompt_token_ids"], out["token_ids"] = c.prompt_ids, c.token_ids
    return out


async def _completion_chunks(call: Call, body: CompletionRequest, choices: list[Choice], head: dict,
                             n_prompt: int) -> AsyncIterator[str]:
    base = {**head, "object": "text_completion"}
    async for c, ev in _events(call, choices):
        before = len(c.token_ids)
        delta = c.take(ev)
        if ev.finish_reason is not None:
            rest = c.text.text()
            delta += rest[c.text.sent:] if len(rest) > c.text.sent else ""
        new = c.token_ids[before:]
        if not (delta or new or ev.finish_reason):
            continue
        choice = {"index": c.index, "text": delta, "finish_reason": c.finish if ev.finish_reason else None,
                  "logprobs": _completion_logprobs(call, new, c.logprobs[before:], 0, c.tops[before:] if body.logprobs else None)
                  if body.logprobs is not None else None,
                  **(c.filtered() if ev.finish_reason else {})}
        if body.return_token_ids:
            choice["token_ids"] = new
            if before == 0:
                choice["prompt_token_ids"] = c.prompt_ids
        yield _sse({**base, "choices": [choice]})
    _count(call, n_prompt, choices)
    if call.capture is not None:
        prompts = [choices[k].prompt_ids for k in range(0, len(choices), body.n)]  # choice k*n+i: prompt k
        _capture(call, body, head["id"], _completion_request(call, body), prompts[0] if len(prompts) == 1 else prompts,
                 n_prompt, choices)
    if body.stream_options and body.stream_options.include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(n_prompt, choices)})
    yield _sse("[DONE]")
