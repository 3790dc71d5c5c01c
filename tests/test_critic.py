"""rlvr.train.critic on the tiny Llama: values aligned with the tokens, the value loss falls as
the critic fits fixed returns, save/load gives the same values and the same next update."""

from __future__ import annotations

import functools

import pytest
import torch

from rlvr.errors import ConfigError, UserError
from rlvr.train import phases
from rlvr.train.critic import Critic, CriticConfig, load_value_model


def _batch(vocab: int):
    """3 right-padded rows with a prompt, policy tokens, an environment gap, padding."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (3, 12), generator=g)
    attn = torch.tensor([[1] * 12, [1] * 9 + [0] * 3, [1] * 6 + [0] * 6])
    loss_mask = torch.zeros(3, 12)
    loss_mask[0, 4:8] = 1
    loss_mask[0, 10:12] = 1  # tokens 8-9 are an environment turn
    loss_mask[1, 3:9] = 1
    loss_mask[2, 2:6] = 1
    returns = torch.where(loss_mask > 0, torch.tensor([[1.0], [-0.5], [0.25]]).expand(3, 12), 0.0)
    return ids, attn, loss_mask, returns


@pytest.fixture()
def critic(tiny_model_dir):
    torch.manual_seed(0)
    return Critic.build(CriticConfig(lr=3e-3), tiny_model_dir, device="cpu", total_steps=100)


def test_value_model_is_the_policy_decoder_with_a_scalar_head(tiny_model_dir, critic):
    from rlvr.model.load import load_model

    policy = load_model(tiny_model_dir)
    critic_emb = critic.model.base_model.get_input_embeddings().weight
    assert torch.equal(critic_emb, policy.get_input_embeddings().weight)
    assert critic.model.config.num_labels == 1
    ids, attn, _, _ = _batch(policy.config.vocab_size)
    assert (critic.values(ids, attn, microbatch_size=3) == 0).all()  # a fresh critic's head starts at zero
    with torch.no_grad():
        critic.model.score.weight.normal_()
        critic.model.score.bias.fill_(0.3)
    v = critic.values(ids, attn, microbatch_size=2)
    # value of the state before token t = head(hidden at t - 1); position 0 and padding are 0
    hidden = critic.model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state
    want = critic.model.score(hidden)[..., 0]
    torch.testing.assert_close(v[:, 1:], (want[:, :-1] * attn[:, 1:]).detach())
    assert (v[:, 0] == 0).all() and (v[attn == 0] == 0).all()
    # micro-batching and trimming do not change the values
    torch.testing.assert_close(v, critic.values(ids, attn, microbatch_size=3))


def test_critic_fits_returns(critic, tiny_model_dir):
    torch.set_num_threads(1)
    vocab = critic.model.config.vocab_size
    ids, attn, lm, ret = _batch(vocab)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(15):
        old = critic.values(ids, attn, microbatch_size=3)
        m = critic.update(ids, attn, lm, ret, old, g, minibatch_size=0, microbatch_size=2)
        losses.append(m["critic/value_loss"])
    assert losses[-1] < 0.3 * losses[0], losses
    assert set(m) >= {"critic/value_loss", "critic/value_clip_frac", "critic/grad_norm", "critic/lr",
                      "critic/value_mean", "critic/returns_mean", "critic/explained_variance"}
    assert m["critic/explained_variance"] > 0.5


def test_explained_variance_is_left_out_when_returns_do_not_vary(critic):
    ids, attn, lm, _ = _batch(critic.model.config.vocab_size)
    same = torch.where(lm > 0, 1.0, 0.0)
    old = critic.values(ids, attn, microbatch_size=3)
    m = critic.update(ids, attn, lm, same, old, torch.Generator().manual_seed(0), minibatch_size=0, microbatch_size=3)
    assert "critic/explained_variance" not in m and m["critic/returns_mean"] == 1.0


def _state(critic: Critic) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in critic.model.state_dict().items()}


def test_save_load_round_trip_gives_same_values_and_same_next_update(critic, tmp_path, tiny_model_dir):
    torch.set_num_threads(1)
    ids, attn, lm, ret = _batch(critic.model.config.vocab_size)
    g = torch.Generator().manual_seed(2)
    old = critic.values(ids, attn, microbatch_size=3)
    critic.update(ids, attn, lm, ret, old, g, minibatch_size=2, microbatch_size=1)  # optimizer state exists
    critic.save(tmp_path / "critic")
    cfg = CriticConfig(lr=3e-3)
    other = Critic.load(tmp_path / "critic", cfg, device="cpu", total_steps=100)
    before = critic.values(ids, attn, microbatch_size=3)
    assert torch.equal(before, other.values(ids, attn, microbatch_size=3))

    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    m1 = critic.update(ids, attn, lm, ret, before, g1, minibatch_size=2, microbatch_size=1)
    m2 = other.update(ids, attn, lm, ret, before, g2, minibatch_size=2, microbatch_size=1)
    # Equal up to float rounding, not bit for bit: on some CPUs the loaded copy's kernels round
    # the last bits differently (its tensors sit at other addresses). A critic or optimizer state
    # that was not restored moves the update by far more (the first AdamW step is lr-sized).
    assert m1.keys() == m2.keys() and all(m1[k] == pytest.approx(m2[k], rel=1e-6, abs=1e-9) for k in m1)
    a, b = _state(critic), _state(other)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-8) for k in a)
    # a fresh critic (new optimizer, new head) would not have matched: the state matters
    fresh = Critic.load(tmp_path / "critic", cfg, device="cpu", total_steps=100)
    fresh.optimizer = torch.optim.AdamW(fresh.model.parameters(), lr=3e-3)
    fresh.update(ids, attn, lm, ret, before, torch.Generator().manual_seed(3), minibatch_size=2, microbatch_size=1)
    c = _state(fresh)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("gamma", 1.5), ("lam", -0.1), ("value_clip", -0.2),
                                       ("epochs", 0), ("grad_clip", -1.0), ("warmup_steps", -1)])
def test_bad_config_names_the_key(key, value):
    with pytest.raises(ConfigError, match=f"critic.{key}"):
        CriticConfig(**{key: value})


def test_a_directory_that_is_not_a_model_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_value_model(tmp_path / "nope", device="cpu")



def test_a_critic_model_of_another_vocabulary_is_refused(tiny_model_dir, tmp_path):
    import rlvr.tasks  # noqa: F401  (the math corpus)
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.load import load_tokenizer
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    other_tok = train_tokenizer(DOMAINS.get("math.word").corpus(1, 100), vocab_size=290)
    small = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32)
    save_model_dir(tmp_path / "other", build_tiny_model(small, other_tok, seed=0), other_tok)
    policy_tok = load_tokenizer(tiny_model_dir)
    kw = dict(device="cpu", total_steps=1, tokenizer=policy_tok)
    with pytest.raises(ConfigError, match="critic.model.*vocabulary"):
        Critic.build(CriticConfig(model=str(tmp_path / "other")), tiny_model_dir, **kw)
    ok = Critic.build(CriticConfig(model=tiny_model_dir), tiny_model_dir, **kw)  # the same tokenizer: a critic
    assert ok.model.config.num_labels == 1


def test_bf16_critic_with_master_weights_steps_float32_copies_and_resumes(tiny_model_dir, tmp_path):
    from rlvr.model.load import ModelLoadConfig
    from rlvr.train.common import MasterWeightAdamW

    kw = dict(device="cpu", total_steps=10, options=ModelLoadConfig(dtype="bf16"), master_weights=True)
    critic = Critic.build(CriticConfig(lr=3e-3), tiny_model_dir, **kw)
    assert isinstance(critic.optimizer, MasterWeightAdamW) and critic.model.dtype == torch.bfloat16
    ids, attn, lm, ret = _batch(critic.model.config.vocab_size)
    old = critic.values(ids, attn, microbatch_size=3)
    critic.update(ids, attn, lm, ret, old, torch.Generator().manual_seed(0), minibatch_size=0, microbatch_size=3)
    critic.save(tmp_path / "critic")
    other = Critic.load(tmp_path / "critic", CriticConfig(lr=3e-3), **kw)
    a, b = critic.optimizer.masters, other.optimizer.masters
    assert len(a) == len(b) and all(torch.equal(x, y) and y.dtype == torch.float32 for x, y in zip(a, b))


def test_checkpoint_extra_is_inside_the_atomic_checkpoint(tiny_model_dir, tmp_path):
    from rlvr.model.checkpoint import latest_checkpoint, save_checkpoint
    from rlvr.model.load import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    ckpt = save_checkpoint(tmp_path, 1, model, tok, {"step": 1}, extra=lambda d: (d / "critic").mkdir())
    assert (ckpt / "critic").is_dir()

    def broken(d):
        (d / "critic").mkdir()
        raise OSError("disk full")

    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 2, model, tok, {"step": 2}, extra=broken)
    assert latest_checkpoint(tmp_path) == ckpt  # no step_2, no leftover temp directory
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]


def test_advantages_are_whitened_gae_of_outcome_rewards_with_kl(critic):
    from rlvr.algos.advantages import ADVANTAGES
    from rlvr.algos.gae import gae, outcome_token_rewards, whiten

    ids, attn, lm, _ = _batch(critic.model.config.vocab_size)
    values = critic.values(ids, attn, microbatch_size=3)
    rewards, kl = torch.tensor([1.0, 0.0, 0.5]), torch.rand(3, 12)
    c = critic.cfg
    estimator = functools.partial(ADVANTAGES.get("gae"), values=values, mask=lm, gamma=c.gamma, lam=c.lam)
    adv, ret = estimator(rewards, None, whiten_advantages=True, kl=kl, beta=0.1)
    want_adv, want_ret = gae(outcome_token_rewards(rewards, lm, kl, 0.1), values, lm, gamma=1.0, lam=0.95)
    torch.testing.assert_close(ret, want_ret)  # the critic's targets: never whitened
    torch.testing.assert_close(adv, whiten(want_adv, lm))
    assert abs(float(adv[lm > 0].mean())) < 1e-5 and (adv[lm == 0] == 0).all()
    torch.testing.assert_close(estimator(rewards, None, whiten_advantages=False)[0],
                               gae(outcome_token_rewards(rewards, lm), values, lm, gamma=1.0, lam=0.95)[0])


# --------------------------------------------------------------------------- in the trainer

from tests.test_grpo import _cfg, digits, killed_and_straight_metrics  # noqa: E402,F401  (digits: test.digits here)


def test_ppo_with_critic_changes_policy_and_critic_and_raises_reward(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo
    from rlvr.train import components
    from rlvr.model.load import load_model
    from rlvr.monitor.metrics import read_metrics

    torch.set_num_threads(1)
    start: dict[str, torch.Tensor] = {}
    real_build = Critic.build

    def build_and_remember(*args, **kwargs):
        critic = real_build(*args, **kwargs)
        start.update(_state(critic))
        return critic

    monkeypatch.setattr(components.Critic, "build", build_and_remember)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=12, **{"algo.advantage": "gae", "critic.lr": "1e-3",
                                                                 "checkpoint_every": 12})
    grpo.run_grpo(cfg, progress=False)
    before = dict(load_model(tiny_model_dir).named_parameters())
    after = dict(load_model(tmp_path / "run" / "final").named_parameters())
    assert not [n for n, p in after.items() if torch.equal(p, before[n])]
    critic = _state(Critic.load(tmp_path / "run" / "checkpoints" / "step_12" / "critic", cfg.critic, device="cpu",
                                total_steps=1))
    assert start.keys() == critic.keys() and any(k.startswith("score.") for k in start)
    assert not [k for k in start if torch.equal(start[k], critic[k])]
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["rollout/reward_mean"] for m in metrics]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.05, rewards
    for key in ("critic/value_loss", "critic/value_mean", "critic/returns_mean", "critic/explained_variance",
                "critic/grad_norm"):
        assert all(key in m for m in metrics), key
    assert all(m["rollout/kept_frac"] == 1.0 for m in metrics)  # zero-variance groups are kept


def test_killed_ppo_with_critic_run_resumes_to_same_metrics(tiny_model_dir, tmp_path, monkeypatch):
    """The critic (weights, AdamW, schedule) is in the checkpoint: a run killed after step 3 (newest
    checkpoint: step 2) and resumed logs exactly the uninterrupted run's metrics, critic/* included."""
    import json

    torch.set_num_threads(1)
    extra = {"algo.advantage": "gae", "critic.lr": "1e-3", "critic.epochs": 2, "algo.ppo_epochs": 2,
             "algo.minibatch_size": 16, "algo.microbatch_size": 8, "algo.kl_coef": 0.05}
    a, b = killed_and_straight_metrics(tiny_model_dir, tmp_path, monkeypatch, extra)
    assert (tmp_path / "crashed" / "checkpoints" / "step_4" / "critic" / "critic_state.pt").is_file()
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert all("critic/value_loss" in r and "critic/explained_variance" in r for r in a)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_kl_in_reward_with_the_critic_is_per_token(tiny_model_dir, monkeypatch):
    """``algo.kl_in_reward`` with gae: -kl_coef * kl_t at every policy token of the token rewards
    (not the sequence sum on the outcome), and no KL term in the loss's batch."""
    from rlvr.algos.gae import gae, outcome_token_rewards, whiten
    from rlvr.algos.kl import masked_kl
    from rlvr.types import Batch

    cfg = _cfg(tiny_model_dir, "unused", **{"algo.advantage": "gae", "algo.kl_coef": 0.1, "algo.kl_in_reward": "true",
                                            "algo.kl_estimator": "k1"})
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 0, 1.], [0, 0, 1, 1, 0]])
    old, ref = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    batch = Batch(input_ids=torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 5, dtype=torch.long),
                  loss_mask=mask, old_logprobs=old, advantages=torch.zeros(2))
    p = phases.Prepared(kept=[object(), object()], batch=batch, budget=5, ref_logprobs=ref,
                      values=torch.randn(2, 5, generator=g))
    rewards = torch.tensor([1.0, 0.0])
    p, metrics = phases.value_advantages(p, rewards, cfg)
    batch = p.batch
    kl = masked_kl(old, ref, mask, "k1")
    adv, ret = gae(outcome_token_rewards(rewards, mask, kl, 0.1), p.values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(p.returns, ret)
    torch.testing.assert_close(batch.advantages, whiten(adv, mask))
    assert abs(metrics["rollout/kl_penalty_mean"] - float(0.1 * kl.sum(-1).mean())) < 1e-6


def test_a_refill_with_the_critic_is_refused(tiny_model_dir):
    """Dynamic sampling refills the zero-variance groups a critic trains on (``rlvr.train.compat``)."""
    with pytest.raises(ConfigError, match=r"algo\.dynamic_sampling_rounds.*gae"):
        _cfg(tiny_model_dir, "unused", **{"algo.advantage": "gae", "algo.dynamic_sampling_rounds": 2})


def test_ppo_with_critic_on_two_turn_episodes_raises_reward(tiny_model_dir, tmp_path, monkeypatch):
    """Environment tokens in the middle of every trajectory: GAE skips them (the next policy token is
    the next timestep) and the run still learns to answer both turns with digits."""
    import rlvr.train.grpo as grpo
    from rlvr.config import load_config
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.monitor.metrics import read_metrics
    from tests.test_grpo_multiturn import twoturn_registered

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    bias = torch.zeros(model.lm_head.out_features)  # as test_grpo_multiturn: a random model rarely ends a turn
    bias[tok.eos_token_id] = 3.0
    model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
    monkeypatch.setattr("rlvr.train.policy.load_model_and_tokenizer", lambda path, **kw: (model, tok))
    overrides = [
        f"model={tiny_model_dir}", f"out={tmp_path / 'run'}", "domains=[test.twoturn]", "levels=[1]",
        "train_tasks=16", "rollout.tasks_per_step=4", "rollout.samples_per_task=8", "env.turn_tokens=8",
        "env.max_tokens=16", "env.max_turns=2", "reward.outcome=score", "optim.lr=1e-2", "optim.warmup_steps=0",
        "steps=12", "checkpoint_every=100", "save_trajectories_every=100", "algo.advantage=gae", "critic.lr=1e-3",
    ]
    with twoturn_registered():
        grpo.run_grpo(load_config(grpo.GRPOConfig, None, overrides), progress=False)
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["rollout/reward_mean"] for m in metrics]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.03, rewards
    assert metrics[-1]["rollout/turns_mean"] > 1.5


