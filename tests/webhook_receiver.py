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


class MailReceiver:
    """A local SMTP server (just enough of RFC 5321 for ``smtplib``): records each message's
    envelope and text; ``fail_first`` answers that many DATA commands with 451 first."""

    def __init__(self, fail_first: int = 0):
        import socketserver

        self.messages: list[tuple[float, str, list[str], str]] = []
        self.fail_left = fail_first
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                def say(line):
                    self.wfile.write(line.encode() + b"\r\n")

                say("220 localhost rlvr-test-smtp")
                sender, rcpts = "", []
                while True:
                    line = self.rfile.readline().decode(errors="replace").rstrip("\r\n")
                    cmd = line[:4].upper()
                    if not line or cmd == "QUIT":
                        say("221 bye")
                        return
                    if cmd in ("EHLO", "HELO"):
                        say("250 localhost")
                    elif cmd == "MAIL":
                        sender, rcpts = line.split(":", 1)[1].strip(" <>"), []
                        say("250 ok")
                    elif cmd == "RCPT":
                        rcpts.append(line.split(":", 1)[1].strip(" <>"))
                        say("250 ok")
                    elif cmd == "DATA":
                        say("354 go on")
                        body = []
                        while (data := self.rfile.readline().decode(errors="replace")) not in (".\r\n", ""):
                            body.append(data[1:] if data.startswith("..") else data)
                        if outer.fail_left:
                            outer.fail_left -= 1
                            say("451 try again")
                        else:
                            outer.messages.append((time.monotonic(), sender, rcpts, "".join(body)))
                            say("250 queued")
                    else:
                        say("250 ok")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
