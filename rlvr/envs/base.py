"""Environments: the protocol every episode runs through, the registry, budgets.

An environment turns a task into an episode::

    messages = env.reset(task)        # the prompt; a workspace is restored from its snapshot
    step = env.step(action)           # the assistant's turn (text) -> observation, done, finish
    verdict = env.verify()            # the episode's verified outcome (hidden tests, answer, ...)

Single-turn tasks are the one-step case (``SingleTurnEnv``: the first action ends the episode and
is judged by the task's verifier). Multi-turn tool environments subclass ``ToolEnv``.
Environments are registered by name in ``ENVS``; a task names its environment in
``task.env`` (default ``single_turn``). An instance is reused across episodes
(``reset`` again), which is what makes a reset cheap.

Budgets: turns and wall time (seconds spent in ``step``) are checked by the environment; token budgets by the rollout
collector, which knows the token ids, and reports them with ``env.cut(reason)``. An episode that
ends on a budget fails (``Verdict.reason == "budget"``) whatever state it left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from rlvr.config import check_range
from rlvr import oplog
from rlvr.envs.grants import Grant, GrantRefused, check_paths
from rlvr.envs.tools import Tool, ToolCallError, cut_result, parse_tool_call, run_tool, tool_message
from rlvr.tool_calls import CALL_OPEN
from rlvr.registry import Registry
from rlvr.types import SINGLE_TURN, Message, Task, Verdict

# Why an episode ended. The first group ends it normally; the rest are budgets or truncation.
NATURAL_FINISHES = ("submit", "answer")
BUDGET_FINISHES = ("turns", "tokens", "context", "wall", "length")


@dataclass
class EnvConfig:
    """Budgets of a multi-turn episode (single-turn tasks use only ``turn_tokens``)."""

    max_turns: int = 6
    """Assistant turns per episode; the episode ends (and fails) when they run out."""
    turn_tokens: int = 64
    """Tokens the policy may generate in one turn; a turn that hits it ends the episode."""
    max_tokens: int = 320
    """Policy tokens per episode, all turns together."""
    max_context: int = 1024
    """Tokens in the whole episode (prompt, turns and observations), capped further by the
    model's own context length."""
    wall_s: float = 60.0
    """Wall-clock seconds the episode may spend in the environment (tool calls, test runs), all
    turns together. Generation time is not counted: in a batched rollout it is shared by every
    episode and depends on machine load; the token budgets bound it."""

    def __post_init__(self) -> None:
        check_range("env.max_turns", self.max_turns, 1)
        check_range("env.turn_tokens", self.turn_tokens, 1)
        check_range("env.max_tokens", self.max_tokens, 1)
        check_range("env.max_context", self.max_context, 8)
        check_range("env.wall_s", self.wall_s, 0.0)


@dataclass(frozen=True)
class Step:
    """What one assistant turn led to: messages to append (empty when done), whether the episode
    is over, and why (one of ``NATURAL_FINISHES`` or ``BUDGET_FINISHES``)."""

    observation: tuple[Message, ...] = ()
    done: bool = False
    finish: str = ""


class Environment:
    """The protocol. Subclasses set ``name`` and implement ``reset``, ``step`` and ``_verify``."""

    name: ClassVar[str] = ""

    def __init__(self, cfg: EnvConfig | None = None, *, sandbox: Any = None) -> None:
        self.cfg = cfg or EnvConfig()
        self.sandbox = sandbox
        self.task: Task | None = None
        self.turns = 0
        self.finish = ""
        self.env_seconds = 0.0  # wall time spent in step() this episode (the wall budget)

    def reset(self, task: Task) -> list[Message]:
        """Start an episode of ``task``; returns the prompt messages."""
        self.task, self.turns, self.finish, self.env_seconds = task, 0, "", 0.0
        return list(task.prompt)

    def tools(self) -> list[Tool]:
        """The tools offered this episode (rendered by the chat template); none by default."""
        return []

    def step(self, action: str) -> Step:
        raise NotImplementedError

    def cut(self, reason: str) -> None:
        """End the episode from outside (a token budget or a truncated turn)."""
        if reason not in BUDGET_FINISHES:
            raise ValueError(f"cut reason must be one of {BUDGET_FINISHES}, got {reason!r}")
        self.finish = reason

    def tampered(self) -> list[str]:
        """What the episode changed that it must not have (e.g. test files); none by default."""
        return []

    def verify(self) -> Verdict:
        """The episode's verdict: ``tampered`` if it touched what it must not (checked first,
        whatever else happened), ``budget`` if it did not finish, else the environment's own."""
        if self.task is None:
            raise RuntimeError("verify() before reset()")
        tampered = self.tampered()
        if tampered:
            return Verdict(False, 0.0, "tampered", {"tampered": tampered, "finish": self.finish or "unfinished",
                                                    "turns": self.turns})
        if self.finish not in NATURAL_FINISHES:
            return Verdict(False, 0.0, "budget", {"finish": self.finish or "unfinished", "turns": self.turns})
        verdict = self._verify()
        return Verdict(verdict.passed, verdict.score, verdict.reason,
                       {**verdict.details, "finish": self.finish, "turns": self.turns})

    def _verify(self) -> Verdict:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the environment holds (workspaces). Idempotent."""

    def _end(self, finish: str, observation: tuple[Message, ...] = ()) -> Step:
        self.finish = finish
        return Step(observation, True, finish)


ENVS: Registry[type[Environment]] = Registry("environment")


@ENVS.register(SINGLE_TURN)
class SingleTurnEnv(Environment):
    """One prompt, one answer, judged by the task's verifier: the one-step episode."""

    name = SINGLE_TURN

    def step(self, action: str) -> Step:
        self.turns += 1
        self.action = action
        return self._end("answer")

    def _verify(self) -> Verdict:
        from rlvr.verifiers import get_verifier

        return get_verifier(self.task).check(self.task, self.action)


