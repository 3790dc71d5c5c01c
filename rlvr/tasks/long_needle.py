"""``long_ctx.needle``: RULER-style needle in a haystack of generated prose.

The prompt is filler prose (``rlvr.tasks.long_text``: sentences drawn from a generated pool) with
needles planted in it, one a sentence: ``The special magic number for quiet-harbor is 4829137.``
Then one question: ``What is the special magic number for quiet-harbor mentioned in the text
above?`` The target needle sits at a depth drawn per task (uniform in [0, 1] of the document);
the distractor needles, at random depths, are other keys with their own numbers, and from L2 on
some are look-alikes of the target key (its adjective with another noun, or its noun with another
adjective). Numbers are seven digits, all distinct within a document.

    level  prompt tokens  needles (target + distractors)
    L1     ~1k            1 + 2
    L2     ~2k            1 + 3
    L3     ~4k            1 + 4
    L4     ~8k            1 + 6
    L5     ~16k           1 + 8
    L6     ~32k           1 + 10

The reference copies the target needle, then ``Answer: N``; the ``math`` verifier checks it
exactly (``{"answer": "4829137", "tolerance": 0.0}``), so a distractor's number, several numbers
or the number only in the reasoning fail.

The key is the level, the needles sorted (``key=number``) and the target: the facts and the
question, not the filler, the depths or the order.
"""

from __future__ import annotations

import random

from rlvr.tasks.base import DOMAINS, Problem
from rlvr.tasks.long_text import LongDomain, filler_sentences, paragraphs, plant
from rlvr.types import Spec

NAME = "long_ctx.needle"
DISTRACTORS = {1: 2, 2: 3, 3: 4, 4: 6, 5: 8, 6: 10}
LOOK_ALIKES = {1: 0, 2: 1, 3: 2, 4: 2, 5: 3, 6: 4}  # of the distractors, how many resemble the target key
ADJECTIVES = ("quiet", "brave", "amber", "silver", "hollow", "gentle", "crimson", "distant", "frozen", "golden",
              "humble", "ivory", "jagged", "lively", "misty", "narrow", "olive", "proud", "rapid", "sandy",
              "tidy", "velvet", "wild", "young")
NOUNS = ("harbor", "falcon", "meadow", "lantern", "river", "canyon", "orchard", "compass", "glacier", "willow",
         "beacon", "thistle", "quarry", "pebble", "summit", "harvest", "marble", "raven", "saddle", "timber",
         "violet", "whistle", "anchor", "cobalt")
NEEDLE = "The special magic number for {k} is {v}."
QUESTION = "What is the special magic number for {k} mentioned in the text above?"


def needle_keys(n_distractors: int, n_look_alikes: int, rng: random.Random) -> list[str]:
    """The target key first, then ``n_distractors`` other keys, the first ``n_look_alikes`` of
    them sharing a word with the target."""
    adj, noun = rng.choice(ADJECTIVES), rng.choice(NOUNS)
    keys = [f"{adj}-{noun}"]
    while len(keys) < 1 + n_look_alikes:
        k = f"{adj}-{rng.choice(NOUNS)}" if rng.random() < 0.5 else f"{rng.choice(ADJECTIVES)}-{noun}"
        if k not in keys:
            keys.append(k)
    while len(keys) < 1 + n_distractors:
        k = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        if k not in keys:
            keys.append(k)
    return keys


class NeedleDomain(LongDomain):
    name = NAME

    def plan(self, level: int, rng: random.Random) -> tuple[Problem, tuple]:
        keys = needle_keys(DISTRACTORS[level], LOOK_ALIKES[level], rng)
        values = rng.sample(range(1_000_000, 10_000_000), len(keys))
        target, value = keys[0], values[0]
        facts = ";".join(sorted(f"{k}={v}" for k, v in zip(keys, values)))
        needle = NEEDLE.format(k=target, v=value)
        problem = Problem(key=f"L{level}:{facts}|{target}", prompt="",
                          spec=Spec("math", {"answer": str(value), "tolerance": 0.0}),
                          reference=f"{needle}\nAnswer: {value}")
        return problem, (keys, values)

    def render(self, level: int, state: tuple, rng: random.Random) -> str:
        keys, values = state
        needles = [NEEDLE.format(k=k, v=v) for k, v in zip(keys, values)]
        question = QUESTION.format(k=keys[0])
        depths = [rng.random() for _ in needles]
        sentences = filler_sentences(level, sum(len(s) + 1 for s in needles) + len(question), rng)
        text = paragraphs(plant(sentences, needles, rng, depths), rng)
        return "\n\n".join([*text, question])


DOMAINS.register(NAME)(NeedleDomain())
