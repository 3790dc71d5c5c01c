"""What the flywheel asks of a running ``rlvr serve``: which weights it serves, and new weights.

Plain HTTP (``urllib``), a timeout on every call; an unreachable server, a refusal or a body
that is not what ``rlvr serve`` answers is a ``UserError`` naming the server and the status.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from rlvr.errors import UserError

TIMEOUT = 60.0
WEIGHTS_TIMEOUT = 600.0


@dataclass(frozen=True)
class Served:
    path: str
    """The weights directory the server reports (``root`` in ``/v1/models``)."""
    version: int
    model: str


def _call(url: str, body: dict | None, token: str, timeout: float) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        try:
            detail = json.loads(detail)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        raise UserError(f"{url}: HTTP {e.code}: {str(detail)[:300]}") from None
    except (OSError, urllib.error.URLError) as e:
        raise UserError(f"{url}: the server did not answer ({e})") from None
    try:
        return json.loads(text)
    except ValueError:
        raise UserError(f"{url}: the answer is not JSON: {text[:200]!r}") from None


def served(server: str, api_key: str = "") -> Served:
    """What ``server`` serves now (``GET /v1/models``)."""
    url = server.rstrip("/") + "/v1/models"
    body = _call(url, None, api_key, TIMEOUT)
    try:
        model = body["data"][0]
        return Served(path=str(model["root"]), version=int(model["version"]), model=str(model["id"]))
    except (KeyError, IndexError, TypeError, ValueError):
        raise UserError(f"{url}: no model with a 'root' and a 'version' (is it rlvr serve?)") from None


def push_weights(server: str, path: str, admin_token: str) -> int:
    """Load ``path`` into ``server`` (``POST /v1/weights``); the new version."""
    url = server.rstrip("/") + "/v1/weights"
    if not admin_token:
        raise UserError("pushing weights needs the server's admin token (--admin-token or RLVR_ADMIN_TOKEN)")
    body = _call(url, {"path": path}, admin_token, WEIGHTS_TIMEOUT)
    try:
        return int(body["version"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{url}: no 'version' in the answer {body!r}") from None
