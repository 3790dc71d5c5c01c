"""SFT: the loss mask covers exactly the assistant tokens; a short run lowers the loss."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import rlvr.tasks  # noqa: F401
from rlvr.config import load_config
from rlvr.model.load import load_model_and_tokenizer
from rlvr.monitor.metrics import read_metrics
from rlvr.rollout.collect import collect
from rlvr.rollout.engine import SamplingParams
from rlvr.tasks.base import generate_tasks
from rlvr.train.sft import SFTConfig, build_examples, run_sft


def test_sft_mask_is_exactly_the_assistant_turn(tiny_model_dir):
    _, tok = load_model_and_tokenizer(tiny_model_dir)
    tasks = generate_tasks(["math.arith", "math.word"], "train", 12, seed=0)
    for task, (ids, mask) in zip(tasks, build_examples(tok, tasks)):
        assert len(ids) == len(mask)
        first = mask.index(1)
        assert all(mask[first:]) and not any(mask[:first])  # one contiguous assistant span at the end
        rendered = tok.apply_chat_template(list(task.prompt), add_generation_prompt=True, tokenize=False)
        assert tok.decode(ids[:first]) == rendered
        assert tok.decode(ids[first:]) == task.reference + "<|end|>"
        full = tok.apply_chat_template(list(task.prompt) + [{"role": "assistant", "content": task.reference}],
                                       tokenize=False)
        assert full == tok.decode(ids) + "\n"  # the template closes the turn with a newline after <|end|>


def test_rollout_mask_is_exactly_the_generated_tokens(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    tasks = generate_tasks(["math.arith"], "train", 3, seed=0)
    params = SamplingParams(max_new_tokens=5, temperature=1.0, top_p=1.0, n=2, stop_token_ids=[tok.eos_token_id])
    for traj in collect(model, tok, tasks, params, generator=torch.Generator().manual_seed(0)):
        first = traj.loss_mask.index(1)
        prompt = tok.apply_chat_template(list(tasks[traj.group_id].prompt), add_generation_prompt=True, tokenize=False)
        assert tok.decode(traj.token_ids[:first]) == prompt
        assert all(traj.loss_mask[first:]) and traj.num_policy_tokens == len(traj.token_ids) - first
        assert all(lp == 0.0 for lp in traj.logprobs[:first])
        assert all(lp < 0.0 for lp in traj.logprobs[first:])


def test_sft_smoke_lowers_loss(tiny_model_dir, tmp_path):
    cfg = load_config(SFTConfig, None, [f"model={tiny_model_dir}", f"out={tmp_path}/sft", "train_tasks=64",
                                        "steps=30", "batch_size=16", "log_every=1", "optim.lr=3e-3",
                                        "device=auto"])  # cpu here, the GPU where there is one
    run_sft(cfg, progress=False)
    losses = [m["train/loss"] for m in read_metrics(tmp_path / "sft")]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert (tmp_path / "sft" / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_stopped_sft_run_resumes_to_the_same_metrics_and_weights(tiny_model_dir, tmp_path, monkeypatch, lora):
    """Checkpoints every 4 steps; stopped inside step 7's update (step 4 the newest checkpoint), then
    ``resume``: every step's metrics and the final weights equal an unstopped run's."""
    import rlvr.train.sft as sft

    def cfg(out):
        return load_config(SFTConfig, None, [f"model={tiny_model_dir}", f"out={out}", "train_tasks=40", "steps=10",
                                            "batch_size=8", "log_every=1", "checkpoint_every=4", "optim.lr=3e-3",
                                            *(["lora.enabled=true", "lora.r=4"] if lora else [])])

    run_sft(cfg(tmp_path / "straight"), progress=False)
    real_step, calls = sft.sft_step, []

    def step_then_stop(*args, **kw):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return real_step(*args, **kw)

    monkeypatch.setattr(sft, "sft_step", step_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_sft(cfg(tmp_path / "stopped"), progress=False)
    monkeypatch.undo()
    assert [m["step"] for m in read_metrics(tmp_path / "stopped")] == list(range(1, 7))
    assert [p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir()] == ["step_4"]
    run_sft(cfg(tmp_path / "stopped"), resume=True, progress=False)
    assert read_metrics(tmp_path / "stopped") == read_metrics(tmp_path / "straight")
    a, b = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("straight", "stopped"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # resumed once more after it finished: nothing retrains (the last step is checkpointed)
    monkeypatch.setattr(sft, "sft_step", lambda *a, **k: pytest.fail("a finished run trained again"))
    run_sft(cfg(tmp_path / "stopped"), resume=True, progress=False)
    assert read_metrics(tmp_path / "stopped") == read_metrics(tmp_path / "straight")
