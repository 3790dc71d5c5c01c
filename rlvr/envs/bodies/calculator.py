"""The ``calculator`` tool: arithmetic over ints/floats (+ - * / // % **, unary minus,
parentheses), parsed with ``ast`` and walked node by node; never ``eval``. Magnitudes, exponents,
length and node count are bounded. Standard library only: it runs in the sandbox (a tool body)."""

from __future__ import annotations

import ast
import math

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 60
MAX_MAGNITUDE = 10**18
MAX_POWER = 64  # largest exponent of **


def format_number(x: float) -> str:
    """``12`` -> ``"12"``, ``5.0`` -> ``"5"``, ``1/3`` -> ``"0.333333"``."""
    if isinstance(x, int):
        return str(x)
    if x.is_integer():
        return str(int(x))
    return repr(round(x, 6))


def _check(x: float) -> float:
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError("the result is not a finite number")
    if abs(x) > MAX_MAGNITUDE:
        raise ValueError("number too large")
    return x


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left), _eval(node.right)
        op = node.op
        if isinstance(op, ast.Add):
            return _check(a + b)
        if isinstance(op, ast.Sub):
            return _check(a - b)
        if isinstance(op, ast.Mult):
            return _check(a * b)
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if b == 0:
                raise ValueError("division by zero")
            if isinstance(op, ast.Div):
                return _check(a / b)
            return _check(a // b if isinstance(op, ast.FloorDiv) else a % b)
        if isinstance(op, ast.Pow):
            if not isinstance(b, int) or not 0 <= b <= MAX_POWER:
                raise ValueError(f"exponent must be an integer 0..{MAX_POWER}")
            if a != 0 and abs(a) != 1 and b * math.log10(abs(a)) > 18:
                raise ValueError("number too large")
            return _check(a**b)
    raise ValueError("only numbers, + - * / // % **, and parentheses")


def evaluate(tree: ast.AST) -> str:
    """A parsed expression's value (the calculator without its length limits: replays)."""
    return format_number(_eval(tree))


def calculate(expression: str) -> str:
    """The tool body: ``expression``'s value as text; ``ValueError`` says what is wrong."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError("invalid expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ValueError("expression too long")
    try:
        return format_number(_eval(tree))
    except (OverflowError, RecursionError):
        raise ValueError("number too large") from None
