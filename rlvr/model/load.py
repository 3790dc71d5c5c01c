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
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlvr.config import check_choice
from rlvr.errors import UserError

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

    def __post_init__(self) -> None:
        check_choice("model_load.dtype", self.dtype, ["auto", *DTYPES])


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
    return p, kwargs


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
