"""``code.gen``: write a small Python function from a description and two examples.

    Write a Python function g(n) that returns n plus 7.      ```python
    Examples:                                           ->    def g(n):
    g(1) == 8                                                     return n + 7
    g(3) == 10                                                ```

Levels are those of ``code_funcs`` (one operation; two; a condition; a loop over a list). The
reward runs the answer in the sandbox on eight **hidden** inputs that differ from the examples;
their expected values come from the reference (a trusted evaluator of the same function) and
never enter the sandbox. A lookup table of the examples, a constant or ``pass`` fails.
"""

from __future__ import annotations

import random

from rlvr.sandbox import plaindata
from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.tasks.code_funcs import Func, hidden_inputs, sample_func
from rlvr.types import Spec

NAME = "code.gen"
VISIBLE, HIDDEN = 2, 8
DESCRIBED_FRACTION = 0.25  # of pretraining items (see ``corpus_text``)


def fence(source: str) -> str:
    return f"```python\n{source}```"


def io_spec(func: Func, hidden: list[tuple], given: Func | None = None) -> Spec:
    """The hidden io check of ``func``; ``given``: the program a debug task shows, whose outputs on
    the hidden inputs (``"given"``) partial credit must beat (``rlvr.verifiers.partial``)."""
    payload = {
        "entry_point": func.name,
        "inputs": plaindata.encode(hidden),
        "expected": plaindata.encode([func.fn(*a) for a in hidden]),
    }
    if given is not None:
        payload["given"] = plaindata.encode([_output(given, a) for a in hidden])
    return Spec(kind="code", payload=payload)


def _output(func: Func, args: tuple):
    try:
        return func.fn(*args)
    except Exception:  # noqa: BLE001 - our own generated code; a raise matches no expected output
        return None


def examples(func: Func, inputs: list[tuple]) -> str:
    return "\n".join(f"{func.call(a)} == {func.fn(*a)!r}" for a in inputs)


class CodeGenDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)
    needs_sandbox = True

    def sample(self, level: int, rng: random.Random) -> Problem:
        while True:
            func = sample_func(level, rng)
            visible = func.inputs(rng, VISIBLE)
            hidden = hidden_inputs(func, rng, HIDDEN, avoid=visible)
            if hidden is not None:
                break
        prompt = (f"Write a Python function {func.signature} that {func.description}.\n"
                  f"Examples:\n{examples(func, visible)}")
        return Problem(key=func.key, prompt=prompt, spec=io_spec(func, hidden),
                       reference=fence(func.source))

    def corpus_text(self, problem: Problem, rng: random.Random) -> str:
        # Mostly code and its behaviour; only a quarter of the items pair an English description
        # with its code, so the prior knows Python well and the mapping from descriptions to code
        # only partly: SFT and RL have the rest to do.
        if rng.random() < DESCRIBED_FRACTION:
            return f"{problem.prompt}\n{problem.reference}"
        return problem.reference + "\n" + problem.prompt.split("Examples:\n", 1)[1]


DOMAINS.register(NAME)(CodeGenDomain())
