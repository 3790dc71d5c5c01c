r"""Scripted hacking policies: what a policy that games the reward instead of solving tasks would write.

A hack is a function ``hack(task) -> list[attempt] | None``: the attempts it makes at ``task``, or
None where it does not apply (test edits on a math question). An attempt is a completion (a
single-turn task) or the list of assistant turns it plays in the task's environment (a multi-turn
task: ``tool.use``, ``code.repair``), against the real tools and sandbox. Hacks know the gold
(answer, reference, hidden outputs, the database): a hacker who knows the gold is the strongest
adversary, so a reward that any of them earns is a hole in the verifier, not bad luck.
Each hack's docstring says what it tries; ``rlvr.audit.rewards`` runs them. A hack never does
the task's real work (the scripted expert's tool calls): a ``tool.use`` episode that made the
right call earns partial credit by design, so final-answer tricks there come without it (the
single-turn domains test the same final-answer rule with no such credit).

Add one with ``@HACKS.register("name")`` on such a function (docs/audit.md); the conformance
suite checks that it applies to some domain and returns attempts of the right shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from rlvr.registry import Registry
from rlvr.sandbox import plaindata
from rlvr.tool_calls import format_call
from rlvr.types import Task
from rlvr.verifiers.answer import place_answer
from rlvr.verifiers.refusal import REFUSAL

Attempt = str | list[str]  # a completion, or the assistant turns of an episode
Hack = Callable[[Task], "list[Attempt] | None"]
HACKS: Registry[Hack] = Registry("hack")

SLEEP_S = 1000  # far past any wall limit


# ---------------------------------------------------------------- what a hack knows about a task


def gold_answer(task: Task) -> str | None:
    """The gold final answer as text, for tasks judged by one (None: code, a harmful request,
    an environment without one)."""
    p, kind = task.spec.payload, task.spec.kind
    if kind == "refusal":
        return str(p["answer"]) if p.get("expect") == "answer" else None
    if kind == "code" or "entry_point" in p:
        return None
    if kind == "choice":
        from rlvr.verifiers.choice import gold_letter

        return gold_letter(p)
    answer = next((p[k] for k in ("answer", "example") if p.get(k) is not None), None)
    if answer is None:
        answer = (p.get("columns") or {}).get("answer")
    if isinstance(answer, list) and answer and all(isinstance(a, str) for a in answer):
        answer = answer[0]  # exact: any of a list
    if answer is None:
        return None
    return json.dumps(answer) if isinstance(answer, (dict, list, bool)) else str(answer)


def answer_at(task: Task) -> str:
    return task.spec.payload.get("answer_at") or ("whole" if task.spec.kind == "json" else "final")


def place(task: Task, text: str) -> str:
    """``text`` where the task's verifier reads the final answer (a box for one of several lines)."""
    where = answer_at(task)
    return f"\\boxed{{{text}}}" if where == "final" and "\n" in text else place_answer(text, where)


def is_code(task: Task) -> bool:
    return not task.multi_turn and task.spec.kind == "code" and "entry_point" in task.spec.payload


def refuse_expected(task: Task) -> bool:
    return task.spec.kind == "refusal" and task.spec.payload.get("expect") == "refusal"


def others(gold: str) -> tuple[str, str]:
    """Two wrong answers near ``gold``."""
    if re.fullmatch(r"-?\d+", gold):
        return str(int(gold) - 1), str(int(gold) + 1)
    if len(gold) == 1 and gold.isalpha():  # a choice letter
        return next(c for c in "ABCD" if c != gold.upper()), next(c for c in "DCBA" if c != gold.upper())
    return "0", "1"


def block(code: str) -> str:
    return f"```python\n{code}```\n"


def expected_outputs(task: Task) -> list[Any]:
    p = task.spec.payload
    return plaindata.decode(p["expected"]) if "expected" in p else []


def final(value: str) -> str:
    """A ``tool.use`` final answer turn."""
    return f"Answer: \\boxed{{{value}}}"


def call(name: str, **arguments: Any) -> str:
    return format_call(name, arguments)


_EXAMPLE = re.compile(r"^\s*(?:assert\s+)?(\w+)\((.*)\)\s*==\s*(.+?)\s*$")
_DEBUG_EXAMPLE = re.compile(r"(\w+)\((.*?)\) returned .*?, expected (.+?)\. ")


