"""Least-privilege tool grants (``rlvr.envs.grants``): a tool call outside its grant is refused,
seen by the model as an error observation, and audited; inside it, the tool works. Tools run
in the sandbox, under the kernel layer (read-only workspace, no network, rlimits) and the audit
hook that names the violation."""

import json

import pytest

from grant_probes import connect, hog, listing, read_path, read_swallowing, shout, spawn, spin, write_path
from rlvr import oplog
from rlvr.envs.base import ToolEnv
from rlvr.envs.grants import Grant, GrantRefused, check_paths, run_granted, workspace_path
from rlvr.envs.tools import Tool, ToolCallError
from rlvr.errors import ConfigError
from rlvr.sandbox.types import Job
from rlvr.sandbox.workspace import Workspace
from rlvr.tool_calls import format_call
from rlvr.types import Spec, Task

READ_PY = Grant(read=("*.py",), wall_s=2.0)
WRITE_NOTES = Grant(read=("*",), write=("notes/*",), wall_s=2.0)


class ProbeEnv(ToolEnv):
    """A test environment whose tools do what their grants forbid (not registered)."""

    name = "probe"
    grants = {"read_path": READ_PY, "write_path": Grant(read=("*",)), "connect": Grant(),
              "spin": Grant(wall_s=0.5), "hog": Grant(memory_mb=512), "spawn": Grant(),
              "shout": Grant(output_kb=1), "read_swallowing": READ_PY, "write_notes": WRITE_NOTES}

    def __init__(self, cfg=None, *, sandbox=None, workdir=None):
        super().__init__(cfg, sandbox=sandbox)
        self.workdir = workdir

    def tools(self):
        def tool(name, body, params, paths=None):
            grant = self.grants[name]
            fn = lambda **a: run_granted(self.sandbox, name, body, grant, a, workdir=self.workdir)
            return Tool(name, name, fn, params, grant=grant, paths=paths or {})

        path = {"path": ("string", "a path")}
        return [tool("read_path", read_path, path, {"path": "read"}),
                tool("read_swallowing", read_swallowing, path),
                tool("write_path", write_path, {**path, "content": ("string", "text")}),
                tool("write_notes", write_path, {**path, "content": ("string", "text")}, {"path": "write"}),
                tool("connect", connect, {"port": ("integer", "port")}),
                tool("spin", spin, {}), tool("hog", hog, {"mb": ("integer", "MB")}),
                tool("spawn", spawn, {}), tool("shout", shout, {"n": ("integer", "chars")})]

    def _verify(self):
        raise NotImplementedError


@pytest.fixture
def ws():
    w = Workspace.create({"main.py": "print('hi')\n", "secret.txt": "s3cret\n", "notes/a.md": "a\n"},
                         writable=True)
    yield w
    w.close()


@pytest.fixture
def env(sandbox, ws, tmp_path):
    oplog.open_log(tmp_path / "operations.jsonl", actor="test")
    e = ProbeEnv(sandbox=sandbox, workdir=ws.path)
    e.reset(Task(id="probe-1", domain="probe", level=1, prompt=({"role": "user", "content": "go"},),
                 spec=Spec("none"), env="probe"))
    yield e
    oplog.close_log()


def _records(tmp_path):
    oplog.close_log()
    return [json.loads(line) for line in (tmp_path / "operations.jsonl").read_text().splitlines()
            if json.loads(line)["op"] == "tool_call"]


@pytest.mark.parametrize("tool,args,kind,needle", [
    ("read_path", {"path": "secret.txt"}, "path", "read secret.txt"),  # layer 1: the argument
    ("read_swallowing", {"path": "secret.txt"}, "path", "read secret.txt"),  # layer 3, swallowed
    ("read_swallowing", {"path": "/etc/passwd"}, "path", "read /etc/passwd"),  # outside the workspace
    ("write_path", {"path": "main.py", "content": "x"}, "path", "write main.py"),  # read-only grant
    ("write_notes", {"path": "main.py", "content": "x"}, "path", "write main.py"),  # not notes/*
    ("connect", {"port": 80}, "network", "socket"),
    ("spin", {}, "wall", "time grant (0.5 s)"),
    ("hog", {"mb": 900}, "memory", "memory grant (512 MB)"),
    ("spawn", {}, "process", "subprocess.Popen"),
    ("shout", {"n": 5000}, "output", "output grant (1 KB)"),
])
def test_a_call_outside_its_grant_is_refused_seen_and_audited(env, ws, tmp_path, tool, args, kind, needle):
    before = ws.read("main.py")
    step = env.step(format_call(tool, args))
    seen = step.observation[0]["content"]
    assert not step.done and step.observation[0]["role"] == "tool"
    assert seen.startswith(f"error: {tool}: refused:") and needle in seen, seen
    assert "s3cret" not in seen and ws.read("main.py") == before
    (rec,) = _records(tmp_path)
    assert rec["tool"] == tool and rec["outcome"] == "refused" and rec["violation"] == kind
    assert rec["grant"] == env.grants[tool].describe()


