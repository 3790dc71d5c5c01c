"""Shared machinery of the long-context domains ``long_ctx.needle``, ``long_ctx.keychain`` and
``long_ctx.aggregate``: generated filler prose, the length of each level, and a ``Domain`` that
draws the (cheap) facts of a problem before it writes the (long) document.

**Levels and length.** Every long domain has six levels whose prompt length doubles:

    L1 ~1k   L2 ~2k   L3 ~4k   L4 ~8k   L5 ~16k   L6 ~32k tokens

``TARGET_TOKENS`` is the mean prompt length aimed at and ``CHARS_PER_TOKEN`` the rate used to turn
it into characters of text. The rate was measured with the quickstart's kind of tokenizer: a
byte-level BPE of 512 tokens (digits single tokens) trained by
``rlvr.model.tokenizer.train_tokenizer`` on 40 corpus documents of each of the three domains, the
prompt chat-formatted (template tokens included). Measured means, 10 train tasks a level (seed 0):

    level  needle   keychain  aggregate     (an 8,192-token BPE on the same corpus: about half)
    L1      1,079    1,157     1,050
    L2      2,155    2,272     2,095
    L3      4,236    4,375     4,119
    L4      8,305    8,587     8,291
    L5     16,517   16,930    16,475
    L6     33,017   33,594    32,911

A keychain link line counts ``UUID_WEIGHT`` times its characters (its hex digits are single
tokens). ``token_lengths`` measures a level with any tokenizer.

**Filler.** The haystack is sentences of plain prose drawn from ``POOL``: ``POOL_SIZE`` sentences
made once at import from templates (a fixed ``random.Random``), never a fixed file. A document is
``rng.choices`` of the pool, grouped into paragraphs, with the domain's fact lines planted at
drawn sentence positions. Writing a 32k-token document takes a few milliseconds: conformance and
contamination suites generate hundreds of tasks per domain.

**Drawing.** ``LongDomain.plan`` draws a problem's facts, question, key and reference (prompt
left empty); ``LongDomain.render`` writes its document. ``draw`` renders only the candidate that
lands in the split asked for, so rejection sampling of the split costs no documents. ``sample``
(plan, then render from the same RNG) gives exactly the problem ``draw`` would.

**Pretraining.** ``corpus_levels`` is L1 and L2: a corpus document is eight problems, and an L6
problem is ~93k characters.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from rlvr.tasks.base import DOMAINS, MAX_DRAWS, Domain, Problem, seeded_rng

LEVELS = (1, 2, 3, 4, 5, 6)
CORPUS_LEVELS = (1, 2)
TARGET_TOKENS = {1: 1_000, 2: 2_000, 3: 4_000, 4: 8_000, 5: 16_000, 6: 32_000}
CHARS_PER_TOKEN = 2.9  # measured: see the module docstring
POOL_SIZE = 600
PARAGRAPH = (4, 8)  # sentences per paragraph

_SUBJECTS = ("The committee", "The harbour office", "A local historian", "The survey team", "The village council",
             "Our correspondent", "The museum curator", "A visiting engineer", "The school board", "The gardeners",
             "The night watchman", "The orchestra", "The weather station", "A retired sailor", "The librarians",
             "The bakery on the corner", "The ferry crew", "The mapmakers", "The beekeepers", "The mountain guides")
_VERBS = ("reviewed", "discussed", "described", "questioned", "praised", "repaired", "catalogued", "photographed",
          "measured", "recorded", "visited", "painted", "restored", "studied", "inspected", "mentioned")
_OBJECTS = ("the old stone bridge", "the spring festival", "the northern trail", "a collection of letters",
            "the lighthouse lamp", "the river crossing", "the market square", "an abandoned mill", "the clock tower",
            "the winter schedule", "a box of photographs", "the coastal path", "the orchard walls",
            "the railway timetable", "a faded tapestry", "the town archive", "the copper roof", "the reading room")
_TIMES = ("last spring", "during the long winter", "after the storm", "before the harvest", "on a quiet morning",
          "late in the evening", "at the start of the season", "over several weeks", "in the autumn",
          "once the roads reopened", "while the tide was out", "early that year")
_ENDINGS = ("and found it in better shape than expected.", "and wrote a short note about it.",
            "though nobody agreed on what it meant.", "and the results were posted by the door.",
            "which surprised most of the neighbours.", "and promised to return the following year.",
            "but the work was left unfinished.", "and shared the story with anyone who asked.",
            "while the children watched from the fence.", "and the discussion went on until dark.")
_REMARKS = ("Nobody remembers exactly when the tradition began.", "The path was muddy but the view was worth it.",
            "Several visitors asked for directions to the harbour.", "The bell rang twice and then fell silent.",
            "It was, by all accounts, an ordinary day.", "The smell of fresh bread drifted down the lane.",
            "A gull settled on the railing and watched the boats.", "The wind turned cold by the afternoon.",
            "Most of the shops closed early that week.", "The old maps disagree about the shape of the bay.")


def _sentence(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return rng.choice(_REMARKS)
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TIMES)} {rng.choice(_ENDINGS)}"


def _pool() -> tuple[str, ...]:
    rng = random.Random("rlvr.long_text.pool")
    pool: list[str] = []
    seen: set[str] = set()
    while len(pool) < POOL_SIZE:
        s = _sentence(rng)
        if s not in seen or len(seen) >= POOL_SIZE:
            seen.add(s)
            pool.append(s)
    return tuple(pool)


POOL = _pool()
MEAN_SENTENCE = sum(len(s) + 1 for s in POOL) / len(POOL)


def filler_sentences(level: int, reserved_chars: int, rng: random.Random) -> list[str]:
    """Filler for a prompt of ``level``: enough sentences that, with ``reserved_chars`` of facts
    and question, the prompt is about ``TARGET_TOKENS[level]`` tokens long."""
    budget = TARGET_TOKENS[level] * CHARS_PER_TOKEN - reserved_chars
    return rng.choices(POOL, k=max(8, round(budget / MEAN_SENTENCE)))


def plant(sentences: list[str], facts: list[str], rng: random.Random,
          depths: list[float] | None = None) -> list[str]:
    """``sentences`` with each of ``facts`` inserted at a sentence position: at ``depths[i]``
    (0 = start, 1 = end) where given, else at a random position."""
    n = len(sentences)
    where = [round(d * n) if depths else rng.randint(0, n) for d in (depths or [0.0] * len(facts))]
    out = list(sentences)
    for pos, fact in sorted(zip(where, range(len(facts))), key=lambda p: (p[0], p[1]), reverse=True):
        out.insert(pos, facts[fact])
    return out


def paragraphs(sentences: list[str], rng: random.Random) -> list[str]:
    """``sentences`` joined into paragraphs of ``PARAGRAPH`` sentences."""
    out, i = [], 0
    while i < len(sentences):
        k = rng.randint(*PARAGRAPH)
        out.append(" ".join(sentences[i:i + k]))
        i += k
    return out


class LongDomain(Domain):
    """A domain whose ``plan`` draws the facts and ``render`` writes the long document."""

    version = "v1"
    levels = LEVELS
    corpus_levels = CORPUS_LEVELS  # an L6 prompt is ~130k characters: too long for a pretraining corpus

    def plan(self, level: int, rng: random.Random) -> tuple[Problem, Any]:
        """``(problem with an empty prompt, what render needs)``."""
        raise NotImplementedError

    def render(self, level: int, state: Any, rng: random.Random) -> str:
        raise NotImplementedError

    def sample(self, level: int, rng: random.Random) -> Problem:
        problem, state = self.plan(level, rng)
        return dataclasses.replace(problem, prompt=self.render(level, state, rng))

    def draw(self, split: str, level: int, *rng_parts: object) -> Problem:
        for attempt in range(MAX_DRAWS):
            rng = seeded_rng(*rng_parts, attempt)
            problem, state = self.plan(level, rng)
            if self.in_split(problem, split):
                return dataclasses.replace(problem, prompt=self.render(level, state, rng))
        raise RuntimeError(f"{self.name}: no {split} problem at level {level} in {MAX_DRAWS} draws")


def token_lengths(name: str, tokenizer, level: int, n: int = 20, seed: int = 0) -> list[tuple[int, int]]:
    """``(prompt, reference)`` token lengths of ``n`` train tasks of ``level`` of domain ``name``:
    the prompt chat-formatted up to the assistant header, the reference with its end token."""
    from rlvr.model.tokenizer import (  # not needed to generate tasks
        encode_chat_prompt,
        encode_completion,
    )

    domain = DOMAINS.get(name)
    tasks = [domain.generate("train", level, i, seed) for i in range(n)]
    return [(len(encode_chat_prompt(tokenizer, list(t.prompt))), len(encode_completion(tokenizer, t.reference)))
            for t in tasks]