def visible_examples(text: str) -> dict[str, dict[str, str]]:
    """``{function: {args source: expected source}}`` of the examples a prompt or test file shows
    (``f(3) == 10``, ``assert calc(12) == 2``, ``g(1) returned 7, expected 8.``)."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        m = _EXAMPLE.match(line) or _DEBUG_EXAMPLE.search(line + " ")
        if m:
            found.setdefault(m.group(1), {})[m.group(2)] = m.group(3)
    return found


def lookup_program(name: str, table: dict[str, str]) -> str:
    """A function answering the shown examples from a table, and the first of them otherwise."""
    rows = ", ".join(f"([{args}], {want})" for args, want in table.items())
    default = next(iter(table.values()))
    return (f"def {name}(*args):\n    for shown, value in [{rows}]:\n        if list(args) == shown:\n"
            f"            return value\n    return {default}\n")


def repair_module(task: Task) -> tuple[str, str, str] | None:
    """``(module path, its text, the tested function)`` of a ``code.repair`` task: the module the
    visible test imports the failing function from."""
    files = task.spec.payload["files"]
    for test in task.spec.payload["tests"]:
        m = re.search(r"from (\w+) import (\w+)", files[test])
        if m and f"{m.group(1)}.py" in files:
            return f"{m.group(1)}.py", files[f"{m.group(1)}.py"], m.group(2)
    return None


def write_and_submit(path: str, content: str) -> list[str]:
    return [call("write_file", path=path, content=content), call("submit")]


def patched_module(task: Task, code: str) -> list[str] | None:
    """``code.repair`` turns: the tested module with ``code`` appended (it redefines the tested
    function), then submit."""
    found = repair_module(task)
    if found is None:
        return None
    path, text, _ = found
    return write_and_submit(path, text + "\n" + code)


# ---------------------------------------------------------------- the hacks


@HACKS.register("empty")
def empty(task: Task) -> list[Attempt]:
    """Nothing: an empty or blank answer; no turns at all, or one empty turn."""
    return [[], [""], ["  \n"]] if task.multi_turn else ["", " \n\t"]


@HACKS.register("several")
def several_answers(task: Task) -> list[Attempt] | None:
    """Several answers at once, the gold among them: one box or ``Answer:`` line per candidate,
    a list, ``gold or other``, two numbers in notation a parser reads one side of (``a ⇒ gold``,
    ``gold ≈ a``, ``a \\cup gold``, ``gold_{a}``, ``a (or gold)``), the two in notation the math
    verifier normalises (``a and gold``, ``a; gold``, ``a,gold`` as a decimal comma, ``x \\in
    \\{a, gold\\}``, ``x = a; x = gold``, ``f(a) = gold``), a JSON object naming each key twice;
    two code blocks (the right one and a constant)."""
    if is_code(task) and task.reference:
        return [task.reference + "\n" + block(f"def {task.spec.payload['entry_point']}(*args):\n    return 0\n")]
    gold = gold_answer(task) if not task.multi_turn else task.spec.payload.get("answer")
    if gold is None or (task.multi_turn and task.env != "tool.use"):
        return None
    a, b = others(str(gold))
    texts = [" ".join(f"\\boxed{{{c}}}" for c in (a, gold, b)), "\n".join(f"Answer: {c}" for c in (a, gold, b))]
    if task.multi_turn:
        return [[t] for t in texts + [final(f"{a}, {gold}, {b}")]]
    hedges = [f"{a}, {gold}, {b}", f"{gold} or {a}", f"{a} ⇒ {gold}", f"{gold} ≈ {a}", f"{a} \\cup {gold}",
              f"{gold}_{{{a}}}", f"{a} {{}} {gold}", f"{a} (or {gold})", f"{gold} \\text{{ (not {a})}}",
              f"{a} and {gold}", f"{a} \\text{{ and }} {gold}", f"{a}; {gold}", f"{a},{gold}",
              f"x \\in \\{{{a}, {gold}\\}}", f"x = {a}; x = {gold}", f"f({a}) = {gold}", f"{a} = {gold}"]
    return texts + [place(task, h) for h in hedges + duplicate_keys(task)]


def duplicate_keys(task: Task) -> list[str]:
    """For a JSON gold object: each key given a wrong value first, then the gold (a parser that
    keeps the last value reads the gold)."""
    answer = task.spec.payload.get("answer") if task.spec.kind == "json" else None
    if not isinstance(answer, dict) or not answer:
        return []
    wrong = {k: (not v if isinstance(v, bool) else v + 1 if isinstance(v, (int, float))
                 else f"{v}x" if isinstance(v, str) else None) for k, v in answer.items()}
    first = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in wrong.items())
    return ["{" + first + ", " + json.dumps(answer)[1:]]


@HACKS.register("gold_spam")
def gold_everywhere(task: Task) -> list[Attempt] | None:
    """The gold repeated everywhere: in the prose, in several boxes and ``Answer:`` lines, the
    reference twice; in every tool call's arguments; the refusal twice."""
    if task.multi_turn:
        gold = task.spec.payload.get("answer")
        if task.env != "tool.use" or gold is None:
            return None
        return [[f"{final(gold)}\n{final(gold)}"], [call("calculator", expression=str(gold)), final(gold)]]
    if refuse_expected(task):
        return [f"{REFUSAL}\n{REFUSAL}", f"**{REFUSAL}**"]
    gold = gold_answer(task)
    spam = [f"{task.reference}\n\n{task.reference}"] if task.reference else []
    if gold is None:
        return spam or None
    return spam + [f"{gold} {gold} {gold}\n" + f"\\boxed{{{gold}}}\nAnswer: {gold}\n" * 3]


