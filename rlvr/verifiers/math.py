r"""The ``math`` verifier: strict final-answer extraction, then equivalence via math-verify.

``extract_final_answer`` reads exactly one final answer: the content of one ``\boxed{...}`` or
a last non-empty line ``Answer: ...``. Several answers, or none, fail; the gold appearing only
in the reasoning counts for nothing.

``answers_equal(pred, gold)`` is mathematical equivalence (math-verify's ``verify``, both sides
parsed as LaTeX and as plain expressions) after a little normalisation. Decisions worth knowing:
  * fractions, decimals: ``\frac{1}{2}`` == ``1/2`` == ``0.5``; floats are compared after
    rounding to 6 decimals (math-verify's default), so ``0.333333`` == ``1/3``.
  * percent: ``50\%`` == ``50%`` == ``0.5``; math-verify also lets the sign be dropped
    (gold ``50%`` matches ``50``), but ``0.5`` never matches ``50``.
  * one spelling per notation before any rule applies, so strictness is about content:
    ``\cfrac``/``\dfrac``/``\tfrac``/``\frac94`` are ``\frac{9}{4}``; ``\textnormal``, ``\mbox``,
    ``\textrm`` are ``\text`` (a trailing unit may be squared: ``15\mbox{ cm}^2`` is ``15 cm``);
    ``x \in [a, b]`` is the set ``[a, b]`` (a bare variable, then a bracket).
  * thousands separators: ``1,000`` / ``1{,}000`` / ``1 000`` / ``1,\!000`` / ``1,\! 000`` == ``1000``
    when the whole answer has that shape (a first group has no leading zero); otherwise a comma
    separates elements (``1,2`` is the set {1, 2}, ``1,\!25`` the set {1, 25}: a thin-space
    separator counts only before 3 digits).
  * a decimal comma: an answer ``1000,99`` (digits, one comma, digits; not the thousands shape)
    is 1000.99 when the gold is one value (no comma, ``;`` or ``and``). A gold's own comma is
    its author's and always separates (gold ``1,5`` is {1, 5}, never 1.5).
  * ``and`` joins list items when the other side is a list: ``6 \text{ and } 8`` == ``6, 8``, but
    ``6 and 8`` is prose for gold ``6``.
  * sets and intervals: ``\{1,2\}`` == ``{2,1}``; ``(0,1]`` != ``(0,1)``.
  * equations: ``x = 3`` == ``3`` only when the left side is a name (below); ``1 + 1 = 42`` is
    not ``42`` (math-verify alone would compare the right-hand side and say it is), nor is a chain
    ``x = 5+5+1 = 11`` (for gold ``x = 11`` it is equal, and the verifier refuses it as not final).
  * a name is letters with subscripts, a function value, a length or a ratio of named things
    (``x``, ``x_{1}``, ``AB``, ``f(x)``, ``|AB|``, ``V_1:V_2``, ``\frac{NO}{BO}``): no digit
    outside a subscript, no operator, no space. ``NAME = 3`` is ``3`` (``f(x)=1`` == ``1``,
    ``V_1:V_2=11:21`` == ``11:21``); ``f(41) = 42``, ``1 + 1 = 42`` and ``the answer = 42`` are not 42.
  * named parts: ``(a,b)=(1,5)`` and ``a=1, b=5`` or ``AB=4, CD=5`` (two or more distinct names)
    match the bare values in order, ``1, 5`` or ``(1, 5)``, never ``5, 1``, ``[1,5]`` or
    ``\{1,5\}``; a count mismatch fails. Two named answers compare by name (``b=5, a=1`` ==
    ``(a,b)=(1,5)``). Solutions separated by ``;`` that name the same parts are tuples:
    ``p=5,q=2;p=7,q=2`` == ``(5,2),(7,2)`` (in any order, as math-verify compares sets).
  * relations: ``\le``/``\leq``/``\leqslant``/``<=``/``≤`` are one relation, likewise ``\ge``,
    ``\ne``/``\neq``/``!=``/``≠`` (``!=`` only after a space or letter: ``5!=120`` is a
    factorial), ``\lt``/``<``, ``\gt``/``>``. A relation is not a number (``y \le -2`` !=
    ``-2``, ``x => 3`` != ``3``); an interval answers a relation gold (``(-\infty,-2]`` for
    ``y \le -2``, math-verify) but not the reverse, since a gold ``(1,5)`` may be a point.
  * two numbers separated only by spaces (``4 2``, ``4\;2``) never match (math-verify reads
    4 + 2), and neither does a chain the gold does not have (``41 \to 42``, ``41 \vee 42``),
    which math-verify would read as its last side.
  * notation the gold does not use is not an answer, beyond plain maths (numbers, ``\frac``,
    ``\sqrt``, ``\pi``, ``\infty``, arithmetic and comparison signs, braces, ``\text``): math-verify
    reads one side of anything it does not know, so ``41 ⇒ 42``, ``41 \iff 42``, ``42 ≈ 41``,
    ``41 \cup 42``, ``41 \oplus 42``, ``41|42``, ``42_{41}`` or ``\max(41, 42)`` would be 42 or 41.
  * a matrix (``\begin{pmatrix}...``) answers a matrix gold only.
  * prose is not an answer: ``The answer is 1`` or ``about 12`` never match ``1``/``12`` (math-verify
    would read the number out of the sentence), nor do ``12\text{ or }`` and ``84 (or 85)`` (a
    hedge, read as 85); a unit after the number (``12 cm``) is allowed.
  * a currency sign is dropped (``$5`` == ``5``), LaTeX spacing (``\,`` ``~``) is a space.

The verifier adds one rule on top: the answer must be in final form, i.e. use no arithmetic
operator the gold does not (``6*7`` or ``40 + 2`` for gold ``42`` fail; so does ``84/2``, a
fraction being allowed only when the gold is not an integer). Otherwise "Compute: 6 * 7" could
be answered by echoing the question.

Safety: math-verify's own timeouts use SIGALRM, which works only in the main thread, cannot
interrupt a long C-level big-integer power, and makes a verdict depend on machine load. They are
off. Instead inputs are bounded before parsing (length, bracket nesting, exponent size and
towers, factorials): anything outside the bounds fails closed, and everything inside parses in
well under a second. Not here: unit handling beyond what math-verify does, partial credit.
"""

