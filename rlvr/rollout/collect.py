"""Turn tasks into trajectories: render prompts, sample n completions each, keep exact tokens.

Single-turn for now: token_ids = prompt ids + generated ids, loss_mask 1 on generated ids only.
The generated ids are kept as produced (never re-tokenised from text).
"""

from __future__ import annotations

import time

import torch

from rlvr.model.tokenizer import encode_chat_prompt
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.types import Task, Trajectory


def collect(
    model,
    tokenizer,
    tasks: list[Task],
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    policy_version: int = 0,
    batch_size: int | None = None,
    engine=None,
) -> list[Trajectory]:
    """Sample ``params.n`` trajectories per task, ordered task-major; group_id = task index.
    ``engine`` (``rlvr.rollout.engine_registry``): what generates; None = rlvr's ``generate``."""
    prompts = [encode_chat_prompt(tokenizer, list(t.prompt)) for t in tasks]
    start = time.perf_counter()
    completions = (engine.generate if engine is not None else generate)(
        model, prompts, params, generator=generator,
        pad_token_id=tokenizer.pad_token_id, batch_size=batch_size,
    )
    seconds = (time.perf_counter() - start) / max(len(completions), 1)
    stop_ids = set(params.stop_token_ids or [tokenizer.eos_token_id])
    trajectories = []
    for c in completions:
        task, prompt = tasks[c.prompt_index], prompts[c.prompt_index]
        text_ids = [t for t in c.token_ids if t not in stop_ids]
        completion = tokenizer.decode(text_ids, skip_special_tokens=True)
        trajectories.append(
            Trajectory(
                task_id=task.id,
                group_id=c.prompt_index,
                messages=tuple(task.prompt) + ({"role": "assistant", "content": completion},),
                completion=completion,
                token_ids=tuple(prompt) + tuple(c.token_ids),
                loss_mask=(0,) * len(prompt) + (1,) * len(c.token_ids),
                logprobs=(0.0,) * len(prompt) + tuple(float(x) for x in c.logprobs),
                finish_reason=c.finish_reason,
                policy_version=policy_version,
                timings={"generate_s": seconds},
            )
        )
    return trajectories