@pytest.mark.parametrize("tool,args,result", [
    ("read_path", {"path": "main.py"}, "print('hi')\n"),
    ("read_swallowing", {"path": "main.py"}, "print('hi')\n"),
    ("write_notes", {"path": "notes/b.md", "content": "b"}, "ok"),
    ("hog", {"mb": 16}, str(16 << 20)),
    ("shout", {"n": 1000}, "x" * 1000),
])
def test_a_call_inside_its_grant_works_and_is_audited_ok(env, ws, tmp_path, tool, args, result):
    step = env.step(format_call(tool, args))
    assert step.observation[0]["content"] == result
    (rec,) = _records(tmp_path)
    assert rec["outcome"] == "ok" and "violation" not in rec and rec["grant"]["read"] == list(env.grants[tool].read)
    if tool == "write_notes":
        assert ws.read("notes/b.md") == "b"


def test_the_kernel_layer_alone_keeps_a_read_only_workspace_and_no_network(sandbox, ws):
    """Without the hook (a plain program job): landlock refuses the write, seccomp the socket."""
    write = "open('main.py', 'a').write('x')\nprint('wrote')"
    assert sandbox.run(Job.run_program(write, workdir=ws.path)).stdout.strip() == "wrote"
    ws.restore()
    r = sandbox.run(Job.run_program(write, workdir=ws.path, read_only=True))
    assert r.exit_code != 0 and "PermissionError" in r.stderr and ws.read("main.py") == "print('hi')\n"
    r = sandbox.run(Job.run_program("import socket; socket.socket()", read_only=True))
    assert r.exit_code != 0 and ("PermissionError" in r.stderr or "OSError" in r.stderr)


def test_a_result_full_of_escapes_comes_back_whole_up_to_its_grant(sandbox, ws):
    ws.write("many.py", "\n\"\x01" * 5000)  # 15,000 characters, ~50 KB as JSON
    assert run_granted(sandbox, "read_path", read_path, READ_PY, {"path": "many.py"}, workdir=ws.path) == "\n\"\x01" * 5000
    with pytest.raises(GrantRefused) as e:
        run_granted(sandbox, "read_path", read_path, Grant(read=("*.py",), output_kb=8), {"path": "many.py"}, workdir=ws.path)
    assert e.value.kind == "output"


def test_listing_needs_a_read_grant(sandbox, ws):
    assert run_granted(sandbox, "ls", listing, Grant(read=("*",)), {}, workdir=ws.path) == "main.py\nnotes\nsecret.txt"
    with pytest.raises(GrantRefused) as e:
        run_granted(sandbox, "ls", listing, Grant(), {}, workdir=ws.path)
    assert e.value.kind == "path"


def test_a_tools_own_error_is_an_error_not_a_refusal(sandbox, ws):
    with pytest.raises(ToolCallError) as e:
        run_granted(sandbox, "read_path", read_path, READ_PY, {"path": "nope.py"}, workdir=ws.path)
    assert not isinstance(e.value, GrantRefused) and str(e.value).startswith("error: read_path: [Errno 2]")


@pytest.mark.parametrize("path,ok", [("a.py", True), ("src/a.py", True), ("./a.py", False), ("a/../b.py", False),
                                     ("/etc/passwd", False), ("../a.py", False), ("", False), (".", False),
                                     ("a//b.py", False), ("a.py/", False), ("a\0.py", False)])
def test_path_arguments_must_be_plain_workspace_paths(path, ok):
    assert (workspace_path(path) is not None) == ok
    if ok:
        check_paths("t", READ_PY, {"path": "read"}, {"path": path})
    else:
        with pytest.raises(GrantRefused):
            check_paths("t", READ_PY, {"path": "read"}, {"path": path})


@pytest.mark.parametrize("bad", [dict(network="loopback"), dict(wall_s=0), dict(memory_mb=1),
                                 dict(read=("/etc/*",)), dict(write=("../x",))])
def test_a_bad_grant_is_refused_with_its_key(bad):
    with pytest.raises(ConfigError, match="grant"):
        Grant(**bad)
