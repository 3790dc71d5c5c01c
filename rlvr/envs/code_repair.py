"""``code.repair``: repair a small Python project with file tools, judged by hidden tests.

    list_files()                  the project's files
    read_file(path)               a file's text
    write_file(path, content)     replace (or create) a file
    replace(path, old, new)       patch: ``old`` must occur exactly once in the file, and
                                  differ from ``new`` (a no-op patch is an error observation)
    run_tests()                   run the visible tests in the sandbox; a short summary
    submit()                      end the episode

The workspace (``rlvr.sandbox.Workspace`` on tmpfs) is created once per task and restored from
its snapshot at every later reset of the same task (about a millisecond), so an instance reused
across the episodes of a group pays the creation once. Test files are read-only (mode 0o444,
and hash-checked by the sandbox in every run): a write to one is refused *and* recorded, and
the verdict is ``tampered`` (score 0) if any was attempted or a test file differs from the
original at verify time. ``run_tests`` output is only an observation: the reward is hidden
tests (trusted expected values, compared here) run on the final workspace in one sandbox
``io`` job through a trusted shim that imports the project's modules. Score 1 if every hidden
test passes, else 0; reasons as the code verifier's (``ok``, ``wrong_answer``,
``syntax_error``, ``runtime_error``, ``timeout``, ``tampered``, ``sandbox_error``) or
``budget`` (``Environment.verify``).
"""

from __future__ import annotations

from typing import Any

from rlvr.envs.base import ENVS, EnvConfig, ToolEnv
from rlvr.envs.bodies import files
from rlvr.envs.bodies.files import OK
from rlvr.envs.grants import Grant, run_granted
from rlvr.envs.tools import Tool, ToolCallError
from rlvr.sandbox import plaindata
from rlvr.tasks.code_repair import SHIM, runner_program
from rlvr.types import Message, Task, Verdict

TESTS_WALL_S = 3.0  # run_tests
HIDDEN_WALL_S = 5.0  # the hidden tests at verify time
MAX_TESTS_OUTPUT = 600


def hidden_limits(wall_s: float):
    from rlvr.sandbox.types import Limits

    return Limits(wall_s=wall_s, cpu_s=max(1, int(wall_s)))


