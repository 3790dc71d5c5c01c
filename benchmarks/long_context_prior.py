"""A tiny Llama that retrieves needles, trained from scratch on CPU with a haystack curriculum.

    python benchmarks/long_context_prior.py --out DIR [--steps 1150] [--max-filler 40] [--json PATH]

The accuracy-against-length measurement (``benchmarks/long_context_accuracy.py``) needs a model
that retrieves at all. The quickstart's prior does not, and answer-only SFT on ~400-token needle
tasks did not teach it (docs/long_context.md). What does, in minutes on 2 cores, is the same
``long_ctx.needle`` facts (2-6 needles, look-alike keys, seven-digit numbers, the question and the
reference answer) with the haystack grown as the model learns:

- each row is ``rng.randint(0, filler)`` filler sentences with the needles planted at random
  depths, chat-formatted, the loss on the reference answer only;
- ``filler`` starts at 0 (needles and question alone, ~200 tokens) and grows by a quarter (at
  least one sentence) each time the running exact-retrieval rate reaches ``--promote``, up to
  ``--max-filler`` sentences (a sentence is ~40 tokens; the default 1,150 steps end at 19, with
  rows of up to ~1k tokens: 27 minutes on 2 cores);
- *exact retrieval* is the seven digits of the answer's needle copy all argmax-right under teacher
  forcing: the one hard part of the answer (the key and the ``Answer:`` line are copies of text
  next to them).

The tokenizer is the quickstart's kind (512-token byte-level BPE, single-digit tokens) trained on
needle prompts. ``DIR`` is a Hugging Face model directory (``max_position_embeddings`` =
``--max-positions``); ``DIR/progress.jsonl`` holds the curve, its largest ``tokens`` the longest
row trained on (the accuracy benchmark's ``--trained-tokens``). The rows come from this script's
own RNG, not from the domain's splits: a held-out task's facts (its keys and seven-digit numbers)
recur only by chance.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_note, write_json  # noqa: E402


def needle_row(rng: random.Random, filler: int) -> tuple[str, str, str]:
    """``(prompt, reference, number)`` of a needle task with ``filler`` filler sentences."""
    from rlvr.tasks.long_needle import NEEDLE, QUESTION, needle_keys
    from rlvr.tasks.long_text import POOL, paragraphs, plant

    n = rng.randint(2, 6)
    keys = needle_keys(n - 1, rng.randint(0, min(2, n - 1)), rng)
    values = rng.sample(range(1_000_000, 10_000_000), n)
    needles = [NEEDLE.format(k=k, v=v) for k, v in zip(keys, values)]
    text = paragraphs(plant(rng.choices(POOL, k=filler), needles, rng, [rng.random() for _ in needles]), rng)
    return "\n\n".join([*text, QUESTION.format(k=keys[0])]), f"{needles[0]}\nAnswer: {values[0]}", str(values[0])


def grow(filler: int, max_filler: int) -> int:
    """The next haystack size: a quarter more sentences (at least one more), at most ``max_filler``."""
    return min(max_filler, max(filler + 1, math.ceil(filler * 1.25)))


def encode_batch(tokenizer, rng: random.Random, rows: int, filler: int):
    """Padded ids, attention mask, loss mask and the positions of each row's seven needle digits."""
    import torch

    from rlvr.model.tokenizer import encode_chat_prompt, encode_completion

    seqs, prompt_lens, digits = [], [], []
    for _ in range(rows):
        prompt, reference, number = needle_row(rng, rng.randint(0, filler))
        ids = encode_chat_prompt(tokenizer, [{"role": "user", "content": prompt}])
        before = tokenizer(reference.split("\n")[0][:-len(number) - 1], add_special_tokens=False)["input_ids"]
        seqs.append(ids + encode_completion(tokenizer, reference))
        prompt_lens.append(len(ids))
        digits.append(len(ids) + len(before))
    width = max(map(len, seqs))
    input_ids = torch.full((rows, width), tokenizer.pad_token_id)
    attention = torch.zeros(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width)
    for i, seq in enumerate(seqs):
        input_ids[i, :len(seq)] = torch.tensor(seq)
        attention[i, :len(seq)] = 1
        loss_mask[i, prompt_lens[i]:len(seq)] = 1
    return input_ids, attention, loss_mask, digits


def train(args) -> dict:
    import torch

    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = train_tokenizer(["\n".join(needle_row(rng, 10)[:2]) for _ in range(300)], 512)
    heads = args.hidden // 32
    cfg = TinyModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=heads, num_kv_heads=heads,
                          intermediate_size=3 * args.hidden, max_positions=args.max_positions)
    model = build_tiny_model(cfg, tokenizer, args.seed).train()
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "progress.jsonl").open("w")
    filler, running, start, curve = 0, 0.0, time.perf_counter(), []
    for step in range(1, args.steps + 1):
        for group in optim.param_groups:
            group["lr"] = args.lr * min(1.0, step / args.warmup)
        ids, attention, loss_mask, digits = encode_batch(tokenizer, rng, args.batch, filler)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        token_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (token_loss * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        with torch.no_grad():  # logits[:, p - 1] predicts token p
            pred = logits.argmax(-1)
            exact = sum(bool((pred[i, d - 1:d + 6] == ids[i, d:d + 7]).all()) for i, d in enumerate(digits)) / args.batch
        running = 0.9 * running + 0.1 * exact
        if running >= args.promote and filler < args.max_filler:
            filler, running = grow(filler, args.max_filler), 0.0
        row = {"step": step, "loss": round(loss.item(), 4), "exact": exact, "filler": filler,
               "tokens": int(ids.shape[1]), "seconds": round(time.perf_counter() - start, 1)}
        log.write(json.dumps(row) + "\n")
        if step % 50 == 0 or step == args.steps:
            log.flush()
            curve.append(row)
            print(json.dumps(row), flush=True)
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
    log.close()
    return {"out": str(out), "params": sum(p.numel() for p in model.parameters()), "args": vars(args), "curve": curve}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--steps", type=int, default=1150)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--max-positions", type=int, default=1280)
    p.add_argument("--max-filler", type=int, default=40, help="filler sentences at the end of the curriculum")
    p.add_argument("--promote", type=float, default=0.6, help="running exact-retrieval rate that grows the haystack")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the curve and settings here")
    args = p.parse_args(argv)
    print(machine_note(), flush=True)
    result = train(args)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
