"""Architecture conformance on CPU: tiny random models of each supported decoder family, built
with transformers' own classes and saved as Hugging Face directories with the tiny tokenizer.

Per family (docs/architectures.md):
(a) the engine's sampling log-probs (temperature 1) = the training forward's (grpo's
    ``logprobs_of``: the flat / row / padded layout ``packed_logprobs`` picks) = transformers' own
    ``model(input_ids).logits.log_softmax`` on each sequence alone, within ``ATOL``;
(b) the padding-free training forward (flat, shared prompts, rows) = the padded forward, in
    log-probs and in gradients;
(c) one GRPO step (``run_grpo``) changes every parameter (MoE: every expert, see the test);
(d) the saved ``final/`` reloads in plain transformers and gives the trained model's logits.
Plus which families the fast decoder takes (``decoder.fast_path_reason``) and which layout the
training forward runs them on.

Sequences are longer (up to ~26 tokens) than the sliding windows set here (8 tokens), so the
windows cut in every check. Everything is fp32.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import rlvr.tasks  # noqa: F401
import rlvr.verifiers  # noqa: F401
from rlvr.config import load_config
from rlvr.monitor.metrics import read_metrics
from test_grpo import digits_registered

ATOL = 1e-4  # fp32 log-probs; observed differences are ~1e-6 (summation order)
WINDOW = 8  # sliding window of the windowed families: shorter than the test sequences
PROMPT_LENGTHS = (4, 9)
NEW_TOKENS = 16

# family -> (config class, model class, config overrides). All: hidden 32, 2 layers, 4 heads over
# 2 KV heads (GQA), the tiny tokenizer's vocabulary.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # q/k/v biases
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", {  # layer 0 global, layer 1 sliding
        "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),  # q/k norm
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
        "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": WINDOW, "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 3.0, "tie_word_embeddings": True}),  # layers alternate sliding/global
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": WINDOW, "final_logit_softcapping": 3.0,
        "attn_logit_softcapping": 5.0, "layer_types": ["sliding_attention", "full_attention"],
        "tie_word_embeddings": True}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),  # fused qkv_proj, gate_up_proj
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}
FAST = {"llama", "qwen2", "qwen3", "phi3"}  # the families the fast decoder takes at these lengths
FLAT = {"llama", "qwen2", "qwen2_window", "qwen3", "mistral", "phi3"}  # the flat (per-sequence attention) training layout
MOE = {"qwen2_moe", "mixtral"}


@pytest.fixture(scope="module")
def tokenizer():
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 200) + DOMAINS.get("math.word").corpus(0, 200)
    return train_tokenizer(docs, vocab_size=320)


def build(family: str, tokenizer, **overrides) -> torch.nn.Module:
    import transformers

    config_cls, model_cls, extra = FAMILIES[family]
    cfg = getattr(transformers, config_cls)(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **{**extra, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():  # some families zero-init norms or biases: random values make every check bite
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def family_dirs(tokenizer, tmp_path_factory):
    """family -> saved Hugging Face directory (built on first use)."""
    from rlvr.model.checkpoint import save_model_dir

    made: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in made:
            path = tmp_path_factory.mktemp(family) / "model"
            save_model_dir(path, build(family, tokenizer), tokenizer)
            made[family] = str(path)
        return made[family]

    return get


def sampled_batch(model, tokenizer):
    """Engine samples (2 prompts x 3, temperature 1) as grpo batches them: right-padded ids, mask,
    loss mask on the completions, and the engine's log-probs at the completion positions."""
    from rlvr.rollout.engine import SamplingParams, generate

    prompts = [[tokenizer.bos_token_id, *range(10, 10 + k - 1)] for k in PROMPT_LENGTHS]
    out = generate(model, prompts, SamplingParams(max_new_tokens=NEW_TOKENS, n=3, stop_token_ids=()),
                   generator=torch.Generator().manual_seed(0), pad_token_id=tokenizer.pad_token_id)
    seqs = [prompts[c.prompt_index] + c.token_ids for c in out]
    B, T = len(seqs), max(map(len, seqs))
    ids = torch.full((B, T), tokenizer.pad_token_id)
    mask, want, engine = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T), torch.zeros(B, T)
    for b, (s, c) in enumerate(zip(seqs, out)):
        p = len(prompts[c.prompt_index])
        ids[b, : len(s)], mask[b, : len(s)], want[b, p : len(s)] = torch.tensor(s), 1, 1
        engine[b, p : len(s)] = torch.tensor(c.logprobs)
    return ids, mask, want, engine


