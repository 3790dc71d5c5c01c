"""Sharded training (FSDP2 over gloo, rlvr/train/sharded.py): 2 processes compute the loss,
gradient shards and AdamW step of 1 process, hold half its bytes each, and a checkpoint they
write resumes in one plain process and one written by a plain process loads on 2 ranks (docs/distributed.md, "Sharded training (FSDP2)").

One 2-process run (module fixture) writes what each rank saw; the tests compare it with the
same steps taken in this (non-distributed) process."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.multiprocessing as mp

ATOL = 1e-5
ROWS, LENGTH, VOCAB = 4, 12, 128
LR, WD = 1e-2, 0.1


def _model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def _lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)  # init_lora_weights=False: B random too, so every adapter gets a gradient
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def _batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(123)
    return [torch.randint(0, VOCAB, (ROWS, LENGTH), generator=gen) for _ in range(3)]


def _optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=WD)


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss  # mean over the rows' tokens (all rows equally long)


def _worker(rank: int, world: int, store: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from rlvr.train.sharded import full_state_dict, load_checkpoint, local_bytes, save_checkpoint, shard_model

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)

    def mine(ids):  # this rank's half of the global batch
        share = ids.shape[0] // world
        return ids[rank * share:(rank + 1) * share]

    def mean(loss):  # the global mean loss (each rank's share holds as many tokens)
        t = loss.detach().clone()
        dist.all_reduce(t)
        return (t / world).item()

    try:
        b0, b1, b2 = _batches()
        res: dict = {}
        model = shard_model(_model())
        res["sharded"] = all(isinstance(p, DTensor) for p in model.parameters())
        opt = _optimizer(model)
        loss = _loss(model, mine(b0))
        loss.backward()
        res["loss1"] = mean(loss)
        res["grads"] = {n: p.grad.to_local().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        res["bytes"] = local_bytes(model, opt)
        res["state1"] = full_state_dict(model)
        save_checkpoint(os.path.join(out, "ckpt"), model, opt)
        loss = _loss(model, mine(b1))  # the step after the checkpoint, continued on 2 ranks
        loss.backward()
        res["loss2"] = mean(loss)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            res["loss3"] = mean(_loss(model, mine(b2)))

        mixed = shard_model(_model(), mixed_precision=True)
        loss = _loss(mixed, mine(b0))
        loss.backward()
        res["loss_bf16"] = mean(loss)
        res["grad_dtypes"] = {p.grad.dtype for p in mixed.parameters()}

        lora = shard_model(_lora(_model()))
        opt = _optimizer(lora)
        loss = _loss(lora, mine(b0))
        loss.backward()
        res["lora_loss"] = mean(loss)
        res["lora_grads"] = {n: p.grad.to_local().clone() for n, p in lora.named_parameters() if p.grad is not None}
        opt.step()
        res["lora_state"] = full_state_dict(lora)

        model = shard_model(_model(seed=3))  # the 1-process checkpoint (fixture) loaded on 2 ranks
        opt = _optimizer(model)
        load_checkpoint(os.path.join(out, "ckpt_one"), model, opt)
        res["from_one"] = full_state_dict(model)
        loss = _loss(model, mine(b1))
        loss.backward()
        res["from_one_loss2"] = mean(loss)
        opt.step()
        with torch.no_grad():
            res["from_one_loss3"] = mean(_loss(model, mine(b2)))
        torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[list[dict], str]:
    """The 2-rank run's results per rank and its checkpoint; before it, this process writes a
    checkpoint (seed 7, one step) that the ranks load."""
    from rlvr.train.sharded import save_checkpoint

    out = tmp_path_factory.mktemp("sharded")
    model = _model(seed=7)
    opt, _, _ = _one_process_step(model, _batches()[0])
    save_checkpoint(out / "ckpt_one", model, opt)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the spawned ranks
    ranks = mp.start_processes(_worker, args=(2, str(out / "store"), str(out)), nprocs=2, start_method="spawn",
                               join=False)
    deadline = time.monotonic() + 240
    try:
        while not ranks.join(timeout=5):  # raises with the rank's traceback when one fails
            if time.monotonic() > deadline:
                pytest.fail("the 2-rank run did not finish in 240 s")
    finally:
        for proc in ranks.processes:
            if proc.is_alive():
                proc.kill()
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)], str(out / "ckpt")


def _one_process_step(model, ids):
    opt = _optimizer(model)
    loss = _loss(model, ids)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    opt.zero_grad()
    return opt, loss.item(), grads


def test_two_ranks_give_the_one_process_loss_gradients_and_step(two_ranks):
    ranks, _ = two_ranks
    assert all(r["sharded"] for r in ranks)
    b0 = _batches()[0]
    model = _model()
    _, loss, grads = _one_process_step(model, b0)
    for rank, res in enumerate(ranks):
        assert res["loss1"] == pytest.approx(loss, abs=ATOL)
        assert sorted(res["grads"]) == sorted(grads)
        for name, full in grads.items():  # rank r holds rows chunk r of dim 0
            torch.testing.assert_close(res["grads"][name], full.chunk(2, dim=0)[rank], atol=ATOL, rtol=0)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(ranks[0]["state1"][name], value, atol=ATOL, rtol=0)
        torch.testing.assert_close(ranks[1]["state1"][name], value, atol=ATOL, rtol=0)


def test_each_rank_holds_half_the_parameter_and_optimizer_bytes(two_ranks):
    from rlvr.train.sharded import local_bytes

    ranks, _ = two_ranks
    model = _model()
    opt, _, _ = _one_process_step(model, _batches()[0])
    one = local_bytes(model, opt)
    assert one["optimizer"] > one["params"] > 0  # AdamW: two moments per parameter
    for res in ranks:
        ratio = res["bytes"]["total"] / one["total"]
        assert 0.4 <= ratio <= 0.6, (res["bytes"], one)
        assert 0.4 <= res["bytes"]["params"] / one["params"] <= 0.6


def test_two_rank_checkpoint_resumes_in_one_plain_process(two_ranks):
    import torch.distributed as dist

    from rlvr.train.sharded import load_checkpoint

    ranks, ckpt = two_ranks
    assert not dist.is_initialized()  # this process has no process group
    _, b1, b2 = _batches()
    model = _model(seed=7)  # other weights: everything must come from the checkpoint
    opt = _optimizer(model)
    load_checkpoint(ckpt, model, opt)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, ranks[0]["state1"][name], atol=0, rtol=0)
    assert all(int(s["step"]) == 1 for s in opt.state.values())  # AdamW's moments came back too
    loss = _loss(model, b1)
    loss.backward()
    opt.step()
    assert loss.item() == pytest.approx(ranks[0]["loss2"], abs=ATOL)
    with torch.no_grad():
        assert _loss(model, b2).item() == pytest.approx(ranks[0]["loss3"], abs=ATOL)  # needs the moments


def test_bf16_mixed_precision_runs_and_lora_shards(two_ranks):
    ranks, _ = two_ranks
    b0 = _batches()[0]
    ref = _loss(_model(), b0).item()
    for res in ranks:
        assert res["loss_bf16"] == pytest.approx(ref, abs=2e-2) and res["loss_bf16"] != ref
        assert res["grad_dtypes"] == {torch.float32}  # fp32 sharded masters, fp32 reduce

    lora = _lora(_model())
    _, loss, grads = _one_process_step(lora, b0)
    assert grads and all("lora_" in n for n in grads)  # the frozen base gets no gradient
    for rank, res in enumerate(ranks):
        assert res["lora_loss"] == pytest.approx(loss, abs=ATOL)
        assert sorted(res["lora_grads"]) == sorted(grads)
        for name, full in grads.items():
            torch.testing.assert_close(res["lora_grads"][name], full.chunk(2, dim=0)[rank], atol=ATOL, rtol=0)
        for name, value in lora.state_dict().items():
            torch.testing.assert_close(res["lora_state"][name], value, atol=ATOL, rtol=0)


def test_one_process_checkpoint_loads_on_two_ranks(two_ranks):
    ranks, _ = two_ranks
    b0, b1, b2 = _batches()
    model = _model(seed=7)  # what the fixture saved: one step from seed 7, then continued here
    opt, _, _ = _one_process_step(model, b0)
    for res in ranks:
        for name, value in model.state_dict().items():
            torch.testing.assert_close(res["from_one"][name], value, atol=0, rtol=0)
    loss = _loss(model, b1)
    loss.backward()
    opt.step()
    with torch.no_grad():
        after = _loss(model, b2).item()
    for res in ranks:
        assert res["from_one_loss2"] == pytest.approx(loss.item(), abs=ATOL)
        assert res["from_one_loss3"] == pytest.approx(after, abs=ATOL)


def test_shard_model_needs_a_process_group():
    from rlvr.train.sharded import shard_model

    with pytest.raises(RuntimeError, match="initialized process group"):
        shard_model(_model())
