"""The ``code`` verifier: strict code extraction, a trusted compile, then hidden tests in the sandbox.

A completion answers with exactly one closed fenced block (```` ```python ````, ```` ```py ````
or a bare ```` ``` ````); zero blocks, an unclosed fence or several blocks are ``no_code``.
The code is compiled here (``compile`` only, never executed here) so a syntax error never costs a
sandbox run, then run in the sandbox against the task's hidden tests. Two spec forms:

- **io** (rlvr's generated tasks): ``{"entry_point", "inputs", "expected", "given"?, "timeout"?}``
  with ``inputs``/``expected`` encoded by ``plaindata.encode`` (a list of argument tuples, a list of
  outputs). Only the inputs enter the sandbox; outputs come back as plain data and are compared
  here, type-strictly (``ExecResult.compare``). ``given`` (a debug task's shown program's outputs
  on the inputs) only raises the floor of partial credit.
- **tests** (HumanEval-style): ``{"entry_point", "test", "prompt_code"?, "timeout"?}`` where
  ``test`` defines ``check(candidate)`` (or ``test_*`` functions). The tests run in a process the
  candidate never touches (``Job.with_tests``).

Either form may name an environment image (``"image": NAME``, ``rlvr.images``): the program then
runs on that image's interpreter and packages, not the host's (a missing or corrupt image stops
with a one-line error; docs/images.md).

A failing run's ``score`` (partial credit, paid only with ``reward.outcome: score``) is the
fraction of hidden cases (io) or tests passed *beyond what the best trivial program passes*: a
program that returns one constant, or one of its arguments unchanged, scores 0 however many
cases it matches (``rlvr.verifiers.partial``; ``details["trivial_baseline"]``).

Either form may carry ``prompt_code`` (the given signature and docstring; see
``assemble_program``): when the extracted code does not define ``entry_point`` at top level, the
program is ``prompt_code + code`` (the model answered with the body only); when it does, the
trusted prompt code still goes first, so imports and helpers the prompt showed are defined.

Verdict reasons:

    ok             every hidden test passed
    no_code        no single closed fenced block, or it is empty (``format_ok`` False)
    syntax_error   the program does not compile (checked here, before the sandbox)
    no_entry_point the program defines no top-level ``entry_point`` (def, assignment or import)
    timeout        killed at the wall-clock or CPU limit (e.g. an infinite loop)
    runtime_error  the program failed to load, every call raised, a test raised something other
                   than an assertion, the candidate's process died, or the output cap was hit
    wrong_answer   it ran, and some hidden test failed (score: the chance-corrected fraction)
    tampered       protected files changed, or the run ended without its complete report
                   (e.g. ``os._exit`` inside the harness's process); score 0
    sandbox_error  the sandbox itself failed (status ``error``); says nothing about the code

``check_many`` streams every sandbox job of a batch into the pool as soon as it is prepared
(``Sandbox.submit``, like ``Sandbox.map``: concurrent, results in order); failures found before
the sandbox never reach it. The sandbox is ``shared_sandbox()`` unless a caller
installed one with ``use_sandbox``. ``check_program`` is the same check for a complete program
and a HumanEval-style test, without extraction.
"""

from __future__ import annotations

import ast
import math
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.errors import UserError
from rlvr.sandbox import plaindata
from rlvr.types import Task, Verdict
from rlvr.verifiers.base import VERIFIERS
from rlvr.verifiers.partial import asserted_baseline, chance_corrected, trivial_baseline

if TYPE_CHECKING:  # the sandbox is imported lazily: importing rlvr.verifiers stays cheap
    from rlvr.sandbox.pool import Sandbox
    from rlvr.sandbox.types import ExecResult, Job

DEFAULT_TIMEOUT = 10.0
MAX_CODE_IN_DETAILS = 4000
MAX_STDERR_IN_DETAILS = 500
PYTHON_TAGS = ("", "python", "py", "python3")
CPU_KILL_SIGNALS = (9, 24)  # SIGKILL (hard RLIMIT_CPU), SIGXCPU (soft RLIMIT_CPU)

_FENCE = re.compile(r"^[ \t]{0,3}```[ \t]*([^`\s]*)[ \t]*$")


