"""rlvr/http_json.py: every way a server can fail becomes one RemoteError line naming the URL."""

from __future__ import annotations

import socket
import threading

import pytest

from rlvr.http_json import Client, RemoteError


def _server(reply: bytes) -> tuple[str, threading.Thread]:
    """A one-shot TCP server that reads a request, writes ``reply`` and closes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def serve():
        conn, _ = sock.accept()
        conn.recv(65536)
        conn.sendall(reply)
        conn.close()
        sock.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", t


@pytest.mark.parametrize("reply, match", [
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1686\r\n\r\n{\"cho", "broke off its answer: IncompleteRead"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "did not answer JSON"),
    (b"", "cannot reach|broke off"),  # closed without a status line
])
def test_a_broken_answer_is_one_remote_error(reply, match):
    url, t = _server(reply)
    with pytest.raises(RemoteError, match=match) as e:
        Client(url, "", timeout_s=5, label="judge").call("/v1/chat/completions", {"x": 1})
    assert str(e.value).startswith("judge: ") and "\n" not in str(e.value)
    t.join(timeout=5)
