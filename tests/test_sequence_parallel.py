"""Sequence parallelism (Ulysses) over gloo: a sequence split across 2 processes gives the
single-process loss, per-token log-probs and every parameter's gradient (docs/distributed.md,
"Sequence parallelism")."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rlvr.train.sequence_parallel import check_heads

ATOL = 1e-5


def _model(family: str, heads: int = 4, kv_heads: int = 2, hidden: int = 64):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    config = config_cls(vocab_size=128, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                        attn_implementation="sdpa")
    return model_cls(config).float()


def _check(family: str, length: int) -> None:
    import torch.distributed as dist

    from rlvr.train.sequence_parallel import reduce_gradients, sequence_loss

    model = _model(family)
    ids = torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(length))
    labels = ids.clone()
    labels[:, : length // 4] = -100  # a prompt the loss skips
    # the single-process reference (every rank computes it)
    out = model(input_ids=ids, labels=labels, use_cache=False)
    out.loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    ref_logprobs = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    model.zero_grad(set_to_none=True)

    got = sequence_loss(model, ids, labels=labels)
    got.loss.backward()
    reduce_gradients(model)
    where = f"{family}, length {length}, rank {dist.get_rank()}"
    assert model.config._attn_implementation == "sdpa", where  # switched back
    assert got.tokens == int((labels[:, 1:] != -100).sum()), where
    assert abs(got.loss.item() - out.loss.item()) < ATOL, (where, got.loss.item(), out.loss.item())
    assert got.logprobs.shape == ref_logprobs.shape, where
    assert torch.allclose(got.logprobs, ref_logprobs.detach(), atol=ATOL), where
    for n, p in model.named_parameters():
        assert p.grad is not None, (where, n)
        diff = (p.grad - ref_grads[n]).abs().max().item()
        assert diff < ATOL, (where, n, diff)
    # the loss value is the same on every rank
    values = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(values, got.loss.detach().reshape(1))
    assert values[0].item() == values[1].item(), where


def _worker(rank: int, world: int, store: str, failures: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from rlvr.train.sequence_parallel import sequence_parallel

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        for family, length in (("llama", 64), ("llama", 99), ("qwen2", 77)):
            _check(family, length)
        for heads, kv in ((3, 3), (4, 1)):  # heads, then key/value heads, not divisible by 2
            model = _model("llama", heads=heads, kv_heads=kv, hidden=48 if heads == 3 else 64)
            with (pytest.raises(ValueError, match=f"num_attention_heads={heads}, num_key_value_heads={kv}"),
                  sequence_parallel(model)):
                pass
            assert model.config._attn_implementation == "sdpa"
    except BaseException:
        Path(failures, f"rank{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def test_two_ranks_give_the_single_process_loss_logprobs_and_gradients(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, 2, str(tmp_path / "store"), str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    for p in procs:
        if p.is_alive():
            p.kill()
    errors = "\n".join(f.read_text() for f in sorted(tmp_path.glob("rank*.txt")))
    assert all(p.exitcode == 0 for p in procs) and not errors, errors or [p.exitcode for p in procs]


def test_head_counts_that_do_not_divide_raise_a_clear_error():
    from transformers import LlamaConfig

    check_heads(LlamaConfig(num_attention_heads=4, num_key_value_heads=2), 2)
    with pytest.raises(ValueError, match=r"world size 2.*num_attention_heads=6, num_key_value_heads=3"):
        check_heads(LlamaConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=3), 2)
    with pytest.raises(ValueError, match=r"world size 4.*num_attention_heads=4, num_key_value_heads=2"):
        check_heads(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2), 4)
