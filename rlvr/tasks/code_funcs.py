"""Small Python functions to write or repair, in four levels, shared by ``code.gen``/``code.debug``.

    L1  one argument, one operation        "returns n plus 7"                 return n + 7
    L2  two arguments, or two operations   "returns a times b, plus 3"        return a * b + 3
    L3  a condition                        "returns x minus 4 if x is greater than 4, otherwise 0"
    L4  a loop over a list                 "returns how many items of xs are greater than 5"

A ``Func`` is one sampled function: its *key* (template, constants and parameter names, not the
function's name: a held-out problem is a new combination of those, never a renamed train one),
the description, the reference source, a trusted Python evaluator of the same function (used
to compute expected outputs; model output is never executed outside the sandbox), and an input
sampler. ``mutate`` gives a plausible bug of the same function for ``code.debug``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NAMES = ("f", "g", "h", "calc", "solve", "compute")
ARGS1 = ("x", "n", "a")
ARGS2 = (("a", "b"), ("x", "y"), ("m", "n"))
LISTS = ("xs", "nums", "items")
OPS = {"+": ("plus", lambda a, b: a + b), "-": ("minus", lambda a, b: a - b),
       "*": ("times", lambda a, b: a * b)}
CMPS = {">": ("greater than", lambda a, b: a > b), "<": ("less than", lambda a, b: a < b)}


@dataclass(frozen=True)
class Func:
    key: str
    name: str
    params: tuple[str, ...]
    description: str  # "returns n plus 7"
    body: tuple[str, ...]  # source lines of the body, unindented
    fn: Callable[..., Any] = field(compare=False)
    sample_args: Callable[[random.Random], tuple] = field(compare=False)

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.params)})"

    @property
    def source(self) -> str:
        lines = [f"def {self.signature}:"]
        depth = 1
        for line in self.body:
            stripped = line.lstrip(">")
            lines.append("    " * (depth + len(line) - len(stripped)) + stripped)
        return "\n".join(lines) + "\n"

    def call(self, args: tuple) -> str:
        return f"{self.name}({', '.join(repr(a) for a in args)})"

    def inputs(self, rng: random.Random, n: int, avoid: list[tuple] = ()) -> list[tuple]:
        """``n`` distinct argument tuples, none of them in ``avoid``."""
        out: list[tuple] = []
        for _ in range(8 * n):  # small input ranges (0..20) may hold fewer than n
            args = self.sample_args(rng)
            if args not in out and args not in avoid:
                out.append(args)
            if len(out) == n:
                break
        return out


def hidden_inputs(func: Func, rng: random.Random, n: int, avoid: list[tuple],
                  include: list[tuple] = ()) -> list[tuple] | None:
    """``n`` hidden test inputs (``include`` among them, in random places), none shown in the
    prompt, on which no constant answer passes (at least two distinct expected outputs); None
    when the function has no such inputs left (then sample another function)."""
    for _ in range(200):
        inputs = [*include, *func.inputs(rng, n - len(include), [*avoid, *include])]
        if len({repr(func.fn(*a)) for a in inputs}) > 1:
            rng.shuffle(inputs)
            return inputs
    return None


def int_arg(rng: random.Random) -> tuple:
    return (rng.randint(0, 20),)


def _two_args(rng: random.Random) -> tuple:
    return (rng.randint(0, 12), rng.randint(0, 12))


def _list_arg(rng: random.Random) -> tuple:
    return ([rng.randint(0, 9) for _ in range(rng.randint(0, 6))],)


def _level1(rng: random.Random, name: str) -> Func:
    x = rng.choice(ARGS1)
    op = rng.choice(list(OPS))
    k = rng.randint(2, 30)
    word, fn = OPS[op]
    return Func(f"L1:{x}{op}{k}", name, (x,), f"returns {x} {word} {k}", (f"return {x} {op} {k}",),
                lambda v, fn=fn, k=k: fn(v, k), int_arg)


def _level2(rng: random.Random, name: str) -> Func:
    if rng.random() < 0.5:
        op = rng.choice(list(OPS))
        word, fn = OPS[op]
        a, b = rng.choice(ARGS2)
        return Func(f"L2:{a}{op}{b}", name, (a, b), f"returns {a} {word} {b}",
                    (f"return {a} {op} {b}",), lambda u, v, fn=fn: fn(u, v), _two_args)
    x = rng.choice(ARGS1)
    op1, op2 = rng.choice(["*", "+"]), rng.choice(["+", "-"])
    k1, k2 = rng.randint(2, 9), rng.randint(1, 9)
    (w1, f1), (w2, f2) = OPS[op1], OPS[op2]
    expr = f"{x} {op1} {k1} {op2} {k2}" if op1 == "*" else f"({x} {op1} {k1}) {op2} {k2}"
    return Func(f"L2:{x}{op1}{k1}{op2}{k2}", name, (x,), f"returns {x} {w1} {k1}, {w2} {k2}",
                (f"return {expr}",), lambda v, f1=f1, f2=f2, k1=k1, k2=k2: f2(f1(v, k1), k2),
                int_arg)


def _level3(rng: random.Random, name: str) -> Func:
    x = rng.choice(ARGS1)
    cmp = rng.choice(list(CMPS))
    k = rng.randint(2, 15)
    cword, cfn = CMPS[cmp]
    if rng.random() < 0.5:
        otherwise = rng.randint(0, 9)
        return Func(f"L3:{x}{cmp}{k}->x-{k}|{otherwise}", name, (x,),
                    f"returns {x} minus {k} if {x} is {cword} {k}, otherwise {otherwise}",
                    (f"if {x} {cmp} {k}:", f">return {x} - {k}", f"return {otherwise}"),
                    lambda v, cfn=cfn, k=k, o=otherwise: v - k if cfn(v, k) else o, int_arg)
    yes, no = rng.sample(range(10), 2)
    return Func(f"L3:{x}{cmp}{k}->{yes}|{no}", name, (x,),
                f"returns {yes} if {x} is {cword} {k}, otherwise {no}",
                (f"if {x} {cmp} {k}:", f">return {yes}", f"return {no}"),
                lambda v, cfn=cfn, k=k, y=yes, n=no: y if cfn(v, k) else n, int_arg)


def _level4(rng: random.Random, name: str) -> Func:
    cmp = rng.choice(list(CMPS))
    k = rng.randint(0, 9)
    xs = rng.choice(LISTS)
    cword, cfn = CMPS[cmp]
    if rng.random() < 0.5:
        return Func(f"L4:{xs}:count{cmp}{k}", name, (xs,),
                    f"returns how many items of {xs} are {cword} {k}",
                    ("total = 0", f"for v in {xs}:", f">if v {cmp} {k}:", ">>total += 1",
                     "return total"),
                    lambda vs, cfn=cfn, k=k: sum(1 for v in vs if cfn(v, k)), _list_arg)
    return Func(f"L4:{xs}:sum{cmp}{k}", name, (xs,),
                f"returns the sum of the items of {xs} that are {cword} {k}",
                ("total = 0", f"for v in {xs}:", f">if v {cmp} {k}:", ">>total += v",
                 "return total"),
                lambda vs, cfn=cfn, k=k: sum(v for v in vs if cfn(v, k)), _list_arg)


LEVELS = {1: _level1, 2: _level2, 3: _level3, 4: _level4}


def sample_func(level: int, rng: random.Random) -> Func:
    """A function of ``level`` that is not constant on its input range (``sum of items < 1``
    would be); a constant one could be passed by returning a constant."""
    while True:
        func = LEVELS[level](rng, rng.choice(NAMES))
        probe = func.inputs(random.Random(1), 12)
        if len({repr(func.fn(*a)) for a in probe}) > 1:
            return func


def mutate(func: Func, rng: random.Random) -> Func | None:
    """A buggy variant: one constant off by one, or one operator or comparison swapped.
    None when the mutation happens to compute the same function on every sampled input."""
    body = list(func.body)
    for _ in range(20):
        i = rng.randrange(len(body))
        line = body[i]
        tokens = line.split(" ")
        spots = [j for j, t in enumerate(tokens) if t in ("+", "-", "*", ">", "<", "+=")
                 or t.rstrip(":").isdigit()]
        if not spots:
            continue
        j = rng.choice(spots)
        t = tokens[j]
        if t.rstrip(":").isdigit():
            n = int(t.rstrip(":"))
            new = str(n + rng.choice((-1, 1)) if n > 0 else n + 1) + (":" if t.endswith(":") else "")
        elif t in ("+", "-", "*"):
            new = rng.choice([o for o in ("+", "-", "*") if o != t])
        elif t in (">", "<"):
            new = {">": "<", "<": ">"}[t]
        else:  # "+="
            new = "-="
        tokens[j] = new
        body[i] = " ".join(tokens)
        buggy_src = tuple(body)
        if buggy_src == func.body:
            continue
        buggy = Func(func.key + "|bug:" + "/".join(buggy_src), func.name, func.params,
                     func.description, buggy_src, _compile_trusted(func.params, buggy_src),
                     func.sample_args)
        probe = func.inputs(random.Random(0), 12)
        if any(buggy.fn(*a) != func.fn(*a) for a in probe):
            return buggy
        body = list(func.body)
    return None


def _compile_trusted(params: tuple[str, ...], body: tuple[str, ...]) -> Callable[..., Any]:
    """Evaluate our own generated (never model-written) function source."""
    tmp = Func("", "_bug", params, "", body, lambda *a: None, lambda r: ())
    namespace: dict[str, Any] = {}
    exec(compile(tmp.source, "<rlvr generated>", "exec"), namespace)  # noqa: S102 - trusted
    return namespace["_bug"]
