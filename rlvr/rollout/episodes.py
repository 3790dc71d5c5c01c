"""Multi-turn rollouts: run episodes of tool environments, keeping the exact tokens of every turn.

``collect_episodes`` plays ``n`` episodes per task, all in lock step: each round generates one
assistant turn for every live episode in one batched ``generate`` call (the first round prefills
each task's prompt once for its ``n`` samples), then steps the environments concurrently (their
tools run in the sandbox). A trajectory grows by appending only:

    prompt ids | turn 1 (policy ids, loss 1) | observation ids (loss 0) | turn 2 | ...

so the ids the policy saw at every turn are exactly the prefix it is trained on; nothing is
re-tokenised from text (``rlvr.envs.tokens``). Each episode keeps the K/V its last turn computed
(``Completion.cache``, fast decoder), so a turn runs only the new tokens (the last reply token
and the observation), not the whole conversation again (``reuse_cache``).

Budgets: a turn may use ``turn_tokens``, an episode ``max_tokens`` policy tokens and
``max_context`` tokens in all (capped by the model's context length); running out cuts the
episode (``finish``: length / tokens / context), which then fails.

``run_tasks`` is what the trainer and eval call: single-turn tasks go through the bulk path
(``collect``, the one-step case done in one batch), multi-turn tasks through episodes;
``rlvr.verifiers.judge`` then gives each its verdict.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from rlvr.envs.base import NATURAL_FINISHES, EnvConfig, Environment, make_env
from rlvr.envs.tokens import observation_ids
from rlvr.model.tokenizer import encode_chat_prompt
from rlvr.rollout.collect import collect
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.rollout.kv_cache import KVPrefix
from rlvr.types import EpisodeInfo, Message, Task, Trajectory


@dataclass
class Episode:
    """A finished episode: its trajectory and the environment that holds its final state
    (``None`` for a single-turn task collected in bulk: its verifier judges the completion)."""

    trajectory: Trajectory
    env: Environment | None = None


class EnvPool:
    """Environment instances by name, reused from one batch to the next (so a reset may take the
    fast restore path). ``take(names)`` gives the k-th request for a name its k-th instance."""

    def __init__(self, cfg: EnvConfig | None = None, sandbox=None) -> None:
        self.cfg, self.sandbox = cfg or EnvConfig(), sandbox
        self._envs: dict[str, list[Environment]] = {}

    def take(self, names: list[str]) -> list[Environment]:
        seen: dict[str, int] = {}
        out = []
        for name in names:
            k = seen.get(name, 0)
            seen[name] = k + 1
            instances = self._envs.setdefault(name, [])
            if k == len(instances):
                instances.append(make_env(name, self.cfg, self.sandbox))
            out.append(instances[k])
        return out

    def close(self) -> None:
        for instances in self._envs.values():
            for env in instances:
                env.close()
        self._envs = {}


@dataclass
class _Live:
    """One episode in progress."""

    task: Task
    group: int
    env: Environment
    tools: list[dict]
    messages: list[Message]
    ids: list[int]
    logprobs: list[float]
    segments: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    policy_tokens: int = 0
    last_text: str = ""
    done: bool = False
    cache: KVPrefix | None = None  # K/V of a prefix of ``ids`` from the last turn

    def append(self, source: str, ids: list[int], logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.segments.append((source, tuple(ids)))


def collect_episodes(
    model,
    tokenizer,
    tasks: list[Task],
    params: SamplingParams,
    pool: EnvPool,
    *,
    generator: torch.Generator | None = None,
    policy_version: int = 0,
    batch_size: int | None = None,
    workers: int = 8,
    reuse_cache: bool = True,
    engine=None,
) -> list[Episode]:
    """Play ``params.n`` episodes per task (task-major; ``group_id`` = task index). The per-turn
    budget is ``pool.cfg.turn_tokens`` (``params.max_new_tokens`` is ignored). ``reuse_cache``:
    a turn starts from the K/V of the episode's previous turns (False: runs the whole
    conversation again each turn; the same tokens up to float rounding). ``engine``
    (``rlvr.rollout.engine_registry``): what generates each turn; None = rlvr's ``generate``."""
    cfg = pool.cfg
    live = _start(tokenizer, tasks, params.n, pool)
    limit = min(cfg.max_context, getattr(model.config, "max_position_embeddings", cfg.max_context))
    stop_ids = set(params.stop_token_ids if params.stop_token_ids is not None else [tokenizer.eos_token_id])
    timings = {"generate_s": 0.0, "env_s": 0.0}
    with ThreadPoolExecutor(max_workers=workers) as threads:
        while True:
            active = [e for e in live if not e.done and _has_budget(e, cfg, limit)]
            if not active:
                break
            start = time.perf_counter()
            turns = _generate_turn(model, tokenizer, active, params, cfg, limit, generator, batch_size,
                                   reuse_cache, engine)
            timings["generate_s"] += time.perf_counter() - start
            start = time.perf_counter()
            stepping = [e for e, turn in zip(active, turns) if _take_turn(e, turn, tokenizer, stop_ids)]
            for e, step in zip(stepping, threads.map(lambda e: e.env.step(e.last_text), stepping)):
                _observe(e, step, tokenizer, limit)
            timings["env_s"] += time.perf_counter() - start
    per = {k: v / max(len(live), 1) for k, v in timings.items()}
    return [Episode(_trajectory(e, policy_version, per), e.env) for e in live]


