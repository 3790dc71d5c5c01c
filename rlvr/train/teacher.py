"""On-policy distillation's teacher: its config and loading (``distill:`` of the GRPO config).

The teacher is a frozen causal LM that scores the student's own samples; the trainer turns its
log-probs into per-token advantages with ``rlvr.algos.distill.reverse_kl_advantages``. It must
share the student's tokenizer vocabulary (the same token ids name the same strings), else the
run stops naming both directories.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.config import check_choice
from rlvr.errors import ConfigError
from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer

DISTILL_MODES = ("add", "alone")


@dataclass
class DistillConfig:
    """On-policy distillation (docs/algorithms.md "On-policy distillation")."""

    teacher: str = ""
    """Hugging Face causal-LM directory of the teacher (empty: no distillation). Its tokenizer must
    have the student's vocabulary. Loaded frozen on the trainer's device, with ``model_load``."""
    coef: float = 1.0
    """Weight of the teacher's per-token signal -coef * (log pi_student - log pi_teacher)."""
    mode: str = "add"
    """add: the per-token signal added to the verifiable reward's group advantages (zero-variance
    groups dropped as ``algo.drop_zero_variance`` says) | alone: the teacher's signal is the only
    one (no reward-based advantage; no sample dropped for zero variance)."""

    def __post_init__(self) -> None:
        check_choice("distill.mode", self.mode, DISTILL_MODES)
        if not self.coef > 0:
            raise ConfigError(f"config key 'distill.coef' = {self.coef!r} must be > 0")

    @property
    def enabled(self) -> bool:
        return bool(self.teacher)

    @property
    def alone(self) -> bool:
        return self.enabled and self.mode == "alone"


def load_teacher(cfg: DistillConfig, student_dir: str, student_tokenizer, *, device: torch.device,
                 options: ModelLoadConfig | None = None) -> torch.nn.Module:
    """The frozen teacher (eval mode, no gradients) on ``device``; ConfigError when its tokenizer's
    vocabulary differs from the student's or its model cannot score every student token id."""
    model, tokenizer = load_model_and_tokenizer(cfg.teacher, device=device, options=options)
    student, teacher = student_tokenizer.get_vocab(), tokenizer.get_vocab()
    if student != teacher:
        differ = sorted(set(student.items()) ^ set(teacher.items()))[:3]
        raise ConfigError(f"config key 'distill.teacher': the teacher {cfg.teacher!r} ({len(teacher)} tokens) and the "
                          f"student {student_dir!r} ({len(student)} tokens) have different vocabularies (e.g. "
                          f"{differ}); distillation compares log-probs of the same token ids, so both need one tokenizer")
    rows = model.get_output_embeddings().weight.shape[0]
    if rows < len(student_tokenizer):
        raise ConfigError(f"config key 'distill.teacher': the teacher {cfg.teacher!r} scores {rows} token ids, fewer "
                          f"than the student {student_dir!r}'s tokenizer has ({len(student_tokenizer)})")
    return model.eval().requires_grad_(False)
