"""Pretraining at toy size: the loss falls (in fp32 and bf16), and a crashed run resumes to the same weights."""

from __future__ import annotations

import pytest
import torch

import rlvr.train.pretrain as pretrain
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.model.load import load_model
from rlvr.monitor.metrics import read_metrics
from rlvr.train.precision import native_precision

TOY = ["docs_per_domain=40", "batch_size=8", "seq_len=64", "model.hidden_size=32", "model.num_layers=1",
       "model.intermediate_size=64", "model.num_heads=2", "model.num_kv_heads=2", "log_every=1",
       "checkpoint_every=2", "optim.warmup_steps=2"]


def test_pretrain_lowers_the_loss(tmp_path):
    cfg = load_config(pretrain.PretrainConfig, None, TOY + ["steps=30", f"out={tmp_path}/p", "device=auto"])
    pretrain.run_pretrain(cfg, progress=False)
    losses = [m["train/loss"] for m in read_metrics(tmp_path / "p")]
    assert len(losses) == 30 and sum(losses[-5:]) < 0.9 * sum(losses[:5])


def test_bf16_pretraining_tracks_fp32_and_keeps_float32_weights(tmp_path):
    runs = {}
    for precision in ("model", "bf16"):
        cfg = load_config(pretrain.PretrainConfig, None,
                          TOY + ["steps=30", f"out={tmp_path}/{precision}", f"precision={precision}"])
        pretrain.run_pretrain(cfg, progress=False)
        runs[precision] = [m["train/loss"] for m in read_metrics(tmp_path / precision)]
    fp32, bf16 = runs["model"], runs["bf16"]
    assert fp32 != bf16  # the bf16 run really multiplied in bf16
    assert sum(bf16[-5:]) < 0.9 * sum(bf16[:5])
    assert abs(sum(bf16[-5:]) - sum(fp32[-5:])) < 0.05 * sum(fp32[-5:])
    assert {p.dtype for p in load_model(tmp_path / "bf16" / "final").parameters()} == {torch.float32}


def test_compiled_pretraining_runs_compiled_to_the_eager_losses(tmp_path):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    runs = {}
    for compile_ in (False, True):
        cfg = load_config(pretrain.PretrainConfig, None,
                          TOY + ["steps=4", f"out={tmp_path}/{compile_}", f"compile={compile_}"])
        pretrain.run_pretrain(cfg, progress=False)
        runs[compile_] = [m["train/loss"] for m in read_metrics(tmp_path / str(compile_))]
    assert counters["stats"]["unique_graphs"] >= 1  # the compiled run went through dynamo
    assert runs[True] == pytest.approx(runs[False], rel=1e-4)


def test_bf16_pretraining_attends_eagerly_and_restores_the_models_attention():
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.train.precision import hf_training_attention

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    before = model.config._attn_implementation
    assert before != "eager"
    with hf_training_attention(model, "bf16"):
        assert model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == before
    with hf_training_attention(model, "model"):
        assert model.config._attn_implementation == before


def test_precision_names_are_checked():
    with pytest.raises(ConfigError, match="pretrain.precision"):
        load_config(pretrain.PretrainConfig, None, ["precision=fp8"])


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(True, False, "bf16"), (False, True, "bf16"),
                                                       (False, False, "model")])
def test_native_precision_follows_the_cpu(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert native_precision("cpu") == expected
    assert native_precision("meta") == "model"
    if not torch.cuda.is_available():
        assert native_precision("cuda") == "model"


def test_crashed_pretrain_resumes_to_the_same_model(tmp_path, monkeypatch):
    straight = load_config(pretrain.PretrainConfig, None, TOY + ["steps=6", f"out={tmp_path}/a"])
    pretrain.run_pretrain(straight, progress=False)

    crashed = load_config(pretrain.PretrainConfig, None, TOY + ["steps=6", f"out={tmp_path}/b"])
    real_step, calls = pretrain.clip_and_step, []

    def step_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # dies inside step 5: steps 1-4 logged, newest checkpoint is step 4
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(pretrain, "clip_and_step", step_then_die)
    with pytest.raises(KeyboardInterrupt):
        pretrain.run_pretrain(crashed, progress=False)
    monkeypatch.setattr(pretrain, "clip_and_step", real_step)
    pretrain.run_pretrain(crashed, resume=True, progress=False)

    assert read_metrics(tmp_path / "a") == read_metrics(tmp_path / "b")
    a, b = load_model(tmp_path / "a" / "final"), load_model(tmp_path / "b" / "final")
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name


def test_packing_encodes_in_one_batch_to_the_ids_of_one_document_at_a_time():
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS
    from rlvr.train.pretrain import pack

    docs = DOMAINS.get("math.word").corpus(0, 60) + DOMAINS.get("code.gen").corpus(0, 60)
    tok = train_tokenizer(docs, vocab_size=300)
    assert getattr(tok, "backend_tokenizer", None) is not None  # the batch path
    one_by_one = []
    for doc in docs:
        one_by_one += tok(doc, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rows = pack(tok, docs, 32)
    n = len(one_by_one) // 32
    assert rows.shape == (n, 32) and rows.flatten().tolist() == one_by_one[: n * 32]
