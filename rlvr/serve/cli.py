"""``rlvr serve``: its flags, and running the app under uvicorn.

Checks what can be checked without loading (flags, the model directory, a non-loopback host
without an API key) and exits 2 on a problem; then starts uvicorn, which answers ``/health`` with
503 until the model is loaded. A load that fails (a model continuous batching cannot run, say)
stops the server and exits 2 with the reason.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from rlvr import oplog
from rlvr.content_filter import ContentFilter
from rlvr.serve.config import SERVING_ENGINES, ServeConfig


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching (docs/serve.md)")
    for f in fields(ServeConfig):
        flag = "--" + f.name.replace("_", "-")
        doc = (f.metadata.get("doc") or "").strip() or _doc(f.name)
        if f.name == "model":
            p.add_argument(flag, required=True, help=doc)
        elif isinstance(f.default, bool):
            p.add_argument(flag, action="store_true", help=doc)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default, help=f"{doc} (default: {f.default!r})")
    p.set_defaults(fn=cmd_serve)


def _doc(name: str) -> str:
    """A field's docstring (the line after it in ``ServeConfig``) as the flag's help."""
    import inspect

    lines = inspect.getsource(ServeConfig).splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(f"{name}:") and i + 1 < len(lines):
            return lines[i + 1].strip().strip('"')
    return ""


def cmd_serve(args) -> None:
    cfg = ServeConfig(**{f.name: getattr(args, f.name) for f in fields(ServeConfig)})
    serve(cfg)


def serve(cfg: ServeConfig) -> None:
    from rlvr.errors import UserError

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise UserError(f"rlvr serve needs the fastapi extra: pip install 'rlvr[fastapi]' (missing: {e.name})") from None
    from rlvr.model.load import ModelLoadConfig, load_tokenizer
    from rlvr.serve.app import create_app

    load_tokenizer(cfg.model, options=ModelLoadConfig(dtype=cfg.dtype))  # a wrong directory fails here, at once
    SERVING_ENGINES.get(cfg.engine_name)
    failed: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_error(e: BaseException) -> None:  # (the error is printed once the server has stopped)
        failed.append(e)
        if server is not None:
            server.should_exit = True

    name = cfg.model_name or Path(cfg.model).resolve().name
    content_filter = ContentFilter.parse(cfg.filter)
    capture = None
    if cfg.capture:
        from rlvr.serve.capture import TrafficLog

        capture = TrafficLog(cfg.capture, rotate_bytes=cfg.capture_rotate_mb << 20, content_filter=content_filter)
    app = create_app(lambda: load_engine(cfg), model_name=name, api_key=cfg.api_key, admin_token=cfg.admin_token,
                     on_load_error=on_load_error, content_filter=content_filter, capture=capture,
                     feedback_token=cfg.feedback_token, root=str(Path(cfg.model).resolve()))
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning"))
    print(f"rlvr serve: {name} on http://{cfg.host}:{cfg.port} (batching {cfg.batching})", flush=True)
    if cfg.op_log:
        oplog.open_log(cfg.op_log, actor="serve")
    try:
        server.run()
    finally:
        oplog.close_log()
    if failed:
        e = failed[0]
        raise e if isinstance(e, UserError) else UserError(f"the model did not load: {e}")


def load_engine(cfg: ServeConfig):
    """The model, its tokenizer and the engine ``cfg`` names (on the load thread)."""
    import torch

    from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model_and_tokenizer(cfg.model, device=device, options=ModelLoadConfig(dtype=cfg.dtype))
    return SERVING_ENGINES.get(cfg.engine_name)(cfg, model, tokenizer), tokenizer


def main(argv: list[str] | None = None) -> int:
    """``python -m rlvr.serve.cli ...``: ``rlvr serve ...`` without building the other commands'
    parsers (faster to start)."""
    import argparse
    import os

    from rlvr.errors import UserError

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="rlvr")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(argv if argv is not None else sys.argv[1:])])
    try:
        args.fn(args)
    except UserError as e:
        print(f"rlvr: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
