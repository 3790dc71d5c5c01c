"""On-policy distillation: the per-token reverse-KL signal against a loop, the teacher's checks,
and a student that learns from a teacher's log-probs alone (no verifiable reward)."""

from __future__ import annotations

import pytest
import torch

from rlvr.monitor.metrics import read_metrics

from test_grpo import _cfg, digits  # noqa: F401  (digits: an autouse fixture, test.digits is registered here too)


def test_reverse_kl_advantages_match_a_loop_and_keep_off_mask_garbage_out():
    from rlvr.algos.distill import reverse_kl, reverse_kl_advantages

    gen = torch.Generator().manual_seed(0)
    student = -torch.rand(3, 6, generator=gen) * 3
    teacher = -torch.rand(3, 6, generator=gen) * 3
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0] * 6, [1] * 6], dtype=torch.float32)
    student[mask == 0], teacher[0, 0], teacher[1, 3] = float("nan"), float("-inf"), float("inf")
    coef = 0.7
    got = reverse_kl_advantages(student, teacher, mask, coef)
    for i in range(3):
        for t in range(6):
            want = -coef * (float(student[i, t]) - float(teacher[i, t])) if mask[i, t] else 0.0
            assert float(got[i, t]) == pytest.approx(want, rel=1e-6), (i, t)
    on = [(i, t) for i in range(3) for t in range(6) if mask[i, t]]
    mean = sum(float(student[i, t] - teacher[i, t]) for i, t in on) / len(on)
    assert reverse_kl(student, teacher, mask) == pytest.approx(mean, rel=1e-6)
    assert reverse_kl(student, teacher, torch.zeros_like(mask)) == 0.0
    s = student.clone().requires_grad_(True)  # a signal, not a loss: no gradient flows through it
    assert not reverse_kl_advantages(s, teacher, mask, coef).requires_grad


def test_distill_config_is_checked_by_key(tiny_model_dir, tmp_path):
    from rlvr.errors import ConfigError

    bad = [({"distill.mode": "both"}, "distill.mode"), ({"distill.coef": 0}, "distill.coef"),
           ({"distill.teacher": "t", "distill.mode": "alone", "algo.kl_coef": 0.1, "algo.kl_in_reward": "true"},
            "algo.kl_in_reward"),
           ({"distill.teacher": "t", "distill.mode": "alone", "algo.dynamic_sampling_rounds": 2},
            "algo.dynamic_sampling_rounds"),
           ({"distill.teacher": "t", "algo.advantage": "gae"}, "distill.teacher")]
    for extra, key in bad:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            _cfg(tiny_model_dir, tmp_path / "x", **extra)


def test_a_teacher_with_another_vocabulary_is_refused_naming_both(tiny_model_dir, tmp_path):
    from rlvr.errors import ConfigError
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.load import load_tokenizer
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.train.teacher import DistillConfig, load_teacher

    other_tok = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 50, vocab_size=280)
    other = save_model_dir(tmp_path / "other", build_tiny_model(TinyModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32), other_tok, seed=0), other_tok)
    student_tok = load_tokenizer(tiny_model_dir)
    with pytest.raises(ConfigError, match="different vocabularies") as err:
        load_teacher(DistillConfig(teacher=str(other)), tiny_model_dir, student_tok, device=torch.device("cpu"))
    assert str(other) in str(err.value) and tiny_model_dir in str(err.value)
    same = load_teacher(DistillConfig(teacher=tiny_model_dir), tiny_model_dir, student_tok, device=torch.device("cpu"))
    assert not same.training and not any(p.requires_grad for p in same.parameters())


def test_distillation_alone_moves_the_student_to_the_teacher_and_raises_reward(tiny_model_dir, tmp_path):
    """A teacher trained by GRPO on test.digits; a fresh student distilled from its log-probs alone
    (``distill.mode: alone``: the verifiable reward is only logged): every parameter changes, the
    reverse KL to the teacher falls and the digits reward rises."""
    from rlvr.model.load import load_model
    from rlvr.train.grpo import run_grpo

    torch.set_num_threads(1)
    run_grpo(_cfg(tiny_model_dir, tmp_path / "teacher", steps=30), progress=False)  # reward ~0.04 -> ~0.95
    teacher = tmp_path / "teacher" / "final"
    cfg = _cfg(tiny_model_dir, tmp_path / "student", steps=20, **{"distill.teacher": teacher, "distill.mode": "alone",
                                                                   "distill.coef": 1.0})
    run_grpo(cfg, progress=False)
    before = dict(load_model(tiny_model_dir).named_parameters())
    after = dict(load_model(tmp_path / "student" / "final").named_parameters())
    assert not [n for n, p in after.items() if torch.equal(p, before[n])]
    rows = read_metrics(tmp_path / "student")
    rewards = [m["rollout/reward_mean"] for m in rows]
    kl = [m["distill/reverse_kl"] for m in rows]
    assert all(m["rollout/kept_frac"] == 1.0 for m in rows)  # alone: no sample dropped for zero variance
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards  # measured ~0.03 -> ~0.66
    assert sum(kl[-3:]) / 3 < sum(kl[:3]) / 3 - 1.0, kl  # measured ~4.9 -> ~1.4 nats per token
