"""The compatibility table (``rlvr.train.compat``): every cell walked.

- every refused (component, producer) cell gives its one-line ``ConfigError`` naming the key;
- every supported cell is accepted by config validation, and the in-process producers (sync,
  async) run two real steps of it on the tiny model, the policy's weights changing;
- docs/compatibility.md is the table as ``markdown()`` renders it.

The Ray, torchrun and remote columns run in their own tests (tests/test_ray.py,
tests/test_distributed.py, tests/test_remote_engine.py, tests/test_critic_parallel.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.train import compat
from rlvr.train.grpo_config import GRPOConfig

ROOT = Path(__file__).resolve().parents[1]

COMPONENT_SETTINGS = {  # the config that turns each component on, on the tiny test task
    "lora": {"lora.enabled": "true", "lora.r": 4},
    "kl_reference": {"algo.kl_coef": 0.05},
    "teacher": {"distill.teacher": "{model}"},
    "critic": {"algo.advantage": "gae"},
    "dynamic_sampling": {"algo.dynamic_sampling_rounds": 1},
    "curriculum": {"curriculum.enabled": "true"},
}
PRODUCER_SETTINGS = {  # the config of each producer (torchrun: the world size the check is given)
    "sync": {}, "async": {"asynchronous.enabled": "true"}, "ray": {"backend": "ray"},
    "ray_async": {"backend": "ray", "asynchronous.enabled": "true"}, "torchrun": {"distributed.rollout_chunk": 2},
    "remote": {"rollout.engine": "remote", "rollout.remote.base_url": "http://127.0.0.1:1"},
    "remote_async": {"rollout.engine": "remote", "rollout.remote.base_url": "http://127.0.0.1:1",
                     "asynchronous.enabled": "true"},
    "vllm": {"rollout.engine": "vllm", "device": "cuda"},
}


def _overrides(model_dir, out, settings: dict) -> list[str]:
    base = [f"model={model_dir}", f"out={out}", "domains=[test.digits]", "levels=[1]", "train_tasks=16",
            "rollout.tasks_per_step=2", "rollout.samples_per_task=4", "rollout.max_new_tokens=4",
            "reward.outcome=score", "optim.lr=1e-2", "optim.warmup_steps=0", "steps=2", "checkpoint_every=2",
            "save_trajectories_every=100", "algo.microbatch_size=8"]
    return base + [f"{k}={str(v).format(model=model_dir)}" for k, v in settings.items()]


def test_the_table_names_every_component_and_producer():
    assert set(COMPONENT_SETTINGS) == {c.name for c in compat.COMPONENTS}
    assert set(PRODUCER_SETTINGS) == set(compat.PRODUCERS)
    assert all((c, p) in {(x, y) for x, y, _ in compat.cells()} for c, p in compat.REFUSED)


@pytest.mark.parametrize(("component", "producer"), [(c, p) for c, p, _ in compat.cells()])
def test_every_cell_is_refused_with_its_reason_or_accepted(component, producer, tiny_model_dir, tmp_path,
                                                          monkeypatch):
    monkeypatch.setattr("rlvr.train.grpo_config.require_vllm", lambda: None)  # as if vllm and CUDA were here
    monkeypatch.setattr("rlvr.rollout.remote_engine.RemoteConfig.require", lambda self: None)
    world = 2 if producer == "torchrun" else 1
    monkeypatch.setattr("rlvr.train.grpo_config.launched", lambda: type("G", (), {"world": world})())
    overrides = _overrides(tiny_model_dir, tmp_path / "run",
                           {**PRODUCER_SETTINGS[producer], **COMPONENT_SETTINGS[component]})
    reason = compat.REFUSED.get((component, producer))
    if reason is None:
        cfg = load_config(GRPOConfig, None, overrides)
        assert compat.producer(cfg, world) == producer
        return
    key = next(c.key for c in compat.COMPONENTS if c.name == component)
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}'") + ".*" + re.escape(compat.PRODUCERS[producer])) as e:
        load_config(GRPOConfig, None, overrides)
    assert "\n" not in str(e.value) and reason in str(e.value)


@pytest.mark.parametrize("producer", ["sync", "async"])
@pytest.mark.parametrize("component", [c.name for c in compat.COMPONENTS])
def test_every_supported_in_process_cell_runs_two_steps(component, producer, tiny_model_dir, tmp_path):
    from rlvr.model.load import load_model
    from rlvr.monitor.metrics import read_metrics
    from rlvr.train import grpo
    from tests.test_grpo import digits_registered

    assert (component, producer) not in compat.REFUSED
    torch.manual_seed(0)
    with digits_registered():
        cfg = load_config(GRPOConfig, None, _overrides(tiny_model_dir, tmp_path / "run",
                                                       {**PRODUCER_SETTINGS[producer], **COMPONENT_SETTINGS[component]}))
        result = grpo.run_grpo(cfg, progress=False)
    assert result["steps"] == 2
    steps = read_metrics(tmp_path / "run")
    assert [m["step"] for m in steps] == [1, 2]
    assert (tmp_path / "run" / "final").is_dir() and (tmp_path / "run" / "checkpoints" / "step_2").is_dir()
    start = load_model(tiny_model_dir).state_dict()
    final = load_model(tmp_path / "run" / "final").state_dict()  # LoRA: merged
    assert any(not torch.equal(t, start[k]) for k, t in final.items()), "the updates changed no weight"


def test_the_docs_show_the_table():
    doc = (ROOT / "docs" / "compatibility.md").read_text()
    assert compat.markdown() in doc, "docs/compatibility.md is out of date: paste rlvr.train.compat.markdown()"