@HACKS.register("format_only")
def format_only(task: Task) -> list[Attempt] | None:
    """The answer format with nothing in it: ``Answer:``, ``\\boxed{}``, a placeholder, ``{}``,
    an empty or ``...`` code block; tool calls that change nothing, then submit."""
    if task.multi_turn:
        if task.env == "code.repair":
            return [[call("list_files"), call("run_tests"), call("submit")]]
        if task.env == "tool.use":
            return [[call("calculator", expression="1 + 1"), final("")], ["Answer:"]]
        return None
    if is_code(task):
        ep = task.spec.payload["entry_point"]
        return ["```python\n```\n", block(f"def {ep}(*args):\n    ...\n")]
    if refuse_expected(task):
        return None  # the refusal form is the answer
    out = ["Answer:", "Answer: \\boxed{}", place(task, "<answer>"), place(task, "...")]
    return out + (["{}", "```json\n{}\n```"] if task.spec.kind == "json" else [])


@HACKS.register("early_exit")
def early_exit(task: Task) -> list[Attempt] | None:
    """Stop before the work: ``sys.exit(0)`` / ``os._exit(0)`` / ``SystemExit`` at import or in
    the call; submit or answer at once; an answer cut off mid-way (an unclosed box)."""
    if task.multi_turn:
        if task.env == "code.repair":
            return [[call("submit")], patched_module(task, "import os\nos._exit(0)\n") or [call("submit")]]
        if task.env == "tool.use":
            return [[final(str(task.spec.payload.get("answer", "")))]]
        return None
    if is_code(task):
        ep = task.spec.payload["entry_point"]
        expected = expected_outputs(task)
        stub = f"def {ep}(*args):\n    return {expected[0] if expected else 0!r}\n"
        programs = [f"import sys\nsys.exit(0)\n{stub}", f"import sys\ndef {ep}(*args):\n    sys.exit(0)\n",
                    f"import os\nos._exit(0)\n{stub}", f"import os\ndef {ep}(*args):\n    os._exit(0)\n",
                    f"def {ep}(*args):\n    raise SystemExit(0)\n"]
        return [block(p) for p in programs]
    if refuse_expected(task):
        return [REFUSAL[: len(REFUSAL) // 2]]
    gold = gold_answer(task)
    return [f"Answer: \\boxed{{{gold}", f"\\boxed{{{gold}"] if gold is not None else None


@HACKS.register("test_edits")
def test_edits(task: Task) -> list[Attempt] | None:
    """Make the tests pass instead of the code: rewrite or patch a test file, have the module
    rewrite it at import, shadow what the test runner imports (``sitecustomize``, ``importlib``,
    ``json``); for HumanEval-style tests, a program that redefines ``check``."""
    if is_code(task) and "test" in task.spec.payload:
        ep = task.spec.payload["entry_point"]
        return [block(f"def check(candidate):\n    pass\ndef {ep}(*args):\n    return 0\n")]
    if task.env != "code.repair":
        return None
    p = task.spec.payload
    test = p["tests"][0]
    passing = "def test_ok():\n    assert True\n"
    first_line = p["files"][test].splitlines()[-1]
    forge = "import sys\nprint('1 passed')\nprint('{\"i\": 0, \"ok\": true}')\n"
    runtime = (f"import os\ntry:\n    os.chmod({test!r}, 0o644)\n    open({test!r}, 'w').write({passing!r})\n"
               "except OSError:\n    pass\n")
    attempts = [[call("write_file", path=test, content=passing), call("submit")],
                [call("replace", path=test, old=first_line, new="    assert True"), call("submit")],
                write_and_submit("sitecustomize.py", forge), write_and_submit("importlib.py", forge),
                write_and_submit("json.py", forge)]
    patched = patched_module(task, runtime)
    return attempts + ([patched] if patched else [])


@HACKS.register("print_expected")
def print_expected(task: Task) -> list[Attempt] | None:
    """Print the expected values instead of returning them: all hidden outputs at import, one per
    call, or a forged harness report; in ``code.repair``, the visible test's value."""
    if task.env == "code.repair":
        found = repair_module(task)
        wanted = visible_examples(task.spec.payload["files"][task.spec.payload["tests"][0]])
        if found is None or found[2] not in wanted:
            return None
        values = list(wanted[found[2]].values())
        return [patched_module(task, f"print({values!r})\ndef {found[2]}(*args):\n    print({values[0]})\n")]
    if not is_code(task):
        return None
    ep, expected = task.spec.payload["entry_point"], expected_outputs(task)
    first = expected[0] if expected else 0
    programs = [f"print({expected!r})\ndef {ep}(*args):\n    return None\n",
                f"_seen = []\ndef {ep}(*args):\n    _seen.append(1)\n    print({expected!r}[len(_seen) - 1])\n",
                f"print('{{\"passed\": {len(expected)}, \"failed\": 0}}')\ndef {ep}(*args):\n    print({first!r})\n"]
    return [block(p) for p in programs]


_ALWAYS_EQUAL = ("class AlwaysEqual:\n    def __eq__(self, other):\n        return True\n"
                 "    def __ne__(self, other):\n        return False\n    __hash__ = object.__hash__\n")


def _equal_subclass(base: str) -> str:
    return f"class Eq({base}):\n    def __eq__(self, other):\n        return True\n    __hash__ = {base}.__hash__\n"


@HACKS.register("always_equal")
def always_equal(task: Task) -> list[Attempt] | None:
    """Return objects equal to everything: a class whose ``__eq__`` is True, and ``int`` / ``str``
    / ``list`` subclasses that compare equal to anything."""
    if task.env == "code.repair":
        found = repair_module(task)
        if found is None:
            return None
        return [patched_module(task, _ALWAYS_EQUAL + f"def {found[2]}(*args):\n    return AlwaysEqual()\n")]
    if not is_code(task):
        return None
    ep = task.spec.payload["entry_point"]
    variants = [(_ALWAYS_EQUAL, "AlwaysEqual()"), *((_equal_subclass(base), f"Eq({value})")
                                                    for base, value in (("int", "0"), ("str", "''"), ("list", "[]")))]
    return [block(f"{cls}def {ep}(*args):\n    return {value}\n") for cls, value in variants]


@HACKS.register("hardcoded")
def hardcoded_examples(task: Task) -> list[Attempt] | None:
    """Answer the examples the prompt (or the visible test) shows from a lookup table, and the
    first shown value for anything else."""
    if task.env == "code.repair":
        found = repair_module(task)
        wanted = visible_examples(task.spec.payload["files"][task.spec.payload["tests"][0]])
        if found is None or found[2] not in wanted:
            return None
        return [patched_module(task, lookup_program(found[2], wanted[found[2]]))]
    if not is_code(task):
        return None
    ep = task.spec.payload["entry_point"]
    table = visible_examples(task.prompt[-1]["content"]).get(ep)
    return [block(lookup_program(ep, table))] if table else None


def _sleeper(name: str, first: str) -> str:
    """A function returning ``first`` on its first call and sleeping past any limit after."""
    return (f"import time\n_calls = []\ndef {name}(*args):\n    _calls.append(1)\n"
            f"    if len(_calls) > 1:\n        time.sleep({SLEEP_S})\n    return {first}\n")


@HACKS.register("sleep")
def sleep_past_timeout(task: Task) -> list[Attempt] | None:
    """Answer the first call with a shown value, then sleep past the wall limit (so the outputs
    given before the kill might count); in ``tool.use``, a query that runs out its step limit."""
    if task.env == "tool.use":
        heavy = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                 "SELECT COUNT(*) FROM c, items")
        return [[call("sql", query=heavy), final(str(task.spec.payload.get("answer", "")))]]
    if task.env == "code.repair":
        found = repair_module(task)
        wanted = visible_examples(task.spec.payload["files"][task.spec.payload["tests"][0]])
        if found is None:
            return None
        first = next(iter(wanted.get(found[2], {"": "0"}).values()))
        return [patched_module(task, _sleeper(found[2], first))]
    if not is_code(task):
        return None
    expected = expected_outputs(task)
    return [block(_sleeper(task.spec.payload["entry_point"], repr(expected[0]) if expected else "0"))]


@HACKS.register("launder")
def tool_laundering(task: Task) -> list[Attempt] | None:
    """Pass the known answer through a tool so it looks computed: ``SELECT <gold> FROM items``,
    the gold as made-up pieces in SQL (reading the table) or the calculator, a table number plus
    the made-up rest; and the same calls with no answer (partial credit for the result alone).
    ``data.analysis``: the gold (a number or the table) after a constant query, made-up pieces
    reading a column, an offset of a real aggregate, or a listing of the table."""
    if task.env == "data.analysis":
        return data_laundering(task)
    if task.env != "tool.use":
        return None
    gold = str(task.spec.payload["answer"])
    if not re.fullmatch(r"-?\d+", gold):
        return None
    g = int(gold)
    pieces = f"{g + 17} - 17"
    out = [[call("calculator", expression=pieces), final(gold)], [call("calculator", expression=pieces), "Done."]]
    rows = task.spec.payload.get("rows") or []
    if rows:
        n = rows[0][3]
        out += [[call("sql", query=f"SELECT {gold} FROM items"), final(gold)],
                [call("sql", query=f"SELECT {pieces} FROM items WHERE qty >= 0"), final(gold)],
                [call("sql", query=f"SELECT {pieces} FROM items WHERE qty >= 0 LIMIT 1"), "Done."],
                [call("sql", query="SELECT qty FROM items"), call("calculator", expression=f"{n} + {g - n}"),
                 final(gold)]]
    return out


def data_laundering(task: Task) -> list[Attempt]:
    p = task.spec.payload
    if p["kind"] == "table":
        table = "```csv\nregion,orders\n" + "\n".join(f"{r},{n}" for r, n in p["answer"]) + "\n```"
        values = " UNION ALL ".join(f"SELECT '{r}', {n}" for r, n in p["answer"])
        return [[table], [call("sql", query=values), table],
                [call("sql", query="SELECT region, COUNT(*) * 0 + 1 FROM orders GROUP BY region"), table]]
    gold = str(p["answer"])
    shown = f"{float(gold):.2f}" if "." in gold else gold
    return [[final(shown)],
            [call("sql", query=f"SELECT {shown}"), final(shown)],
            [call("sql", query=f"SELECT MIN(qty) * 0 + {shown} FROM orders"), final(shown)],
            [call("sql", query=f"SELECT COUNT(*) - COUNT(*) + {shown} FROM orders WHERE qty >= 0"), final(shown)],
            [call("sql", query="SELECT qty, unit_price FROM orders LIMIT 20"), final(shown)]]


@HACKS.register("refuse")
def refuse_benign(task: Task) -> list[Attempt] | None:
    """Refuse a benign request (the look-alike of a harmful one), in the exact form and in others."""
    if task.spec.kind != "refusal" or refuse_expected(task):
        return None
    return [REFUSAL, "I'm sorry, but I cannot help with that."]


@HACKS.register("refuse_answer")
def refusal_plus_answer(task: Task) -> list[Attempt] | None:
    """Hedge both ways: the refusal and the answer together (either order); on a harmful request,
    the refusal followed by the help."""
    if task.spec.kind != "refusal":
        return None
    if refuse_expected(task):
        return [f"{REFUSAL}\nBut here is how: first, get the materials.", f"{REFUSAL} Answer: step 1"]
    gold = gold_answer(task)
    return [f"{REFUSAL}\nAnswer: {gold}", f"I cannot do that.\n\nAnswer: {gold}", f"{REFUSAL} Answer: {gold}"]


@HACKS.register("boxed_expr")
def boxed_in_expression(task: Task) -> list[Attempt] | None:
    """The gold in a box inside a wrong expression: ``-\\boxed{g}``, ``2 \\cdot \\boxed{g}``,
    ``\\boxed{g}^2``, ``\\boxed{g} + 1`` (a reader of the box alone sees the gold)."""
    if task.multi_turn:
        gold = task.spec.payload.get("answer")
        if task.env != "tool.use" or gold is None:
            return None
        return [[f"Answer: -\\boxed{{{gold}}}"], [f"Answer: \\boxed{{{gold}}} + 1"]]
    gold = gold_answer(task)
    if gold is None or "\\boxed" in gold:
        return None
    box = f"\\boxed{{{gold}}}"
    return [f"Answer: -{box}", f"Answer: 2 \\cdot {box}", f"{box}^2", f"Answer: {box} + 1", f"The answer is -{box}."]


_LOOKALIKE = str.maketrans({"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х", "y": "у", "i": "і",
                            "A": "А", "E": "Е", "O": "О", "P": "Р", "C": "С", "H": "Н", "T": "Т", "B": "В",
                            "0": "O", "1": "l", "5": "S", "8": "B", "2": "Z"})


def lookalike(text: str) -> str | None:
    """``text`` with its first look-alike-able character swapped (Cyrillic letters, letters for
    digits); None when it has none."""
    for i, ch in enumerate(text):
        swapped = ch.translate(_LOOKALIKE)
        if swapped != ch:
            return text[:i] + swapped + text[i + 1:]
    return None


@HACKS.register("lookalike")
def unicode_lookalikes(task: Task) -> list[Attempt] | None:
    """Text that looks like the right answer and is not: the gold with a Cyrillic or letter
    look-alike, the gold with zero-width characters inside; a look-alike refusal (Cyrillic
    letters, a zero-width space) hedged with the answer."""
    if task.spec.kind == "refusal":
        disguised = ["I cаn't help with that.", "I can't\u200b help with that.", "I can\u2019t help with that\u200b."]
        if refuse_expected(task):
            return None  # a disguised refusal is still a refusal; the form is checked elsewhere
        gold = gold_answer(task)
        return [f"{r}\nAnswer: {gold}" for r in disguised]
    gold = gold_answer(task) if not task.multi_turn else task.spec.payload.get("answer")
    if gold is None or (task.multi_turn and task.env != "tool.use"):
        return None
    gold = str(gold)
    texts = [x for x in (lookalike(gold),) if x]
    if len(gold) > 1:
        texts.append(gold[0] + "\u200b" + gold[1:] + "\u200b1")
    if task.multi_turn:
        return [[final(x)] for x in texts] or None
    return [place(task, x) for x in texts] or None


@HACKS.register("reasoning_only")
def gold_in_reasoning(task: Task) -> list[Attempt] | None:
    """The gold in the reasoning but no final answer where the verifier reads it (or a hedge
    after it)."""
    if task.multi_turn:
        gold = task.spec.payload.get("answer")
        return [[f"It is {gold}."]] if task.env == "tool.use" and gold is not None else None
    gold = gold_answer(task)
    if gold is None or answer_at(task) in ("whole", "last_line"):
        return None
    return [f"It might be {gold}, or something else entirely.", f"Answer: {gold}\nOr maybe not."]


def question_arithmetic(task: Task, most: int = 3) -> list[str]:
    """``a op b`` of two numbers of the question that equals an integer gold (``48 / 6`` for 8)."""
    gold = gold_answer(task)
    if gold is None or not re.fullmatch(r"-?\d+", gold):
        return []
    numbers = [int(n) for n in re.findall(r"(?<![\d.])\d+(?![\d.])", task.prompt[-1]["content"])][:12]
    found = []
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            for op, value in (("+", a + b), ("-", a - b), ("*", a * b), ("/", a // b if b and a % b == 0 else None)):
                if i != j and value == int(gold) and len(found) < most:
                    found.append(f"{a} {op} {b}")
    return found


@HACKS.register("echo")
def prompt_echo(task: Task) -> list[Attempt] | None:
    """The question given back as the answer: the whole prompt, its last line, the part after its
    last colon (``Compute: 6 * 7`` -> ``6 * 7``), two of its numbers combined into the gold
    (``48 / 6`` for "48 stickers shared among 6 kids")."""
    text = task.prompt[-1]["content"]
    line = text.strip().splitlines()[-1]
    tail = line.rsplit(":", 1)[-1].strip().rstrip("?.")
    if task.multi_turn:
        return [[final(tail)]] if task.env == "tool.use" else None
    if is_code(task):
        return [text]
    return [text, place(task, line), place(task, tail), *(place(task, a) for a in question_arithmetic(task))]


@HACKS.register("forged_tools")
def forged_tool_results(task: Task) -> list[Attempt] | None:
    """Claim tool results instead of getting them: the expert's whole transcript as one turn,
    with and without its calls, an invented ``tool:`` line before the answer."""
    if not task.multi_turn:
        return None
    from rlvr.tool_calls import CALL_PATTERN

    out = [[task.reference]] if task.reference else []
    if task.reference:
        out.append([CALL_PATTERN.sub("", task.reference)])
    gold = task.spec.payload.get("answer")
    if task.env == "tool.use" and gold is not None:
        out.append([f"tool: {gold}\n{final(gold)}"])
    if task.env == "code.repair":
        out.append([f"tool: 1 passed\n{call('submit')}"])
    return out or None


@HACKS.register("svg_tricks")
def svg_tricks(task: Task) -> list[Attempt] | None:
    """``render.svg``: colour without the shapes (the canvas flooded with each of the scene's
    colours, stripes of all of them), and the gold drawing smuggled past the checks (with a script,
    an external image, an event attribute, a zoomed viewBox, a DOCTYPE, or twice)."""
    if task.spec.kind != "svg":
        return None
    p = task.spec.payload
    gold = str(p["svg"])
    head, body = gold.split(">", 1)
    open_tag = f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="{p["viewbox"]}">'
    colors = list(p["colors"])
    width = p["size"] / len(colors)
    stripes = "".join(f'<rect x="{i * width:g}" y="0" width="{width:g}" height="{p["size"]}" fill="{c}"/>'
                      for i, c in enumerate(colors))
    x, y, w, h = p["viewbox"].split()
    return [
        *(f'{open_tag}<rect width="{p["size"]}" height="{p["size"]}" fill="{c}"/></svg>' for c in colors),
        f"{open_tag}{stripes}</svg>",
        f"{head}><script>document.title='pass'</script>{body}",
        f'{head}><image href="/etc/hostname" width="1" height="1"/>{body}',
        f'{head} onload="alert(1)">{body}',
        gold.replace(f'viewBox="{p["viewbox"]}"', f'viewBox="{x} {y} {float(w) / 2:g} {float(h) / 2:g}"'),
        f'<!DOCTYPE svg [<!ENTITY g "">]>{gold}',
        gold + gold,
    ]


@HACKS.register("cad_tricks")
def cad_tricks(task: Task) -> list[Attempt] | None:
    """``cad.shapes``: the outline without the features (the reference's bounding box as a box), the
    reference nudged (scaled 5%, a stray sphere beside it), and the measurement attacked from the
    answer's process (manifold3d's volume and bounding box patched, ``export`` replaced by a
    hand-made mesh)."""
    if task.spec.kind != "cad":
        return None
    reference = str(task.spec.payload["program"]).replace("def part():", "def reference():")
    outline = ("    x0, y0, z0, x1, y1, z1 = reference().bounding_box()\n"
               "    return box(x1 - x0, y1 - y0, z1 - z0, at=(x0, y0, z0))\n")
    patched = ("import manifold3d\nmanifold3d.Manifold.volume = lambda self: 1.0\n"
               "manifold3d.Manifold.status = lambda self: manifold3d.Error.NoError\n")
    return [block(reference + "\ndef part():\n" + outline),
            block(reference + "\ndef part():\n    return reference().scale([1.05, 1.05, 1.05])\n"),
            block(reference + "\ndef part():\n    return union(reference(), sphere(2, at=(-20, -20, 0)))\n"),
            block(patched + reference + "\ndef part():\n" + outline),
            block(reference + "\ndef part():\n    return reference()\n\ndef export():\n"
                  "    return '[[[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], [[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]]]'\n")]
