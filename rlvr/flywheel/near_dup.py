"""Near-duplicate prompts, found with MinHash LSH (datasketch) and confirmed exactly.

Two texts are near-duplicates when they hold the same numbers in the same order and the Jaccard
similarity of their character 5-gram sets (after ``rlvr.tasks.validate.normalise_text``, spaces
removed) is at least ``threshold``. The numbers rule keeps ``What is 12 + 35?`` and ``What is 12
+ 36?`` apart (two problems, one character apart) while ``what's 12+35??`` and ``What is 12 + 35?``
meet: in a verifiable task the numbers are the problem. LSH proposes candidates in about
constant time per query; each is confirmed on the exact sets, so a reported pair always meets
the rule (LSH may miss a pair just above the threshold, rarely).
"""

from __future__ import annotations

import re

from datasketch import MinHash, MinHashLSH

from rlvr.tasks.validate import normalise_text

SHINGLE = 5
PERMUTATIONS = 128
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def shingles(text: str) -> frozenset[str]:
    s = "".join(normalise_text(text).split())
    return frozenset([s] if len(s) <= SHINGLE else (s[i:i + SHINGLE] for i in range(len(s) - SHINGLE + 1)))


def numbers(text: str) -> tuple[str, ...]:
    return tuple(_NUMBER.findall(normalise_text(text)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class NearDuplicateIndex:
    """Texts added under keys; ``find(text)`` is the key of a near-duplicate already added, or None."""

    def __init__(self, threshold: float = 0.8) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"near-duplicate threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self._lsh = MinHashLSH(threshold=threshold, num_perm=PERMUTATIONS)
        self._items: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}

    @staticmethod
    def _minhash(grams: frozenset[str]) -> MinHash:
        m = MinHash(num_perm=PERMUTATIONS, seed=1)
        m.update_batch([g.encode() for g in sorted(grams)])
        return m

    def find(self, text: str) -> str | None:
        grams, nums = shingles(text), numbers(text)
        best, best_sim = None, 0.0
        for key in self._lsh.query(self._minhash(grams)):
            other, other_nums = self._items[key]
            sim = jaccard(grams, other)
            if other_nums == nums and sim >= self.threshold and sim > best_sim:
                best, best_sim = key, sim
        return best

    def add(self, key: str, text: str) -> None:
        grams = shingles(text)
        self._items[key] = (grams, numbers(text))
        self._lsh.insert(key, self._minhash(grams))
