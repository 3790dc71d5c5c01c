"""``rlvr serve``: an OpenAI-compatible HTTP server with continuous batching (docs/serve.md)."""
