"""MBPP-style tests: a list of ``assert`` strings that call the function by name.

MBPP rows carry ``test_list`` (``assert remove_Occ("hello","l") == "heo"``), an optional
``test_setup_code`` and a reference ``code``. ``tests_from_asserts`` turns them into trusted test
source for the ``tests`` form of the code verifier: one ``test_*`` function per assert (so a
failure's partial score counts asserts: those passed beyond what the best constant or
argument-returning program passes, ``rlvr.verifiers.partial``, which reads each
``assert f(<literals>) == <literal>`` back), run in the harness's tests process, where the
``entry_point`` name is bound to the stub that calls the candidate in its own process. The
candidate's process never sees the asserts.

Pure functions: nothing here runs any of the code.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from rlvr.verifiers.code import defines_top_level

TEST_PREFIX = "test_assert_"
_SAVED = "_rlvr_candidate"


def _parse(source: str, what: str) -> ast.Module:
    try:
        compile(source, "tests.py", "exec")  # also refuses ``return`` outside a function etc.
        return ast.parse(source, "tests.py")
    except SyntaxError as e:
        raise ValueError(f"{what} does not parse: {e.msg} (line {e.lineno})") from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        raise ValueError(f"{what} does not parse: {type(e).__name__}: {str(e)[:200]}") from None


def _check_setup(tree: ast.Module) -> None:
    """Setup code must not add tests of its own: the harness would run (and count) them."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                node.name == "check" or node.name.startswith("test_")):
            raise ValueError(f"test_setup_code defines {node.name!r}, a name the harness "
                             "reads as a test")


def tests_from_asserts(asserts: Sequence[str], entry_point: str, setup_code: str = "") -> str:
    """Trusted test source for MBPP's ``test_list``: ``test_assert_<i>`` runs assert ``i``.

    ``setup_code`` (MBPP's ``test_setup_code``) runs first, at module level, so the asserts see
    its imports and names. The asserts call ``entry_point`` by name: in the harness's tests
    process that name is the candidate's stub, and it is saved before the setup code and
    restored after it, so nothing the setup binds can stand in for the candidate.

    ``ValueError`` (naming the index) for an assert that is not a string, does not parse or
    contains no ``assert`` statement; also for an empty list, a bad ``entry_point`` and setup
    code that does not parse or defines ``check``/``test_*``.
    """
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError(f"entry_point must be a Python name, got {entry_point!r}")
    if isinstance(asserts, str) or not isinstance(asserts, Sequence) or not asserts:
        raise ValueError("asserts must be a non-empty list of assert strings")
    if not isinstance(setup_code, str):
        raise ValueError(f"test_setup_code must be a string, got {type(setup_code).__name__}")  # noqa: TRY004
    functions = []
    for i, source in enumerate(asserts):
        if not isinstance(source, str):
            raise ValueError(f"assert {i} is not a string (got {type(source).__name__})")  # noqa: TRY004
        tree = _parse(source.strip(), f"assert {i}")
        if not any(isinstance(n, ast.Assert) for n in ast.walk(tree)):
            raise ValueError(f"assert {i} contains no assert statement: {source.strip()[:100]!r}")
        fn = ast.parse(f"def {TEST_PREFIX}{i}():\n    pass\n").body[0]
        fn.body = tree.body
        functions.append(ast.unparse(fn))
    parts = []
    if setup_code.strip():
        _check_setup(_parse(setup_code, "test_setup_code"))
        parts = [f"{_SAVED} = {entry_point}", setup_code.rstrip("\n"), f"{entry_point} = {_SAVED}"]
    parts.extend(functions)
    test = "\n\n\n".join(parts) + "\n"
    _parse(test, "the generated tests")  # e.g. setup code with ``from __future__``
    return test


def _called_names(asserts: Sequence[str]) -> list[str]:
    """Names the asserts call directly (``f(...)``), then the other names they load, in order."""
    called: list[str] = []
    loaded: list[str] = []
    for source in asserts:
        if not isinstance(source, str):
            continue
        try:
            tree = ast.parse(source.strip())
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.append(node.func.id)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                loaded.append(node.id)
    seen: dict[str, None] = {}
    for name in called + loaded:
        seen.setdefault(name, None)
    return list(seen)


def entry_point_of(code: str, asserts: Sequence[str] = ()) -> str | None:
    """The function a reference ``code`` defines that the ``asserts`` call, or None.

    With ``asserts``: the first name they call (then: use otherwise) that ``code`` binds at top
    level (``def``, ``class``, assignment or import, as the verifier's entry-point check reads
    it). Without: the only top-level function, else the last one (MBPP references define their
    helpers first). None when the code does not parse or defines no such name.
    """
    if not isinstance(code, str):
        return None
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if asserts:
        for name in _called_names(asserts):
            if defines_top_level(tree, name):
                return name
        return None
    functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return functions[-1] if functions else None