@ENVS.register("code.repair")
class CodeRepairEnv(ToolEnv):
    name = "code.repair"
    grants = {
        "list_files": Grant(read=("*",), wall_s=2.0, memory_mb=512, output_kb=8),
        "read_file": Grant(read=("*",), wall_s=2.0, memory_mb=512, output_kb=16),
        "write_file": Grant(read=("*",), write=("*",), wall_s=2.0, memory_mb=512, output_kb=1),
        "replace": Grant(read=("*",), write=("*",), wall_s=2.0, memory_mb=512, output_kb=1),
        "run_tests": Grant(read=("*",), wall_s=TESTS_WALL_S, memory_mb=1024, output_kb=16),
        "submit": None,
    }

    file_limits: dict[str, int] = {}  # trusted limits of write_file/replace (repo.fix: a real repository)

    def __init__(self, cfg: EnvConfig | None = None, *, sandbox: Any = None) -> None:
        super().__init__(cfg, sandbox=sandbox)
        self._ws = None
        self._ws_task = ""
        self._payload: dict[str, Any] = {}
        self._protected: set[str] = set()
        self._tamper: list[str] = []
        self.restored = False  # whether the last reset took the restore path (tests, benchmarks)
        g = self.grants
        self._tools = [
            Tool("list_files", "List the project's files.", self._list_files, grant=g["list_files"]),
            Tool("read_file", "Read a file.", self._read_file,
                 {"path": ("string", "file path")}, grant=g["read_file"], paths={"path": "read"}),
            Tool("write_file", "Write a whole file.", self._write_file,
                 {"path": ("string", "file path"), "content": ("string", "new text")},
                 grant=g["write_file"], paths={"path": "write"}),
            Tool("replace", "Replace text that occurs once in a file.", self._replace,
                 {"path": ("string", "file path"), "old": ("string", "text to find"),
                  "new": ("string", "replacement")}, grant=g["replace"], paths={"path": "write"}),
            Tool("run_tests", "Run the tests.", self._run_tests, grant=g["run_tests"]),
            Tool("submit", "Submit the fixed project.", self._submit),
        ]

    # -- episode --

    def reset(self, task: Task) -> list[Message]:
        payload = task.spec.payload
        if self._ws is not None and self._ws_task == task.id:
            self._ws.restore()
            self.restored = True
        else:
            self._close_ws()
            self._ws = self._create(payload)
            self._ws_task = task.id
            self.restored = False
        self._payload = payload
        self._protected = set(payload["protected"])
        self._tamper = []
        return super().reset(task)

    @staticmethod
    def _create(payload: dict[str, Any]):
        from rlvr.sandbox.workspace import Workspace

        protected = set(payload["protected"])
        files = payload["files"]
        # Writable (0o666): the file tools run in the sandbox as a slot uid, not the owner.
        ws = Workspace.create({p: t for p, t in files.items() if p not in protected}, writable=True)
        try:
            for path in payload["protected"]:
                ws.write(path, files[path], mode=0o444)
            ws.snapshot()
        except BaseException:
            ws.close()
            raise
        return ws

    def tools(self) -> list[Tool]:
        return self._tools

    def close(self) -> None:
        self._close_ws()

    def _close_ws(self) -> None:
        if self._ws is not None:
            self._ws.close()
        self._ws, self._ws_task = None, ""

    def _sandbox(self):
        if self.sandbox is not None:
            return self.sandbox
        from rlvr.verifiers.code import current_sandbox

        return current_sandbox()

    # -- tools (arguments are checked against the schema and the grant by ``run_tool``) --

    def _granted(self, tool: str, body, context: dict[str, Any] | None = None, **arguments) -> str:
        return run_granted(self._sandbox(), tool, body, self.grants[tool], arguments, context=context,
                           workdir=self._ws.path, task_id=self.task.id)

    def _put(self, tool: str, path: str, **arguments) -> str:
        if path in self._protected:  # workspace paths are normalized: no "./x" or "a/../x"
            self._tamper.append(path)
            raise ToolCallError(f"error: {path} is a test file; it is read-only")
        return self._granted(tool, getattr(files, tool), context=dict(self.file_limits) or None, path=path, **arguments)

    def _list_files(self) -> str:
        return self._granted("list_files", files.list_files)

    def _read_file(self, path: str) -> str:
        return self._granted("read_file", files.read_file, path=path)

    def _write_file(self, path: str, content: str) -> str:
        return self._put("write_file", path, content=content)

    def _replace(self, path: str, old: str, new: str) -> str:
        return self._put("replace", path, old=old, new=new)

    def _run_tests(self) -> str:
        from rlvr.sandbox.types import Job

        job = Job.run_program(runner_program(self._payload["tests"]), workdir=self._ws.path,
                              protected=tuple(self._payload["protected"]), read_only=True,
                              limits=self.grants["run_tests"].limits(), task_id=self.task.id)
        r = self._sandbox().run(job)
        if r.tampered:
            self._tamper += r.tampered
        if r.status == "timeout":
            return "error: the tests timed out"
        if r.status != "ok":
            return f"error: the tests did not finish ({r.status})"
        out = r.stdout.strip() or (r.stderr.strip().splitlines() or ["no output"])[-1]
        return out[-MAX_TESTS_OUTPUT:]

    def _submit(self) -> str:
        self.finish_with("submit")
        return OK

    # -- verdict --

    def tampered(self) -> list[str]:
        bad = list(dict.fromkeys(self._tamper))
        for path in self._payload["protected"]:
            try:
                same = self._ws.read(path) == self._payload["files"][path]
            except (OSError, ValueError):
                same = False
            if not same and path not in bad:
                bad.append(path)
        return bad

    def _verify(self) -> Verdict:
        from rlvr.sandbox.types import Job
        from rlvr.verifiers.code import compile_check, io_verdict

        hidden = [tuple(h) for h in plaindata.decode(self._payload["hidden"])]
        expected = plaindata.decode(self._payload["expected"])
        for module in dict.fromkeys(h[0] for h in hidden):  # compile only, never run here
            try:
                source = self._ws.read(f"{module}.py")
            except (OSError, ValueError):
                continue  # a missing module fails in the sandbox (runtime_error)
            error = compile_check(source)
            if isinstance(error, str):
                return Verdict(False, 0.0, "syntax_error", {"error": error, "file": f"{module}.py"})
        job = Job.io(SHIM, "run", hidden, workdir=self._ws.path,
                     protected=tuple(self._payload["protected"]),
                     limits=hidden_limits(HIDDEN_WALL_S), task_id=self.task.id)
        v = io_verdict(expected, {})(self._sandbox().run(job))
        return Verdict(v.passed, 1.0 if v.passed else 0.0, v.reason,
                       {**v.details, "fraction": v.score})
