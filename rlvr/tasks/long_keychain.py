"""``long_ctx.keychain``: follow a chain of UUID-like keys through distractor documents.

KeyChain / LoongRL-like multi-hop retrieval. The prompt is a collection of short documents of
generated prose (``Document 1``, ``Document 2``, ...; ``rlvr.tasks.long_text``), with link
sentences planted at random places, in no particular order:

    Key 3f2a9c1e-47b2-4d1a-9e3f-0b5c7d2e8a14 points to key 9b1e...
    Key 9b1e... holds the value 58213.

The question gives the first key of one chain; following ``points to`` hop by hop reaches the key
that ``holds`` a value, the answer. Distractor chains have the same shape and their own start keys
and values; from L3 on one distractor chain merges into the target chain (a foreign key points to
one of its keys: it changes nothing for the start key asked about, but a model that searches
backwards from the values is misled). Every key is distinct and every key points to at most one.

    level  prompt tokens  hops  distractor chains
    L1     ~1k            2     1
    L2     ~2k            3     2
    L3     ~4k            4     2
    L4     ~8k            5     3
    L5     ~16k           6     4
    L6     ~32k           8     5

A chain of ``h`` hops has ``h`` ``points to`` links and one ``holds`` line. Values are five digits,
distinct within a document. The reference copies the target chain's lines in order, then
``Answer: N``; the ``math`` verifier checks it exactly, so a distractor chain's value, a value
listed with others or the right value only inside the copied lines fail.

The key is the level and a hash of the chains (each as ``a>b>...>z=N``, sorted, the merge link
included) and the start key asked about: the facts, not the filler, the documents or the order.
"""

from __future__ import annotations

import hashlib
import itertools
import random

from rlvr.tasks.base import DOMAINS, Problem
from rlvr.tasks.long_text import LongDomain, filler_sentences, paragraphs, plant
from rlvr.types import Spec

NAME = "long_ctx.keychain"
HOPS = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 8}
DISTRACTOR_CHAINS = {1: 1, 2: 2, 3: 2, 4: 3, 5: 4, 6: 5}
UUID_WEIGHT = 2  # characters of prose a character of a link line takes the place of
DOCUMENTS = {1: 3, 2: 4, 3: 6, 4: 10, 5: 16, 6: 24}
LINK = "Key {a} points to key {b}."
HOLDS = "Key {a} holds the value {v}."
QUESTION = ("Start at key {k}. Follow the key it points to, then the key that one points to, and so on, until "
            "you reach a key that holds a value. What is that value?")


def uuid_like(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def chain_lines(chain: list[str], value: int) -> list[str]:
    """The lines of one chain in order: each link, then the value its last key holds."""
    return [LINK.format(a=a, b=b) for a, b in itertools.pairwise(chain)] + [HOLDS.format(a=chain[-1], v=value)]


class KeychainDomain(LongDomain):
    name = NAME

    def plan(self, level: int, rng: random.Random) -> tuple[Problem, tuple]:
        hops = HOPS[level]
        n_chains = 1 + DISTRACTOR_CHAINS[level]
        chains = [[uuid_like(rng) for _ in range(hops + 1)] for _ in range(n_chains)]
        values = rng.sample(range(10_000, 100_000), n_chains)
        lines = [line for chain, v in zip(chains, values) for line in chain_lines(chain, v)]
        canon = [">".join(chain) + f"={v}" for chain, v in zip(chains, values)]
        if level >= 3:  # a foreign key points into the target chain past its start
            foreign, into = uuid_like(rng), chains[0][rng.randint(1, hops)]
            lines.append(LINK.format(a=foreign, b=into))
            canon.append(f"{foreign}>{into}")
        start, answer = chains[0][0], values[0]
        digest = hashlib.sha256(f"{';'.join(sorted(canon))}|{start}".encode()).hexdigest()[:24]
        reference = "\n".join([*chain_lines(chains[0], answer), f"Answer: {answer}"])
        problem = Problem(key=f"L{level}:{digest}", prompt="", spec=Spec("math", {"answer": str(answer), "tolerance": 0.0}),
                          reference=reference)
        return problem, (lines, start)

    def render(self, level: int, state: tuple, rng: random.Random) -> str:
        lines, start = state
        lines = list(lines)
        rng.shuffle(lines)
        question = QUESTION.format(k=start)
        n_docs = DOCUMENTS[level]
        heads = [f"Document {i + 1}" for i in range(n_docs)]
        # a UUID costs about twice the tokens per character of prose (digits are single tokens)
        reserved = UUID_WEIGHT * sum(len(s) + 1 for s in lines) + len(question) + sum(len(h) + 2 for h in heads)
        sentences = plant(filler_sentences(level, reserved, rng), lines, rng)
        per_doc = -(-len(sentences) // n_docs)
        parts = []
        for i, head in enumerate(heads):
            body = paragraphs(sentences[i * per_doc:(i + 1) * per_doc], rng)
            parts.append("\n\n".join([head, *body]))
        return "\n\n".join([*parts, question])


DOMAINS.register(NAME)(KeychainDomain())
