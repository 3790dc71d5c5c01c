"""``long_ctx.retrieval``: find facts in a generated document of records, then combine them.

The prompt is a document of short records, one a line (``Locker 17 holds 48``, ``Box 71: 35``,
``Bin 18 has 62 coins``), then a question about some of them. Every record is a container (a
kind and a two-digit id) and how many coins it holds (a two-digit value, all values of a document
distinct). **The level sets the length** of the document and the operation:

    L1   6 records   retrieve one value              "How many coins are in locker 17?"
    L2  12 records   retrieve one value
    L3  24 records   two values: sum or difference   "How many more coins are in locker 17 than in box 42?"
    L4  40 records   two or three values: a + b, a - b, a + b + c or a + b - c

Each target gets up to three planted look-alikes, drawn from: the same id under the document's
other kinds (``Box 17`` for ``locker 17``), the same kind with a neighbouring id (``Locker 18``)
and, where it is another valid id, the digits swapped (``Locker 71``); the rest are random
records of the document's two (L1, L2) or three (L3, L4) kinds. L4 has 40 records, not 48: 48
would not fit 480 tokens. The phrasing of a record (one of ``RECORD_FORMS``), the coin word
and the question's wording are decoration.

The reference copies each retrieved record, then the arithmetic as ``math.word`` writes it, then
``Answer: N``::

    Locker 17: 48
    Box 42: 31
    48 + 31 = 79
    Answer: 79

and the ``math`` verifier checks it exactly (``Spec("math", {"answer": "79", "tolerance": 0.0})``,
built by ``math_arith.math_problem``): one final answer, so an answer listing several numbers or
the arithmetic unevaluated fails. The arithmetic steps are ``math.arith`` facts (``reveals``), so
a train problem never states the result of an eval arithmetic problem.

The key is the records sorted (``box42=31;locker17=48;...``), then the operation and its targets
in order (``|+:locker17,box42``): the facts and the question, not their order or wording, so a
reshuffled or reworded document is the same problem and sits in the same split.

Length in tokens (``token_lengths``): the chat-formatted prompt (``encode_chat_prompt``, the
template's tokens included) and the reference with its end token (``encode_completion``), over
200 train tasks a level (seed 0), mean / max. The tokenizer is trained as the quickstart trains
its own (``train_tokenizer``, 384-token byte-level BPE, digits single tokens) on 1000 corpus
documents of this domain; the last column trains it on those plus the quickstart's corpus (4000
documents each of ``math.arith`` and ``math.word``), as a pretraining run with this domain added
would:

    level  records  prompt     reference  prompt + reference   + math corpus
    L1       6       73 / 76   15 / 15     88 / 91              90 / 93
    L2      12      129 / 133  15 / 15    144 / 148            146 / 151
    L3      24      248 / 254  35 / 37    283 / 290            289 / 297
    L4      40      400 / 411  47 / 59    447 / 470            454 / 480

So an L4 task fits a model with 512 positions. ``configs/curriculum.yaml``'s tokenizer (512
tokens, trained on 2000 documents of each of its six pretraining domains) gives 90 / 93,
146 / 151, 287 / 296 and 452 / 477 (prompt + reference). A record costs about 9 tokens (``Box``,
a space, two digits, ``holds``, a space, two digits, the newline): every number is preceded by a
space token. The tokenizer must have seen this domain: the quickstart's own, trained on the math
corpus alone, spells the container words byte by byte and gives 135 / 160, 225 / 268, 441 / 495
and 701 / 842 tokens for L1-L4.

Not here: answer checking (the ``math`` verifier).
"""

from __future__ import annotations

import dataclasses
import random

from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.tasks.math_arith import math_problem

NAME = "long_ctx.retrieval"
KINDS = ("Locker", "Box", "Bin", "Shelf", "Crate", "Drawer", "Room", "Case")
COINS = ("coins", "keys", "pens", "cards", "stamps", "beads")
RECORDS = {1: 6, 2: 12, 3: 24, 4: 40}  # records in a document, per level
IDS = (10, 99)
VALUES = (10, 99)
# a record, value after the container; {c} is the document's coin word
RECORD_FORMS = ("{K} {k} holds {v}", "{K} {k}: {v}", "{K} {k} has {v} {c}")
# (operation, number of targets) -> question wordings; targets read "{K} {k}" in lower case
QUESTIONS = {
    ("=", 1): ("How many {c} are in {0}?", "How many {c} does {0} hold?"),
    ("+", 2): ("How many {c} are in {0} and {1} together?", "How many {c} do {0} and {1} hold in all?"),
    ("-", 2): ("How many more {c} are in {0} than in {1}?",),
    ("++", 3): ("How many {c} are in {0}, {1} and {2} together?",),
    ("+-", 3): ("How many more {c} are in {0} and {1} together than in {2}?",),
}
OPERATIONS = {1: ("=",), 2: ("=",), 3: ("+", "-"), 4: ("+", "-", "++", "+-")}

