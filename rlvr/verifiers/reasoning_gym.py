r"""The ``reasoning_gym`` verifier: rlvr's strict final answer, then reasoning-gym's scorer, full credit only.

Tasks of the ``rg.<dataset>`` domains (``rlvr.tasks.reasoning_gym``) carry spec payload
``{"dataset": name, "config": {...}, "answer": gold, "entry": {"question", "answer", "metadata"}}``
(plain JSON), plus ``"rebuild": {"size", "index"}`` where the JSON round trip broke the entry for
its scorer (one that compares the answer with a tuple in the metadata pays 0.05 for the right one):
the scorer then gets item ``index`` of the dataset made again (seed 0, ``size``), whose question
must equal the entry's (``entry_mismatch`` otherwise, e.g. another library version). A completion
passes when, in this order:

1. exactly one final answer is found by rlvr's rule (one ``\boxed{...}`` or a last
   ``Answer: ...`` line; ``rlvr.verifiers.math.extract_final_answer``); several, or none, fail;
2. the answer passes the gates below;
3. the dataset's own ``score_answer(answer, entry)`` returns 1.0. Anything less fails: the
   library's default scorer gives ``len(gold) / len(answer)`` to an answer that merely *contains*
   the gold, and several scorers give partial credit that rlvr does not want as a reward.

Gates (checked before the scorer sees the answer):

* ``too_long``: more than ``max(len(gold) + 256, min(4 * len(gold), MAX_ANSWER_CHARS))`` characters.
* ``gold_plus_extra``: the gold (whitespace and case folded) occurs as a whole token run inside a
  longer answer (``"42 legs"``, ``"41, 42, 43"``, ``"42 or 7"``). Several scorers pull the first
  number, every known word or every ``0``/``1`` out of the text and would pass these.
* ``unsafe_answer``: a call of anything but a maths function (``exec(...)``, ``open(...)``), a
  dunder or ``lambda``. Some scorers ``eval`` or ``sympy.parse_expr`` the model's text in this
  process; the gates below make those safe, this one is a backstop for scorers not listed.
* ``bad_shape``: a per-dataset check (``SHAPES``) for scorers known to accept more than the
  answer: the ones that ``eval`` model text must get a Python literal (or non-Python text), the
  ``parse_expr`` ones an arithmetic expression of numbers, names and maths functions with bounded
  powers (no ``or``, comparisons, attributes or subscripts), and the lenient ones the shape of
  their gold (one number for ``gsm_symbolic``, ``U/D/L/R`` moves for ``sokoban``, ...).

Equivalences a scorer checks exactly still pass: any order of the knights and knaves, an
equivalent polynomial or antiderivative, another valid N-queens board or sokoban solution.

reasoning-gym is an optional extra and is imported on first use only; without it the verifier
raises ``UserError`` naming ``pip install 'rlvr[reasoning_gym]'``.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
import json
import math
import re
from typing import Any, Callable

from rlvr.errors import UserError
from rlvr.types import Task, Verdict
from rlvr.verifiers.base import VERIFIERS
from rlvr.verifiers.math import extract_final_answer

KIND = "reasoning_gym"
INSTALL_HINT = "pip install 'rlvr[reasoning_gym]'"
MAX_ANSWER_CHARS = 20_000
MAX_POWER = 10_000  # the product of the exponents of nested powers in a parse_expr answer

# functions a maths answer may call: sympy resolves them, none of them runs code or grows memory
MATH_FUNCS = frozenset({
    "sqrt", "cbrt", "exp", "log", "ln", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos",
    "atan", "acot", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "abs", "Abs", "sign", "re", "im",
})
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_LAMBDA = re.compile(r"\blambda\b")
_WS = re.compile(r"\s+")


def available() -> bool:
    """Whether reasoning-gym is installed (without importing it)."""
    try:
        return importlib.util.find_spec("reasoning_gym") is not None
    except (ImportError, ValueError):
        return False


def require() -> Any:
    """The ``reasoning_gym`` module, or ``UserError`` saying how to install it."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise UserError(f"the reasoning-gym domains and verifier need the reasoning-gym package "
                        f"(an optional extra): {INSTALL_HINT}") from e
    return reasoning_gym


@functools.lru_cache(maxsize=256)
def _dataset(dataset: str, config_json: str, size: int = 1) -> Any:
    """A dataset instance (seed 0); size 1 to score with (its config matters to some scorers, its
    seed does not), the level's size to rebuild an item."""
    rg = require()
    return rg.create_dataset(dataset, seed=0, size=size, **json.loads(config_json))


# ---------------------------------------------------------------- gates


def _norm(s: str) -> str:
    return _WS.sub(" ", s).strip().casefold()


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch in "._"


