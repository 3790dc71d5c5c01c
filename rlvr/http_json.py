"""JSON over HTTP to an OpenAI-compatible server (stdlib only): the remote rollout engine's client
(``rlvr.rollout.remote_engine``) and the flywheel's (``rlvr.flywheel.server``).

``Client.call`` GETs or POSTs one route with a bearer token, waits out 429s (a full queue) with
backoff until its timeout, and turns any failure into a ``RemoteError`` of one line that starts
with the caller's ``label`` and names the URL: unreachable, an HTTP error with the server's
message, an answer cut off (the server died mid-reply: ``http.client.IncompleteRead`` and the
like), or an answer that is not JSON.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

from rlvr.errors import UserError


class RemoteError(UserError):
    """The server could not be reached, or answered with an error or a malformed body."""


class Client:
    """JSON over HTTP to one server (stdlib only; thread-safe: one connection per request)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float, label: str = "rollout.engine: remote") -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.api_key, self.timeout_s, self.label = api_key, timeout_s, label

    def call(self, route: str, body: dict | None = None, token: str | None = None) -> dict:
        """GET (``body`` None) or POST ``route``; the decoded answer, or ``RemoteError`` in one line."""
        url = self.root + route
        token = self.api_key if token is None else token
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
        deadline, wait = time.monotonic() + self.timeout_s, 0.05
        try:
            while True:
                try:
                    with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                        text = r.read().decode()
                    break
                except urllib.error.HTTPError as e:
                    if e.code != 429 or time.monotonic() + wait > deadline:  # 429: the server's queue is full
                        raise
                    time.sleep(wait)
                    wait = min(2 * wait, 1.0)
        except urllib.error.HTTPError as e:
            raise RemoteError(f"{self.label}: {url} answered HTTP {e.code}: {error_text(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RemoteError(f"{self.label}: cannot reach {self.root} ({url}): {reason}") from None
        except http.client.HTTPException as e:  # the connection broke during the answer
            raise RemoteError(f"{self.label}: {url} broke off its answer: {type(e).__name__}: {e}") from None
        try:
            return json.loads(text)
        except ValueError:
            raise RemoteError(f"{self.label}: {url} did not answer JSON: {text[:200]!r}") from None


def error_text(e: urllib.error.HTTPError) -> str:
    text = e.read().decode(errors="replace")
    try:
        err = json.loads(text)
        err = err.get("error", err) if isinstance(err, dict) else err
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except ValueError:
        return text[:300]
