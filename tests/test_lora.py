"""LoRA (``rlvr.model.lora``) in SFT, DPO and GRPO on the tiny model: only the adapters train, the
reference is the model with adapters off, the engine samples from the merged weights, ``final/``
is a plain merged model or an adapter peft loads, and a resumed run continues exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_dpo import arithmetic_pairs
from test_grpo import _cfg, digits, killed_at_rollout, without_times  # noqa: F401  (digits: the autouse fixture registering test.digits)

import rlvr.model.load as load_module
import rlvr.tasks  # noqa: F401
import rlvr.train.policy as policy_module
from rlvr.config import from_dict, load_config
from rlvr.errors import ConfigError
from rlvr.model.load import load_model, load_model_and_tokenizer
from rlvr.model.logprobs import sequence_logprobs
from rlvr.model.lora import (
    LoraConfig,
    adapters_off,
    apply_lora,
    is_adapter_dir,
    lora_layers,
    sampling_weights,
    trainable_count,
)
from rlvr.monitor.metrics import read_metrics
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.train import dpo, grpo, sft


def _ids(tok, n=3, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, len(tok) - 1, (n, length), generator=g)


def _adapted(tiny_model_dir, seed=0, **cfg):
    """The tiny model with LoRA adapters whose B is random (a non-zero update), and its tokenizer."""
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    peft_model = apply_lora(model, LoraConfig(enabled=True, r=4, **cfg), base_path=tiny_model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(peft_model):
            w = layer.lora_B["default"].weight
            w.copy_(torch.randn(w.shape, generator=g) * 0.2)
    return peft_model, tok


def _base_weights_of(peft_model) -> dict[str, torch.Tensor]:
    """The base model's weights as saved names (LoRA's ``base_layer`` folded back), cloned."""
    out = {}
    for name, p in peft_model.get_base_model().named_parameters():
        if "lora_" not in name:
            out[name.replace(".base_layer", "")] = p.detach().clone()
    return out


def _adapter_weights(peft_model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}


def test_config_keys_are_checked_by_name(tiny_model_dir, tmp_path):
    for bad, key in [({"r": 0}, "lora.r"), ({"alpha": 0}, "lora.alpha"), ({"save": "both"}, "lora.save"),
                     ({"target_modules": []}, "lora.target_modules"), ({"dropout": 1.5}, "lora.dropout"),
                     ({"target_modules": ["lm_head"]}, "lora.target_modules")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            LoraConfig(enabled=True, **bad)
    with pytest.raises(ConfigError, match=r"lora\.enabled.*rollout\.engine: remote"):  # rlvr.train.compat
        _cfg(tiny_model_dir, tmp_path, **{"lora.enabled": "true", "rollout.engine": "remote",
                                          "rollout.remote.base_url": "http://127.0.0.1:1"})
    model, _ = load_model_and_tokenizer(tiny_model_dir)
    with pytest.raises(ConfigError, match="lora.target_modules"):
        apply_lora(model, LoraConfig(enabled=True, target_modules=["no_such_proj"]))


def test_only_adapters_train_adapters_off_is_the_base_and_sampling_uses_merged_weights(tiny_model_dir):
    base = load_model(tiny_model_dir)
    peft_model, tok = _adapted(tiny_model_dir)
    model = peft_model.get_base_model()
    trainable, total = trainable_count(model)
    assert 0 < trainable < total / 5
    assert all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())
    assert {n.split(".")[-1] for n, _ in model.named_modules() if n.endswith("_proj")} >= {"q_proj", "down_proj"}
    assert not any("lm_head" in n and "lora_" in n for n, _ in model.named_parameters())  # all-linear spares the head
    ids = _ids(tok)
    with torch.no_grad():
        want = base(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
        with adapters_off(peft_model) as ref:
            off = ref(input_ids=ids).logits
    assert torch.equal(off, want)  # the reference: bit for bit the base model
    assert (adapted - want).abs().max() > 1e-2  # the adapters do change the model
    before = _base_weights_of(peft_model)
    with sampling_weights(peft_model) as merged:
        with torch.no_grad():
            assert torch.allclose(merged(input_ids=ids).logits, adapted, atol=1e-4)
        out = generate(merged, ids[:, :5].tolist(), SamplingParams(max_new_tokens=8, n=2),
                       pad_token_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    after = _base_weights_of(peft_model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # restored bit for bit
    # the engine's sampling log-probs (fast decoder on the merged weights) = the adapted training forward
    for c in out:
        seq = torch.tensor([ids[c.prompt_index, :5].tolist() + list(c.token_ids)])
        with torch.no_grad():
            lp = sequence_logprobs(model, seq, torch.ones_like(seq))[0, 5:]
        assert torch.allclose(lp, torch.tensor(c.logprobs), atol=1e-4)


def test_sft_lora_trains_the_adapter_only_and_saves_an_adapter_peft_loads(tiny_model_dir, tmp_path, monkeypatch):
    from peft import PeftModel

    captured = {}
    real_save = policy_module.save_final  # what SFT's Policy.save_final calls

    def capture(directory, peft_model, tokenizer, cfg):
        captured.update(base=_base_weights_of(peft_model), adapter=_adapter_weights(peft_model))
        return real_save(directory, peft_model, tokenizer, cfg)

    monkeypatch.setattr(policy_module, "save_final", capture)
    out = tmp_path / "sft"
    cfg = load_config(sft.SFTConfig, None, [f"model={tiny_model_dir}", f"out={out}", "train_tasks=64", "steps=30",
                                            "batch_size=16", "log_every=1", "optim.lr=5e-2", "optim.warmup_steps=0",
                                            "lora.enabled=true", "lora.r=8", "lora.save=adapter"])
    sft.run_sft(cfg, progress=False)
    losses = [m["train/loss"] for m in read_metrics(out)]
    # The random tiny model's frozen LM head and final norm bound its logits near uniform (loss ~ ln V),
    # so the adapters can only move the loss a little: it must fall, not by much.
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.05, losses
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    assert all(torch.equal(original[k], captured["base"][k]) for k in original)  # base weights unchanged
    assert all(captured["adapter"][k].abs().max() > 0 for k in captured["adapter"] if "lora_B" in k)  # B starts at 0
    final = out / "final"
    assert is_adapter_dir(final) and not (final / "model.safetensors").exists()
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        str(Path(tiny_model_dir).resolve())
    model, tok = load_model_and_tokenizer(final)  # rlvr: the base with the adapter merged in
    peft_loaded = PeftModel.from_pretrained(load_model(tiny_model_dir), str(final))  # peft's own loader
    ids = _ids(tok)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, peft_loaded(input_ids=ids).logits, atol=1e-4)
        assert not torch.allclose(model(input_ids=ids).logits, load_model(tiny_model_dir)(input_ids=ids).logits,
                                  atol=1e-3)


def test_dpo_lora_reference_is_adapters_off_and_final_is_merged(tiny_model_dir, tmp_path, monkeypatch):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl")
    loads, captured = [], {"ids": _ids(load_model_and_tokenizer(tiny_model_dir)[1])}
    real_load, real_save = load_model_and_tokenizer, policy_module.save_final
    real_model = load_module.load_model
    monkeypatch.setattr(load_module, "load_model", lambda *a, **k: loads.append(a) or real_model(*a, **k))

    def capture(directory, peft_model, tokenizer, cfg):
        captured.update(base=_base_weights_of(peft_model), adapter=_adapter_weights(peft_model))
        with torch.no_grad():
            captured["logits"] = peft_model.get_base_model()(input_ids=captured["ids"]).logits
        return real_save(directory, peft_model, tokenizer, cfg)

    monkeypatch.setattr(policy_module, "save_final", capture)
    data = {"model": tiny_model_dir, "pair_files": [pairs], "out": str(tmp_path / "run"), "batch_size": 4,
            "epochs": 4, "log_every": 1, "checkpoint_every": 100, "optim": {"lr": 1e-2, "warmup_steps": 0},
            "lora": {"enabled": True, "r": 8}}
    dpo.run_dpo(from_dict(dpo.DPOConfig, data), progress=False)
    assert len(loads) == 1  # the policy only: the reference is the same model with adapters off
    steps = read_metrics(tmp_path / "run")
    first = steps[0]
    assert abs(first["train/rewards/margin"]) < 1e-5  # adapters start at 0: policy == reference
    assert len(steps) == 16
    # the reference log-probs are the base model's, as a separately loaded reference computes them
    model, tok = real_load(tiny_model_dir)
    rows, _ = dpo.encode_pairs(tok, dpo.load_pairs(pairs), None)
    ref = torch.load(tmp_path / "run" / dpo.REFERENCE_FILE)["logps"]
    assert torch.allclose(ref, dpo._logps_of(model.eval(), rows, tok.pad_token_id, 4), atol=1e-5)
    # the trained policy prefers the chosen answers more than the reference does, on most pairs
    # (the per-step batch margins of this random model's bounded logits are too noisy to compare)
    final = load_model(tmp_path / "run" / "final")
    policy = dpo._logps_of(final, rows, tok.pad_token_id, 4)
    margins = (policy[:, 0] - ref[:, 0]) - (policy[:, 1] - ref[:, 1])
    assert margins.mean() > 0.2 and (margins > 0).float().mean() >= 0.6, margins
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    assert all(torch.equal(original[k], captured["base"][k]) for k in original)
    assert all(v.abs().max() > 0 for k, v in captured["adapter"].items() if "lora_B" in k)
    # final/: merged, a plain transformers directory with the adapted model's logits
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=captured["ids"]).logits, captured["logits"], atol=1e-4)


def _grpo_cfg(model_dir, out, **extra):
    return _cfg(model_dir, out, **{"lora.enabled": "true", "lora.r": 8, "optim.lr": 3e-2, "algo.kl_coef": 0.05,
                                   **extra})


def test_grpo_lora_samples_merged_weights_kl_from_adapters_off_final_merged(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    loads = []
    real_load, real_model = policy_module.load_model_and_tokenizer, load_module.load_model
    monkeypatch.setattr(load_module, "load_model", lambda *a, **k: loads.append(a) or real_model(*a, **k))
    out = tmp_path / "run"
    grpo.run_grpo(_grpo_cfg(tiny_model_dir, out, steps=8, checkpoint_every=8), progress=False)
    assert len(loads) == 1  # no reference model: the KL reference is the policy with adapters off
    metrics = read_metrics(out)
    assert max(m["rollout/logprob_mismatch_kl"] for m in metrics) < 1e-8  # engine (merged) == training forward
    assert metrics[0]["train/kl"] == pytest.approx(0.0, abs=1e-7)  # adapters start at 0: policy == reference
    assert metrics[-1]["train/kl"] > 1e-6
    # (no reward-rise check: the random tiny model's frozen LM head and final norm bound how far
    # adapters can move its logits, so 8 steps of reward are noise; test_grpo checks it for full FT)
    ckpt = out / "checkpoints" / "step_8"  # the adapter at the last step: the same weights as final/
    assert is_adapter_dir(ckpt) and (ckpt / "trainer_state.pt").exists()
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(load_model(tiny_model_dir), str(ckpt))
    merged = AutoModelForCausalLM.from_pretrained(out / "final")
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    base_now = _base_weights_of(adapted)
    assert all(torch.equal(original[k], base_now[k]) for k in original)
    ids = _ids(real_load(tiny_model_dir)[1])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-4)
        assert not torch.allclose(merged(input_ids=ids).logits, load_model(tiny_model_dir)(input_ids=ids).logits,
                                  atol=1e-3)


def test_killed_grpo_lora_run_resumes_to_same_metrics(tiny_model_dir, tmp_path, monkeypatch):
    straight = _grpo_cfg(tiny_model_dir, tmp_path / "straight", steps=4)
    grpo.run_grpo(straight, progress=False)
    crashed = _grpo_cfg(tiny_model_dir, tmp_path / "crashed", steps=4)
    killed_at_rollout(crashed, monkeypatch, 3)  # step 4 starts: the newest checkpoint is step 2
    grpo.run_grpo(crashed, resume=True, progress=False)
    a, b = without_times(read_metrics(tmp_path / "straight")), without_times(read_metrics(tmp_path / "crashed"))
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    fa, fb = load_file(tmp_path / "straight/final/model.safetensors"), load_file(tmp_path / "crashed/final/model.safetensors")
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


def test_bf16_base_keeps_float32_adapters_and_the_fast_decoder_samples_it(tiny_model_dir):
    from rlvr.rollout.decoder import unsupported_reason

    model = load_model(tiny_model_dir, dtype=torch.bfloat16)
    peft_model = apply_lora(model, LoraConfig(enabled=True, r=4))
    adapters = {n: p for n, p in peft_model.named_parameters() if "lora_" in n}
    assert {p.dtype for p in adapters.values()} == {torch.float32}  # peft's default: trainable in fp32
    with sampling_weights(peft_model) as merged:
        assert unsupported_reason(merged) is None  # one dtype while sampling: the fast path
    assert all(p.dtype == torch.float32 for p in adapters.values())


def test_real_model_recipe_parses_and_its_parameter_counts_are_right():
    """configs/real_model_lora.yaml resolves, and the counts its memory comments are computed from
    (Qwen2.5-0.5B's shape, built on the meta device: no weights) are what peft creates."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlvr.config import read_yaml

    cfg = from_dict(grpo.GRPOConfig, read_yaml(Path(__file__).resolve().parents[1] / "configs" / "real_model_lora.yaml"))
    assert cfg.lora.enabled and cfg.model_load.dtype == "bfloat16" and cfg.device == "cuda"
    shape = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 494.0
    peft_model = apply_lora(model, cfg.lora)
    trainable, _ = trainable_count(peft_model)
    assert round(trainable / 1e6, 2) == 8.80


def test_killed_dpo_lora_run_resumes_from_its_adapter_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl", n=8)

    def cfg(out):
        return from_dict(dpo.DPOConfig, {"model": tiny_model_dir, "pair_files": [pairs], "out": str(out),
                                         "batch_size": 2, "epochs": 1, "log_every": 1, "checkpoint_every": 2,
                                         "optim": {"lr": 1e-2, "warmup_steps": 0}, "lora": {"enabled": True, "r": 4}})

    dpo.run_dpo(cfg(tmp_path / "a"), progress=False)
    real_step, calls = dpo.clip_and_step, []

    def step_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # dies inside step 4: the newest checkpoint is step 2
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(dpo, "clip_and_step", step_then_die)
    with pytest.raises(KeyboardInterrupt):
        dpo.run_dpo(cfg(tmp_path / "b"), progress=False)
    assert is_adapter_dir(tmp_path / "b" / "checkpoints" / "step_2")
    monkeypatch.setattr(dpo, "clip_and_step", real_step)
    dpo.run_dpo(cfg(tmp_path / "b"), resume=True, progress=False)
    assert read_metrics(tmp_path / "a") == read_metrics(tmp_path / "b")
    a, b = load_file(tmp_path / "a/final/model.safetensors"), load_file(tmp_path / "b/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("save", ["merged", "adapter"])
def test_cli_train_with_lora_evaluates_during_and_after_and_eval_reads_final(tiny_model_dir, tmp_path, save):
    from test_bring_your_own import FAST, qa_rows, write_csv

    from rlvr.cli import main

    train, held_out = write_csv(tmp_path / "train.csv", qa_rows(1, 8)), write_csv(tmp_path / "eval.csv", qa_rows(40, 3))
    run = tmp_path / "run"
    files = ["--map", "prompt=question", "--verifier", "number"]
    assert main(["train", "--model", tiny_model_dir, "--tasks", train, "--eval-tasks", held_out, *files, "--out", str(run),
                 *FAST, "--set", "eval.max_new_tokens=4", "--set", "eval_every=1", "--set", "lora.enabled=true",
                 "--set", f"lora.save={save}"]) == 0
    assert (run / "eval" / "step_1.json").exists() and (run / "eval" / "final.json").exists()
    assert is_adapter_dir(run / "final") == (save == "adapter")
    assert main(["eval", "--model", str(run / "final"), "--tasks", held_out, *files, "--out", str(tmp_path / "e.json"),
                 "--set", "max_new_tokens=4", "--no-radar"]) == 0
