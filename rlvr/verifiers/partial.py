"""Partial credit of the ``code`` verifier: only what a trivial program could not earn.

``score = passed / total`` paid a program for work it never did: where most hidden outputs
coincide, ``return 0`` matched most of them (7/8 on some generated tasks), and where outputs
often equal an argument, ``return x`` did. The partial score is therefore chance-corrected
against the best *trivial* program, one whose output ignores its input (a constant) or is one
of its arguments unchanged::

    baseline = the most hidden cases one trivial program gets right
    score    = max(0, (passed - baseline) / (total - baseline))     (0 if baseline == total)

so every trivial program scores 0 (whichever constant or argument it returns), a program that
is right beyond them is paid for exactly the cases beyond, and a full pass is still 1.0.
(It is Cohen's kappa with the best trivial program as chance.)

- **io** tasks know every input and expected output: the baseline is exact. A task that shows a
  program to fix (``code.debug``) carries that program's outputs on the hidden inputs as
  ``"given"``: sending it back unchanged is trivial too, so the baseline is at least its matches.
- **tests** tasks (``test_*`` functions, e.g. MBPP's asserts through ``tests_from_asserts``)
  are read statically from the trusted test source: a test whose body is one
  ``assert f(<literals>) == <literal>`` (either side; also ``is``, a bare ``assert f(...)``
  and ``assert not f(...)``) says what it expects; the baseline counts those. A test of any other
  shape (``assert abs(f(x) - 2.5) < 1e-9``, ``set(f(x)) == ...``) is assumed to fail a trivial
  program, so a constant that passes one still earns its share there. ``check(candidate)`` is one
  test: no partial credit at all.

Pure functions: nothing here runs any code.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rlvr.sandbox import plaindata

MAX_CANDIDATES = 16  # most common expected outputs tried as the constant (with tolerance)
_TRUTHY, _FALSY = object(), object()  # what a bare ``assert f(x)`` / ``assert not f(x)`` expects


def chance_corrected(passed: int, total: int, baseline: int) -> float:
    """The partial score beyond ``baseline`` (module docstring); 1.0 for a full pass."""
    if total > 0 and passed >= total:
        return 1.0
    if total <= baseline:
        return 0.0
    return max(0.0, (passed - baseline) / (total - baseline))


def trivial_baseline(inputs: Sequence[tuple], expected: Sequence[Any],
                     same: Callable[[Any, Any], bool], given: Sequence[Any] | None = None) -> int:
    """The most io cases one constant, one argument returned unchanged, or the ``given`` outputs
    (the program a debug task shows) get right (``same``: the verifier's own comparison)."""
    groups = Counter(_key(e) for e in expected)  # exact values; ``same`` adds float tolerance
    firsts = {}
    for e in expected:
        firsts.setdefault(_key(e), e)
    common = [firsts[k] for k, _ in groups.most_common(MAX_CANDIDATES)]
    best = max((sum(same(c, e) for e in expected) for c in common), default=0)
    width = max((len(args) for args in inputs), default=0)
    for k in range(width):
        right = sum(len(args) > k and same(args[k], e) for args, e in zip(inputs, expected))
        best = max(best, right)
    if given is not None:
        best = max(best, sum(same(g, e) for g, e in zip(given, expected)))
    return best


def _key(value: Any) -> str:
    return json.dumps(plaindata.encode(value))


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _call_of(node: ast.AST, entry_point: str) -> ast.Call | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point:
        return node
    return None


def _expectation(test: ast.FunctionDef, entry_point: str) -> tuple[Any, tuple | None] | None:
    """(what the test expects, the call's literal arguments or None), or None if unknown."""
    body = [s for s in test.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return None
    node = body[0].test
    want: Any
    if (call := _call_of(node, entry_point)) is not None:
        want = _TRUTHY
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and \
            (call := _call_of(node.operand, entry_point)) is not None:
        want = _FALSY
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.Is)):
        left, right = node.left, node.comparators[0]
        call = _call_of(left, entry_point) or _call_of(right, entry_point)
        ok, want = _literal(right if call is left else left)
        if call is None or not ok:
            return None
    else:
        return None
    literal_args = [_literal(a) for a in call.args]
    args = tuple(v for _, v in literal_args) if not call.keywords and all(ok for ok, _ in literal_args) \
        else None
    return want, args


def _passes(value: Any, want: Any) -> bool:
    """Whether a program returning ``value`` passes a test that expects ``want`` (Python's ``==``,
    as the asserts compare)."""
    try:
        if want is _TRUTHY or want is _FALSY:
            return bool(value) is (want is _TRUTHY)
        return bool(value == want)
    except Exception:  # noqa: BLE001 - a literal whose comparison raises passes nothing
        return False


def asserted_baseline(test_source: str, entry_point: str) -> int:
    """The most ``test_*`` functions of ``test_source`` one trivial program passes, counting the
    tests whose expectation can be read (module docstring); 0 when the source does not parse."""
    try:
        tree = ast.parse(test_source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 0
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    if any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
        return 0  # one test: pass or fail, no partial credit to correct
    known = [e for t in tests if (e := _expectation(t, entry_point)) is not None]
    constants = [want for want, _ in known if want is not _TRUTHY and want is not _FALSY] + [True, False]
    best = max((sum(_passes(c, want) for want, _ in known) for c in constants), default=0)
    width = max((len(args) for _, args in known if args is not None), default=0)
    for k in range(width):
        best = max(best, sum(args is not None and len(args) > k and _passes(args[k], want)
                             for want, args in known))
    return best
