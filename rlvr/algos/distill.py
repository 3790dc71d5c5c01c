"""On-policy distillation: a teacher's per-token log-probs on the student's own samples as the signal.

The student samples; the teacher scores the sampled tokens; each policy token t of sample i gets

    A_{i,t} = -coef * (log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t))

the negative single-sample estimate of the reverse KL(pi_student || pi_teacher) at that token, used
as a per-token reward with no discounting beyond the token (each token's advantage is its own
term, not a sum over later tokens): Agarwal et al. 2024, "On-Policy Distillation of Language
Models: Learning from Self-Generated Mistakes" (GKD, ICLR; Sec. 3, the reverse-KL divergence on
student samples), and Thinking Machines Lab 2025, "On-Policy Distillation" (the per-token reverse
KL as the advantage of an RL loss); Gu et al. 2024, "MiniLLM", derive the same reverse-KL policy
gradient. The trainer (``rlvr.train.grpo``, ``distill.*``) passes these [B,T] advantages to the
policy loss, added to the group advantages of the verifiable reward (``mode: add``) or alone.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reverse_kl_advantages(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor, coef: float) -> Tensor:
    """Per-token advantages -coef * (student - teacher) on ``mask == 1``, exactly 0 elsewhere.

    ``student_logprobs`` are the log-probs the student sampled with (pi_old), ``teacher_logprobs``
    the teacher's of the same tokens; off-mask values may be anything (inf, nan) and never leak.
    No gradient flows through either.

    student_logprobs [B,T], teacher_logprobs [B,T], mask [B,T] -> advantages [B,T] (student's dtype).
    """
    on = mask > 0
    zero = torch.zeros_like(student_logprobs)
    diff = torch.where(on, student_logprobs.detach(), zero) - torch.where(on, teacher_logprobs.detach().to(zero.dtype), zero)
    return torch.where(on, -coef * diff, zero)


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor) -> float:
    """``distill/reverse_kl``: mean over ``mask == 1`` of student - teacher (the k1 estimate of
    KL(pi_student || pi_teacher) per token on the student's samples); 0.0 for an empty mask."""
    on = mask > 0
    diff = -reverse_kl_advantages(student_logprobs, teacher_logprobs, mask, 1.0)
    return float(diff.sum() / on.sum().clamp(min=1))
