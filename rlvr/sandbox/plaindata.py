"""Plain data across the sandbox boundary: a tagged JSON encoding and type-strict comparison.

Values that cross out of the sandbox are rebuilt by the trusted side from this encoding, so an
object with a forged ``__eq__`` or ``__repr__`` can never arrive: only ``None``, ``bool``,
``int``, ``float``, ``complex``, ``str``, ``bytes`` and lists, tuples, dicts, sets and
frozensets of them exist on the other side. Tuples stay tuples and ``True`` never equals ``1``.
"""

from __future__ import annotations

import json
import math

TYPE_CHECKING = False  # (typing is not imported at run time: a run on an image imports this fresh)
if TYPE_CHECKING:
    from typing import Any

MAX_DEPTH = 64


class NotPlainData(TypeError):
    """A value that is not plain data (a class instance, a function, a cycle, too deep)."""


def encode(value: Any, depth: int = 0) -> Any:
    """A JSON-able tagged tree for ``value``; raises NotPlainData for anything else."""
    if depth > MAX_DEPTH:
        raise NotPlainData("nested too deeply")
    t = type(value)  # exact types only: subclasses can override comparison
    if value is None:
        return ["n"]
    if t is bool:
        return ["b", value]
    if t is int:
        return ["i", str(value)]
    if t is float:
        return ["f", repr(value)]
    if t is complex:
        return ["c", repr(value.real), repr(value.imag)]
    if t is str:
        return ["s", value]
    if t is bytes:
        return ["y", value.hex()]
    if t in (list, tuple, set, frozenset):
        items = [encode(v, depth + 1) for v in value]
        if t in (set, frozenset):
            items.sort(key=lambda e: json.dumps(e))
        return [{list: "l", tuple: "t", set: "S", frozenset: "F"}[t], items]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise NotPlainData(f"not plain data: {t.__name__}")


def decode(tree: Any) -> Any:
    """Rebuild a value from ``encode``'s tree; raises NotPlainData on anything malformed."""
    try:
        tag = tree[0]
        if tag == "n":
            return None
        if tag == "b" and type(tree[1]) is bool:
            return tree[1]
        if tag == "i":
            return int(tree[1])
        if tag == "f":
            return float(tree[1])
        if tag == "c":
            return complex(float(tree[1]), float(tree[2]))
        if tag == "s" and type(tree[1]) is str:
            return tree[1]
        if tag == "y":
            return bytes.fromhex(tree[1])
        if tag in ("l", "t", "S", "F"):
            items = [decode(v) for v in tree[1]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d":
            return {decode(k): decode(v) for k, v in tree[1]}
    except NotPlainData:
        raise
    except (TypeError, ValueError, IndexError, KeyError, RecursionError) as e:
        raise NotPlainData(f"malformed value: {e}") from None
    raise NotPlainData(f"malformed value tag: {str(tree)[:40]}")


def dumps(value: Any) -> str:
    return json.dumps(encode(value), separators=(",", ":"))


def loads(text: str) -> Any:
    try:
        return decode(json.loads(text))
    except (ValueError, RecursionError) as e:
        raise NotPlainData(f"malformed value: {e}") from None


def same(a: Any, b: Any, rel_tol: float = 1e-9, abs_tol: float = 0.0) -> bool:
    """Type-strict equality; floats (and complex parts) compare within the tolerances."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    if type(a) is complex:
        return same(a.real, b.real, rel_tol, abs_tol) and same(a.imag, b.imag, rel_tol, abs_tol)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y, rel_tol, abs_tol) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k], rel_tol, abs_tol) for k in a)
    return a == b
