"""Load a causal LM and its tokenizer from a local Hugging Face directory.

What it does: checks the directory first and turns the usual mistakes (wrong path, a checkpoint
folder without ``config.json``, a hub id while offline, a tokenizer without a chat template, a
model that needs remote code) into one-line ``UserError``s that say what to do. Loading itself is
plain ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` with ``local_files_only=True``:
rlvr never downloads.

``ModelLoadConfig`` (config key ``model_load`` of the stages; CLI ``--dtype``,
``--trust-remote-code``, ``--chat-template``): the weights' dtype (``auto``: as stored in
``config.json``, float32 when it says nothing), ``trust_remote_code`` (an explicit opt-in; a
directory whose ``config.json`` has an ``auto_map`` is refused without it), and a chat template
for a tokenizer that has none (a Jinja file or the template text). The dtype goes to
``from_pretrained`` as ``dtype=`` on transformers >= 4.56 and ``torch_dtype=`` before
(``dtype_kwarg``), so the whole range in ``pyproject.toml`` loads the same way.

RoPE scaling (``model_load.rope_scaling``, the mapping of ``TinyModelConfig.rope_scaling``:
``linear`` / ``yarn`` / ``dynamic``; YaRN's ``original_max_positions`` defaults to the model's
own trained length): the directory's config is read, its RoPE parameters replaced (its
``rope_theta`` kept) and the model built from that config (``from_pretrained(config=...)``);
``max_position_embeddings`` becomes the trained length x ``factor`` unless
``model_load.max_positions`` sets it. The trained length is the config's
``original_max_position_embeddings`` where it has one, else its ``max_position_embeddings``. A
model whose config has no RoPE (GPT-2) or RoPE per layer type (Gemma 3) is refused.

Fallback: a tokenizer without a pad token gets its EOS token as pad (padding is always masked, so
the choice of id does not matter).

What it does not do: build the default model (``rlvr/model/tiny.py``) or read rlvr checkpoints'
trainer state (``rlvr/model/checkpoint.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlvr.config import check_choice, check_range
from rlvr.errors import ConfigError, UserError
from rlvr.model.tiny import check_rope_scaling, hf_rope_parameters

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
CHAT_TEMPLATE_OPTION = "pass --chat-template FILE (config key model_load.chat_template)"


@dataclass
class ModelLoadConfig:
    """How a user's model directory is loaded (config key ``model_load``)."""

    dtype: str = "auto"
    """auto (the dtype stored in config.json, float32 if none) | float32 | bfloat16 | float16 (or fp32, bf16, fp16)."""
    trust_remote_code: bool = False
    """Run the model directory's own Python code (config.json auto_map); off unless you opt in."""
    chat_template: str = ""
    """A Jinja chat template (a file path or the template text) for a tokenizer that has none."""
    rope_scaling: dict | None = None
    """Override the model's RoPE scaling (None: as saved): {type: linear, factor: F} | {type: yarn,
    factor: F, [original_max_positions, beta_fast, beta_slow, attention_factor]} | {type: dynamic, factor: F}."""
    max_positions: int = 0
    """With rope_scaling: the model's max_position_embeddings (0: its trained length x factor)."""

    def __post_init__(self) -> None:
        check_choice("model_load.dtype", self.dtype, ["auto", *DTYPES])
        check_range("model_load.max_positions", self.max_positions, 0)
        if self.rope_scaling is not None:
            self.rope_scaling = check_rope_scaling("model_load.rope_scaling", self.rope_scaling, require_original=False)
        elif self.max_positions:
            raise ConfigError("config key 'model_load.max_positions' only applies with model_load.rope_scaling")


