"""``code.debug``: fix a small Python function, shown the function and a failing test.

    This function should return n plus 7, but it is wrong:
    ```python
    def g(n):                                         ```python
        return n + 6                             ->   def g(n):
    ```                                                   return n + 7
    g(1) returned 7, expected 8. Fix it.              ```

The bug is one constant off by one or one operator/comparison swapped (``code_funcs.mutate``),
and the failing test is real: the buggy function's output on an input where it differs from the
reference (both are our own generated code, evaluated in-process; model output never is). The
reward is the same hidden-test check as ``code.gen``, whose hidden inputs here also include one
the unchanged buggy function fails; the spec's ``given`` (the buggy function's outputs there) makes
partial credit count only the cases the answer gets right beyond the program it was shown. Levels follow ``code_funcs``. The fix is a ``code.gen``
solution, so a problem ``reveals`` that function's ``code.gen`` key: a train problem never shows
the solution of an eval ``code.gen`` task.
"""

from __future__ import annotations

import random

from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.tasks.code_funcs import hidden_inputs, mutate, sample_func
from rlvr.tasks.code_gen import HIDDEN, fence, io_spec

NAME = "code.debug"


class CodeDebugDomain(Domain):
    name = NAME
    version = "v3"  # v2: train problems that reveal an eval code.gen solution are drawn again;
    # v3: the spec carries the shown program's outputs ("given"), the floor of partial credit
    levels = (1, 2, 3, 4)
    needs_sandbox = True

    def sample(self, level: int, rng: random.Random) -> Problem:
        while True:
            func = sample_func(level, rng)
            buggy = mutate(func, rng)
            if buggy is None:
                continue
            failing = [a for a in func.inputs(rng, 16) if buggy.fn(*a) != func.fn(*a)]
            if len(failing) < 2:  # one to show, one more to hide
                continue
            shown, caught = failing[0], failing[1]
            hidden = hidden_inputs(func, rng, HIDDEN, avoid=[shown], include=[caught])
            if hidden is not None:
                break
        prompt = (f"This function should {func.description.replace('returns', 'return', 1)}, "
                  f"but it is wrong:\n{fence(buggy.source)}\n"
                  f"{func.call(shown)} returned {buggy.fn(*shown)!r}, expected {func.fn(*shown)!r}. "
                  "Fix it.")
        return Problem(key=buggy.key, prompt=prompt, spec=io_spec(func, hidden, given=buggy),
                       reference=fence(func.source), reveals=(("code.gen", func.key),))

    def corpus_text(self, problem: Problem, rng: random.Random) -> str:
        return problem.reference.removeprefix("```python\n").removesuffix("```")  # code only


DOMAINS.register(NAME)(CodeDebugDomain())