Record = tuple[str, int]  # (kind, id)


def near_ids(k: int) -> list[int]:
    """Ids that look like ``k``: its neighbours and, when it is another valid id, its digits swapped."""
    swapped = int(str(k)[::-1])
    near = [k - 1, k + 1] + ([swapped] if swapped != k and swapped >= IDS[0] else [])
    return [x for x in near if IDS[0] <= x <= IDS[1]]


def records_with_distractors(n: int, n_targets: int, rng: random.Random) -> tuple[list[Record], list[Record]]:
    """``(records, targets)``: ``n`` distinct records of two or three kinds (in document order),
    ``n_targets`` of them the targets, each with its look-alikes planted where room allows."""
    kinds = rng.sample(KINDS, 2 if n < 24 else 3)
    targets: list[Record] = []
    while len(targets) < n_targets:
        target = (rng.choice(kinds), rng.randint(*IDS))
        if target not in targets:
            targets.append(target)
    chosen = list(targets)
    for kind, k in targets:
        look_alikes = [(other, k) for other in kinds if other != kind] + [(kind, x) for x in near_ids(k)]
        rng.shuffle(look_alikes)
        for record in look_alikes[:3]:
            if record not in chosen and len(chosen) < n:
                chosen.append(record)
    while len(chosen) < n:
        record = (rng.choice(kinds), rng.randint(*IDS))
        if record not in chosen:
            chosen.append(record)
    rng.shuffle(chosen)
    return chosen, targets


def values_for(records: list[Record], targets: list[Record], op: str, rng: random.Random) -> dict[Record, int]:
    """Distinct values for ``records``, drawn again until no step of ``op`` on the targets goes negative."""
    while True:
        values = dict(zip(records, rng.sample(range(VALUES[0], VALUES[1] + 1), len(records))))
        t = [values[r] for r in targets]
        if op == "-" and t[0] < t[1] or op == "+-" and t[0] + t[1] < t[2]:
            continue
        return values


def key_of(values: dict[Record, int], targets: list[Record], op: str) -> str:
    """The records sorted, then the operation and its targets in order (see the module docstring)."""
    facts = ";".join(sorted(f"{kind.lower()}{k}={v}" for (kind, k), v in values.items()))
    return f"{facts}|{op}:{','.join(f'{kind.lower()}{k}' for kind, k in targets)}"


class RetrievalDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)

    def sample(self, level: int, rng: random.Random) -> Problem:
        op = rng.choice(OPERATIONS[level])
        n_targets = 1 if op == "=" else len(op) + 1
        records, targets = records_with_distractors(RECORDS[level], n_targets, rng)
        values = values_for(records, targets, op, rng)
        coin = rng.choice(COINS)
        lines = [rng.choice(RECORD_FORMS).format(K=kind, k=k, v=values[kind, k], c=coin) for kind, k in records]
        names = [f"{kind.lower()} {k}" for kind, k in targets]
        question = rng.choice(QUESTIONS[op, n_targets]).format(*names, c=coin)
        first, *rest = (values[r] for r in targets)
        ops = list(zip(op, rest))  # empty for "=": the answer is the retrieved value itself
        problem = math_problem(key_of(values, targets, op), "\n".join([*lines, question]), first, ops,
                               show_single_step=True)
        retrieved = "\n".join(f"{kind} {k}: {values[kind, k]}" for kind, k in targets)
        return dataclasses.replace(problem, reference=f"{retrieved}\n{problem.reference}")


def token_lengths(tokenizer, level: int, n: int = 200, seed: int = 0) -> list[tuple[int, int]]:
    """``(prompt, reference)`` token lengths of ``n`` train tasks of ``level``, as a model sees them:
    the prompt chat-formatted up to the assistant header, the reference with its end token."""
    from rlvr.model.tokenizer import encode_chat_prompt, encode_completion  # not needed to generate tasks

    domain = DOMAINS.get(NAME)
    tasks = [domain.generate("train", level, i, seed) for i in range(n)]
    return [(len(encode_chat_prompt(tokenizer, list(t.prompt))), len(encode_completion(tokenizer, t.reference)))
            for t in tasks]


DOMAINS.register(NAME)(RetrievalDomain())
