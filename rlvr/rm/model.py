"""A reward model: any Hugging Face causal LM's last hidden state, and a scalar head on it.

    outcome   one score per sequence, read at its last real token (explicit pooling: the index
              is the attention mask's length, never "the first pad token", so a tokenizer whose
              pad token is its EOS scores chosen and rejected apart)
    process   one score per step, read at the last token of each step (``step_ends``)

A right-padded batch is the only layout pooled: a row whose attention mask has a hole or leading
padding is refused with one line (``PaddingError``), never pooled at the wrong token.

On disk a reward model is a Hugging Face model directory (the backbone; a LoRA backbone merged)
plus ``reward_head.safetensors`` (the head's weight, [1, hidden]) and ``reward_model.json``:
``kind`` (outcome | process), ``pooling`` (last_token | step_end), the normalisation statistics
of its training rewards (``mean``, ``std``: a scorer reports ``(r - mean) / std``), ``max_length``,
the base model and the held-out metrics. ``load_reward_model`` refuses a directory without them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file

from rlvr.errors import UserError
from rlvr.model.checkpoint import save_model_dir
from rlvr.model.inputs import pad_right
from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer
from rlvr.model.tokenizer import encode_chat_prompt, encode_completion
from rlvr.types import Message

HEAD_FILE = "reward_head.safetensors"
META_FILE = "reward_model.json"


class PaddingError(UserError):
    """A batch whose padding would make last-token pooling read the wrong token."""


@dataclass
class RewardMeta:
    """What ``reward_model.json`` holds beside the weights."""

    kind: Literal["outcome", "process"] = "outcome"
    pooling: str = "last_token"
    mean: float = 0.0
    """Mean of the trained rewards over the training responses (normalisation)."""
    std: float = 1.0
    """Their standard deviation (normalisation; 1 when they were all equal)."""
    max_length: int = 512
    """Tokens a scored sequence keeps (prompt cut from the left first)."""
    base: str = ""
    """The directory the backbone started from."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Held-out metrics at save time (pairwise accuracy, step accuracy)."""


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] index of each row's last real token. Raises ``PaddingError`` unless every row is right
    padded (its mask is ones, then zeros) and not empty."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None]
    bad = ((mask != expected).any(-1) | (lengths == 0)).nonzero().flatten().tolist()
    if bad:
        raise PaddingError(f"reward pooling reads each row's last real token, so rows must be right padded "
                           f"(attention_mask ones then zeros, not empty); row {bad[0]} is not "
                           f"({len(bad)} rows like it)")
    return lengths - 1


class RewardModel(torch.nn.Module):
    """``backbone`` (a causal LM, LoRA layers injected in place or not) and ``head`` (hidden -> 1)."""

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        if head is None:
            head = torch.nn.Linear(hidden, 1, bias=False)
            torch.nn.init.normal_(head.weight, std=1.0 / (hidden + 1) ** 0.5)
        self.head = head.to(device=next(backbone.parameters()).device, dtype=torch.float32)

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T, H] last hidden states (after the final norm)."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                            use_cache=False)
        return out.hidden_states[-1]

    def token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T] the head at every position (float32)."""
        return self.head(self.hidden(input_ids, attention_mask).float()).squeeze(-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B] one reward per right-padded row, at its last real token."""
        idx = last_token_index(attention_mask)
        h = self.hidden(input_ids, attention_mask)
        rows = torch.arange(h.shape[0], device=h.device)
        return self.head(h[rows, idx].float()).squeeze(-1)


def batch_tensors(seqs: list[list[int]], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention mask of ``seqs``."""
    ids = pad_right(seqs, pad_token_id, torch.long).to(device)
    mask = pad_right([[1] * len(s) for s in seqs], 0, torch.long).to(device)
    return ids, mask


def encode(tokenizer, prompt: tuple[Message, ...] | list[Message], response: str,
           max_length: int) -> tuple[list[int], int]:
    """Token ids of ``prompt`` (the reward model's own chat template, generation prompt on) and
    ``response`` (its text, then EOS), at most ``max_length`` of them: the prompt is cut from the
    left first; and where the response starts in them. Re-templated from text on purpose: the
    policy's token ids mean nothing to a reward model with another tokenizer."""
    p = encode_chat_prompt(tokenizer, list(prompt))
    r = encode_completion(tokenizer, response)
    if len(r) > max_length:
        r = r[: max_length - 1] + [r[-1]]  # keep the end token: pooling reads it
    keep = max(0, max_length - len(r))
    p = p[len(p) - keep:] if keep else []
    return p + r, len(p)


def step_ends(tokenizer, response: str) -> list[int]:
    """Token index (within ``encode_completion(tokenizer, response)``) of the last token of each
    step of ``response``; a step is a non-empty line. Needs a fast tokenizer (offsets)."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("process rewards need a fast tokenizer (character offsets of each step)")
    enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    ends, pos = [], 0
    for line in response.split("\n"):
        start, pos = pos, pos + len(line) + 1
        if not line.strip():
            continue
        end_char = start + len(line.rstrip())
        last = max((i for i, (a, _) in enumerate(offsets) if a < end_char), default=None)
        if last is not None and (not ends or last > ends[-1]):
            ends.append(last)
    return ends


def save_reward_model(directory: str | Path, model: RewardModel, backbone: torch.nn.Module, tokenizer,
                      meta: RewardMeta) -> Path:
    """``directory`` atomically: ``backbone`` (a plain HF model: a LoRA one merged by the caller),
    the head and ``reward_model.json``."""
    def extra(d: Path) -> None:
        save_file({"weight": model.head.weight.detach().cpu().contiguous()}, d / HEAD_FILE)
        (d / META_FILE).write_text(json.dumps(asdict(meta), indent=2) + "\n")

    return save_model_dir(directory, backbone, tokenizer, extra=extra)


def read_meta(directory: str | Path) -> RewardMeta:
    """``reward_model.json`` of ``directory``; a one-line error when it is not a reward model."""
    d = Path(directory)
    if not (d / META_FILE).is_file() or not (d / HEAD_FILE).is_file():
        raise UserError(f"{d} is not a reward model directory: it needs {META_FILE} and {HEAD_FILE} "
                        f"(`rlvr rm` writes them)")
    try:
        raw: dict[str, Any] = json.loads((d / META_FILE).read_text())
        return RewardMeta(**raw)
    except (ValueError, TypeError) as e:
        raise UserError(f"{d / META_FILE}: not a valid reward model description ({e})") from None


def load_reward_model(directory: str | Path, *, device: str | torch.device = "cpu",
                      options: ModelLoadConfig | None = None) -> tuple[RewardModel, Any, RewardMeta]:
    """The reward model of ``directory`` (eval mode, no grad), its tokenizer and its description."""
    meta = read_meta(directory)
    backbone, tokenizer = load_model_and_tokenizer(directory, device=device, options=options)
    weight = load_file(str(Path(directory) / HEAD_FILE))["weight"]
    hidden = backbone.config.hidden_size
    if tuple(weight.shape) != (1, hidden):
        raise UserError(f"{Path(directory) / HEAD_FILE}: head weight has shape {tuple(weight.shape)}, the backbone's "
                        f"hidden size needs (1, {hidden})")
    head = torch.nn.Linear(hidden, 1, bias=False)
    with torch.no_grad():
        head.weight.copy_(weight)
    rm = RewardModel(backbone, head).eval().requires_grad_(False)
    return rm, tokenizer, meta
