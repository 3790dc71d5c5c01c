"""Least-privilege tool grants: what each tool may touch, declared as data and enforced.

Every tool an environment offers declares a ``Grant`` (``ToolEnv.grants``, shown by ``rlvr envs
show NAME``): the workspace paths it may read and write (``fnmatch`` patterns relative to the
episode's workspace; ``*`` is all of it), its network (``none``), wall time, memory and output
size. The tool's body (a plain function of a module that imports only the standard library) runs
as its own sandbox job with exactly that grant, never in the trainer's process:

1. **Before it runs** (trusted side): path arguments (``Tool.paths``) must be plain relative paths
   (normal form) matching the grant; any other is refused without running.
2. **In the sandbox, by the kernel**: the job's limits are the grant's (wall time, address space,
   output); no network (network namespace, seccomp, landlock); the workspace is mounted
   read-only unless the grant writes (landlock, or ``--ro-bind`` under bwrap); nothing outside
   the workspace and the system is visible. This holds whatever the body does.
3. **In the sandbox, by name**: an audit hook (``sys.addaudithook``) installed before the body
   runs checks each file open, directory listing, file mutation and socket against the grant's
   patterns, and refuses a subprocess or a native library load, so a violation is refused with
   what it touched (``read /etc/passwd``) rather than a bare ``EACCES`` from layer 2. Its path
   patterns are finer than layer 2 (which grants the whole workspace, read-only or writable):
   they bind trusted tool code driven by model arguments, not hostile native code.

A refused call raises ``GrantRefused`` (a ``ToolCallError``): the model sees ``error: TOOL:
refused: ...`` as the tool result, and the operation log records the call with outcome
``refused``, the violation and the grant. Reads of the interpreter and the system libraries
(imports) are allowed to every tool, as to every sandbox run.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import json
import posixpath
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlvr.config import check_choice, check_range
from rlvr.envs.tools import ToolCallError
from rlvr.errors import ConfigError

NETWORKS = ("none",)
VIOLATIONS = ("path", "network", "process", "wall", "memory", "output")


@dataclass(frozen=True)
class Grant:
    """What one tool may touch. ``read``/``write``: workspace path patterns (``fnmatch``, ``*``
    matches across ``/``); a writable path is also readable."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    network: str = "none"
    """Only ``none`` is built: every sandbox run has no network at all (seccomp refuses every
    socket), so a loopback grant would need a second seccomp profile."""
    wall_s: float = 2.0
    memory_mb: int = 512
    """Address space of the tool's process (RLIMIT_AS), the interpreter's own included."""
    output_kb: int = 16
    """The tool's result; a longer one is refused, not cut."""

    def __post_init__(self) -> None:
        check_choice("grant.network", self.network, NETWORKS)
        check_range("grant.wall_s", self.wall_s, 0.05, 60.0)
        check_range("grant.memory_mb", self.memory_mb, 64, 8192)
        check_range("grant.output_kb", self.output_kb, 1, 1024)
        for pattern in (*self.read, *self.write):
            if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
                raise ConfigError(f"grant path pattern {pattern!r} must be relative to the workspace, without '..'")

    def allows(self, rel: str, write: bool) -> bool:
        """Whether workspace path ``rel`` (normalised, relative) may be read (or written)."""
        patterns = self.write if write else (*self.read, *self.write)
        return any(fnmatch.fnmatchcase(rel, p) for p in patterns)

    def limits(self):
        from rlvr.sandbox.types import Limits

        # stdout carries the result as JSON: up to 6 bytes per character (\u00XX escapes)
        return Limits(wall_s=self.wall_s, cpu_s=max(1, int(self.wall_s + 0.999)),
                      memory_mb=self.memory_mb, output_kb=6 * self.output_kb + 4)

    def describe(self) -> dict[str, Any]:
        """The grant as plain data (the operation log's ``grant`` field, ``rlvr envs show``)."""
        return {"read": list(self.read), "write": list(self.write), "network": self.network,
                "wall_s": self.wall_s, "memory_mb": self.memory_mb, "output_kb": self.output_kb}

    def summary(self) -> str:
        paths = lambda ps: ",".join(ps) or "-"
        return (f"read {paths(self.read)}  write {paths(self.write)}  network {self.network}  "
                f"wall {self.wall_s:g} s  memory {self.memory_mb} MB  output {self.output_kb} KB")


