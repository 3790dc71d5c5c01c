"""SFT: the loss mask covers exactly the assistant tokens; a short run lowers the loss."""

from __future__ import annotations


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
    import torch

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
