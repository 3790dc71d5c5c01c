"""What goes into the sandbox (``Job`` with ``Limits``) and what comes out (``ExecResult``).

Four kinds of job:

- ``io``: call ``entry_point`` of the candidate ``program`` on each of ``inputs``; the outputs
  come back as plain data (see ``plaindata``) and the trusted caller compares them with expected
  values that never entered the sandbox (``ExecResult.compare``).
- ``tests``: run trusted ``tests`` (HumanEval-style ``check(candidate)`` or ``test_*``
  functions) against the candidate. The tests run in a separate process from the candidate and
  call it through a plain-data channel, and report through a pipe the candidate never holds.
- ``program``: run the candidate ``program`` as ``__main__`` with ``stdin``.
- ``command``: execute ``argv`` (e.g. ``["python3", "-m", "pytest", "-q"]``) in the workspace.

A job with ``image`` (a verified ``rlvr.images`` directory) runs on that image's interpreter and
packages instead of the host's, and only that image is readable to it.

Every job runs over a workspace: ``files`` written into a fresh directory, or an existing
``workdir`` (a ``Workspace`` snapshot). Files named in ``protected`` are read-only to the
candidate and hash-checked after the run; ``read_only`` makes the whole workspace read-only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.sandbox import plaindata

JobKind = Literal["io", "tests", "program", "command"]
Status = Literal["ok", "timeout", "output_limit", "killed", "error"]


@dataclass(frozen=True)
class Limits:
    """Per-execution limits. Wall time kills the whole process tree; the rest are rlimits."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    processes: int = 32  # RLIMIT_NPROC of the per-slot uid
    file_size_mb: int = 16
    open_files: int = 64
    output_kb: int = 64  # kept per stream (head; plus a 4 KiB tail)
    output_kill_mb: int = 8  # total stdout+stderr past which the run is killed

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Job:
    kind: JobKind
    program: str = ""
    entry_point: str = ""
    inputs: tuple = ()  # io: one tuple of positional arguments per call
    tests: str = ""  # tests: trusted test source
    argv: tuple[str, ...] = ()  # command
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)
    protected: tuple[str, ...] = ()
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = Limits()
    task_id: str = ""
    read_only: bool = False  # the workspace is read-only to the run (landlock; bwrap: --ro-bind)
    image: str = ""  # a verified environment image's directory (rlvr.images): the run's interpreter

    @classmethod
    def io(cls, program: str, entry_point: str, inputs, **kw) -> Job:
        return cls(kind="io", program=program, entry_point=entry_point,
                   inputs=tuple(tuple(a) for a in inputs), **kw)

    @classmethod
    def with_tests(cls, program: str, tests: str, entry_point: str, **kw) -> Job:
        return cls(kind="tests", program=program, tests=tests, entry_point=entry_point, **kw)

    @classmethod
    def run_program(cls, program: str, stdin: str = "", **kw) -> Job:
        return cls(kind="program", program=program, stdin=stdin, **kw)

    @classmethod
    def command(cls, argv, **kw) -> Job:
        return cls(kind="command", argv=tuple(argv), **kw)

    def untrusted_part(self) -> dict[str, Any]:
        """What the candidate's process may see: everything except the tests."""
        return {
            "kind": self.kind, "program": self.program, "entry_point": self.entry_point,
            "inputs": plaindata.dumps([tuple(a) for a in self.inputs]), "argv": list(self.argv),
            "stdin": self.stdin, "files": self.files, "protected": list(self.protected),
            "workdir": self.workdir, "env": self.env, "limits": self.limits.to_dict(),
            "read_only": self.read_only, "image": self.image,
        }


@dataclass
class ExecResult:
    """One execution. ``status`` says how it ended; the rest says what it did."""

    status: Status
    backend: str
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_bytes: int = 0  # total produced on stdout+stderr, kept or not
    truncated: bool = False
    duration_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    outputs: list[dict[str, Any]] | None = None  # io: per input {"ok": value} | {"error": str}
    tests_total: int | None = None  # tests: the count the trusted side expects
    tests_passed: int | None = None
    tests_failed: int | None = None
    failures: list[str] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)  # protected files that changed
    report_ok: bool = False  # the harness's report arrived intact with the right nonce
    error: str = ""

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"

    @property
    def passed(self) -> bool:
        """Tests jobs: every expected test passed, reported through the trusted channel."""
        return (self.status == "ok" and self.report_ok and not self.tampered
                and self.tests_total is not None and self.tests_total > 0
                and self.tests_passed == self.tests_total and self.tests_failed == 0)

    def compare(self, expected: list[Any], rel_tol: float = 1e-9, abs_tol: float = 0.0) -> int:
        """Io jobs: how many outputs equal (type-strictly) the expected values, in order."""
        if self.tampered or self.outputs is None:
            return 0
        n = 0
        for want, got in zip(expected, self.outputs):
            if "ok" in got and plaindata.same(got["ok"], want, rel_tol, abs_tol):
                n += 1
        return n

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.outputs is not None:
            d["outputs"] = [{k: (plaindata.encode(v) if k == "ok" else v) for k, v in o.items()}
                            for o in self.outputs]
        return d
