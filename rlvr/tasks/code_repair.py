"""``code.repair``: fix a bug in a small multi-file Python project with tools, then submit.

The episode runs in ``rlvr.envs.code_repair.CodeRepairEnv``: the model lists, reads and edits
files (``replace`` is a one-line patch), runs the visible tests, and submits. The reward is
hidden tests on the final workspace; the test files are read-only and tamper-checked.

    L1  ops.py: one buggy function; the prompt shows the failing assertion and the wrong value
    L2  ops.py: two functions, one buggy; the prompt names only the failing test
    L3  app.py calls a helper imported from util.py; the bug is in the helper, the failing test
        is the main function's
    L4  ops.py: two or three functions, one buggy; the prompt says only "the tests fail"
        (``run_tests`` says which)

Functions and bugs come from ``code_funcs`` (``sample_func``, ``mutate``); every expected
value (visible and hidden) is computed by the trusted in-process evaluator of our own
generated code, never by running model output. Files stay a few lines (the policy is tiny and
the whole episode must fit in about 1000 tokens). The key is canonical (templates, constants,
the bug; not names or inputs) so a problem lands in one split whatever asked for it; a train
problem must not reveal an eval ``code.debug`` fix or ``code.gen`` solution, so those keys are
listed in ``reveals``.

``Task.actions`` is a scripted expert that acts, observes and corrects: it reads what the
level needs, patches, runs the tests and submits once they pass. In about half of the problems
(``RECOVER_FRAC``) its first patch is a plausible wrong one (another one-token change of the
buggy line), the tests say so, and it patches again: the transcripts show the loop a repair
episode exists for, not only a fix that is right the first time. ``Task.reference`` is the
transcript of that episode as plain text (pretraining);
the observations in it are simulated here by the same rules the environment follows, which
the tests check against real episodes.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from rlvr.sandbox import plaindata
from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.tasks.code_funcs import (
    NAMES,
    OPS,
    Func,
    int_arg,
    hidden_inputs,
    mutate,
    sample_func,
)
from rlvr.tool_calls import format_call
from rlvr.types import Spec

NAME = "code.repair"
HIDDEN_BUGGY, HIDDEN_OTHER = 6, 3  # hidden inputs for the buggy function / every other one
# code_funcs levels each repair level draws its functions from
FUNC_LEVELS = {1: (1, 2), 2: (1, 2, 3), 3: (1, 2, 3), 4: (2, 3, 4)}
OK = "ok"  # what a successful edit answers (rlvr.envs.bodies.files.OK, which runs in the sandbox)
MAX_FILE = 250  # characters per file (module or tests); longer drafts are drawn again
RECOVER_FRAC = 0.5  # problems whose expert tries a wrong patch first, runs the tests, corrects


# ---------------------------------------------------------------- rules shared with the env


def tests_summary(results: list[tuple[str, str | None]]) -> str:
    """The ``run_tests`` observation: one line per failing test, then the counts.
    ``results``: (test name, None if it passed else what went wrong)."""
    failed = [f"{name} FAILED: {why}" for name, why in results if why is not None]
    passed = sum(why is None for _, why in results)
    counts = f"{len(failed)} failed, {passed} passed" if failed else f"{passed} passed"
    return "\n".join([*failed, counts])


# The trusted runner of the visible tests (``run_tests``). It runs in the sandbox together
# with the model's code, so what it prints is only an observation, never a reward.
RUNNER = r'''import sys
sys.dont_write_bytecode = True
if "" not in sys.path:
    sys.path.insert(0, "")
import ast, importlib

def why(mod, path, e):
    if not isinstance(e, AssertionError):
        return f"{type(e).__name__}: {e}"[:120]
    tb, line = e.__traceback__, ""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(path):
            import linecache
            line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
        tb = tb.tb_next
    try:
        node = ast.parse(line).body[0].test
        left, right = node.left, node.comparators[0]
        got = eval(compile(ast.Expression(left), path, "eval"), vars(mod))
        want = eval(compile(ast.Expression(right), path, "eval"), vars(mod))
        return f"{ast.unparse(left)} returned {got!r}, expected {want!r}"
    except Exception:
        return line[:120] or "AssertionError"

results = []
for path in PATHS:
    try:
        mod = importlib.import_module(path[:-3])
    except Exception as e:
        results.append((path, f"{type(e).__name__}: {e}"[:120]))
        continue
    for name in [n for n in vars(mod) if n.startswith("test_") and callable(vars(mod)[n])]:
        try:
            vars(mod)[name]()
            results.append((name, None))
        except Exception as e:
            results.append((name, why(mod, path, e)))
failed = [f"{n} FAILED: {w}" for n, w in results if w is not None]
passed = sum(w is None for _, w in results)
print("\n".join(failed + [f"{len(failed)} failed, {passed} passed" if failed else f"{passed} passed"]))
'''

# The trusted shim of the hidden tests: an io job calls ``run(module, function, *args)`` on the
# workspace; the expected values stay on the trusted side.
SHIM = '''import sys
sys.dont_write_bytecode = True
import importlib

def run(module, name, *args):
    return getattr(importlib.import_module(module), name)(*args)
'''


def visible_result(func: Func, args: tuple, got: Any) -> tuple[str, str | None]:
    """One visible test of ``func`` at ``args`` as ``RUNNER`` reports it: (name, None if it
    passed else "<call> returned <got>, expected <want>")."""
    want = func.fn(*args)
    return (f"test_{func.name}", None if got == want else
            f"{func.call(args)} returned {got!r}, expected {want!r}")


def runner_program(test_paths: list[str]) -> str:
    return f"PATHS = {list(test_paths)!r}\n" + RUNNER


def transcript(prompt: str, turns: list[tuple[str, str | None]]) -> str:
    """Plain text of an episode: the prompt, then each assistant turn and its tool result."""
    lines = [f"user: {prompt}"]
    for action, observation in turns:
        lines.append(f"assistant: {action}")
        if observation is not None:
            lines.append(f"tool: {observation}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the project


@dataclass(frozen=True)
class Fn:
    """One function of the project: where it lives, how it should behave, how it ships."""

    module: str  # "ops" (file ops.py)
    good: Func
    shipped: Func  # the buggy version for the buggy function, else ``good``

    def source(self) -> str:
        return self.shipped.source


def _funcs(level: int, rng: random.Random, k: int, one_arg: bool = False) -> list[Func]:
    names = rng.sample(NAMES, k)  # distinct: they share a module
    out = []
    for name in names:
        while True:
            f = sample_func(rng.choice(FUNC_LEVELS[level]), rng)
            if not one_arg or len(f.params) == 1:
                break
        out.append(dataclasses.replace(f, name=name))
    return out


def _wrapper(helper: Func, name: str, op: str, k: int) -> Func:
    """``def f(x): return g(x) + 3``: the main function of L3, calling ``helper`` (good or
    buggy: the source is the same, the trusted evaluator follows the helper)."""
    x = helper.params[0]
    word, fn = OPS[op]
    return Func(f"W:{op}{k}", name, (x,), f"returns {helper.name}({x}) {word} {k}",
                (f"return {helper.name}({x}) {op} {k}",),
                lambda v, fn=fn, k=k, h=helper.fn: fn(h(v), k), int_arg)


@dataclass(frozen=True)
class Draft:
    level: int
    fns: list[Fn]  # in file order
    bug: int  # index of the buggy function
    tested: list[int]  # indices of the functions the visible test file tests
    shown: dict[int, tuple]  # index -> the visible input of its test
    caught: tuple  # a second input where the buggy function fails (hidden)
    wrap: tuple[str, int] | None = None  # L3: the main function's (operator, constant)


def module_source(draft: Draft, module: str) -> str:
    imports = ""
    if module == "app":
        helpers = [f.shipped.name for f in draft.fns if f.module == "util"]
        imports = f"from util import {', '.join(helpers)}\n\n"
    return imports + "\n".join(f.source() for f in draft.fns if f.module == module)


def tests_file(draft: Draft, test_module: str) -> tuple[str, str]:
    fns = [draft.fns[i] for i in draft.tested]
    module = fns[0].module
    lines = [f"from {module} import {', '.join(f.good.name for f in fns)}", ""]
    for i in draft.tested:
        f = draft.fns[i]
        args = draft.shown[i]
        lines += [f"def test_{f.good.name}():", f"    assert {f.good.call(args)} == {f.good.fn(*args)!r}"]
    return f"{test_module}.py", "\n".join(lines) + "\n"


class CodeRepairDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)
    needs_sandbox = True
    env = NAME  # episodes in the code.repair environment (rlvr.envs.code_repair)

    # -- sampling --

    def _draft(self, level: int, rng: random.Random) -> Draft | None:
        if level == 3:
            helper, = _funcs(level, rng, 1, one_arg=True)
            main_name = rng.choice([n for n in NAMES if n != helper.name])
            op, k = rng.choice(list(OPS)), rng.randint(2, 9)
            buggy = mutate(helper, rng)
            if buggy is None:
                return None
            fns = [Fn("util", helper, buggy),
                   Fn("app", _wrapper(helper, main_name, op, k), _wrapper(buggy, main_name, op, k))]
            bug, tested, failing_fn, wrap = 0, [1], 1, (op, k)
        else:
            k = {1: 1, 2: 2, 4: rng.choice((2, 3))}[level]
            funcs = _funcs(level, rng, k)
            bug = rng.randrange(k)
            buggy = mutate(funcs[bug], rng)
            if buggy is None:
                return None
            fns = [Fn("ops", f, buggy if i == bug else f) for i, f in enumerate(funcs)]
            tested, failing_fn, wrap = list(range(k)), bug, None
        target = fns[failing_fn]
        failing = [a for a in target.good.inputs(rng, 16)
                   if target.shipped.fn(*a) != target.good.fn(*a)]
        if len(failing) < 2:
            return None
        shown = {i: fns[i].good.inputs(rng, 1)[0] for i in tested}
        shown[failing_fn] = failing[0]
        return Draft(level, fns, bug, tested, shown, failing[1], wrap)

    def _fix(self, draft: Draft) -> tuple[str, str, str] | None:
        """(path, old, new): the buggy line, stripped, and its fix; None if not unique."""
        f = draft.fns[draft.bug]
        old_lines = [ln.lstrip(">") for ln in f.shipped.body]
        new_lines = [ln.lstrip(">") for ln in f.good.body]
        diff = [(o, n) for o, n in zip(old_lines, new_lines) if o != n]
        if len(diff) != 1:
            return None
        old, new = diff[0]
        if module_source(draft, f.module).count(old) != 1:
            return None
        return f"{f.module}.py", old, new

    @staticmethod
    def _wrong_patch(draft: Draft, old: str, rng: random.Random) -> tuple[str, list] | None:
        """A plausible wrong fix: another one-token change of the buggy line that the visible
        test still catches. (the new line, the ``run_tests`` results after it) or None."""
        f = draft.fns[draft.bug]
        module = module_source(draft, f.module)
        for _ in range(10):
            guess = mutate(f.shipped, rng)
            if guess is None or guess.body == f.good.body:
                continue
            changed = [(a.lstrip(">"), b.lstrip(">")) for a, b in zip(f.shipped.body, guess.body) if a != b]
            if len(changed) != 1 or changed[0][0] != old:
                continue
            if module.replace(old, changed[0][1], 1).count(changed[0][1]) != 1:
                continue  # the second patch must find it exactly once
            results = []
            for i in draft.tested:
                t, args = draft.fns[i], draft.shown[i]
                if draft.wrap is not None:  # L3: the tested main function calls the helper
                    got = _wrapper(guess, t.good.name, *draft.wrap).fn(*args)
                else:
                    got = guess.fn(*args) if i == draft.bug else t.good.fn(*args)
                results.append(visible_result(t.good, args, got))
            if any(why is not None for _, why in results):
                return changed[0][1], results
        return None

    @staticmethod
    def _files(draft: Draft) -> dict[str, str]:
        modules = list(dict.fromkeys(f.module for f in draft.fns))
        files = {f"{m}.py": module_source(draft, m) for m in modules}
        test_path, test_text = tests_file(draft, "test_app" if draft.level == 3 else "test_ops")
        files[test_path] = test_text
        return files

    def sample(self, level: int, rng: random.Random) -> Problem:
        while True:
            draft = self._draft(level, rng)
            if draft is None:
                continue
            fix = self._fix(draft)
            if fix is None or max(len(text) for text in self._files(draft).values()) > MAX_FILE:
                continue
            hidden = []
            for i, f in enumerate(draft.fns):
                avoid = [draft.shown[i]] if i in draft.shown else []
                include = [draft.caught] if i == draft.bug or (level == 3 and i == 1) else []
                n = HIDDEN_BUGGY if include else HIDDEN_OTHER
                inputs = hidden_inputs(f.good, rng, n, avoid=avoid, include=include)
                if inputs is None:
                    break
                hidden += [(f.module, f.good.name, tuple(a), f.good.fn(*a)) for a in inputs]
            else:
                wrong = self._wrong_patch(draft, fix[1], rng) if rng.random() < RECOVER_FRAC else None
                return self._problem(draft, fix, hidden, wrong)

    def _problem(self, draft: Draft, fix: tuple[str, str, str], hidden: list[tuple],
                 wrong: tuple[str, list] | None = None) -> Problem:
        level = draft.level
        files = self._files(draft)
        test_path = next(p for p in files if p.startswith("test_"))
        listing = ", ".join(sorted(files, key=lambda p: (p.startswith("test_"), p)))
        main = draft.fns[draft.tested[0]] if level == 3 else draft.fns[draft.bug]
        if level == 1:
            args = draft.shown[draft.bug]
            line = f"assert {main.good.call(args)} == {main.good.fn(*args)!r}"
            what = (f"{test_path} fails: {line} ({main.good.call(args)} returned "
                    f"{main.shipped.fn(*args)!r}).")
        elif level in (2, 3):
            what = f"test_{main.good.name} in {test_path} fails."
        else:
            what = "The tests fail."
        prompt = f"{what} Files: {listing}. Fix the bug, then submit."
        payload: dict[str, Any] = {
            "files": files,
            "protected": [test_path],
            "tests": [test_path],
            "hidden": plaindata.encode([(m, fn, *args) for m, fn, args, _ in hidden]),
            "expected": plaindata.encode([want for *_, want in hidden]),
        }
        results = [visible_result(draft.fns[i].good, draft.shown[i], draft.fns[i].shipped.fn(*draft.shown[i]))
                   for i in draft.tested]
        path, old, new = fix
        fixed_results = [(name, None) for name, _ in results]
        read = lambda p: (format_call("read_file", {"path": p}), files[p])
        patch = lambda a, b: (format_call("replace", {"path": path, "old": a, "new": b}), OK)
        run = lambda res: (format_call("run_tests"), tests_summary(res))
        submit = (format_call("submit"), None)
        if level == 1:
            look = [read(path)]
        elif level == 4:
            look = [run(results), read(path)]
        else:  # the failing test (L2) or the main module calling the helper (L3), then the bug
            look = [read(test_path if level == 2 else "app.py"), read(path)]
        if wrong is None:
            turns = [*look, patch(old, new), run(fixed_results), submit]
        else:  # act, observe, correct (no second test run: the whole episode fits in 6 turns)
            guess, guess_results = wrong
            turns = [*look, patch(old, guess), run(guess_results), patch(guess, new), submit]
        buggy = draft.fns[draft.bug]
        key = (f"R{level}:" + ";".join(f.good.key for i, f in enumerate(draft.fns) if i != draft.bug)
               + "#" + buggy.shipped.key)
        reveals = (("code.debug", buggy.shipped.key),
                   *(("code.gen", f.good.key) for f in draft.fns if not f.good.key.startswith("W:")))
        return Problem(key=key, prompt=prompt, spec=Spec(NAME, payload),
                             reference=transcript(prompt, turns), reveals=reveals,
                             actions=tuple(a for a, _ in turns))

    # -- corpus --

    def corpus_text(self, problem: Problem, rng: random.Random) -> str:
        return problem.reference  # the whole transcript: prompt, turns, observations


DOMAINS.register(NAME)(CodeRepairDomain())
