"""A group of actors of one role that runs chunks of work and survives the loss of its actors.

    group = ActorGroup("verifier", make, size=2, max_retries=3, log=events.write)
    results = group.run("verify", [(tasks, part) for part in parts])   # in chunk order

Chunk k goes to actor k mod size. When an actor dies (its process killed, its node lost), every
chunk it held fails with a Ray actor error; the actor is replaced once (``make(slot)``, then
``prepare(actor)``, e.g. loading the current weights) and each of its chunks is submitted again
to the replacement. With no room left in the cluster for a replacement (its node is gone) and
other actors alive, the slot is dropped instead and its chunks go to those.

Elastic (``max_size`` > ``size``): ``grow()``, called between steps, adds actors while the cluster
has the resources for one more (``resources``: what one actor reserves), so a node that joins a
running job gets work from the next step on; each addition is logged with the caller's tag (the
step). A chunk's result is taken exactly once, from the one attempt that finished,
so nothing is lost or counted twice. Each retry is logged (``log``) and counted. An error raised
by the work itself (a bug, a stale-weights canary) is not retried: it reaches the caller.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from rlvr.faults import armed, fault_point


WAIT_WINDOW = 64
GROW_TIMEOUT_S = 60.0  # a new actor not scheduled by then is given back (the room was taken meanwhile)


class WorkerLost(RuntimeError):
    """A chunk failed on more actors than ``max_retries`` allows."""


class ActorGroup:
    def __init__(self, role: str, make: Callable[[int], object], size: int, *, max_retries: int,
                 log: Callable[[dict], None], prepare: Callable[[object], None] | None = None,
                 max_size: int = 0, resources: dict[str, float] | None = None) -> None:
        import ray

        self.ray, self.role, self.make = ray, role, make
        self.max_retries, self.log, self.prepare = max_retries, log, prepare
        self.max_size, self.resources = max(max_size, size), dict(resources or {})
        self.actors = [make(i) for i in range(size)]
        self.retries = self.replaced = self.added = self.dropped = 0
        self.next_slot = size  # a new actor's name never reuses a slot's
        self.in_flight: dict[int, object] = {}  # chunk -> the actor running it (tests kill one)

    @property
    def size(self) -> int:
        return len(self.actors)

    def room(self) -> bool:
        """Whether the cluster has the resources for one more actor of this group now."""
        free = self.ray.available_resources()
        return all(free.get(k, 0.0) >= v - 1e-9 for k, v in self.resources.items() if v > 0)

    def grow(self, **tag) -> int:
        """Add actors up to ``max_size`` while there is room (between steps); how many were added."""
        added = 0
        while self.size < self.max_size and self.room():
            t0 = time.perf_counter()
            actor = self.make(self.next_slot)
            try:  # scheduled within the timeout, or the room was taken meanwhile: give it back
                self.ray.get(actor.pid.remote(), timeout=GROW_TIMEOUT_S)
            except self.ray.exceptions.GetTimeoutError:
                self.ray.kill(actor)
                self.log({"event": "grow_timeout", "role": self.role, "slot": self.next_slot, **tag})
                break
            if self.prepare is not None:
                self.prepare(actor)
            self.actors.append(actor)
            self.added += 1
            added += 1
            self.log({"event": "added", "role": self.role, "slot": self.next_slot, "size": self.size,
                      "seconds": round(time.perf_counter() - t0, 3), **tag})
            self.next_slot += 1
        return added

    def pids(self) -> list[int]:
        return self.ray.get([a.pid.remote() for a in self.actors])

    def run(self, method: str, chunks: list[tuple]) -> list:
        """``actor.method(*chunk)`` for every chunk, spread over the actors; results in chunk order."""
        errors = self._errors()
        pending = dict(self._submit(method, k, chunks[k]) for k in range(len(chunks)))
        results: list = [None] * len(chunks)
        attempts = [0] * len(chunks)
        while pending:
            # the oldest WAIT_WINDOW calls only: a wait over every pending ref costs the driver
            # O(pending) per result; chunks finish roughly in submission order
            done, _ = self.ray.wait(list(itertools.islice(pending, WAIT_WINDOW)), num_returns=1)
            k, actor = pending.pop(done[0])
            try:
                results[k] = self.ray.get(done[0])
                self.in_flight.pop(k, None)
            except errors as e:
                attempts[k] += 1
                if attempts[k] > self.max_retries:
                    raise WorkerLost(f"{self.role} chunk {k} failed on {attempts[k]} actors; last: {e}") from e
                self._replace(actor, e)
                self.retries += 1
                self.log({"event": "retry", "role": self.role, "method": method, "chunk": k,
                          "attempt": attempts[k] + 1, "error": _first_line(e)})
                ref, held = self._submit(method, k, chunks[k])
                pending[ref] = held
            except self.ray.exceptions.RayTaskError as e:
                raise e.as_instanceof_cause() from None
        return results

    def broadcast(self, method: str, args: tuple) -> list:
        """``actor.method(*args)`` on every actor (a replacement gets it through ``prepare``)."""
        return self.run(method, [args] * self.size)

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []

    def _submit(self, method: str, k: int, chunk: tuple):
        """(the call's object ref, (chunk, the actor running it))."""
        actor = self.actors[k % self.size]
        self.in_flight[k] = actor
        pid = actor.pid.remote() if armed("actor_chunk") else None  # asked first: answered before the chunk
        ref = getattr(actor, method).remote(*chunk)
        fault_point("actor_chunk", victim=lambda: self.ray.get(pid))
        return ref, (k, actor)

    def _replace(self, lost, error: Exception) -> None:
        """Replace the lost actor if it is still in the group (its other chunks fail too: the first
        failure replaces it, the others find the replacement); with no room for a replacement and
        other actors alive, drop its slot."""
        if not any(a is lost for a in self.actors):
            return
        slot = next(i for i, a in enumerate(self.actors) if a is lost)
        try:
            self.ray.kill(lost)  # an unavailable actor that comes back must not hold resources
        except Exception:  # noqa: BLE001 - already gone
            pass
        if self.size > 1 and self.resources and not self._room_after_kill():
            self.actors.pop(slot)
            self.dropped += 1
            self.log({"event": "dropped", "role": self.role, "slot": slot, "size": self.size,
                      "error": _first_line(error)})
            return
        t0 = time.perf_counter()
        self.actors[slot] = self.make(slot)
        if self.prepare is not None:
            self.prepare(self.actors[slot])
        self.replaced += 1
        self.log({"event": "replaced", "role": self.role, "slot": slot, "error": _first_line(error),
                  "seconds": round(time.perf_counter() - t0, 3)})

    def _room_after_kill(self, wait_s: float = 2.0) -> bool:
        """Room for a replacement, waiting briefly for the killed actor's resources to come back."""
        end = time.monotonic() + wait_s
        while True:
            if self.room():
                return True
            if time.monotonic() > end:
                return False
            time.sleep(0.1)

    def _errors(self) -> tuple[type, ...]:
        ex = self.ray.exceptions
        return tuple(getattr(ex, n) for n in ("RayActorError", "ActorUnavailableError", "WorkerCrashedError",
                                              "ObjectLostError") if hasattr(ex, n))


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
