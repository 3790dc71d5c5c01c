"""Tool bodies that try to touch what their grant does not allow (tests/test_grants.py). Standard
library only: like every tool body, this module's source runs in the sandbox."""

import os
import socket
import subprocess


def read_path(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_path(path: str, content: str) -> str:
    with open(path, "w") as f:
        f.write(content)
    return "ok"


def read_swallowing(path: str) -> str:
    """Catches the refusal and answers anyway: the grant's verdict must still be 'refused'."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return "nothing to see"


def connect(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return "connected"


def spin() -> str:
    while True:
        pass


def hog(mb: int) -> str:
    return str(len(bytearray(mb << 20)))


def spawn() -> str:
    return subprocess.run(["true"]).returncode


def shout(n: int) -> str:
    return "x" * n


def listing() -> str:
    return "\n".join(sorted(os.listdir(".")))


def echo(text: str) -> str:
    return text