from __future__ import annotations

import logging
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlvr.types import Task, Verdict
from rlvr.verifiers.answer import ANSWER_AT, format_instruction, locate_answer, place_answer, unwrap_boxed
from rlvr.verifiers.answer import extract_final_answer  # noqa: F401  (re-exported: the math rule's name)
from rlvr.verifiers.base import VERIFIERS

MAX_ANSWER_CHARS = 200
MAX_NESTING = 6  # bracket depth; math-verify's LaTeX parser slows down exponentially with depth
MAX_EXPONENT_DIGITS = 3
MAX_EXPONENT_PRODUCT = 10**5  # product of all exponents: bounds (9^{999})^{999}-style blow-ups

_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]
_THOUSANDS = re.compile(r"[+-]?[1-9]\d{0,2}(?:(?:,|\{,\}| )\d{3})+(?:\.\d+)?")
_JUXTAPOSED = re.compile(r"\d\s+\d")
_LATEX_SPACE = re.compile(r"\\(?:[,;:! ]|q?quad\b)|~")
# math-verify reads "a REL b" as its right (or left) side; like "=", we accept none of these
_RELATIONS = re.compile(
    r"\\(?:to|[rR]ightarrow|[iI]mplies|mapsto|sim|approx|equiv|coloneqq|vee|lor|[lc]?dots)\b|:=|→"
)
# notation any answer may use: numbers' own LaTeX, arithmetic, comparison, braces of sets, text
_PLAIN_COMMANDS = frozenset("frac dfrac tfrac sqrt pi infty cdot times div pm mp left right text mathrm textbf mathbf "
                            "sin cos tan cot sec csc log ln exp".split()) | set("{}%,;: ")
