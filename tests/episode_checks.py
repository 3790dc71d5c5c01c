"""Multi-turn episodes through a rollout engine (the engine seam's tests: vLLM stand-in, remote
server): a tool environment that echoes, and the token-faithfulness check of its episodes."""

from __future__ import annotations

import torch

from rlvr.model.logprobs import sequence_logprobs
from rlvr.rollout.engine import SamplingParams


def echo_episodes(trainer, tok, engine) -> list:
    """Two episodes of up to 3 turns of a ``test.echo`` tool environment, generated on ``engine``."""
    from rlvr.envs.base import ENVS, EnvConfig, ToolEnv
    from rlvr.envs.tools import Tool
    from rlvr.rollout.episodes import EnvPool, collect_episodes
    from rlvr.types import Spec, Task, Verdict

    class Echo(ToolEnv):
        name = "test.echo"

        def tools(self):
            return [Tool("echo", "Echo the text.", lambda text: f"echo: {text}", {"text": ("string", "text")})]

        def _verify(self):
            return Verdict(False, 0.0, "mismatch")

    task = Task(id="test.echo/v1/train/1/000000", domain="test.echo", level=1, env="test.echo", key="0",
                prompt=({"role": "user", "content": "Say ok."},), spec=Spec("echo", {}))
    with ENVS.temporary("test.echo", Echo):
        pool = EnvPool(EnvConfig(max_turns=3, turn_tokens=10, max_tokens=30, max_context=400))
        try:
            return collect_episodes(trainer, tok, [task], SamplingParams(n=2, stop_token_ids=tuple(range(40, 100))),
                                    pool, generator=torch.Generator().manual_seed(0), engine=engine)
        finally:
            pool.close()


def assert_token_faithful(trainer, episodes: list) -> None:
    """At least one episode took 2 turns; each one's segments make its ids, and its policy
    log-probs equal a fresh forward over the whole trajectory."""
    assert max(e.trajectory.episode.turns for e in episodes) >= 2
    for e in episodes:
        t = e.trajectory
        assert tuple(i for _, ids in t.segments for i in ids) == t.token_ids
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            fresh = sequence_logprobs(trainer, ids, torch.ones_like(ids))[0]
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        assert torch.allclose(fresh[mask], torch.tensor(t.logprobs)[mask], atol=1e-4)
