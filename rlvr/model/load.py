"""Load a causal LM and its tokenizer from a local Hugging Face directory.

What it does: checks the directory first and turns the usual mistakes (wrong path, a checkpoint
folder without ``config.json``, a hub id while offline, a tokenizer without a chat template) into
one-line ``UserError``s that say what to do. Loading itself is plain ``AutoModelForCausalLM`` /
``AutoTokenizer.from_pretrained`` with ``local_files_only=True``: rlvr never downloads.

Fallback: a tokenizer without a pad token gets its EOS token as pad (padding is always masked, so
the choice of id does not matter).

What it does not do: build the default model (``rlvr/model/tiny.py``) or read rlvr checkpoints'
trainer state (``rlvr/model/checkpoint.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlvr.errors import UserError

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


def load_model(path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> PreTrainedModel:
    """Load a causal LM from a local directory, in ``dtype`` on ``device``, in eval mode."""
    p = _check_model_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:  # missing/corrupt weights, unknown architecture
        raise UserError(f"could not load a causal LM from '{p}': {e}") from e
    return model.to(device).eval()


def load_tokenizer(path: str | Path, *, require_chat_template: bool = True) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in a local model directory.

    Raises ``UserError`` when there is none, when it has no EOS token, or (unless
    ``require_chat_template=False``, e.g. for pretraining) when it has no chat template.
    """
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"model directory '{p}' does not exist; {_FIX}")
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise UserError(f"model directory '{p}' has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); save the tokenizer next to the model")
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UserError(f"could not load the tokenizer from '{p}': {e}") from e
    if tokenizer.eos_token_id is None:
        raise UserError(f"the tokenizer in '{p}' has no eos token; set `eos_token` in its tokenizer_config.json")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if require_chat_template and not tokenizer.chat_template:
        raise UserError(
            f"the tokenizer in '{p}' has no chat template; use an instruct/chat model, or add a "
            "`chat_template` (e.g. a chat_template.jinja file) to the directory"
        )
    return tokenizer


def load_model_and_tokenizer(
    path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``load_model`` and ``load_tokenizer`` from the same directory."""
    model = load_model(path, dtype=dtype, device=device)
    return model, load_tokenizer(path)
