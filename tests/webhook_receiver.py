"""A local webhook receiver for the pushed-alert tests (tests/test_alert_push.py, tests/test_oplog.py)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A local webhook: records each JSON body with its arrival time; ``fail_first`` answers 500
    that many times first; ``hang_s`` holds each request that long before answering."""

    def __init__(self, fail_first: int = 0, hang_s: float = 0.0):
        self.bodies: list[tuple[float, dict, dict]] = []
        self.fail_left, self.hang_s = fail_first, hang_s
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.hang_s:
                    time.sleep(outer.hang_s)
                if outer.fail_left:
                    outer.fail_left -= 1
                    self.send_response(500)
                else:
                    outer.bodies.append((time.monotonic(), body, dict(self.headers)))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