def contains_gold(answer: str, gold: str) -> bool:
    """The gold as a whole token run inside a longer answer (whitespace and case folded):
    ``"42 legs"`` and ``"41, 42"`` contain ``42``; ``"42.0"`` and ``"142"`` do not."""
    a, g = _norm(answer), _norm(gold)
    if not g or a == g:
        return False
    start = a.find(g)
    while start >= 0:
        end = start + len(g)
        before = a[start - 1] if start else " "
        after = a[end] if end < len(a) else " "
        if not (_is_word(before) and _is_word(g[0])) and not (_is_word(after) and _is_word(g[-1])):
            return True
        start = a.find(g, start + 1)
    return False


def is_unsafe(answer: str) -> bool:
    """A call of a non-maths function, a dunder or ``lambda``: text that could run code where a
    scorer evaluates it."""
    if "__" in answer or _LAMBDA.search(answer):
        return True
    return any(m.group(1) not in MATH_FUNCS for m in _CALL.finditer(answer))


def _parse(answer: str) -> ast.Expression | None:
    try:
        return ast.parse(answer, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


_LITERAL_NODES = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp,
                  ast.USub, ast.UAdd, ast.Load, ast.Name)


def literal_or_not_python(answer: str, entry: dict) -> bool:
    """For scorers that ``eval`` the answer: it is a Python literal of constants and names (what
    ``eval`` then does is a lookup at most: no call, attribute or subscript; dunders are refused
    earlier) or not Python at all (``eval`` raises before running anything)."""
    tree = _parse(answer)
    return tree is None or all(isinstance(n, _LITERAL_NODES) for n in ast.walk(tree))


_ARITH_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.BitXor)  # sympy reads ^ as **


def _exponent(node: ast.AST) -> float | None:
    """The largest absolute number in an exponent; None if the exponent itself has a power."""
    biggest = 1.0
    for n in ast.walk(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Pow, ast.BitXor)):
            return None
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            biggest = max(biggest, abs(float(n.value)))
    return biggest


def _arith_ok(node: ast.AST, power: float = 1.0) -> bool:
    if isinstance(node, ast.Expression):
        return _arith_ok(node.body, power)
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, float, complex)
    if isinstance(node, ast.Name):
        return not node.id.startswith("_")
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _arith_ok(node.operand, power)
    if isinstance(node, ast.BinOp):
        if not isinstance(node.op, _ARITH_OPS):
            return False
        if isinstance(node.op, (ast.Pow, ast.BitXor)):
            e = _exponent(node.right)
            if e is None or power * e > MAX_POWER:
                return False
            return _arith_ok(node.left, power * e) and _arith_ok(node.right, power)
        return _arith_ok(node.left, power) and _arith_ok(node.right, power)
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Name) and node.func.id in MATH_FUNCS and not node.keywords
                and all(_arith_ok(a, power) for a in node.args))
    return False


def arithmetic(answer: str, entry: dict) -> bool:
    """For scorers that ``sympy.parse_expr`` the answer: numbers, names, + - * / ** ^, maths
    functions, powers bounded (``9**9**9`` and ``(9**99)**999`` fail); nothing else."""
    tree = _parse(answer)
    return tree is not None and _arith_ok(tree)


def _fullmatch(pattern: str, flags: int = 0) -> Callable[[str, dict], bool]:
    compiled = re.compile(pattern, flags)
    return lambda answer, entry: compiled.fullmatch(answer.strip()) is not None


def _same_as_gold(answer: str, entry: dict) -> bool:
    return _norm(answer) == _norm(str(entry["answer"]))


def _same_word_count(answer: str, entry: dict) -> bool:
    return len(answer.split()) == len(str(entry["answer"]).split())


def _knights_and_knaves(answer: str, entry: dict) -> bool:
    """Only ``<name> is a <role>`` statements joined by ``and``/commas, each name once (the
    scorer skips every word it does not know)."""
    from reasoning_gym.logic.knights_knaves import VALID_ROLES

    text = answer.lower()
    for ch in ".,()":
        text = text.replace(ch, " ")
    words = [w for w in text.split() if w not in ("is", "a", "an", "and")]
    names, roles = words[0::2], words[1::2]
    return (bool(words) and len(words) % 2 == 0 and all(r in VALID_ROLES for r in roles)
            and not any(n in VALID_ROLES for n in names) and len(set(names)) == len(names))