class GrantRefused(ToolCallError):
    """A call outside its tool's grant. ``kind``: one of ``VIOLATIONS``; ``str(e)`` is the
    error observation."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def workspace_path(path: str) -> str | None:
    """``path`` if it is a plain path inside the workspace (relative, normal form: no ``.``,
    ``..``, ``//`` or trailing ``/``), else None."""
    if not path or "\0" in path or posixpath.normpath(path) != path or path.startswith(("/", "../")):
        return None
    return None if path in (".", "..") else path


def check_paths(tool: str, grant: Grant, paths: dict[str, str], arguments: dict[str, Any]) -> None:
    """Layer 1: refuse a path argument outside the workspace or the grant (``paths``: argument
    name -> ``read`` | ``write``)."""
    for arg, mode in paths.items():
        if arg not in arguments:
            continue
        path = arguments[arg]
        rel = workspace_path(path)
        if rel is None:
            raise GrantRefused("path", f"error: {tool}: refused: {mode} {path!r}: not a plain path inside "
                                       "the workspace (relative, no '.' or '..' parts)")
        if not grant.allows(rel, write=mode == "write"):
            allowed = ", ".join(grant.write if mode == "write" else (*grant.read, *grant.write)) or "nothing"
            raise GrantRefused("path", f"error: {tool}: refused: {mode} {rel}: this tool may {mode} {allowed}")


# ---------------------------------------------------------------- layer 3, in the sandbox

# Appended to the body's module source; runs the body with the audit hook in place.
# stdin: {"function", "args", "context", "grant", "system"}; stdout: one JSON line,
# {"ok": true, "result"} | {"ok": false, "error"} | {"ok": false, "denied": [kind, detail]}.
_SHIM = r'''
def _rlvr_grant_main():
    import fnmatch as _fn, json as _json, os as _os, sys as _sys
    req = _json.loads(_sys.stdin.read())
    grant, root = req["grant"], _os.path.realpath(_os.getcwd())
    system = tuple(req["system"])
    # /dev/null, and the bytecode cache prefix that cannot exist (imports try it and fail)
    harmless = ("/dev/null",) + ((_sys.pycache_prefix,) if _sys.pycache_prefix else ())
    denied = []

    class Denied(PermissionError):
        pass

    def deny(kind, detail):
        if not denied:
            denied.append([kind, detail])
        raise Denied(f"refused: {detail}")

    def check(path, write):
        if path is None or isinstance(path, int):
            return  # an fd: opened (and checked) before
        real = _os.path.realpath(_os.path.join(root, _os.fsdecode(path)))
        if real == root or real.startswith(root + _os.sep):
            rel = "." if real == root else _os.path.relpath(real, root)
            pats = grant["write"] if write else grant["read"] + grant["write"]
            if rel == "." and not write and pats:
                return  # listing the workspace itself: what is in it is checked per file
            if not any(_fn.fnmatchcase(rel, p) for p in pats):
                deny("path", f"{'write' if write else 'read'} {rel}: not in this tool's grant")
        elif real.startswith(harmless):
            return
        elif write or not real.startswith(system):
            deny("path", f"{'write' if write else 'read'} {real}: outside the workspace")

    flags_w = _os.O_WRONLY | _os.O_RDWR | _os.O_APPEND | _os.O_CREAT | _os.O_TRUNC
    writes = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.truncate": 1, "os.chmod": 1,
              "os.chown": 1, "os.utime": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2,
              "shutil.copyfile": 2, "shutil.rmtree": 1}
    banned = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
              "os.forkpty", "pty.spawn", "ctypes.dlopen", "os.kill", "os.killpg")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            check(path, bool((flags or 0) & flags_w) or any(c in (mode or "") for c in "wax+"))
        elif event in ("os.listdir", "os.scandir"):
            check(args[0] if args else ".", False)
        elif event in writes:
            for path in args[:writes[event]]:
                check(path, True)
        elif event.startswith("socket."):
            deny("network", f"{event} (this tool's network grant is none)")
        elif event.startswith(banned):
            deny("process", f"{event} (no tool may start processes or load native code)")

    fn = globals()[req["function"]]
    _sys.addaudithook(hook)
    try:
        result = fn(**req["args"], **req["context"])
        out = {"ok": True, "result": str(result)}
    except Denied:
        out = {"ok": False}
    except MemoryError:
        denied.append(["memory", f"over its memory grant ({grant['memory_mb']} MB)"])
        out = {"ok": False}
    except RecursionError:
        out = {"ok": False, "error": "too deeply nested"}
    except Exception as e:  # noqa: BLE001 - the tool's own error, shown to the model
        out = {"ok": False, "error": str(e) or type(e).__name__}
    if out.get("ok") and len(out["result"].encode()) > grant["output_kb"] * 1024:
        denied.append(["output", f"a result over its output grant ({grant['output_kb']} KB)"])
    if denied:
        out = {"ok": False, "denied": denied[0]}
    _sys.stdout.write(_json.dumps(out) + "\n")
    _sys.stdout.flush()


_rlvr_grant_main()
'''

_SOURCES: dict[str, str] = {}


def body_program(body: Callable) -> str:
    """The sandbox program that runs ``body``: its module's source, then the shim. The module
    may import only what the sandbox can read (the standard library, installed packages)."""
    module = body.__module__
    if module not in _SOURCES:
        _SOURCES[module] = inspect.getsource(sys.modules[module])
    return _SOURCES[module] + "\n" + _SHIM


@functools.cache
def system_paths() -> tuple[str, ...]:
    """What every sandbox run may read outside its workspace (computed once: a scan of sys.path)."""
    from rlvr.sandbox.isolate import SYSTEM_READ_ONLY, python_paths

    return tuple(p.rstrip("/") + "/" for p in SYSTEM_READ_ONLY + python_paths())


def run_granted(sandbox, tool: str, body: Callable, grant: Grant, arguments: dict[str, Any],
                context: dict[str, Any] | None = None, workdir: str | None = None,
                protected: tuple[str, ...] = (), task_id: str = "") -> str:
    """Run tool ``body(**arguments, **context)`` as a sandbox job under ``grant`` (layers 2 and
    3): its result, or ``GrantRefused`` for a violation, ``ToolCallError`` for the tool's own
    error. ``context``: trusted arguments the model does not choose (the task's table)."""
    from rlvr.sandbox.types import Job

    stdin = json.dumps({"function": body.__name__, "args": arguments, "context": context or {},
                        "grant": grant.describe(), "system": list(system_paths())})
    job = Job.run_program(body_program(body), stdin=stdin, workdir=workdir, protected=protected,
                          limits=grant.limits(), read_only=not grant.write, task_id=task_id)
    r = sandbox.run(job)
    if r.status == "timeout":
        raise GrantRefused("wall", f"error: {tool}: refused: over its time grant ({grant.wall_s:g} s)")
    if r.status == "output_limit":
        raise GrantRefused("output", f"error: {tool}: refused: over its output grant ({grant.output_kb} KB)")
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        ok = bool(out["ok"])
    except (ValueError, IndexError, KeyError, TypeError):
        if "MemoryError" in r.stderr:
            raise GrantRefused("memory", f"error: {tool}: refused: over its memory grant ({grant.memory_mb} MB)") from None
        raise ToolCallError(f"error: {tool}: the tool failed ({r.status})") from None
    if ok:
        return str(out["result"])
    if out.get("denied"):
        kind, detail = out["denied"]
        raise GrantRefused(str(kind), f"error: {tool}: refused: {detail}")
    raise ToolCallError(f"error: {tool}: {str(out.get('error', 'failed'))[:200]}")