# --- the padding-free forward (rlvr.train.packing.packed_hidden) vs the padded one ---------------

def _shared_batch():
    """Two groups sharing prompts (5 and 3 tokens), one sample alone; ragged lengths; multi-turn
    masks with environment gaps; random token ids in the padding (they must not leak)."""
    g = torch.Generator().manual_seed(5)
    rand = lambda n: torch.randint(3, 61, (n,), generator=g)  # noqa: E731
    a, b, c = rand(5), rand(3), rand(4)
    # (prompt, total length, policy spans)
    rows = [(a, 11, [(5, 11)]), (a, 14, [(5, 8), (10, 14)]), (a, 7, [(5, 7)]),
            (b, 11, [(3, 7), (10, 11)]), (b, 11, [(3, 11)]), (c, 9, [(4, 9)])]
    T = 14
    ids = torch.stack([rand(T) for _ in rows])
    attn, lm = torch.zeros(len(rows), T, dtype=torch.long), torch.zeros(len(rows), T)
    for i, (prompt, n, spans) in enumerate(rows):
        ids[i, : len(prompt)] = prompt
        attn[i, :n] = 1
        for s, e in spans:
            lm[i, s:e] = 1
    return ids, attn, lm


def _value_model(kind: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3, pad_token_id=0,
                  num_labels=1, classifier_dropout=0.0)
    extra = {"llama": {}, "mistral_window": {"sliding_window": 4},
             "gemma2": {"head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 4,
                        "final_logit_softcapping": 3.0, "attn_logit_softcapping": 5.0}}[kind]
    family = {"llama": "Llama", "mistral_window": "Mistral", "gemma2": "Gemma2"}[kind]
    cfg = getattr(transformers, f"{family}Config")(**common, **extra)
    cfg._attn_implementation = "eager" if kind == "gemma2" else "sdpa"
    return getattr(transformers, f"{family}ForTokenClassification")(cfg).float()


