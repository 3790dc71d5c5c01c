"""The FastAPI app of ``rlvr serve``: routes, auth, errors, and loading the engine.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``rlvr/serve/handlers.py``),
``GET /v1/models`` (each model's ``root``: the weights directory served now, as vLLM reports
it), ``GET /health`` (200 once the engine is up, 503 while it loads or after a failed load),
``GET /metrics`` (Prometheus text, ``rlvr/serve/metrics.py``) and two rlvr extensions:
``POST /v1/weights`` (``{"path": DIR}``, ``Authorization: Bearer <admin token>``: 401 without
the header, 403 with a wrong token or when no admin token is set) and ``POST /v1/feedback``
(a judgement of a captured response, ``rlvr.serve.protocol.FeedbackRequest``; the feedback
token, else the admin token, checked the same way; 404 without ``--capture`` or for an id the
capture does not hold).

The engine loads on a background thread when the app starts (``load`` returns ``(engine,
tokenizer)``), so ``/health`` answers 503 meanwhile; a load that fails calls ``on_load_error``.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlvr.errors import UserError
from rlvr.serve.errors import (
    ApiError,
    api_error_handler,
    error_response,
    validation_handler,
)
from rlvr.serve.handlers import Call, chat_completion, completion
from rlvr import oplog
from rlvr.serve.metrics import ServeMetrics
from rlvr.serve.capture import utc_now
from rlvr.serve.protocol import ChatCompletionRequest, CompletionRequest, FeedbackRequest, WeightsRequest


class _Server:
    """What the routes share: the engine once loaded, and the settings."""

    def __init__(self, model_name: str, api_key: str, admin_token: str, content_filter=None, capture=None,
                 feedback_token: str = "", root: str = ""):
        self.model_name, self.api_key, self.admin_token = model_name, api_key, admin_token
        self.content_filter, self.capture = content_filter, capture
        self.feedback_token = feedback_token or admin_token
        self.root = root
        """The weights directory served now (the model's, then each /v1/weights path)."""
        self.engine = None
        self.tokenizer = None
        self.load_error: str | None = None
        self.created = int(time.time())
        self.metrics = ServeMetrics(lambda: self.engine.stats() if self.engine is not None else None)


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def create_app(load: Callable[[], tuple[object, object]], *, model_name: str, api_key: str = "",
               admin_token: str = "", on_load_error: Callable[[BaseException], None] | None = None,
               content_filter=None, capture=None, feedback_token: str = "", root: str = "") -> FastAPI:
    """The app; ``load()`` (run on a thread at startup) builds the engine and the tokenizer.
    ``content_filter``: an ``rlvr.content_filter.ContentFilter`` every completion goes through;
    ``capture``: an ``rlvr.serve.capture.TrafficLog`` every completed request is appended to;
    ``root``: the weights directory being served."""
    s = _Server(model_name, api_key, admin_token, content_filter, capture, feedback_token, root)

    def _load() -> None:
        started = time.monotonic()
        try:
            s.engine, s.tokenizer = load()
            oplog.write("model_load", model=model_name, outcome="ok", seconds=round(time.monotonic() - started, 3))
        except BaseException as e:  # noqa: BLE001 - reported through /health and the callback
            s.load_error = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
            oplog.write("model_load", model=model_name, outcome="error", error=s.load_error[:300])
            if on_load_error is not None:
                on_load_error(e)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        threading.Thread(target=_load, name="rlvr-serve-load", daemon=True).start()
        yield
        if s.engine is not None:
            await run_in_threadpool(s.engine.close)
        if s.capture is not None:
            s.capture.close()

    app = FastAPI(title="rlvr serve", lifespan=lifespan)
    app.state.server = s
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_handler)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail), "invalid_request_error" if e.status_code < 500 else "server_error")

    @app.middleware("http")
    async def count(request: Request, call_next):
        started = time.monotonic()
        response = await call_next(request)
        if request.url.path != "/metrics":
            s.metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        key = _bearer(request)
        oplog.write("http_request", method=request.method, path=request.url.path, status=response.status_code,
                    outcome="ok" if response.status_code < 400 else "refused" if response.status_code < 500 else "error",
                    client=request.client.host if request.client else None,
                    key_sha256=oplog.digest(key)[:16] if key else None, seconds=round(time.monotonic() - started, 4))
        return response

    _openai_routes(app, s)
    _operations_routes(app, s)
    return app


