"""rlvr.model: tokenizer (roundtrip, digits, chat template), tiny model, loading, checkpoints."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.errors import ConfigError, UserError
from rlvr.model.checkpoint import (
    checkpoint_problem,
    latest_checkpoint,
    load_trainer_state,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    save_model_dir,
    set_rng_state,
)
from rlvr.model.load import load_model, load_model_and_tokenizer, load_tokenizer
from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.model.tokenizer import CHAT_TEMPLATE, encode_chat_prompt, encode_completion, train_tokenizer

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _corpus(n: int = 300) -> list[str]:
    rng = random.Random(0)
    names = ["Tom", "Ann", "Lee", "Mia"]
    docs = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        docs.append(f"Compute: {a} + {b}\nThe answer is {a + b}.")
        docs.append(f"{rng.choice(names)} has {a} apples and buys {b} more. How many apples now?\n{a + b}")
    return docs


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(_corpus(), vocab_size=400)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(SMALL, tok, seed=0)


TEXTS = [
    "Compute: 12 + 345\nThe answer is 357.",
    "  leading spaces,\n\n\ttabs and trailing  \n",
    "Tom has 1000000 apples; héllo wörld 😀 (x*y)/z = 0.25",
    "",
]


# ---------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_roundtrip_is_exact(tok, text):
    assert tok.decode(tok(text)["input_ids"]) == text


def test_digits_are_single_tokens(tok):
    ids = tok("Compute: 1234567890 + 98765\n55 apples")["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    for piece in pieces:
        if any(ch.isdigit() for ch in piece):
            assert len(piece) == 1, f"token {piece!r} mixes a digit with other characters"
    assert sum(p.isdigit() for p in pieces) == 17


def test_no_automatic_special_tokens_and_specials(tok):
    assert tok("hi")["input_ids"] == tok("hi", add_special_tokens=False)["input_ids"]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|end|>", "<|pad|>")
    for role in ("system", "user", "assistant", "tool"):
        assert len(tok(f"<|{role}|>")["input_ids"]) == 1


def test_chat_template_renders_exactly(tok):
    messages = [{"role": "user", "content": "Compute: 2 + 3"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|user|>\nCompute: 2 + 3<|end|>\n<|assistant|>\n"
    ids = encode_chat_prompt(tok, messages)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.chat_template == CHAT_TEMPLATE


def test_prompt_plus_completion_is_the_rendered_conversation(tok):
    """A training example (prompt ids + completion ids) is the conversation as the template renders it."""
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute: 2 + 3"}]
    completion = encode_completion(tok, "The answer is 5.")
    assert completion[-1] == tok.eos_token_id
    full = tok.apply_chat_template(prompt + [{"role": "assistant", "content": "The answer is 5."}], tokenize=False)
    assert tok.decode(encode_chat_prompt(tok, prompt) + completion) + "\n" == full


def test_tokenizer_save_and_reload(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for text in TEXTS:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "Compute: 2 + 3"}]
    assert encode_chat_prompt(again, messages) == encode_chat_prompt(tok, messages)
    assert again.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(messages, tokenize=False)
    assert (again.bos_token_id, again.eos_token_id, again.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
    )


def test_vocab_too_small_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


# ---------------------------------------------------------------- tiny model


def test_default_config_size_and_special_ids(tok):
    m = build_tiny_model(TinyModelConfig(), tok, seed=0)
    n = sum(p.numel() for p in m.parameters())
    assert 0.5e6 < n < 1.5e6
    assert m.config.vocab_size == len(tok)
    assert (m.config.bos_token_id, m.config.eos_token_id, m.config.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
    )
    assert m.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|end|>")


def test_build_is_deterministic_and_leaves_global_rng_alone(tok):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model(SMALL, tok, seed=7)
    assert torch.equal(torch.rand(1), before)
    b = build_tiny_model(SMALL, tok, seed=7)
    c = build_tiny_model(SMALL, tok, seed=8)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_config_validation():
    with pytest.raises(ConfigError, match="divisible"):
        TinyModelConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ConfigError, match="model.num_layers"):
        TinyModelConfig(num_layers=0)


def test_save_model_dir_reloads_with_plain_transformers(model, tok, tmp_path):
    out = tmp_path / "final"
    save_model_dir(out, model, tok)
    save_model_dir(out, model, tok)  # replacing an existing directory works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temp dirs left
    again = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    ids = torch.tensor([encode_chat_prompt(tok, [{"role": "user", "content": "Compute: 2 + 3"}])])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert again.generation_config.eos_token_id == tok.eos_token_id
    m2, t2 = load_model_and_tokenizer(out)
    assert not m2.training and t2.chat_template == CHAT_TEMPLATE


def test_missing_model_dir_is_a_user_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(UserError, match="does not exist.*rlvr pretrain"):
        load_model(missing)
    with pytest.raises(UserError, match=str(missing)):
        load_model_and_tokenizer(missing)
    with pytest.raises(UserError, match="no config.json"):
        load_model(tmp_path)


def test_tokenizer_without_chat_template_is_a_user_error(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    os.remove(tmp_path / "chat_template.jinja")
    with pytest.raises(UserError, match="no chat template"):
        load_tokenizer(tmp_path)
    assert load_tokenizer(tmp_path, require_chat_template=False).eos_token == "<|end|>"


# ---------------------------------------------------------------- checkpoints


def test_checkpoints_latest_state_and_prune(model, tok, tmp_path):
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 2, model, tok, {"step": 2})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"step": 10, "optimizer": opt.state_dict(), "metrics": {"reward": [0.5, 0.75]}}
    ckpt = save_checkpoint(tmp_path, 10, model, tok, state)
    assert ckpt == tmp_path / "checkpoints" / "step_10" and (ckpt / "COMPLETE").is_file()
    # Debris of a crash: a temp dir and a step dir without the marker (higher steps) are ignored.
    (tmp_path / "checkpoints" / ".tmp-step_30-deadbeef").mkdir()
    (tmp_path / "checkpoints" / "step_20").mkdir()
    assert latest_checkpoint(tmp_path) == ckpt
    loaded = load_trainer_state(ckpt)
    assert loaded["step"] == 10 and loaded["metrics"] == {"reward": [0.5, 0.75]}
    assert loaded["optimizer"]["param_groups"][0]["lr"] == 1e-3
    assert AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True).config.vocab_size == len(tok)

    save_checkpoint(tmp_path, 12, model, tok, {"step": 12})
    prune_checkpoints(tmp_path, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_10", "step_12", "step_20"]  # oldest complete + temp dir removed


def test_resaving_a_step_replaces_it(model, tok, tmp_path):
    save_checkpoint(tmp_path, 5, model, tok, {"v": 1})
    save_checkpoint(tmp_path, 5, model, tok, {"v": 2})
    assert load_trainer_state(latest_checkpoint(tmp_path))["v"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_5"]


def test_failed_save_leaves_no_checkpoint(model, tok, tmp_path):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(tmp_path, 3, model, tok, {"bad": Unpicklable()})
    assert latest_checkpoint(tmp_path) is None
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_rng_state_roundtrip(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(3))
    torch.save(state, tmp_path / "rng.pt")  # survives serialisation like a checkpoint does
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=False))
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1] and torch.equal(first[2], second[2])


@pytest.mark.parametrize("damage", ["truncated", "flipped", "missing", "manifest"])
def test_a_damaged_checkpoint_is_skipped_with_one_line_and_the_previous_one_used(model, tok, tmp_path, capsys,
                                                                                 damage):
    good = save_checkpoint(tmp_path, 1, model, tok, {"step": 1})
    bad = save_checkpoint(tmp_path, 2, model, tok, {"step": 2})
    assert checkpoint_problem(good) is None and checkpoint_problem(bad) is None
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":  # same size, one byte changed
        weights.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "missing":
        (bad / "trainer_state.pt").unlink()
    else:
        (bad / "MANIFEST.json").write_text("{not json")
    capsys.readouterr()  # (the saves' progress bars)
    assert latest_checkpoint(tmp_path) == good
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "using the one before it" in err[0], err
    assert {"truncated": "model.safetensors has", "flipped": "model.safetensors changed", "missing":
            "trainer_state.pt is missing", "manifest": "MANIFEST.json is unreadable"}[damage] in err[0]


def test_a_checkpoint_without_a_manifest_is_trusted_and_the_manifest_lists_every_file(model, tok, tmp_path):
    ckpt = save_checkpoint(tmp_path, 3, model, tok, {"step": 3}, extra=lambda d: (d / "critic").mkdir()
                           or (d / "critic" / "w.bin").write_bytes(b"x" * 10))
    listed = json.loads((ckpt / "MANIFEST.json").read_text())["files"]
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()} - {"COMPLETE", "MANIFEST.json"}
    assert set(listed) == on_disk and listed["critic/w.bin"]["bytes"] == 10  # sub-directories too
    (ckpt / "MANIFEST.json").unlink()  # as written before manifests existed
    assert latest_checkpoint(tmp_path) == ckpt