_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
SHAPES: dict[str, Callable[[str, dict], bool]] = {
    # eval(answer) in the scorer
    **dict.fromkeys(("binary_matrix", "n_queens", "spiral_matrix", "string_insertion"), literal_or_not_python),
    # sympy.parse_expr(answer) in the scorer
    **dict.fromkeys(("countdown", "puzzle24", "polynomial_multiplication", "simple_integration",
                     "intermediate_integration"), arithmetic),
    # lenient scorers: the shape of the gold
    "gsm_symbolic": _fullmatch(_NUMBER),  # scores the first number in the text
    "fraction_simplification": _fullmatch(r"\$?\s*(?:\d+\s*/\s*\d+|\\d?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\})\s*\$?"),
    "polynomial_equations": _fullmatch(rf"{_NUMBER}(?:\s*,\s*{_NUMBER})*"),  # skips non-numbers
    "game_of_life_halting": _same_as_gold,  # its scorer passes any non-empty answer
    "kakurasu": _fullmatch(r"[01\s]+"),  # keeps every 0 and 1 of the text
    "survo": _fullmatch(r"[\d\s]+"),  # skips non-integers
    "sokoban": _fullmatch(r"[UDLR]+"),  # ignores unknown moves
    "quantum_lock": _fullmatch(r"[A-C](?:\s*(?:→|->|,)?\s*[A-C])*"),  # keeps every A, B, C
    "letter_jumble": _same_word_count,  # compares word by word, ignoring extra words
    "knights_knaves": _knights_and_knaves,  # skips unknown words
}


def judge(dataset: str, config: dict, entry: dict, answer: str) -> tuple[str, float | None]:
    """``(reason, score)`` for an extracted ``answer``: ``"ok"`` only at the scorer's full credit;
    ``score`` is the scorer's raw value (None when a gate stopped the answer first)."""
    require()
    gold = str(entry["answer"])
    if len(answer) > max(len(gold) + 256, min(4 * len(gold), MAX_ANSWER_CHARS)):
        return "too_long", None
    if is_unsafe(answer):
        return "unsafe_answer", None
    if contains_gold(answer, gold):
        return "gold_plus_extra", None
    shape = SHAPES.get(dataset)
    if shape is not None and not shape(answer, entry):
        return "bad_shape", None
    scorer = _dataset(dataset, json.dumps(config, sort_keys=True))
    try:
        score = float(scorer.score_answer(answer, copy.deepcopy(entry)))
    except Exception:  # a scorer that raises on model text fails closed
        return "scorer_error", None
    if not math.isfinite(score):
        return "scorer_error", None
    if score >= 1.0:
        return "ok", 1.0
    return ("partial_credit" if score > 0 else "mismatch"), score


@functools.lru_cache(maxsize=1024)
def _rebuilt(dataset: str, config_json: str, size: int, index: int) -> dict:
    return _dataset(dataset, config_json, size)[index]


def scoring_entry(payload: dict) -> dict | None:
    """The entry the dataset's scorer gets: the payload's, or the item rebuilt (``rebuild``);
    None when the rebuilt item is not the entry's problem."""
    entry, rebuild = payload["entry"], payload.get("rebuild")
    if not rebuild:
        return entry
    config_json = json.dumps(payload.get("config", {}), sort_keys=True)
    try:
        item = _rebuilt(payload["dataset"], config_json, int(rebuild["size"]), int(rebuild["index"]))
    except Exception:
        return None
    return item if item.get("question") == entry["question"] else None


def judge_payload(payload: dict, answer: str) -> tuple[str, float | None]:
    """``judge`` for a task's spec payload (rebuilding the entry where it says so)."""
    entry = scoring_entry(payload)
    if entry is None:
        return "entry_mismatch", None
    return judge(payload["dataset"], payload.get("config", {}), entry, answer)


class ReasoningGymVerifier:
    """Spec ``{"dataset", "config", "answer", "entry"}`` (see the module docstring).

    ``details``: ``extracted``, ``gold``, ``format_ok`` (one well-formed final answer) and
    ``rg_score`` (the dataset scorer's own value, for diagnosis; the verdict's score is 0 or 1).
    """

    name = KIND

    def check(self, task: Task, completion: str) -> Verdict:
        payload = task.spec.payload
        try:
            gold = str(payload["entry"]["answer"])
            payload["dataset"]  # noqa: B018  (required)
        except (KeyError, TypeError) as e:
            raise UserError(f"task {task.id}: a reasoning_gym spec needs 'dataset' and 'entry' "
                            f"(with 'answer'); missing {e}") from None
        extracted, status = extract_final_answer(completion)
        details: dict[str, Any] = {"extracted": extracted, "gold": gold, "format_ok": extracted is not None,
                                   "rg_score": None}
        if extracted is None:
            return Verdict(passed=False, score=0.0, reason=status, details=details)
        reason, score = judge_payload(payload, extracted)
        details["rg_score"] = score
        passed = reason == "ok"
        return Verdict(passed=passed, score=float(passed), reason=reason, details=details)


VERIFIER = ReasoningGymVerifier()


def _resolve(name: str) -> ReasoningGymVerifier:
    if name != KIND:
        raise UserError(f"unknown verifier {name!r}; did you mean {KIND!r}?")
    require()
    return VERIFIER


VERIFIERS.lazy(KIND, _resolve, f"{KIND} (with {INSTALL_HINT})")
if available():
    VERIFIERS.register(KIND)(VERIFIER)