# ---------------------------------------------------------------- extraction


def extract_code(text: str) -> str | None:
    """The content of the one closed fenced Python block in ``text``, or None.

    None when there is no block, more than one block (of any language), an unclosed fence,
    a block tagged with another language, or only whitespace inside. A fence is a line of three
    backticks and an optional language tag; a tagged fence inside an open block is malformed.
    """
    blocks: list[tuple[str, list[str]]] = []
    current: tuple[str, list[str]] | None = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if current is None:
            if m is not None:
                current = (m.group(1).lower(), [])
        elif m is None:
            current[1].append(line)
        elif m.group(1):
            return None  # "```python" while a block is open: not one well-formed block
        else:
            blocks.append(current)
            current = None
    if current is not None or len(blocks) != 1:
        return None
    tag, lines = blocks[0]
    code = "\n".join(lines) + "\n"
    return code if tag in PYTHON_TAGS and code.strip() else None


def defines_top_level(tree: ast.Module, name: str) -> bool:
    """Whether a module binds ``name`` at top level: ``def``, ``class``, assignment or import."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                    return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
    return False


def compile_check(source: str) -> ast.Module | str:
    """The module's AST, or a one-line description of why it does not compile.

    Compiled here in the trusted process with ``compile`` (never executed): syntax errors,
    null bytes and too-deep nesting are all found without a sandbox run.
    """
    try:
        compile(source, "solution.py", "exec")
        return ast.parse(source, "solution.py")
    except SyntaxError as e:
        return f"{type(e).__name__}: {e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


# ---------------------------------------------------------------- the sandbox in use

_installed: Sandbox | None = None
_installed_lock = threading.Lock()


def use_sandbox(sandbox: Sandbox | None) -> Sandbox | None:
    """Make the code verifier run in ``sandbox`` (None: back to ``shared_sandbox()``).

    Returns the previously installed one. The caller keeps ownership (and closes it).
    """
    global _installed
    with _installed_lock:
        previous, _installed = _installed, sandbox
    return previous


def current_sandbox() -> Sandbox:
    """The installed sandbox if it is open, else the process-wide shared one (opened on use)."""
    sandbox = _installed
    if sandbox is not None and not getattr(sandbox, "_closed", False):
        return sandbox
    from rlvr.sandbox.config import shared_sandbox

    return shared_sandbox()


# ---------------------------------------------------------------- one check, in two halves


@dataclass
class _Pending:
    """A check that needs the sandbox: the job to run, and how to read its result."""

    job: Job
    finish: Callable[[ExecResult], Verdict]


def _fail(reason: str, details: dict[str, Any]) -> Verdict:
    return Verdict(passed=False, score=0.0, reason=reason, details=details)


def _limits(timeout: Any, task_id: str = ""):
    from rlvr.sandbox.types import Limits

    ok = type(timeout) in (int, float) and math.isfinite(timeout) and timeout > 0
    if not ok:
        where = f"task {task_id}: " if task_id else ""
        raise UserError(f"{where}code spec: 'timeout' must be a positive number of seconds, "
                        f"got {timeout!r}")
    return Limits(wall_s=float(timeout), cpu_s=max(1, math.ceil(timeout)))


def _common_details(details: dict[str, Any], result: ExecResult) -> dict[str, Any]:
    stderr = result.stderr or result.error
    return {**details, "status": result.status, "backend": result.backend,
            "stderr": stderr[-MAX_STDERR_IN_DETAILS:] if stderr else ""}


def _before_run(result: ExecResult) -> str | None:
    """The reason a run failed as a whole (before its tests are read), or None."""
    if result.status == "error":
        return "sandbox_error"
    if result.status == "timeout" or (result.status == "killed" and result.signal in CPU_KILL_SIGNALS):
        return "timeout"
    if result.status in ("killed", "output_limit"):
        return "runtime_error"
    if result.tampered:
        return "tampered"
    return None


def io_verdict(expected: list[Any], details: dict[str, Any],
               inputs: list[tuple] | None = None, given: list[Any] | None = None) -> Callable[[ExecResult], Verdict]:
    """The verdict of an io run; a partial score is chance-corrected against the best trivial
    program (``rlvr.verifiers.partial``), whose arguments are ``inputs`` (constants only if None),
    or the ``given`` outputs of the program the task shows."""
    baseline = trivial_baseline(inputs or [], expected, plaindata.same, given)

    def finish(result: ExecResult) -> Verdict:
        d = _common_details(details, result)
        total = len(expected)
        outputs = result.outputs or []
        errors = [o["error"] for o in outputs if "error" in o]
        n_right = result.compare(expected)
        d.update(tests_passed=n_right, tests_total=total, trivial_baseline=baseline)
        if errors:
            d["error"] = str(errors[0])[:300]
        failed = _before_run(result)
        if failed is None and errors and all(str(e).startswith("load: ") for e in errors) \
                and len(errors) == total:
            failed = "runtime_error"  # the program raised while loading (no outputs at all)
        if failed is None and not result.report_ok:
            # status ok, yet the report is incomplete (the process ended mid-way, e.g. os._exit)
            # or carries lines without this run's nonce: nothing in it is trusted.
            failed = "tampered"
        if failed is not None:
            d["tests_passed"] = 0
            return _fail(failed, d)
        if n_right == total:
            return Verdict(passed=True, score=1.0, reason="ok", details=d)
        reason = "runtime_error" if len(errors) == total else "wrong_answer"
        return Verdict(passed=False, score=chance_corrected(n_right, total, baseline), reason=reason,
                       details=d)

    return finish


def _finish_tests(details: dict[str, Any], baseline: int) -> Callable[[ExecResult], Verdict]:
    def finish(result: ExecResult) -> Verdict:
        d = _common_details(details, result)
        total = result.tests_total or 0
        passed = result.tests_passed or 0
        d.update(tests_passed=passed, tests_total=total, trivial_baseline=baseline)
        if result.failures:
            d["error"] = result.failures[0][:300]
        failed = _before_run(result)
        if failed is None and not result.report_ok:
            failed = "tampered"  # the tests' process never reported, or a report was forged
        if failed is not None:
            d["tests_passed"] = 0
            return _fail(failed, d)
        if total <= 0:
            return _fail("sandbox_error", {**d, "error": result.error or "the tests define no test"})
        if result.passed:
            return Verdict(passed=True, score=1.0, reason="ok", details=d)
        # A failure reads "<test>: <ExceptionType>: message"; anything but an assertion means
        # the candidate raised, failed to load, or its process died before answering.
        crashed = any(f.split(": ", 2)[1:2] != ["AssertionError"] for f in result.failures)
        reason = "runtime_error" if crashed else "wrong_answer"
        return Verdict(passed=False, score=chance_corrected(passed, total, baseline), reason=reason,
                       details=d)

    return finish


def _prepare_program(program: str, spec: dict[str, Any], details: dict[str, Any],
                     task_id: str = "") -> Verdict | _Pending:
    """Trusted pre-checks of a complete program, then the sandbox job for it."""
    from rlvr.sandbox.types import Job

    details["code"] = program[:MAX_CODE_IN_DETAILS]
    entry_point = spec["entry_point"]
    tree = compile_check(program)
    if isinstance(tree, str):
        return _fail("syntax_error", {**details, "error": tree})
    if not defines_top_level(tree, entry_point):
        return _fail("no_entry_point",
                     {**details, "error": f"the program defines no top-level {entry_point!r}"})
    limits = _limits(spec.get("timeout", DEFAULT_TIMEOUT), task_id)
    image = _image(spec, details, task_id)
    if "test" in spec:
        _check_test_source(spec["test"], task_id)
        tests = tests_with_prompt(spec["test"], spec.get("prompt_code") or "", entry_point)
        job = Job.with_tests(program, tests, entry_point, limits=limits, task_id=task_id, image=image)
        return _Pending(job, _finish_tests(details, asserted_baseline(spec["test"], entry_point)))
    inputs, expected = _decode_io(spec, task_id)
    given = _decode_given(spec, len(expected), task_id)
    job = Job.io(program, entry_point, inputs, limits=limits, task_id=task_id, image=image)
    return _Pending(job, io_verdict(expected, details, inputs, given))


def _image(spec: dict[str, Any], details: dict[str, Any], task_id: str) -> str:
    """The verified environment image the spec names (``image``), as the job's directory; "" for
    the host's interpreter. A missing or corrupt image is a ``UserError``: never run without it."""
    name = spec.get("image")
    if not name:
        return ""
    if not isinstance(name, str):
        raise UserError(f"task {task_id}: code spec 'image' must be an image name")
    from rlvr.images.cache import resolve

    image = resolve(name)
    details["image"] = image.key[:12]
    return str(image.path)