def _start(tokenizer, tasks: list[Task], n: int, pool: EnvPool) -> list[_Live]:
    """``n`` episodes per task, each reset in its environment instance with its prompt encoded."""
    live = []
    for i, env in enumerate(pool.take([t.env for t in tasks for _ in range(n)])):
        task = tasks[i // n]
        messages = env.reset(task)
        tools = [t.schema() for t in env.tools()]
        episode = _Live(task, i // n, env, tools, list(messages), [], [])
        episode.append("prompt", encode_chat_prompt(tokenizer, messages, tools))
        live.append(episode)
    return live


def _take_turn(e: _Live, turn: tuple[list[int], list[float], str], tokenizer, stop_ids: set[int]) -> bool:
    """Append the policy's turn to ``e``; False when a budget cut the turn (the episode ends)."""
    ids, logprobs, cut = turn
    e.append("policy", ids, logprobs)
    e.policy_tokens += len(ids)
    e.last_text = tokenizer.decode([t for t in ids if t not in stop_ids], skip_special_tokens=True)
    e.messages.append({"role": "assistant", "content": e.last_text})
    if cut:
        e.env.cut(cut)
        e.done, e.cache = True, None
    return not cut


def _observe(e: _Live, step, tokenizer, limit: int) -> None:
    """Append the environment's answer to ``e``, or end it (done, or no room left for it)."""
    if step.done:
        e.done, e.cache = True, None
        return
    obs = observation_ids(tokenizer, e.messages, step.observation, e.tools)
    if len(e.ids) + len(obs) >= limit:  # no room for the observation and a reply
        e.env.cut("context")
        e.done, e.cache = True, None
        return
    e.messages += step.observation
    e.append("env", obs)


def _has_budget(e: _Live, cfg: EnvConfig, limit: int) -> bool:
    """Whether ``e`` may take another turn; if not, cut it (tokens or context)."""
    if e.done:
        return False
    if e.policy_tokens >= cfg.max_tokens:
        e.env.cut("tokens")
    elif len(e.ids) >= limit:
        e.env.cut("context")
    else:
        return True
    e.done = True
    return False


def _generate_turn(model, tokenizer, active: list[_Live], params: SamplingParams, cfg: EnvConfig,
                   limit: int, generator, batch_size, reuse_cache: bool = True, engine=None,
                   ) -> list[tuple[list[int], list[float], str]]:
    """One assistant turn per active episode: (ids, logprobs, cut reason or ""); with
    ``reuse_cache`` each episode's ``cache`` is read and replaced."""
    budgets = []
    for e in active:
        options = [(cfg.turn_tokens, "length"), (cfg.max_tokens - e.policy_tokens, "tokens"),
                   (limit - len(e.ids), "context")]
        budgets.append(min(options, key=lambda o: o[0]))
    # Identical prompts (the n samples of a task on the first turn) are prefilled once.
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, e in enumerate(active):
        groups.setdefault(tuple(e.ids), []).append(r)
    sizes = {len(rows) for rows in groups.values()}
    k = sizes.pop() if len(sizes) == 1 else 1
    prompts = list(groups) if k > 1 else [tuple(e.ids) for e in active]
    order = [r for rows in groups.values() for r in rows] if k > 1 else list(range(len(active)))
    firsts = [rows[0] for rows in groups.values()] if k > 1 else order  # a row of each prompt
    past = [active[r].cache for r in firsts] if reuse_cache else None
    # The episode's sampling settings (temperature, top-p, stop tokens, precision) with this turn's
    # budget and group size; turns end at stop tokens and budgets, the environment reads the text.
    turn_params = dataclasses.replace(params, max_new_tokens=max(b for b, _ in budgets), n=k, stop=())
    completions = (engine.generate if engine is not None else generate)(model, prompts, turn_params, generator=generator,
                           pad_token_id=tokenizer.pad_token_id, batch_size=batch_size,
                           past=past if past and any(c is not None for c in past) else None,
                           keep_cache=reuse_cache)
    out: list[tuple[list[int], list[float], str] | None] = [None] * len(active)
    for r, c in zip(order, completions):
        active[r].cache = c.cache
        budget, reason = budgets[r]
        ids, logprobs = c.token_ids[:budget], c.logprobs[:budget]
        stopped = c.finish_reason == "stop" and len(c.token_ids) <= budget
        out[r] = (ids, logprobs, "" if stopped else reason)
    return out  # type: ignore[return-value]


def _trajectory(e: _Live, policy_version: int, timings: dict[str, float]) -> Trajectory:
    mask = tuple(int(source == "policy") for source, ids in e.segments for _ in ids)
    finish = e.env.finish
    return Trajectory(
        task_id=e.task.id,
        group_id=e.group,
        messages=tuple(e.messages),
        completion=e.last_text,
        token_ids=tuple(e.ids),
        loss_mask=mask,
        logprobs=tuple(e.logprobs),
        finish_reason="stop" if finish in NATURAL_FINISHES else "length",
        policy_version=policy_version,
        timings=dict(timings),
        segments=tuple(e.segments),
        episode=EpisodeInfo(env=e.env.name, finish=finish, turns=e.env.turns, max_tokens=e.env.cfg.max_tokens),
    )


def run_tasks(model, tokenizer, tasks: list[Task], params: SamplingParams, pool: EnvPool | None, *,
              generator: torch.Generator | None = None, policy_version: int = 0,
              batch_size: int | None = None, engine=None) -> list[Episode]:
    """Roll out ``params.n`` samples of every task, task-major (``group_id`` = index in
    ``tasks``): single-turn tasks in one batched ``collect`` (``params.max_new_tokens`` per
    answer), multi-turn tasks as episodes of their environments (``pool.cfg`` budgets).
    ``engine`` (``rlvr.rollout.engine_registry``): what generates; None = rlvr's own ``generate`` on
    ``model``."""
    multi = [i for i, t in enumerate(tasks) if t.multi_turn]
    single = [i for i, t in enumerate(tasks) if not t.multi_turn]
    episodes: list[Episode] = []
    on = {"engine": engine} if engine is not None else {}  # the default path calls exactly as before
    if single:
        trajectories = collect(model, tokenizer, [tasks[i] for i in single], params, generator=generator,
                               policy_version=policy_version, batch_size=batch_size, **on)
        episodes += [Episode(dataclasses.replace(t, group_id=single[t.group_id])) for t in trajectories]
    if multi:
        if pool is None:
            raise ValueError("multi-turn tasks need an EnvPool")
        played = collect_episodes(model, tokenizer, [tasks[i] for i in multi], params, pool, generator=generator,
                                  policy_version=policy_version, batch_size=batch_size, **on)
        episodes += [Episode(dataclasses.replace(ep.trajectory, group_id=multi[ep.trajectory.group_id]), ep.env)
                     for ep in played]
    episodes.sort(key=lambda ep: ep.trajectory.group_id)  # stable: samples keep their order
    return episodes