def _openai_routes(app: FastAPI, s: _Server) -> None:
    """``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` (the OpenAI API)."""

    def ready_engine(request: Request, model: str | None = None):
        """The engine for a /v1 request: API key checked, loaded, and ``model`` the served one."""
        if s.api_key and not hmac.compare_digest((_bearer(request) or "").encode(), s.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", type="authentication_error",
                           code="invalid_api_key")
        engine = _loaded(s)
        if model is not None and model != s.model_name:
            raise ApiError(404, f"model '{model}' is not served here; this server serves '{s.model_name}'",
                           param="model", code="model_not_found")
        return engine

    def call(request: Request, endpoint: str) -> Call:
        return Call(s.engine, s.tokenizer, s.model_name, s.metrics, request, endpoint, content=s.content_filter,
                    capture=s.capture)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        ready_engine(request, body.model)
        return await chat_completion(call(request, "chat"), body)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        ready_engine(request, body.model)
        if body.echo and body.stream:
            raise ApiError(400, "echo is not supported with stream", param="echo")
        return await completion(call(request, "completions"), body)

    @app.get("/v1/models")
    async def models(request: Request):
        engine = ready_engine(request)
        return {"object": "list", "data": [{"id": s.model_name, "object": "model", "created": s.created,
                                            "owned_by": "rlvr", "version": engine.version, "root": s.root,
                                            "max_model_len": engine.max_context}]}


def _operations_routes(app: FastAPI, s: _Server) -> None:
    """``/health``, ``/metrics`` (Prometheus) and ``/v1/weights`` (admin: load new weights)."""

    @app.get("/health")
    async def health():
        if s.engine is None or not s.engine.ready:
            return JSONResponse({"status": "error" if s.load_error else "loading", "error": s.load_error}, 503)
        return {"status": "ok", "model": s.model_name, "version": s.engine.version}

    @app.get("/metrics")
    async def metrics():
        return Response(s.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/weights")
    async def weights(body: WeightsRequest, request: Request):
        _authorise(request, s.admin_token, "weight updates", "admin token", "--admin-token")
        engine = _loaded(s)
        try:
            version = await asyncio.to_thread(engine.load_weights, body.path)
        except (UserError, ValueError) as e:
            oplog.write("weights_update", path=body.path, outcome="error", error=str(e)[:300])
            raise ApiError(400, str(e), param="path") from None
        oplog.write("weights_update", path=body.path, outcome="ok", version=version)
        s.root = str(Path(body.path).resolve())
        return {"version": version, "path": body.path}

    @app.post("/v1/feedback")
    async def feedback(body: FeedbackRequest, request: Request):
        _authorise(request, s.feedback_token, "feedback requests", "feedback token", "--feedback-token or --admin-token")
        if s.capture is None:
            raise ApiError(404, "feedback is recorded with the traffic: start the server with --capture DIR",
                           code="capture_off")
        if body.id not in s.capture.known:
            raise ApiError(404, f"no captured response has id {body.id!r}", param="id", code="unknown_response")
        if body.rating is None and body.correction is None and body.label is None:
            raise ApiError(400, "feedback needs a rating (up|down), a correction or a label", param="rating")
        try:
            s.capture.append({"type": "feedback", "id": body.id, "time": utc_now(), "choice": body.choice,
                              "rating": body.rating, "correction": s.capture.text(body.correction),
                              "label": body.label, "reason": s.capture.text(body.reason)})
        except OSError as e:  # not recorded: the client must know, and may retry
            raise ApiError(503, f"the traffic log could not be written: {e}", type="server_error",
                           code="capture_failed") from None
        return {"id": body.id, "recorded": True}


def _authorise(request: Request, token: str, what: str, name: str, flag: str) -> None:
    """401 without a bearer token, 403 with a wrong one or when ``token`` is unset."""
    got = _bearer(request)
    if got is None:
        raise ApiError(401, f"{what} need Authorization: Bearer <{name}>", type="authentication_error",
                       code="missing_token")
    if not token or not hmac.compare_digest(got.encode(), token.encode()):
        raise ApiError(403, f"wrong {name}" if token else f"{what} are off (no {flag})",
                       type="permission_error", code="forbidden")


def _loaded(s: _Server):
    """The engine, or 503 while it loads (or after it failed to)."""
    if s.engine is None or not s.engine.ready:
        raise ApiError(503, s.load_error or "the model is loading", type="server_error", code="not_ready")
    return s.engine