def _decode_io(spec: dict[str, Any], task_id: str) -> tuple[list[tuple], list[Any]]:
    where = f"task {task_id}: code spec" if task_id else "code spec"
    try:
        inputs, expected = plaindata.decode(spec["inputs"]), plaindata.decode(spec["expected"])
        if type(inputs) is not list or type(expected) is not list:
            raise TypeError("'inputs' and 'expected' must each encode a list")
        inputs = [tuple(args) for args in inputs]
    except (plaindata.NotPlainData, TypeError) as e:
        raise UserError(f"{where}: 'inputs'/'expected' are not plaindata-encoded lists: {e}") from None
    if not inputs or len(inputs) != len(expected):
        raise UserError(f"{where} needs a non-empty list of 'inputs' and as many 'expected' "
                        f"outputs (got {len(inputs)} and {len(expected)})")
    return inputs, expected


def _decode_given(spec: dict[str, Any], n: int, task_id: str) -> list[Any] | None:
    """The optional ``given``: outputs of the program the task shows, one per hidden input."""
    if "given" not in spec:
        return None
    where = f"task {task_id}: code spec" if task_id else "code spec"
    try:
        given = plaindata.decode(spec["given"])
    except plaindata.NotPlainData as e:
        raise UserError(f"{where}: 'given' is not a plaindata-encoded list: {e}") from None
    if type(given) is not list or len(given) != n:
        raise UserError(f"{where}: 'given' must encode one output per hidden input ({n})")
    return given