_PLAIN_SYMBOLS = frozenset("≤≥≠−×÷·±√∞π")
_DEGREES_AT_END = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°)\s*$")  # a unit, not an operator
_TEXT_BLOCK = re.compile(r"\\(?:text|mathrm|textbf|mathbf)\{[^{}]*\}")
_ODD_ASCII = frozenset("|&#;_")
_COMMAND = re.compile(r"\\([A-Za-z]+|.)")
_INTEGER = re.compile(r"[+-]?\d+")
_OPERATORS = {
    "add": re.compile(r"(?<=[\w)\]}.])\s*[-+−]"),  # a binary plus or minus: after an operand
    "mul": re.compile(r"\*|\\times|\\cdot|\\ast|×|·"),
    "div": re.compile(r"\\div|÷"),
    "frac": re.compile(r"/|\\[dt]?frac"),
    "pow": re.compile(r"\^"),
}


class _NoTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is disabled; we disable it on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutWarning())


# ---------------------------------------------------------------- equivalence

# one spelling per relation: LaTeX, ASCII and Unicode forms all become the Unicode sign. "!="
# only after a space or a letter: "5!=120" keeps its factorial (and fails the safety bound).
_RELATION_SPELLINGS = (
    (re.compile(r"\\(?:leq?|leqslant|leqq)(?![A-Za-z])|(?<![<>=!])<=(?![<>=])|⩽"), "≤"),
    (re.compile(r"\\(?:geq?|geqslant|geqq)(?![A-Za-z])|(?<![<>=!])>=(?![<>=])|⩾"), "≥"),
    (re.compile(r"\\(?:neq?(?![A-Za-z])|not\s*=)|(?<=[\sA-Za-z])!=(?!=)"), "≠"),
    (re.compile(r"\\lt(?![A-Za-z])"), "<"),
    (re.compile(r"\\gt(?![A-Za-z])"), ">"),
)
_INEQUALITY = re.compile(r"[<>≤≥≠]")
# LaTeX's thin-space thousands separator "1,\!250"; not before a group of other than 3 digits
_THIN_THOUSANDS = re.compile(r"(?<=\d),\\!\s*(?=\d{3}(?!\d))")
# one spelling per notation: a fraction is \frac{a}{b} (\cfrac, \dfrac, \tfrac, \frac94), text is \text
_FRAC_SPELLING = re.compile(r"\\[cdt]frac(?![A-Za-z])")
_FRAC_ARGUMENT = r"\s*(\{[^{}]*\}|[0-9A-Za-z])"
_FRAC_SHORT = re.compile(r"\\frac" + _FRAC_ARGUMENT + _FRAC_ARGUMENT)
_TEXT_SPELLING = re.compile(r"\\(?:textnormal|textrm|textup|textsf|textit|mbox)(?![A-Za-z])")
_UNIT_POWER_AT_END = re.compile(r"(\\text\{[^{}]*[A-Za-z][^{}]*\})\s*\^\s*(?:\{\s*[23]\s*\}|[23])\s*$")
# "x \in [a, b]" is the set itself: a bare variable, then a bracket (never "84 \in 85")
_MEMBER_OF = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*(?:\\in(?![A-Za-z])|∈)\s*(?=[\[(]|\\left|\\\{|\\mathbb)")
# a decimal comma: "1000,99", "0,111", "2,5"; never the thousands shape "1,000"
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?=[()])")


def _group_end(s: str, i: int) -> int:
    """Index just past the bracket group opening at ``s[i]`` (end of string if unbalanced)."""
    depth = 0
    for k in range(i, len(s)):
        depth += 1 if s[k] in "{(" else -1 if s[k] in "})" else 0
        if depth == 0:
            return k + 1
    return len(s)


def _is_safe(s: str) -> bool:
    """True when math-verify is known to finish quickly on ``s`` (see the module docstring)."""
    if len(s) > MAX_ANSWER_CHARS or "!" in s or "\\binom" in s or "\\choose" in s:
        return False
    depth = 0
    for ch in s:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if depth > MAX_NESTING:
            return False
    s, product = s.replace("**", "^"), 1
    for m in re.finditer(r"\^\s*", s):
        j = m.end()
        if j < len(s) and s[j] in "{(":
            end = _group_end(s, j)
        else:
            token = re.match(r"[+-]?\d+|\\[A-Za-z]+|.?", s[j:])
            end = j + len(token.group(0))
        exponent = s[j:end]
        if "^" in exponent or s[end:].lstrip().startswith("^"):
            return False  # a tower such as 10^{10^{10}} or 9^9^9
        for digits in re.findall(r"\d+", exponent):
            if len(digits) > MAX_EXPONENT_DIGITS:
                return False
            product *= max(int(digits), 1)
    return product <= MAX_EXPONENT_PRODUCT


def _normalise(s: str) -> str | None:
    """Strip delimiters, currency signs and unambiguous thousands separators, spell each
    relation one way; None if unsafe."""
    s = _THIN_THOUSANDS.sub("{,}", s)
    for pattern, sign in _RELATION_SPELLINGS:
        s = pattern.sub(sign, s)
    s = _FRAC_SHORT.sub(lambda m: "\\frac" + "".join(a if a.startswith("{") else "{" + a + "}" for a in m.groups()),
                        _FRAC_SPELLING.sub(lambda _: "\\frac", s))
    s = _TEXT_SPELLING.sub(lambda _: "\\text", s)
    s = _LATEX_SPACE.sub(" ", s.replace("\\$", "").replace("$", "")).strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right):
            s = s[len(left) : -len(right)].strip()
    s = s.rstrip(".").strip()
    s = _MEMBER_OF.sub("", _UNIT_POWER_AT_END.sub(r"\1", s))
    if _THOUSANDS.fullmatch(s):
        s = re.sub(r",|\{,\}| ", "", s)
    return s if s and _is_safe(s) else None


_SUBSCRIPT = re.compile(r"_(?:\{[^{}]*\}|\w)")
_NAME_FRACTION = re.compile(r"\\frac\{([^{}]*)\}\{([^{}]*)\}")
_NAME = re.compile(r"[A-Za-z()|:/']{1,24}")


def _is_name(s: str) -> bool:
    """Whether ``s`` names a quantity: letters with subscripts, a function value or a ratio or
    length of named things (``x``, ``x_{1}``, ``AB``, ``f(x)``, ``|AB|``, ``V_1:V_2``,
    ``\frac{NO}{BO}``); no digit outside a subscript, no operator, no space."""
    s = _NAME_FRACTION.sub(lambda m: f"{m.group(1)}/{m.group(2)}", _SUBSCRIPT.sub("", s.strip()))
    s = re.sub(r"\s*:\s*", ":", s)
    return bool(_NAME.fullmatch(s)) and any(ch.isalpha() for ch in s)


def _rhs_of_assignment(s: str) -> str | None:
    """``"x = 3"`` (or ``f(x) = 3``, ``A:B = 3``: a name on the left) -> ``"3"``; None for anything
    else containing ``=`` (``x => 3`` and ``1 + 1 = 2`` too)."""
    parts = s.split("=")
    if len(parts) == 2 and _is_name(parts[0]) and parts[1].strip():
        return None if _INEQUALITY.search(parts[1]) else parts[1].strip()
    return None


def _split_items(s: str) -> list[str] | None:
    """Top-level comma-separated items; None if brackets do not balance or an item is empty."""
    items, depth, start = [], 0, 0
    for k, ch in enumerate(s):
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if depth < 0:
            return None
        if depth == 0 and ch == ",":
            items.append(s[start:k].strip())
            start = k + 1
    items.append(s[start:].strip())
    return items if depth == 0 and all(items) else None


def _elements(s: str) -> list[str] | None:
    """``"1, 5"`` or ``"(1, 5)"`` -> ``["1", "5"]``; any other bracket keeps its group whole."""
    s = _LEFT_RIGHT.sub("", s).strip()
    if s.startswith("(") and s.endswith(")") and _split_items(s[1:-1]) is not None:
        s = s[1:-1]
    return _split_items(s)


def _named_parts(s: str) -> list[tuple[str, str]] | None:
    """``"(a,b)=(1,5)"`` or ``"a=1, b=5"`` -> ``[("a", "1"), ("b", "5")]``; None unless two or
    more distinct bare variables are each given one value."""
    if s.count("=") == 1:
        names, values = (_elements(side) for side in s.split("="))
    else:
        halves = [item.split("=") for item in _elements(s) or []]
        if not all(len(half) == 2 for half in halves):
            return None
        names, values = [h[0].strip() for h in halves], [h[1].strip() for h in halves]
    if not names or not values or len(names) != len(values) or len(names) < 2:
        return None
    names = [name.replace("{", "").replace("}", "") for name in names]
    if len(set(names)) < len(names) or not all(_is_name(n) and "," not in n for n in names):
        return None
    return list(zip(names, values))


def _named_groups(s: str) -> str | None:
    """``"p=5,q=2;p=7,q=2"`` -> ``"(5,2),(7,2)"``: several solutions, each naming the same parts in
    the same order; None for anything else."""
    groups = [_named_parts(group.strip()) for group in s.split(";")] if ";" in s else []
    if len(groups) < 2 or any(g is None for g in groups) or len({tuple(n for n, _ in g) for g in groups}) > 1:
        return None
    return ",".join("(" + ",".join(value for _, value in g) + ")" for g in groups)


def _named_parts_equal(p: str, g: str) -> bool | None:
    """Compare answers that name their parts: by name when both do, else the values in order
    against the bare items of the other side. None when neither side names its parts."""
    grouped_p, grouped_g = _named_groups(p), _named_groups(g)
    if grouped_p is not None or grouped_g is not None:
        return answers_equal(grouped_p or p, grouped_g or g)
    named_p, named_g = _named_parts(p), _named_parts(g)
    if named_p is None and named_g is None:
        return None
    if named_p is not None and named_g is not None:
        by_name_p, by_name_g = dict(named_p), dict(named_g)
        return by_name_p.keys() == by_name_g.keys() and all(
            answers_equal(value, by_name_g[name]) for name, value in by_name_p.items()
        )
    named, other = (named_p, g) if named_p is not None else (named_g, p)
    items = None if "=" in other else _elements(other)
    if items is None or len(items) != len(named):
        return False
    values = [value for _, value in named]
    pairs = zip(values, items) if named is named_p else zip(items, values)
    return all(answers_equal(pred_value, gold_value) for pred_value, gold_value in pairs)


def _parse(s: str) -> list:
    try:
        return parse(f"${s}$", _CONFIG, parsing_timeout=None)
    except Exception:  # math-verify raises on some malformed input despite raise_on_error=False
        return []


_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_MATH_WORDS = frozenset("sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp sqrt pi inf "
                        "infty oo mod max min gcd lcm det dfrac tfrac frac left right cdot times text mathrm "
                        "begin end matrix pmatrix bmatrix vmatrix array".split())


_HEDGE_WORDS = frozenset("or nor and not but maybe perhaps possibly either approximately about roughly".split())
_NUMBER_AFTER = re.compile(r"(?<![\^_{\d.])\d")  # a number, not an exponent or subscript


def is_prose(s: str) -> bool:
    """An answer that talks: two or more words that are not math (``the answer is 1``), a word
    before the first number (``about 12``), a hedging word (``12 or``) or a number after the word
    (``84 (or 85)``, ``85 \\text{ (not 84)}``). A unit after the number (``12 cm``) is not prose."""
    words = [m for m in _WORD.finditer(s) if m.group(0).lower() not in _MATH_WORDS]
    first_digit = next((i for i, ch in enumerate(s) if ch.isdigit()), len(s))
    if len(words) >= 2 or any(m.start() < first_digit or m.group(0).lower() in _HEDGE_WORDS for m in words):
        return True
    return bool(words) and _NUMBER_AFTER.search(s, words[0].end()) is not None


def _notation(s: str) -> set[str]:
    """The LaTeX commands and the symbols beyond plain ASCII maths that ``s`` uses; also an empty
    group and text before a number (``4 {} 2``, ``4 \\text{,} 2``), which hide two numbers."""
    s = _DEGREES_AT_END.sub("", s)
    marks = {"{}"} if re.search(r"\{\s*\}", s) else set()
    if any(re.search(r"\d", s[m.end():]) for m in _TEXT_BLOCK.finditer(s)):
        marks.add("\\text before a number")
    rest = _COMMAND.sub(" ", s)
    return marks | {f"\\{c}" for c in _COMMAND.findall(s)} | {ch for ch in rest if ch in _ODD_ASCII
                                                              or (ord(ch) > 127 and not ch.isalnum())}


def _foreign_notation(pred: str, gold: str) -> bool:
    """Whether ``pred`` uses notation neither plain maths nor ``gold`` uses (module docstring)."""
    plain = {f"\\{c}" for c in _PLAIN_COMMANDS} | _PLAIN_SYMBOLS
    if _INEQUALITY.search(gold):
        plain |= {"\\cup"}  # a union of intervals answers a relation
    return bool(_notation(pred) - _notation(gold) - plain)


_AND = re.compile(r",?\s*(?:\\text\{\s*and\s*\}|(?<![\\A-Za-z])and(?![A-Za-z]))\s*")


def _in_context(p: str, g: str) -> tuple[str, str]:
    """The readings the other side decides: ``and`` joining the items of a list when the other
    side is a list (``6 \\text{ and } 8`` for ``6, 8``), and a decimal comma in ``p`` (``1000,99``)
    when the gold is one value (no comma, ``;`` or ``and``)."""
    p_items, g_items = (_split_items(x) if "=" not in x else None for x in (p, g))
    if g_items is not None and len(g_items) >= 2:
        p = _AND.sub(", ", p)
    if p_items is not None and len(p_items) >= 2:
        g = _AND.sub(", ", g)
    if _DECIMAL_COMMA.fullmatch(p) and not re.search(r"[,;]|(?<![A-Za-z])and(?![A-Za-z])", g):
        p = p.replace(",", ".")
    return p, g


def _comparable(pred: str, gold: str) -> tuple[str, str] | None:
    p, g = _normalise(pred), _normalise(gold)
    if p is None or g is None:
        return None
    p, g = _in_context(p, g)
    if "=" in p and "=" not in g:
        p = _rhs_of_assignment(p)
    elif "=" in g and "=" not in p:
        g = _rhs_of_assignment(g)
    if p is None or g is None or _JUXTAPOSED.search(p) or _JUXTAPOSED.search(g):
        return None
    if is_prose(p) and not _WORD.search(g):  # math-verify would pick a number out of the sentence
        return None
    if _foreign_notation(p, g):
        return None
    if _RELATIONS.search(p) and not _RELATIONS.search(g):
        return None
    if _INEQUALITY.search(p) and not _INEQUALITY.search(g):
        return None  # a relation is not a number; math-verify may still take a set for a relation
    return p, g


def answers_equal(pred: str, gold: str) -> bool:
    """Whether ``pred`` is mathematically equivalent to ``gold`` (see the module docstring)."""
    p, g = _normalise(pred), _normalise(gold)
    if p is None or g is None:
        return False
    p, g = _in_context(p, g)
    named = _named_parts_equal(p, g)
    if named is not None:
        return named
    pair = _comparable(pred, gold)
    if pair is None:
        return False
    p, g = pair
    if p == g:
        return True
    if _INTEGER.fullmatch(p) and _INTEGER.fullmatch(g):  # fast path: plain integers need no parser
        return int(p) == int(g)
    gold_parsed, pred_parsed = _parse(g), _parse(p)
    if not gold_parsed or not pred_parsed:
        return False
    try:
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception:
        return False


def _number(s: str) -> float | None:
    parsed = _parse(s)
    try:
        value = parsed[0] if parsed else None
        if value is not None and value.is_number and value.is_real:
            x = float(value)
            return x if abs(x) != float("inf") else None
    except Exception:  # not a sympy number, or a float overflow
        pass
    return None


def within_tolerance(pred: str, gold: str, tolerance: float) -> bool:
    """``|pred - gold| <= tolerance`` when both are real numbers; False otherwise."""
    pair = _comparable(pred, gold)
    if pair is None:
        return False
    p, g = (_number(x) for x in pair)
    return p is not None and g is not None and abs(p - g) <= tolerance


def is_final_form(pred: str, gold: str) -> bool:
    """False when ``pred`` uses an arithmetic operator that ``gold`` does not (``6*7`` vs 42)."""
    p, g = _normalise(pred) or pred, _normalise(gold) or gold
    for name, pattern in _OPERATORS.items():
        if pattern.search(p) and not pattern.search(g):
            if name == "frac" and not _INTEGER.fullmatch(g):
                continue  # 1/2 for gold 0.5 is a final answer
            return False
    return True


# ---------------------------------------------------------------- the verifier


class MathVerifier:
    """Spec ``{"answer": str, "tolerance": float, "answer_at": str}``; tolerance is absolute, 0 (or
    absent) = exact; ``answer_at`` is where the final answer must be (``rlvr.verifiers.answer``,
    default ``final``).

    ``format_ok`` is True when exactly one well-formed final answer was found. Where the place is
    a line or the whole completion, one ``\\boxed{...}`` that is all of it is unwrapped; a box
    inside other text (``I guess \\boxed{1}``) is a ``mismatch``, since math-verify would read the
    box alone.
    """

    name = "math"
    PAYLOAD_KEYS = ("answer", "tolerance", "answer_at")

    def check(self, task: Task, completion: str) -> Verdict:
        gold = str(task.spec.payload["answer"])
        tolerance = float(task.spec.payload.get("tolerance", 0.0))  # tolerance is optional in task files
        extracted, status = locate_answer(completion, task.spec.payload.get("answer_at", "final"))
        details = {"extracted": extracted, "gold": gold, "format_ok": extracted is not None}
        if extracted is None:
            return Verdict(passed=False, score=0.0, reason=status, details=details)
        answer = unwrap_boxed(extracted)
        passed = answer is not None and is_final_form(answer, gold) and (
            answers_equal(answer, gold) or (tolerance > 0 and within_tolerance(answer, gold, tolerance))
        )
        reason = "ok" if passed else "mismatch"
        return Verdict(passed=passed, score=float(passed), reason=reason, details=details)

    def validate_payload(self, payload: dict) -> None:
        """``ValueError`` naming the key: a missing or empty answer, a bad tolerance or answer_at."""
        unknown = sorted(set(payload) - set(self.PAYLOAD_KEYS))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; allowed: {', '.join(self.PAYLOAD_KEYS)}")
        answer = payload.get("answer")
        if answer is None or isinstance(answer, (bool, dict, list)) or not str(answer).strip():
            raise ValueError("'answer' is missing" if answer is None else "'answer' must be a non-empty string")
        tolerance = payload.get("tolerance", 0.0)
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
            raise ValueError("'tolerance' must be a number >= 0")
        if payload.get("answer_at", "final") not in ANSWER_AT:
            raise ValueError(f"'answer_at' must be one of: {', '.join(ANSWER_AT)}")

    def gold_completion(self, payload: dict) -> str:
        return place_answer(str(payload["answer"]), payload.get("answer_at", "final"))

    def instruction(self, payload: dict) -> str:
        return format_instruction(payload.get("answer_at", "final"))


VERIFIERS.register("math")(MathVerifier())
