"""``long_ctx.aggregate``: count or sum ledger entries spread through a long document.

The prompt is generated prose (``rlvr.tasks.long_text``) with ledger entries planted at random
places, one a sentence: ``Ledger entry: fuel, 47 credits.`` From L3 on some entries are marked
void (``Ledger entry (void): fuel, 47 credits.``), and the prompt says once, at the start, that
void entries do not count. The question asks either how many (non-void) entries are for one
category, or their total in credits:

    How many ledger entries are for fuel?
    What is the total, in credits, of all ledger entries for fuel?

    level  prompt tokens  entries  of the asked category  void entries
    L1     ~1k            6        2-3                    0
    L2     ~2k            8        2-4                    0
    L3     ~4k            10       3-4                    1
    L4     ~8k            12       3-5                    2
    L5     ~16k           16       4-6                    2
    L6     ~32k           20       5-7                    3

Amounts are two-digit credits. Categories are drawn from ``CATEGORIES``; a document uses four
(three at L1). The first void entry, and every other one after it, is of the asked category: a
count or sum that takes it in is wrong.

The reference copies the counted entries in document order, then for a sum the additions as
``math.word`` writes them (``47 + 12 = 59`` ...; the steps are ``math.arith`` facts, ``reveals``),
then ``Answer: N``; the ``math`` verifier checks it exactly.

The key is the level, the entries sorted (``category=amount``, ``!`` for void) and the question
(``count:fuel`` or ``sum:fuel``): not the filler, the positions or the wording.
"""

from __future__ import annotations

import dataclasses
import random

from rlvr.tasks.base import DOMAINS, Problem
from rlvr.tasks.long_text import LongDomain, filler_sentences, paragraphs, plant
from rlvr.tasks.math_arith import math_problem
from rlvr.types import Spec

NAME = "long_ctx.aggregate"
ENTRIES = {1: 6, 2: 8, 3: 10, 4: 12, 5: 16, 6: 20}
ASKED = {1: (2, 3), 2: (2, 4), 3: (3, 4), 4: (3, 5), 5: (4, 6), 6: (5, 7)}  # entries of the asked category
VOID = {1: 0, 2: 0, 3: 1, 4: 2, 5: 2, 6: 3}
CATEGORIES = ("fuel", "rent", "repairs", "wages", "supplies", "travel", "postage", "insurance")
ENTRY = "Ledger entry: {c}, {v} credits."
VOID_ENTRY = "Ledger entry (void): {c}, {v} credits."
NOTE = "The text below contains ledger entries. Entries marked (void) were cancelled and do not count."
QUESTIONS = {"count": "How many ledger entries are for {c}?",
             "sum": "What is the total, in credits, of all ledger entries for {c}?"}

Entry = tuple[str, int, bool]  # (category, amount, void)


def entry_line(entry: Entry) -> str:
    category, amount, void = entry
    return (VOID_ENTRY if void else ENTRY).format(c=category, v=amount)


class AggregateDomain(LongDomain):
    name = NAME

    def plan(self, level: int, rng: random.Random) -> tuple[Problem, tuple]:
        kinds = rng.sample(CATEGORIES, 3 if level == 1 else 4)
        asked = kinds[0]
        n_asked = rng.randint(*ASKED[level])
        n_void = VOID[level]
        entries: list[Entry] = [(asked, rng.randint(10, 99), False) for _ in range(n_asked)]
        entries += [(asked if i % 2 == 0 else rng.choice(kinds[1:]), rng.randint(10, 99), True) for i in range(n_void)]
        while len(entries) < ENTRIES[level]:
            entries.append((rng.choice(kinds[1:]), rng.randint(10, 99), False))
        rng.shuffle(entries)  # document order
        op = rng.choice(("count", "sum"))
        counted = [e for e in entries if e[0] == asked and not e[2]]
        facts = ";".join(sorted(f"{c}={v}{'!' if void else ''}" for c, v, void in entries))
        key = f"L{level}:{facts}|{op}:{asked}"
        copied = "\n".join(entry_line(e) for e in counted)
        if op == "count":
            problem = Problem(key=key, prompt="", spec=Spec("math", {"answer": str(len(counted)), "tolerance": 0.0}),
                              reference=f"{copied}\nAnswer: {len(counted)}")
        else:
            first, *rest = (v for _, v, _ in counted)
            problem = math_problem(key, "", first, [("+", v) for v in rest], show_single_step=True)
            problem = dataclasses.replace(problem, reference=f"{copied}\n{problem.reference}")
        return problem, (entries, QUESTIONS[op].format(c=asked), level >= 3)

    def render(self, level: int, state: tuple, rng: random.Random) -> str:
        entries, question, note = state
        lines = [entry_line(e) for e in entries]
        head = [NOTE] if note else []
        reserved = sum(len(s) + 1 for s in lines) + len(question) + sum(len(h) + 2 for h in head)
        sentences = filler_sentences(level, reserved, rng)
        depths = sorted(rng.random() for _ in lines)  # planted in document order
        text = paragraphs(plant(sentences, lines, rng, depths), rng)
        return "\n\n".join([*head, *text, question])


DOMAINS.register(NAME)(AggregateDomain())
