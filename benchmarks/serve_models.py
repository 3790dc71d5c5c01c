"""A target/draft pair for the fast-mode measurements: the quickstart's trained policy as the
target, and a much smaller draft distilled from the target's own greedy answers.

    python benchmarks/serve_models.py [--target DIR] [--out runs/bench/draft] [--seconds 240]

- ``target_dir()``: the quickstart's GRPO policy (``runs/quickstart/grpo/final``, the directory
  ``rlvr quickstart`` writes; or ``$RLVR_TARGET``); run ``rlvr quickstart`` first.
- ``distil_draft(target_dir, out)``: the target answers train-split prompts of its domains
  (math.arith, math.word, code.gen; half of them after the benchmarks' shared system prompt,
  ``SYSTEM``; greedy, up to 64 tokens, on rlvr's engine), and a 1-layer,
  64-wide Llama with the target's tokenizer learns those answers (cross-entropy on the answer
  tokens, AdamW) for ``seconds`` of wall time (4 minutes by default). The draft is what agrees
  with the target where it matters: on its own greedy continuations of task prompts. Cached:
  a directory that already has the draft is reused (``meta.json`` names the target it fits).

- ``medium_target(tokenizer_dir, out)``: a randomly initialised 26M-parameter Llama
  (``MEDIUM_SHAPE``: 8 layers x 512, the quickstart's tokenizer and context) for serving
  measurements where a forward is compute-bound rather than per-op overhead (the quickstart policy
  is 0.9M parameters). Its weights are random, so its answers are noise: it measures speed only
  (requests with ``ignore_eos``), never accuracy.

Held-out (eval split) prompts never enter the draft's training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

DOMAINS = ["math.arith", "math.word", "code.gen"]
DRAFT_SHAPE = {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2, "intermediate_size": 192}
MEDIUM_SHAPE = {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 8, "intermediate_size": 1408}
CANDIDATES = ("runs/quickstart/grpo/final", "runs/qs/grpo/final")
# The benchmarks' shared system prompt (benchmarks/fast_decode.py): half the draft's training prompts
# carry it, as the served requests do.
SYSTEM = ("You are a careful assistant for arithmetic and short Python functions. Read the task, "
          "work it out step by step in your head, and give only the final answer in the format the "
          "task asks for.")


def target_dir() -> Path:
    """The target model directory (``$RLVR_TARGET`` or the quickstart's GRPO policy)."""
    env = os.environ.get("RLVR_TARGET")
    for c in ([env] if env else []) + list(CANDIDATES):
        if (Path(c) / "config.json").exists():
            return Path(c)
    raise SystemExit("no target model: run `rlvr quickstart` first (writes runs/quickstart/grpo/final), "
                     "or set RLVR_TARGET / pass --target DIR")


def task_prompts(tokenizer, split: str, n: int, seed: int = 0, domains=DOMAINS, system: str | None = None,
                 every: int = 1) -> list[list[int]]:
    """Chat prompts (token ids) of ``n`` tasks of ``split``; with ``system``, every ``every``-th
    one starts with that system message."""
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.model.tokenizer import encode_chat_prompt
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(list(domains), split, n, seed=seed)
    sys_msg = [{"role": "system", "content": system}] if system else []
    return [list(encode_chat_prompt(tokenizer, (sys_msg if i % every == 0 else []) + list(t.prompt)))
            for i, t in enumerate(tasks)]


def distil_draft(target: str | Path, out: str | Path, *, seconds: float = 240, prompts: int = 768,
                 seed: int = 0) -> Path:
    """Train (or reuse) the draft in ``out`` for ``target`` (module docstring); returns ``out``."""
    from transformers import AutoTokenizer

    from rlvr.model.load import load_model
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.rollout.engine import SamplingParams, generate

    out, target = Path(out), Path(target)
    meta = out / "meta.json"
    if meta.exists() and json.loads(meta.read_text()).get("target") == str(target.resolve()) \
            and json.loads(meta.read_text()).get("recipe") == 2:
        return out
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(target)
    model = load_model(target)
    t0 = time.perf_counter()
    ps = task_prompts(tok, "train", prompts, seed=seed, system=SYSTEM, every=2)
    comps = generate(model, ps, SamplingParams(max_new_tokens=64, temperature=0.0), pad_token_id=tok.pad_token_id,
                     batch_size=128)
    seqs = [(p, c.token_ids) for p, c in zip(ps, comps)]
    gen_s = time.perf_counter() - t0
    cfg = TinyModelConfig(**DRAFT_SHAPE, max_positions=model.config.max_position_embeddings)
    draft = build_tiny_model(cfg, tok, seed).train()
    opt = torch.optim.AdamW(draft.parameters(), lr=5e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    steps, end, losses = 0, time.perf_counter() + seconds, []
    while time.perf_counter() < end:
        batch = [seqs[i] for i in torch.randint(len(seqs), (32,), generator=g).tolist()]
        ids, labels = _batch(batch, tok.pad_token_id)
        loss = draft(input_ids=ids, attention_mask=(labels != -100) | (ids != tok.pad_token_id), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        steps += 1
    out.mkdir(parents=True, exist_ok=True)
    draft.eval().save_pretrained(out)
    tok.save_pretrained(out)
    meta.write_text(json.dumps({"target": str(target.resolve()), "recipe": 2, "shape": DRAFT_SHAPE, "steps": steps,
                                "train_prompts": len(seqs), "generate_s": round(gen_s, 1), "train_s": seconds,
                                "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:]))}, indent=2))
    return out


def medium_target(tokenizer_dir: str | Path, out: str | Path, seed: int = 0) -> Path:
    """The random ``MEDIUM_SHAPE`` Llama with ``tokenizer_dir``'s tokenizer and context, saved to
    ``out`` (reused when it is there); returns ``out``."""
    from transformers import AutoConfig, AutoTokenizer

    from rlvr.model.tiny import TinyModelConfig, build_tiny_model

    out = Path(out)
    if (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ctx = AutoConfig.from_pretrained(tokenizer_dir).max_position_embeddings
    model = build_tiny_model(TinyModelConfig(**MEDIUM_SHAPE, max_positions=ctx), tok, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _batch(batch, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt + answer ids, labels on the answer tokens only."""
    width = max(len(p) + len(c) for p, c in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (p, c) in enumerate(batch):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
    return ids, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--out", default="runs/bench/draft")
    ap.add_argument("--seconds", type=float, default=240)
    a = ap.parse_args()
    out = distil_draft(a.target or target_dir(), a.out, seconds=a.seconds)
    print(f"draft in {out}: {(out / 'meta.json').read_text()}")


if __name__ == "__main__":
    main()