class ToolEnv(Environment):
    """A multi-turn environment whose actions are tool calls.

    Each turn must carry exactly one ``<tool_call>``. A malformed call, an unknown tool or bad
    arguments give an ``error: ...`` tool message and the episode goes on (the turn counts). A
    turn without any call goes to ``on_text`` (tool.use reads a final answer there; the default
    is an error observation). A tool ends the episode by calling ``self.finish_with(reason)``.

    ``grants`` declares, per tool the environment may offer, what it may touch
    (``rlvr.envs.grants``; None: a control tool that runs no code). A call outside its grant is
    refused (an ``error: TOOL: refused: ...`` observation) and recorded in the operation log
    with outcome ``refused``, the violation and the grant; every call records its grant.
    """

    grants: ClassVar[dict[str, Grant | None]] = {}

    def reset(self, task: Task) -> list[Message]:
        self._done_reason = ""
        return super().reset(task)

    def finish_with(self, reason: str) -> None:
        if reason not in NATURAL_FINISHES:
            raise ValueError(f"finish reason must be one of {NATURAL_FINISHES}, got {reason!r}")
        self._done_reason = reason

    def on_text(self, action: str) -> Step | None:
        """A turn with no tool call. Return a Step to end/continue, None for the default error."""
        return None

    def step(self, action: str) -> Step:
        if self.finish:
            raise RuntimeError(f"step() after the episode ended ({self.finish})")
        self.turns += 1
        started = time.perf_counter()
        call, refused = None, ""
        try:
            call = parse_tool_call(action)
            if call is None:
                handled = self.on_text(action)
                if handled is not None:
                    return handled
                name, result = "error", "error: no tool call; call one tool per turn as <tool_call>{...}</tool_call>"
            else:
                name, result = call.name, run_tool({t.name: t for t in self.tools()}, call, _check_grant)
        except GrantRefused as e:
            name, result, refused = "error", cut_result(str(e)), e.kind
        except ToolCallError as e:
            name, result = "error", cut_result(str(e))  # errors quote the call, of any length
        if call is not None or CALL_OPEN in action:  # every attempted call, a malformed one too
            grant = self.grants.get(call.name) if call else None
            oplog.write("tool_call", task=self.task.id, tool=call.name if call else "(malformed)",
                        args_sha256=oplog.digest(call.arguments if call else action),
                        outcome="refused" if refused else "error" if name == "error" else "ok",
                        **({"violation": refused} if refused else {}),
                        grant=grant.describe() if grant is not None else None,
                        seconds=round(time.perf_counter() - started, 5))
        if self._done_reason:
            return self._end(self._done_reason)
        if self.turns >= self.cfg.max_turns:
            return self._end("turns")
        self.env_seconds += time.perf_counter() - started
        if self.env_seconds > self.cfg.wall_s:
            return self._end("wall")
        return Step((tool_message(name, result),), False, "")


def _check_grant(tool: Tool, arguments: dict[str, Any]) -> None:
    if tool.grant is not None and tool.paths:
        check_paths(tool.name, tool.grant, tool.paths, arguments)


def make_env(name: str, cfg: EnvConfig | None = None, sandbox: Any = None) -> Environment:
    import rlvr.envs  # noqa: F401  (registers the built-in environments)

    return ENVS.get(name)(cfg, sandbox=sandbox)


def play(env: Environment, task: Task, actions: list[str]) -> tuple[list[Message], Verdict]:
    """Run a scripted policy: ``actions`` are the assistant turns, in order. Returns the whole
    conversation (prompt, turns, observations) and the verdict. Stops early when the episode
    ends; if the actions run out first, the episode is cut as ``turns``. Used for reference
    demonstrations (SFT) and for tests."""
    messages = env.reset(task)
    for action in actions:
        messages.append({"role": "assistant", "content": action})
        step = env.step(action)
        messages += step.observation
        if step.done:
            break
    else:
        env.cut("turns")
    return messages, env.verify()
