"""Any Hugging Face causal-LM directory: the stored dtype or a chosen one, remote code only when
opted in, a chat template supplied for a tokenizer without one, and one-line errors otherwise.
Runs on the lowest and the newest transformers of pyproject's range (`make test-compat`)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rlvr.errors import ConfigError, UserError
from rlvr.model.load import ModelLoadConfig, dtype_kwarg, load_model, load_model_and_tokenizer, load_tokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _copy(src: str, dst, *, dtype: torch.dtype | None = None):
    shutil.copytree(src, dst)
    if dtype is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(src, **{dtype_kwarg(): dtype})
        model.save_pretrained(dst)
    return dst


def test_auto_keeps_the_stored_dtype_and_a_choice_overrides_it(tiny_model_dir, tmp_path):
    bf16 = _copy(tiny_model_dir, tmp_path / "bf16", dtype=torch.bfloat16)
    assert next(load_model(bf16, options=ModelLoadConfig()).parameters()).dtype == torch.bfloat16
    assert next(load_model(tiny_model_dir, options=ModelLoadConfig()).parameters()).dtype == torch.float32
    for name, dtype in [("bf16", torch.bfloat16), ("float16", torch.float16), ("fp32", torch.float32)]:
        assert next(load_model(bf16, options=ModelLoadConfig(dtype=name)).parameters()).dtype == dtype
    assert next(load_model(bf16).parameters()).dtype == torch.float32  # without options: float32, as before


def test_auto_without_a_stored_dtype_is_float32_and_fp16_stays_fp16(tiny_model_dir, tmp_path):
    fp16 = _copy(tiny_model_dir, tmp_path / "fp16", dtype=torch.float16)
    assert next(load_model(fp16, options=ModelLoadConfig(dtype="auto")).parameters()).dtype == torch.float16
    config = json.loads((fp16 / "config.json").read_text())
    for key in ("dtype", "torch_dtype"):
        config.pop(key, None)
    (fp16 / "config.json").write_text(json.dumps(config))
    assert next(load_model(fp16, options=ModelLoadConfig()).parameters()).dtype == torch.float32


def test_the_dtype_keyword_argument_still_wins(tiny_model_dir, tmp_path):
    bf16 = _copy(tiny_model_dir, tmp_path / "bf16", dtype=torch.bfloat16)
    model = load_model(bf16, dtype=torch.float32, options=ModelLoadConfig(dtype="bf16"))
    assert next(model.parameters()).dtype == torch.float32


def test_dtype_choices_are_checked():
    with pytest.raises(ConfigError, match=r"config key 'model_load.dtype' = 'int8' is not allowed.*bf16"):
        ModelLoadConfig(dtype="int8")


@pytest.mark.parametrize("version, name", [("4.45.2", "torch_dtype"), ("4.55.4", "torch_dtype"), ("4.56.0", "dtype"),
                                           ("5.25.0", "dtype"), ("4.57.0.dev0", "dtype")])
def test_dtype_keyword_follows_the_transformers_version(version, name):
    assert dtype_kwarg(version) == name


def test_remote_code_is_refused_unless_opted_in(tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "remote")
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="needs its own Python code.*--trust-remote-code"):
        load_model(path)
    with pytest.raises(UserError, match="could not load a causal LM"):  # opted in: transformers tries the code
        load_model(path, options=ModelLoadConfig(trust_remote_code=True))


def test_a_tokenizer_with_its_own_code_is_refused_unless_opted_in(tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "remote_tok")
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    tok_cfg["auto_map"] = {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    with pytest.raises(UserError, match=r"tokenizer_config.json has auto_map.*--trust-remote-code "
                                        r"\(config key model_load.trust_remote_code\)"):
        load_tokenizer(path)


def test_a_tokenizer_without_a_chat_template_names_the_option(tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "plain")
    cfg_path = path / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(tok_cfg))
    for extra in ("chat_template.jinja", "chat_template.json"):
        (path / extra).unlink(missing_ok=True)
    with pytest.raises(UserError, match=r"no chat template; pass --chat-template FILE \(config key model_load.chat_template\)"):
        load_tokenizer(path)
    template_file = tmp_path / "template.jinja"
    template_file.write_text(TEMPLATE)
    for value in (str(template_file), TEMPLATE):
        tok = load_tokenizer(path, options=ModelLoadConfig(chat_template=value))
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
        assert text == f"<|user|>hi{tok.eos_token}<|assistant|>"
    with pytest.raises(UserError, match="model_load.chat_template.*no file"):
        load_tokenizer(path, options=ModelLoadConfig(chat_template=str(tmp_path / "missing.jinja")))


def test_a_given_chat_template_replaces_the_tokenizers_own(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir, options=ModelLoadConfig(chat_template=TEMPLATE))
    assert tok.chat_template == TEMPLATE


@pytest.mark.parametrize("damage, needle", [
    (lambda p: (p / "model.safetensors").write_bytes(b"not weights"), "could not load a causal LM"),
    (lambda p: (p / "config.json").unlink(), "has no config.json"),
    (lambda p: [f.unlink() for f in p.iterdir() if f.name.startswith(("tokenizer", "vocab", "chat_template", "special"))],
     "has no tokenizer files"),
    (lambda p: (p / "config.json").write_text(json.dumps({**json.loads((p / "config.json").read_text()),
                                                          "model_type": "no_such_arch"})), "could not load a causal LM"),
    (lambda p: (p / "model.safetensors").unlink(), "could not load a causal LM"),
    (lambda p: (p / "tokenizer.json").write_text("{not json"), "could not load the tokenizer"),
])
def test_broken_directories_are_one_line_errors(tiny_model_dir, tmp_path, damage, needle):
    path = _copy(tiny_model_dir, tmp_path / "broken")
    damage(path)
    with pytest.raises(UserError, match=needle) as info:
        load_model_and_tokenizer(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_the_cli_exits_2_with_one_line_naming_the_directory(tiny_model_dir, tmp_path, capsys):
    from rlvr.cli import main

    path = _copy(tiny_model_dir, tmp_path / "no_tokenizer")
    for f in path.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "chat_template", "special")):
            f.unlink()
    assert main(["eval", "--model", str(path), "--out", str(tmp_path / "eval.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlvr: error: ") and "\n" not in err and f"'{path}' has no tokenizer files" in err


def test_the_cli_flags_reach_the_stage_configs(tmp_path):
    from rlvr.cli import _load, build_parser
    from rlvr.train.grpo import GRPOConfig

    args = build_parser().parse_args(["train", "--dtype", "bf16", "--trust-remote-code", "--chat-template", "t.jinja",
                                      "--out", str(tmp_path)])
    cfg = _load(GRPOConfig, args)
    assert (cfg.model_load.dtype, cfg.model_load.trust_remote_code, cfg.model_load.chat_template) == ("bf16", True, "t.jinja")
