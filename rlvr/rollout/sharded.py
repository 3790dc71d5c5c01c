"""Rollouts split over data-parallel ranks, with a batch that does not depend on how many there are.

``SyncRollout``'s two phase functions, sharded (``distributed.rollout_chunk`` > 0):

    generate(tasks, version)   the tasks cut into fixed chunks of ``chunk`` whole groups; one seed
                               per chunk drawn from the run's generator (every rank draws them all,
                               so the generator advances the same everywhere); rank r generates the
                               chunks k with k % world == r, each from a generator of its own seed
    verify(tasks, episodes)    this rank's episodes verified here (its own sandbox), then every
                               rank's scored samples gathered and put back in chunk order

The chunks and their seeds depend on the tasks and the generator only, so 1, 2 or 8 ranks give
the same batch, and a checkpoint resumes at any world size. Groups never straddle chunks: their
advantages are computed from whole groups on every rank after the gather.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from rlvr.rollout.episodes import Episode
from rlvr.types import Scored, Task


def chunk_seeds(generator: torch.Generator, n: int) -> list[int]:
    """``n`` seeds drawn from ``generator``, one per rollout chunk (here and on Ray actors)."""
    return torch.randint(0, 2**62, (n,), generator=generator).tolist()


class ShardedPhases:
    """``generate(tasks, version, generator) -> episodes`` runs one chunk (group ids from 0 within
    it); ``verify(tasks, episodes) -> scored`` is the run's verifier over any subset of samples
    whose group ids index ``tasks``; ``gather(items) -> [items of rank 0, of rank 1, ...]`` is the
    process group's (``rlvr.train.distributed.gather``)."""

    def __init__(self, *, generate: Callable, verify: Callable, generator: torch.Generator, chunk: int,
                 rank: int, world: int, gather: Callable[[list], list[list]]) -> None:
        self.generate_fn, self.verify_fn, self.gather = generate, verify, gather
        self.generator, self.chunk, self.rank, self.world = generator, chunk, rank, world

    def generate(self, tasks: list[Task], version: int) -> list[Episode]:
        starts = range(0, len(tasks), self.chunk)
        seeds = chunk_seeds(self.generator, len(starts))
        episodes: list[Episode] = []
        for k in range(self.rank, len(starts), self.world):
            part = tasks[starts[k]: starts[k] + self.chunk]
            chunk_episodes = self.generate_fn(part, version, torch.Generator().manual_seed(seeds[k]))
            episodes += [shift_group(ep, starts[k]) for ep in chunk_episodes]
        return episodes

    def verify(self, tasks: list[Task], episodes: list[Episode]) -> list[Scored]:
        every = [s for mine in self.gather(self.verify_fn(tasks, episodes)) for s in mine]
        return sorted(every, key=lambda s: s.trajectory.group_id // self.chunk)  # stable: chunk order, samples in order


def shift_group(ep: Episode, offset: int) -> Episode:
    """``ep`` with its group id moved ``offset`` groups on (a chunk's groups in the whole batch)."""
    if not offset:
        return ep
    return Episode(dataclasses.replace(ep.trajectory, group_id=ep.trajectory.group_id + offset), ep.env)