def _check_test_source(test: Any, task_id: str) -> None:
    """The trusted test must parse and define ``check`` or ``test_*`` (a task error otherwise)."""
    from rlvr.sandbox.harness import count_tests

    where = f"task {task_id}: " if task_id else ""
    if not isinstance(test, str):
        raise UserError(f"{where}code spec 'test' must be Python source, got {type(test).__name__}")
    try:
        n = count_tests(test)
    except (SyntaxError, ValueError) as e:
        raise UserError(f"{where}code spec 'test' does not parse: {e}") from None
    if n == 0:
        raise UserError(f"{where}code spec 'test' defines neither check(candidate) nor test_* functions")


def check_spec(task: Task) -> dict[str, Any]:
    """The task's code payload, checked (``UserError`` naming the task when it is malformed).

    Task files call this to drop broken tasks; the verifier calls it on every check, so a bad
    task is an error, never a silent zero reward.
    """
    spec = task.spec.payload
    where = f"task {task.id}: code spec"
    if not isinstance(spec.get("entry_point"), str) or not spec["entry_point"].isidentifier():
        raise UserError(f"{where} needs an 'entry_point' that is a Python name")
    if not isinstance(spec.get("prompt_code", ""), str):
        raise UserError(f"{where}: 'prompt_code' must be a string")
    _limits(spec.get("timeout", DEFAULT_TIMEOUT), task.id)
    if "test" in spec:
        _check_test_source(spec["test"], task.id)
    elif "inputs" in spec and "expected" in spec:
        _decode_io(spec, task.id)
    else:
        raise UserError(f"{where} needs 'test', or 'inputs' and 'expected'")
    return spec


def assemble_program(code: str, prompt_code: str, entry_point: str) -> str:
    """The program to run for extracted ``code`` given the task's ``prompt_code`` (may be "").

    Code that defines ``entry_point`` at top level is the whole solution; the prompt's code is
    put before it (it is trusted, its stub is redefined by the solution, and it carries the
    imports and helpers the prompt showed, e.g. HumanEval's ``from typing import List``) unless
    that does not compile (``from __future__`` must come first). Code that does not define it is
    read as the body that completes the prompt: ``prompt_code + code``.
    """
    if not prompt_code:
        return code
    prompt_code += "" if prompt_code.endswith("\n") else "\n"
    tree = compile_check(code)
    if isinstance(tree, str) or not defines_top_level(tree, entry_point):
        return prompt_code + code
    combined = prompt_code + "\n\n" + code
    return combined if not isinstance(compile_check(combined), str) else code


