"""Fault injection at named points of a run, for the reliability harness (``benchmarks/faults.py``,
``tests/test_faults.py``): a child process started with ``RLVR_FAULT=POINT[@N]:ACTION`` meets the
fault the N-th time (default the first) it passes POINT.

Actions: ``kill`` (SIGKILL to this process: no cleanup, no ``finally``; at a point that names
another process, SIGKILL to that one) and ``enospc`` (an ``OSError`` "No space left on device"
raised where a write would have failed).

Points (``POINTS``): ``rollout`` and ``verify`` (the start of those GRPO phases), ``optimizer_step``
(before an optimizer step of the GRPO update, after its backward), ``checkpoint`` (inside a
checkpoint write, the weights written and the trainer state not), ``checkpoint_mid_file`` (the
trainer state half written, then the action), ``checkpoint_publish`` (a
checkpoint complete in its temporary directory, not yet renamed into place), ``metrics``
(before a metrics line is appended), ``metrics_line`` (half a metrics line written, then the
action); and two that name another process: ``sandbox_run`` (a sandbox worker, once its run has
started: the pool's N-th run) and ``actor_chunk`` (the Ray actor a chunk of work was just
submitted to).

Unset (every run but the harness's), ``fault_point`` returns at once.
"""

from __future__ import annotations

import errno
import os
import signal
from collections import Counter
from collections.abc import Callable

POINTS = ("rollout", "verify", "optimizer_step", "checkpoint", "checkpoint_mid_file", "checkpoint_publish", "metrics",
          "metrics_line", "sandbox_run", "actor_chunk")
ACTIONS = ("kill", "enospc")


def _parse(text: str) -> tuple[str, int, str] | None:
    if not text:
        return None
    where, _, action = text.partition(":")
    point, _, nth = where.partition("@")
    if point not in POINTS or action not in ACTIONS or (nth and not nth.isdigit()):
        raise ValueError(f"RLVR_FAULT={text!r}: expected POINT[@N]:ACTION with POINT in {', '.join(POINTS)} "
                         f"and ACTION in {', '.join(ACTIONS)}")
    return point, int(nth or 1), action


_FAULT = _parse(os.environ.get("RLVR_FAULT", ""))
_passed: Counter = Counter()


def armed(name: str) -> bool:
    """Whether a fault is configured at point ``name`` (to prepare what it needs, e.g. a pid)."""
    return _FAULT is not None and _FAULT[0] == name


def fault_point(name: str, before: Callable[[], None] | None = None,
                victim: Callable[[], int] | None = None) -> None:
    """Pass the point ``name``; the configured fault happens here when it is this point's turn
    (``before``: what to do first, e.g. write half a line; ``victim``: the pid ``kill`` aims at
    when it is not this process)."""
    if _FAULT is None or _FAULT[0] != name:
        return
    _passed[name] += 1
    if _passed[name] != _FAULT[1]:
        return
    if before is not None:
        before()
    if _FAULT[2] == "kill":
        os.kill(victim() if victim is not None else os.getpid(), signal.SIGKILL)
        return
    raise OSError(errno.ENOSPC, f"No space left on device (injected at {name})")
