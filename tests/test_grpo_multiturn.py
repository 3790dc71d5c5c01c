"""GRPO on multi-turn episodes (tiny random model): parameters change and the reward rises, with
environment tokens in the middle of every trajectory and out of the loss."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

import rlvr.tasks  # noqa: F401
from rlvr.config import load_config
from rlvr.envs.base import ENVS, Environment, Step
from rlvr.monitor.metrics import read_metrics
from rlvr.tasks.base import DOMAINS, seeded_rng
from rlvr.types import Spec, Task, Verdict


class TwoTurnDomain:
    """Two turns: answer, read the environment's nudge, answer again. Registered as any domain."""

    name = "test.twoturn"
    version = "v1"
    levels = (1,)

    def generate(self, split: str, level: int, index: int, seed: int) -> Task:
        key = f"{split}:{index}:{seeded_rng(seed, self.name, split, index).randrange(10**6)}"
        return Task(id=f"{self.name}/v1/{split}/1/{index:06d}", domain=self.name, level=1,
                    prompt=({"role": "user", "content": "Write digits."},), spec=Spec("test.twoturn"),
                    key=key, reference="1", env="test.twoturn")

    def corpus(self, seed: int, n_docs: int) -> list[str]:
        return ["123"] * n_docs


class TwoTurnEnv(Environment):
    """Score = fraction of digit characters over both assistant turns (partial credit)."""

    name = "test.twoturn"

    def reset(self, task):
        self.texts = []
        return super().reset(task)

    def step(self, action: str) -> Step:
        self.turns += 1
        self.texts.append(action)
        if self.turns == 2:
            return self._end("answer")
        return Step(({"role": "user", "content": "Again, digits only."},), False, "")

    def _verify(self) -> Verdict:
        text = "".join(self.texts)
        score = sum(c.isdigit() for c in text) / max(len(text), 1)
        return Verdict(score == 1.0, score, "ok" if score == 1.0 else "mismatch")


@contextlib.contextmanager
def twoturn_registered():
    """``test.twoturn`` registered as a domain and an environment for the block, removed after it."""
    with DOMAINS.temporary("test.twoturn", TwoTurnDomain()), ENVS.temporary("test.twoturn", TwoTurnEnv):
        yield


@pytest.fixture(scope="module", autouse=True)
def twoturn():
    with twoturn_registered():
        yield


def test_grpo_on_two_turn_episodes_changes_parameters_and_raises_reward(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo
    from rlvr.model.load import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    # A random model almost never ends a turn (a cut turn fails the episode); bias it towards EOS.
    bias = torch.zeros(model.lm_head.out_features)
    bias[tok.eos_token_id] = 3.0
    model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    monkeypatch.setattr("rlvr.train.policy.load_model_and_tokenizer", lambda path, **kw: (model, tok))
    overrides = [
        f"model={tiny_model_dir}", f"out={tmp_path / 'run'}", "domains=[test.twoturn]", "levels=[1]",
        "train_tasks=16", "rollout.tasks_per_step=4", "rollout.samples_per_task=8", "env.turn_tokens=8",
        "env.max_tokens=16", "env.max_turns=2", "reward.outcome=score", "optim.lr=1e-2", "optim.warmup_steps=0",
        "steps=12", "checkpoint_every=100", "save_trajectories_every=12",
    ]
    grpo.run_grpo(load_config(grpo.GRPOConfig, None, overrides), progress=False)
    assert not [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["rollout/reward_mean"] for m in metrics]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.05, rewards
    # episodes really had two turns, and RL learned to finish them instead of running out of tokens
    finished = [m.get("rollout/finish/answer", 0.0) for m in metrics]
    assert metrics[-1]["rollout/turns_mean"] > 1.5 and sum(finished[-3:]) > sum(finished[:3]) + 0.3, finished
    saved = [json.loads(line) for line in (tmp_path / "run" / "trajectories" / "step_12.jsonl").open()]
    roles = [m["role"] for m in saved[0]["messages"]]
    assert roles[:3] == ["user", "assistant", "user"] and saved[0]["info"]["env"] == "test.twoturn"
