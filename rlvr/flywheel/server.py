"""What the flywheel asks of a running ``rlvr serve``: which weights it serves, and new weights.

Through ``rlvr.http_json.Client`` (a timeout on every call; 429s waited out): an unreachable
server, a refusal or a body that is not what ``rlvr serve`` answers is a ``UserError`` naming the
server and the status.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.errors import UserError
from rlvr.http_json import Client

TIMEOUT = 60.0
WEIGHTS_TIMEOUT = 600.0
LABEL = "flywheel"


@dataclass(frozen=True)
class Served:
    path: str
    """The weights directory the server reports (``root`` in ``/v1/models``)."""
    version: int
    model: str


def served(server: str, api_key: str = "") -> Served:
    """What ``server`` serves now (``GET /v1/models``)."""
    body = Client(server, api_key, TIMEOUT, LABEL).call("/v1/models")
    try:
        model = body["data"][0]
        return Served(path=str(model["root"]), version=int(model["version"]), model=str(model["id"]))
    except (KeyError, IndexError, TypeError, ValueError):
        raise UserError(f"{LABEL}: {server}/v1/models lists no model with a 'root' and a 'version' "
                        "(is it rlvr serve?)") from None


def push_weights(server: str, path: str, admin_token: str) -> int:
    """Load ``path`` into ``server`` (``POST /v1/weights``); the new version."""
    if not admin_token:
        raise UserError("pushing weights needs the server's admin token (--admin-token or RLVR_ADMIN_TOKEN)")
    body = Client(server, "", WEIGHTS_TIMEOUT, LABEL).call("/v1/weights", {"path": path}, token=admin_token)
    try:
        return int(body["version"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{LABEL}: {server}/v1/weights answered no 'version': {body!r}") from None