@pytest.mark.parametrize("kind,packing,share", [("llama", True, True), ("llama", True, False), ("llama", False, True),
                                                ("mistral_window", True, True), ("mistral_window", False, True),
                                                ("gemma2", True, True)])
def test_packed_values_and_gradients_equal_the_padded_forward_on_policy_tokens(kind, packing, share):
    """values[b, t] = score(hidden predicting token t) at the policy tokens, 0 elsewhere, whatever the
    layout (flat with shared prompts, flat, causal rows; a sliding window shorter than the
    sequences), and the same gradients; Gemma 2 (soft-capped family) runs the padded forward."""
    from rlvr.train import sequence_attention
    from rlvr.train.critic import packed_values, value_decoder_and_head, value_forward
    from rlvr.train.packing import shared_prompts

    torch.set_num_threads(1)
    ids, attn, lm = _shared_batch()
    assert sorted((p, sorted(m)) for p, m in shared_prompts(ids, attn, lm)) == [(3, [3, 4]), (5, [0, 1, 2])]
    model = _value_model(kind)
    splits = value_decoder_and_head(model)[0] is not None
    assert splits == (kind != "gemma2")
    if kind == "llama" and packing:
        assert sequence_attention.supported(model, 14)  # the flat layout, attention per sequence
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    on = lm > 0

    def run(fn):
        model.zero_grad()
        v = fn()
        (v * weights * lm).sum().backward()
        return v.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    padded, padded_grads = run(lambda: value_forward(model, ids, attn))
    packed, packed_grads = run(lambda: packed_values(model, ids, attn, lm, packing=packing, share_prompts=share))
    assert padded[on].abs().min() > 0  # a head that reads nothing would match trivially
    torch.testing.assert_close(packed[on], padded[on], atol=1e-5, rtol=1e-5)
    assert (packed[~on] == 0).all()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_critic_values_and_update_run_the_packed_forward(critic, monkeypatch):
    """With the loss mask, ``values`` and ``update`` never call the padded forward, the values match
    it on policy tokens and are 0 elsewhere; without a mask, every real token but the first."""
    import rlvr.train.critic as critic_module

    torch.set_num_threads(1)
    ids, attn, lm, ret = _batch(critic.model.config.vocab_size)
    with torch.no_grad():
        critic.model.score.weight.normal_()
    padded = critic_module.value_forward(critic.model, ids, attn).detach()
    assert critic.share_prompts and critic.packing

    def refuse(*_, **__):
        raise AssertionError("padded forward called")

    monkeypatch.setattr(critic_module, "value_forward", refuse)
    v = critic.values(ids, attn, microbatch_size=2, loss_mask=lm)
    torch.testing.assert_close(v[lm > 0], padded[lm > 0], atol=1e-5, rtol=1e-5)
    assert (v[lm == 0] == 0).all()
    everywhere = critic.values(ids, attn, microbatch_size=2)
    real = attn.bool()
    real[:, 0] = False
    torch.testing.assert_close(everywhere[real], padded[real], atol=1e-5, rtol=1e-5)
    m = critic.update(ids, attn, lm, ret, v, torch.Generator().manual_seed(0), minibatch_size=0, microbatch_size=2)
    assert m["critic/value_loss"] > 0