def reference_logprobs(model, ids, mask) -> torch.Tensor:
    """transformers' own forward on each sequence alone (no padding): log_softmax of its logits."""
    out = torch.zeros(ids.shape)
    with torch.no_grad():
        for b in range(len(ids)):
            s = ids[b, : int(mask[b].sum())]
            lp = model(s[None]).logits[0].float().log_softmax(-1)
            out[b, 1 : len(s)] = lp[:-1].gather(-1, s[1:, None])[:, 0]
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_logprobs_match_training_and_transformers_forward(family, tokenizer):
    from rlvr.rollout import decoder
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.update import logprobs_of

    model = build(family, tokenizer)
    longest = max(PROMPT_LENGTHS) + NEW_TOKENS
    assert (decoder.unsupported_reason(model, longest) is None) == (family in FAST), \
        decoder.unsupported_reason(model, longest)
    ids, mask, want, engine = sampled_batch(model, tokenizer)
    assert ids.shape[1] > WINDOW
    reference = reference_logprobs(model, ids, mask) * want
    with torch.no_grad():  # grpo's training forward, its default settings (packing, shared prompts)
        training = logprobs_of(model, SimpleNamespace(input_ids=ids, attention_mask=mask, loss_mask=want),
                               AlgoConfig()) * want
    torch.testing.assert_close(engine, reference, atol=ATOL, rtol=0)
    torch.testing.assert_close(training, reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_padding_free_forward_matches_padded(family, tokenizer):
    from rlvr.model.logprobs import sequence_logprobs
    from rlvr.train import sequence_attention
    from rlvr.train.packing import packed_logprobs

    model = build(family, tokenizer)
    ids, mask, want, _ = sampled_batch(model, tokenizer)
    keep = [0, 3, 4]  # different lengths, two sharing a prompt
    ids, mask, want = ids[keep], mask[keep], want[keep]
    assert len(set(mask.sum(1).tolist())) > 1
    longest = int(mask.sum(1).max())
    assert sequence_attention.supported(model, longest) == (family in FLAT)
    with torch.no_grad():
        padded = sequence_logprobs(model, ids, mask) * want
        layouts = {
            "default": packed_logprobs(model, ids, mask, want),
            "shared prompts": packed_logprobs(model, ids, mask, want, share_prompts=True),
            "rows": packed_logprobs(model, ids, mask, want, packing=True, width=2 * longest),
            "causal rows": packed_logprobs(model, ids, mask, want, packing=False),
        }
    for name, lp in layouts.items():
        torch.testing.assert_close(lp, padded, atol=ATOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")

    def grads(logprobs) -> dict[str, torch.Tensor]:
        model.zero_grad()
        (logprobs * want).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    # gradients too: the default training layout with shared prompts against the padded forward
    expected = grads(sequence_logprobs(model, ids, mask))
    got = grads(packed_logprobs(model, ids, mask, want, share_prompts=True))
    assert got.keys() == expected.keys()
    for n in expected:
        torch.testing.assert_close(got[n], expected[n], atol=1e-5, rtol=1e-3, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_grpo_step_changes_every_parameter_and_final_reloads(family, family_dirs, tmp_path, monkeypatch):
    """(c) and (d). MoE: an expert no token was routed to gets no gradient and cannot change; with
    4 experts, top-2 and ~500 tokens a layer every expert receives tokens, and the test checks
    each expert's slice of the fused expert tensors changed."""
    from transformers import AutoModelForCausalLM

    from rlvr.model.load import load_model
    from rlvr.train import grpo

    runs = []
    setup = grpo.setup
    monkeypatch.setattr(grpo, "setup", lambda *a, **k: runs.append(setup(*a, **k)) or runs[-1])
    model_dir = family_dirs(family)
    cfg = load_config(grpo.GRPOConfig, None, [
        f"model={model_dir}", f"out={tmp_path / 'run'}", "domains=[test.digits]", "levels=[1]", "train_tasks=8",
        "rollout.tasks_per_step=4", "rollout.samples_per_task=6", "rollout.max_new_tokens=12",
        "reward.outcome=score", "optim.lr=1e-2", "optim.warmup_steps=0", "steps=1", "save_trajectories_every=100"])
    with digits_registered():
        grpo.run_grpo(cfg, progress=False)
    metrics = read_metrics(tmp_path / "run")
    assert metrics[-1]["rollout/logprob_mismatch_kl"] < 1e-8  # engine vs training forward inside the run

    before = dict(load_model(model_dir).named_parameters())
    after = dict(load_model(tmp_path / "run" / "final").named_parameters())
    assert before.keys() == after.keys()
    unchanged = [n for n, p in after.items() if torch.equal(p, before[n])]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    if family in MOE:
        experts = [n for n in after if ".experts." in n]
        assert experts
        for n in experts:  # [experts, ...]: every expert's slice moved
            still = [e for e in range(after[n].shape[0]) if torch.equal(after[n][e], before[n][e])]
            assert not still, f"{n}: experts {still} did not change"

    trained = runs[-1].model.eval()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final").eval()
    assert type(reloaded) is type(trained)
    ids = torch.randint(3, len(runs[-1].tokenizer), (2, 3 * WINDOW))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, trained(ids).logits, atol=1e-5, rtol=0)


def test_fast_path_reason_names_why_each_family_falls_back(tokenizer):
    from rlvr.rollout import decoder

    words = {"qwen2_window": "sliding-window", "gemma2": "soft-capping", "gemma3": "sliding",
             "qwen2_moe": "mixture-of-experts", "mixtral": "mixture-of-experts", "mistral": "sliding-window"}
    for family in FAMILIES:
        config = build(family, tokenizer).config
        reason = decoder.fast_path_reason(config, longest=4 * WINDOW)
        if family in FAST:
            assert reason is None, (family, reason)
        else:
            assert reason is not None and words[family] in reason, (family, reason)
    mistral = build("mistral", tokenizer).config
    assert decoder.fast_path_reason(mistral, longest=WINDOW) is None  # the window cuts nothing
    assert "sliding-window" in decoder.fast_path_reason(mistral)  # length unknown: refused
    assert "not Llama-like" in decoder.fast_path_reason(SimpleNamespace(model_type="gpt2"))


def test_mistral_with_a_window_it_never_reaches_runs_on_the_fast_decoder(tokenizer):
    """Mistral whose window is at least the call's longest sequence: the fast decoder, exact."""
    from rlvr.rollout import decoder

    model = build("mistral", tokenizer, sliding_window=64)
    assert decoder.unsupported_reason(model, max(PROMPT_LENGTHS) + NEW_TOKENS) is None
    ids, mask, want, engine = sampled_batch(model, tokenizer)
    torch.testing.assert_close(engine, reference_logprobs(model, ids, mask) * want, atol=ATOL, rtol=0)


def test_phi3_with_partial_rotary_falls_back_to_transformers_forward(tokenizer):
    """Phi-3 with RoPE on half of each head: the fast decoder refuses it (its RoPE covers whole
    heads) and the engine's log-probs still match transformers' forward."""
    from rlvr.rollout import decoder

    model = build("phi3", tokenizer, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.5})
    assert "partial rotary" in decoder.unsupported_reason(model, 64)
    ids, mask, want, engine = sampled_batch(model, tokenizer)
    torch.testing.assert_close(engine, reference_logprobs(model, ids, mask) * want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", sorted(FAST))
def test_fast_decoder_next_turn_on_a_kept_cache_matches_transformers(family, tokenizer):
    """Prefix reuse (``keep_cache`` / ``past``, the multi-turn path) on each fast family: the next
    turn's log-probs, its prompt run from the kept K/V, equal transformers' forward."""
    from rlvr.rollout.engine import SamplingParams, generate

    model = build(family, tokenizer)
    params = SamplingParams(max_new_tokens=6, stop_token_ids=())
    prompts = [[tokenizer.bos_token_id, *range(10, 10 + k - 1)] for k in PROMPT_LENGTHS]
    first = generate(model, prompts, params, pad_token_id=tokenizer.pad_token_id, backend="fast", keep_cache=True,
                     generator=torch.Generator().manual_seed(1))
    turns = [prompts[c.prompt_index] + c.token_ids + [20, 21] for c in first]
    second = generate(model, turns, params, pad_token_id=tokenizer.pad_token_id, backend="fast",
                      past=[c.cache for c in first], generator=torch.Generator().manual_seed(2))
    for turn, c in zip(turns, second):
        seq = torch.tensor([turn + c.token_ids])
        ref = reference_logprobs(model, seq, torch.ones_like(seq))[0, len(turn):]
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_whose_window_cuts_nothing_runs_in_packed_rows(family, tokenizer):
    """Gemma 2/3 with a window longer than every sequence: the row layout (a 4D mask standing for
    every layer's) is exact, soft-capping included, and is what shared prompts run on."""
    from rlvr.model.logprobs import sequence_logprobs
    from rlvr.train import packing

    model = build(family, tokenizer, sliding_window=256)
    ids, mask, want, _ = sampled_batch(model, tokenizer)
    assert packing.window_reason(model, ids.shape[1]) is None
    with torch.no_grad():
        padded = sequence_logprobs(model, ids, mask) * want
        for lp in (packing.packed_logprobs(model, ids, mask, want, share_prompts=True),
                   packing.packed_logprobs(model, ids, mask, want, packing=True, width=2 * ids.shape[1])):
            torch.testing.assert_close(lp, padded, atol=ATOL, rtol=0)