def dtype_kwarg(version: str = transformers.__version__) -> str:
    """The name ``from_pretrained`` takes the dtype under: ``dtype`` from transformers 4.56 on
    (``torch_dtype`` deprecated there), ``torch_dtype`` before."""
    major, minor = (int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _stored_dtype(p: Path) -> torch.dtype:
    try:
        config = json.loads((p / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"model directory '{p}': config.json is not readable JSON: {e}") from None
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return DTYPES.get(str(name).replace("torch.", ""), torch.float32)


def resolve_dtype(p: Path, options: ModelLoadConfig | None, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    name = options.dtype if options is not None else "float32"
    return _stored_dtype(p) if name == "auto" else DTYPES[name]


def _check_remote_code(p: Path, options: ModelLoadConfig | None, file: str = "config.json") -> bool:
    """Whether to pass ``trust_remote_code=True``; refuses a directory whose ``file`` has an
    ``auto_map`` (its own Python code) unless the user opted in."""
    trust = bool(options and options.trust_remote_code)
    try:
        needs = "auto_map" in json.loads((p / file).read_text())
    except (OSError, ValueError, TypeError):
        needs = False
    if needs and not trust:
        raise UserError(f"model directory '{p}' needs its own Python code ({file} has auto_map); if you "
                        "trust it, pass --trust-remote-code (config key model_load.trust_remote_code)")
    return trust


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


_FIX = "run `rlvr pretrain` to build the default model, or pass a Hugging Face causal-LM directory"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _check_model_dir(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise UserError(f"model directory '{p}' does not exist; {_FIX}")
    if not p.is_dir():
        raise UserError(f"model path '{p}' is a file, not a directory; {_FIX}")
    if not (p / "config.json").is_file():
        raise UserError(f"model directory '{p}' has no config.json, so it is not a Hugging Face model directory; {_FIX}")
    return p


def pretrained_kwargs(path: str | Path, options: ModelLoadConfig | None = None,
                      dtype: torch.dtype | None = None) -> tuple[Path, dict]:
    """A checked model directory and the ``from_pretrained`` keyword arguments that load it as
    ``load_model`` does (dtype, local files only, remote code when opted in); for other Auto
    classes (the PPO critic's ``AutoModelForTokenClassification``)."""
    p = _check_model_dir(path)
    kwargs = {dtype_kwarg(): resolve_dtype(p, options, dtype), "local_files_only": True}
    if _check_remote_code(p, options):
        kwargs["trust_remote_code"] = True
    if options is not None and options.rope_scaling is not None:
        try:
            config = AutoConfig.from_pretrained(p, **{k: v for k, v in kwargs.items() if k != dtype_kwarg()})
        except Exception as e:
            raise UserError(f"could not read the config of '{p}': {_first_line(e)}") from e
        apply_rope_scaling(config, options.rope_scaling, options.max_positions, where=str(p))
        kwargs["config"] = config
    return p, kwargs


def apply_rope_scaling(config, scaling: dict, max_positions: int = 0, where: str = "the model") -> None:
    """Replace ``config``'s RoPE scaling with the checked ``scaling`` (``check_rope_scaling``),
    keeping its ``rope_theta``, and set ``max_position_embeddings`` to ``max_positions`` (0: the
    trained length x factor). Raises ``UserError`` for a config without one global RoPE."""
    what = f"config key 'model_load.rope_scaling': model '{where}' ({getattr(config, 'model_type', '?')})"
    trained = getattr(config, "max_position_embeddings", None)
    if not isinstance(trained, int):
        raise UserError(f"{what} has no max_position_embeddings")
    rope = getattr(config, "rope_parameters", None)
    if rope is not None or not hasattr(config, "rope_scaling"):  # transformers 5 (or a config without RoPE)
        if not isinstance(rope, dict) or not rope or "rope_theta" not in rope:
            kind = "RoPE per layer type" if isinstance(rope, dict) and rope else "no rotary position embedding"
            raise UserError(f"{what} has {kind}; RoPE scaling applies to models with one global RoPE (Llama family)")
        theta = rope["rope_theta"]
    else:  # transformers 4: rope_theta beside rope_scaling
        rope = getattr(config, "rope_scaling", None) or {}
        theta = getattr(config, "rope_theta", None)
        if theta is None:
            raise UserError(f"{what} has no rotary position embedding; RoPE scaling applies to the Llama family")
    trained = getattr(config, "original_max_position_embeddings", None) or rope.get(
        "original_max_position_embeddings") or trained
    params = hf_rope_parameters(scaling, float(theta), original=trained)
    base = params.get("original_max_position_embeddings", trained)
    config.max_position_embeddings = int(max_positions or round(base * scaling["factor"]))
    if hasattr(config, "original_max_position_embeddings"):  # Phi-3 keeps it beside the RoPE dict
        config.original_max_position_embeddings = base
    if hasattr(config, "rope_parameters") and getattr(config, "rope_parameters", None) is not None:
        config.rope_parameters = params
    else:
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        config.rope_scaling = rest


def load_model(path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
               options: ModelLoadConfig | None = None) -> PreTrainedModel:
    """Load a causal LM from a local directory on ``device``, in eval mode, in ``dtype`` if given,
    else as ``options.dtype`` says (default without options: float32). A LoRA adapter directory
    (``adapter_config.json``, no ``config.json``; ``lora.save: adapter``) loads as its recorded
    base model with the adapter merged in (``rlvr.model.lora``)."""
    from rlvr.model.lora import adapter_base, is_adapter_dir, load_adapter_dir

    if Path(path).is_dir() and is_adapter_dir(path):
        base = load_model(adapter_base(path), dtype=dtype, device=device, options=options)
        return load_adapter_dir(base, path).to(device).eval()
    p, kwargs = pretrained_kwargs(path, options, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(p, **kwargs)
    except Exception as e:  # missing/corrupt weights (safetensors' own errors too), unknown architecture
        raise UserError(f"could not load a causal LM from '{p}': {_first_line(e)}") from e
    return model.to(device).eval()


def load_tokenizer(path: str | Path, *, require_chat_template: bool = True,
                   options: ModelLoadConfig | None = None) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in a local model directory.

    Raises ``UserError`` when there is none, when it has no EOS token, or (unless
    ``require_chat_template=False``, e.g. for pretraining) when it has no chat template.
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"model directory '{p}' does not exist; {_FIX}")
    if not p.is_dir():
        raise UserError(f"model path '{p}' is a file, not a directory; {_FIX}")
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise UserError(f"model directory '{p}' has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); save the tokenizer next to the model")
    trust = _check_remote_code(p, options, "tokenizer_config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True, **({"trust_remote_code": True} if trust else {}))
    except Exception as e:  # corrupt tokenizer.json (the tokenizers library raises plain Exception), bad config
        raise UserError(f"could not load the tokenizer from '{p}': {_first_line(e)}") from e
    if tokenizer.eos_token_id is None:
        raise UserError(f"the tokenizer in '{p}' has no eos token; set `eos_token` in its tokenizer_config.json")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if options is not None and options.chat_template:
        tokenizer.chat_template = _template_text(options.chat_template)
    if require_chat_template and not tokenizer.chat_template:
        raise UserError(f"the tokenizer in '{p}' has no chat template; {CHAT_TEMPLATE_OPTION}, or use "
                        "an instruct/chat model")
    return tokenizer


def _template_text(value: str) -> str:
    """A chat template given as a file path or as the template text itself (text when it has a
    Jinja tag or expression and names no existing file)."""
    path = Path(value).expanduser()
    try:
        is_file = "\n" not in value and path.is_file()
    except OSError:  # e.g. a long template text is not a valid file name
        is_file = False
    if is_file:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"config key 'model_load.chat_template': cannot read {path}: {_first_line(e)}") from None
    if "{{" in value or "{%" in value:
        return value
    raise UserError(f"config key 'model_load.chat_template': no file {path} (and not a Jinja template text)")


def load_model_and_tokenizer(
    path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
    options: ModelLoadConfig | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``load_model`` and ``load_tokenizer`` from the same directory (the tokenizer first: a
    missing tokenizer or chat template is found before the weights are read)."""
    tokenizer = load_tokenizer(path, options=options)
    return load_model(path, dtype=dtype, device=device, options=options), tokenizer