def tests_with_prompt(test: str, prompt_code: str, entry_point: str) -> str:
    """The trusted test source, with the task's (trusted) prompt code defined before it.

    HumanEval tests may call helpers the prompt defines (``poly`` in HumanEval/32,
    ``encode_cyclic`` in /38), as they do in the reference harness, where tests and program share
    a namespace. Here the tests run apart from the candidate, so the prompt code is run on the
    tests' side too; the harness's stub for ``entry_point`` is kept and restored, so the tests
    still call the candidate. The prompt's ``from __future__`` imports (which must come first)
    are put before the stub is saved, and a prompt that ends in a bare ``def`` line (the model
    writes the body) gets a ``...`` body here. Falls back to ``test`` alone when the combination
    does not compile.
    """
    if not prompt_code:
        return test
    head, body = _split_future(prompt_code)
    last = body.rstrip().rsplit("\n", 1)[-1]
    stubbed = body.rstrip() + "\n" + last[:len(last) - len(last.lstrip())] + "    ...\n"
    for prompt_body in (body, stubbed):
        combined = (f"{head}_rlvr_candidate = {entry_point}\n{prompt_body}\n\n{test}\n\n"
                    f"{entry_point} = _rlvr_candidate\n")
        if not isinstance(compile_check(combined), str):
            return combined
    return test


def _split_future(source: str) -> tuple[str, str]:
    """``source`` split after its leading docstring and ``from __future__`` imports, if any."""
    tree = compile_check(source)
    if isinstance(tree, str):
        return "", source
    end = 0
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            end = node.end_lineno or 0
        elif not (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str)):
            break
    if not end:
        return "", source
    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", source)  # as the tokenizer counts
    head = "".join(lines[:end])
    return head + ("" if head.endswith("\n") else "\n"), "".join(lines[end:])


def _prepare(task: Task, completion: str) -> Verdict | _Pending:
    spec = check_spec(task)
    code = extract_code(completion) if isinstance(completion, str) else None
    if code is None:
        return _fail("no_code", {"format_ok": False, "code": None})
    program = assemble_program(code, spec.get("prompt_code") or "", spec["entry_point"])
    return _prepare_program(program, spec, {"format_ok": True}, task.id)


def _run_all(prepared: Iterable[Verdict | _Pending]) -> list[Verdict]:
    """Submit each sandbox job as soon as it is prepared (preparing the next overlaps with
    running this one; ``submit`` blocks while the pool's queue is full), then read in order."""
    sandbox = None
    slots: list[tuple[Verdict | _Pending, Future | None]] = []
    for p in prepared:
        if isinstance(p, _Pending):
            sandbox = sandbox or current_sandbox()
            slots.append((p, sandbox.submit(p.job)))
        else:
            slots.append((p, None))
    return [p.finish(future.result()) if future is not None else p for p, future in slots]


# ---------------------------------------------------------------- the verifier


class CodeVerifier:
    """Spec kind ``code`` (see the module docstring for the two payload forms and the reasons)."""

    name = "code"

    def check(self, task: Task, completion: str) -> Verdict:
        return _run_all([_prepare(task, completion)])[0]

    def check_many(self, pairs: list[tuple[Task, str]]) -> list[Verdict]:
        """``check`` for each pair, in order, with every sandbox job submitted at once."""
        return _run_all(_prepare(task, completion) for task, completion in pairs)


def check_program(program: str, test: str, entry_point: str, timeout: float = 10.0) -> Verdict:
    """Run a complete Python ``program`` against HumanEval-style ``test`` source (defining
    ``check(candidate)``) in the sandbox. Same reasons as the verifier; no fence extraction."""
    if not isinstance(program, str) or not program.strip():
        return _fail("no_code", {"format_ok": False, "code": None})
    spec = {"entry_point": entry_point, "test": test, "timeout": timeout}
    return _run_all([_prepare_program(program, spec, {"format_ok": True})])[0]


VERIFIERS.register("code")(CodeVerifier())
