"""Preference losses: rlvr's ``PREFERENCE_LOSSES`` vs TRL's trainers on the same model, pairs and token ids.

Run it in the benchmark's own environment (TRL is not an rlvr dependency):

    make bench-dpo-trl                               # builds .venv-trl (trl==1.16.0), runs this
    .venv-trl/bin/python benchmarks/dpo_vs_trl.py [--json PATH]

Setup: the ``small`` benchmark Llama (``common.bench_model``, random weights) and rlvr's default
tokenizer with its chat template. The reference model is that model; the policy is a copy with
seeded Gaussian noise (std 0.01) added to every weight, so the log-ratios are not zero. 8 pairs:
the prompts of 8 ``math.arith`` train tasks, chosen = the task's reference answer, rejected = the
next task's reference answer (a wrong answer of another length). fp32 on both sides, no gradients
(TRL's configs default to ``bf16=True``, which accelerate applies to the reference model as bf16
autocast: ~1e-2 per log-prob sum here, so the script sets ``bf16=False``).

Token ids: rlvr's, for both sides. A pair is ``encode_chat_prompt(prompt)`` followed by
``encode_completion(answer)`` (the text, then EOS ``<|end|>``). TRL tokenises the same chat-format
pairs itself when its trainer is built; the script reports whether those ids are rlvr's (they are
not: TRL's completion is the chat template's rendering of the assistant turn, so it ends
``<|end|>`` then the template's newline, one token more than a generated reply). TRL's loss is then
computed on rlvr's ids, batched by TRL's own collator (``DataCollatorForPreference`` for
``DPOTrainer``, ``DPODataCollatorWithPadding`` for ``CPOTrainer``), with TRL's own forward and loss
code: ``DPOTrainer.compute_loss`` (reference model = a separate copy, ``precompute_ref_log_probs``
off), ``CPOTrainer.get_batch_loss_metrics``.

rlvr's side: ``rlvr.model.logprobs.sequence_logprobs`` over prompt + completion (chosen and rejected
as two right-padded batches), ``preference.sequence_logps`` over the completion mask, the registry's
loss, mean over pairs, ``preference_metrics``.

Rows (rlvr name and settings -> TRL):
  sigmoid                 -> DPOTrainer loss_type="sigmoid"
  sigmoid, eps 0.1 (cDPO) -> DPOTrainer loss_type="aot", one pair per call (TRL 1.x's sigmoid has no
                             label smoothing; aot's formula is cDPO's on log-ratio margins sorted over
                             the batch, and the sort of a single pair is the identity)
  robust, eps 0.1         -> DPOTrainer loss_type="robust"
  ipo                     -> DPOTrainer loss_type="ipo"
  simpo (and eps 0.1)     -> trl.experimental.cpo.CPOTrainer loss_type="simpo", cpo_alpha=0
Each row: both losses (mean over the 8 pairs), |diff|, and |diff| of the reward margin (TRL's
``rewards/margins``). Exits 1 when any |diff| exceeds ``--tol`` (1e-5).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from common import bench_model, bench_tokenizer, print_table, write_json  # noqa: E402

# (row label, rlvr loss, rlvr kwargs, TRL trainer, TRL settings)
ROWS = [
    ("sigmoid", "sigmoid", dict(beta=0.1), "dpo", dict(loss_type="sigmoid", beta=0.1)),
    ("sigmoid eps=0.1 (cDPO)", "sigmoid", dict(beta=0.1, label_smoothing=0.1), "dpo_per_pair",
     dict(loss_type="aot", beta=0.1, label_smoothing=0.1)),
    ("robust eps=0.1", "robust", dict(beta=0.1, label_smoothing=0.1), "dpo",
     dict(loss_type="robust", beta=0.1, label_smoothing=0.1)),
    ("ipo", "ipo", dict(beta=0.1), "dpo", dict(loss_type="ipo", beta=0.1)),
    ("simpo gamma=0.5", "simpo", dict(beta=2.0, gamma=0.5), "cpo",
     dict(loss_type="simpo", beta=2.0, simpo_gamma=0.5)),
    ("simpo gamma=0.5 eps=0.1", "simpo", dict(beta=2.0, gamma=0.5, label_smoothing=0.1), "cpo",
     dict(loss_type="simpo", beta=2.0, simpo_gamma=0.5, label_smoothing=0.1)),
]


def make_pairs(seed: int, n: int = 8) -> list[dict]:
    """``n`` chat-format preference pairs: a math.arith prompt, its reference answer (chosen) and the
    next task's reference answer (rejected)."""
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(["math.arith"], "train", n, seed=seed)
    return [{"prompt": [dict(m) for m in t.prompt],
             "chosen": [{"role": "assistant", "content": t.reference}],
             "rejected": [{"role": "assistant", "content": tasks[(i + 1) % n].reference}]}
            for i, t in enumerate(tasks)]


def rlvr_ids(tok, pairs: list[dict]) -> list[dict]:
    """rlvr's token ids of each pair: prompt_ids, chosen_ids, rejected_ids (TRL's column names)."""
    from rlvr.model.tokenizer import encode_chat_prompt, encode_completion

    return [{"prompt_ids": encode_chat_prompt(tok, p["prompt"]),
             "chosen_ids": encode_completion(tok, p["chosen"][0]["content"]),
             "rejected_ids": encode_completion(tok, p["rejected"][0]["content"])} for p in pairs]


def perturbed(model, seed: int, std: float = 0.01):
    """A copy of ``model`` with seeded Gaussian noise added to every weight (the policy)."""
    policy = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return policy


# --------------------------------------------------------------------------- rlvr side


@torch.no_grad()
def rlvr_sums(model, rows: list[dict], key: str, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob sums, lengths) of the ``key`` completions of ``rows`` under ``model``."""
    from rlvr.algos.preference import sequence_logps
    from rlvr.model.logprobs import sequence_logprobs

    seqs = [r["prompt_ids"] + r[key] for r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (r, s) in enumerate(zip(rows, seqs)):
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        mask[i, len(r["prompt_ids"]):len(s)] = 1
    return sequence_logps(sequence_logprobs(model, ids, attn), mask)


def rlvr_side(policy, ref, rows: list[dict], pad_id: int) -> dict[str, dict]:
    from rlvr.algos.preference import PREFERENCE_LOSSES, preference_metrics

    pc, lc = rlvr_sums(policy, rows, "chosen_ids", pad_id)
    pr, lr = rlvr_sums(policy, rows, "rejected_ids", pad_id)
    rc, _ = rlvr_sums(ref, rows, "chosen_ids", pad_id)
    rr, _ = rlvr_sums(ref, rows, "rejected_ids", pad_id)
    out = {}
    for label, name, kw, _, _ in ROWS:
        loss, cr, rj = PREFERENCE_LOSSES.get(name)(pc, pr, rc, rr, chosen_lengths=lc, rejected_lengths=lr, **kw)
        out[label] = {"loss": float(loss.mean()), **preference_metrics(cr, rj)}
    return out


# --------------------------------------------------------------------------- TRL side


def trl_dpo(policy, ref, tok, data, rows: list[dict], out: str, settings: dict, per_pair: bool) -> dict:
    """TRL's DPOTrainer loss (mean over pairs) and reward margin on rlvr's ids."""
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=len(rows),
                     max_length=None, precompute_ref_log_probs=False, disable_tqdm=True, **settings)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data, processing_class=tok)
    batches = [[r] for r in rows] if per_pair else [rows]
    losses, margins = [], []
    with torch.no_grad():
        for b in batches:
            losses.append(float(trainer.compute_loss(trainer.model, trainer.data_collator(b))))
            mode = "train" if trainer.model.training else "eval"
            margins.append(trainer._metrics[mode]["rewards/margins"][-1])
    trl_rows = [{k: trainer.train_dataset[i][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                for i in range(len(rows))]
    return {"loss": sum(losses) / len(losses), "rewards/margin": sum(margins) / len(margins), "trl_rows": trl_rows}


def trl_cpo(policy, tok, data, rows: list[dict], out: str, settings: dict) -> dict:
    """TRL's CPOTrainer (cpo_alpha=0: SimPO) loss and reward margin on rlvr's ids."""
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    args = CPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=len(rows),
                     max_length=1024, cpo_alpha=0.0, remove_unused_columns=False, disable_tqdm=True, **settings)
    trainer = CPOTrainer(model=policy, args=args, train_dataset=data, processing_class=tok)
    features = []
    for r in rows:
        f = {"prompt_input_ids": r["prompt_ids"], "prompt_attention_mask": [1] * len(r["prompt_ids"])}
        for key in ("chosen", "rejected"):
            ids = r["prompt_ids"] + r[f"{key}_ids"]
            f[f"{key}_input_ids"] = ids
            f[f"{key}_attention_mask"] = [1] * len(ids)
            f[f"{key}_labels"] = [-100] * len(r["prompt_ids"]) + r[f"{key}_ids"]
        features.append(f)
    with torch.no_grad():
        loss, metrics = trainer.get_batch_loss_metrics(trainer.model, trainer.data_collator(features))
    return {"loss": float(loss), "rewards/margin": metrics["rewards/margins"]}


def describe_tokenisation(tok, ours: list[dict], theirs: list[dict]) -> dict:
    """Whether TRL's own tokenisation of the chat-format pairs gives rlvr's ids, and how it differs."""
    same = {k: sum(a[k] == b[k] for a, b in zip(ours, theirs)) for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
    note = ""
    a, b = ours[0]["chosen_ids"], theirs[0]["chosen_ids"]
    if a != b:
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        note = (f"first chosen completion: rlvr ends {tok.decode(a[max(0, n - 1):], skip_special_tokens=False)!r} "
                f"({len(a)} tokens), TRL ends {tok.decode(b[max(0, n - 1):], skip_special_tokens=False)!r} "
                f"({len(b)} tokens)")
    return {"pairs_identical": same, "pairs": len(ours), "note": note}


# --------------------------------------------------------------------------- the run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-5, help="largest |diff| allowed (loss and reward margin)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    try:
        import trl
        from datasets import Dataset
    except ImportError:
        sys.exit("TRL is not installed here: run `make bench-dpo-trl` (builds .venv-trl) or "
                 ".venv-trl/bin/python benchmarks/dpo_vs_trl.py")
    from datasets.utils.logging import disable_progress_bar
    from transformers.utils import logging as hf_logging

    disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    torch.manual_seed(a.seed)
    tok = bench_tokenizer()
    ref = bench_model("small", tok, seed=a.seed).eval()
    policy = perturbed(ref, a.seed + 1).eval()
    pairs = make_pairs(a.seed)
    rows = rlvr_ids(tok, pairs)
    data = Dataset.from_list(pairs)

    ours = rlvr_side(policy, ref, rows, tok.pad_token_id)
    results, table, tokenisation = [], [], None
    with tempfile.TemporaryDirectory(prefix="dpo_vs_trl_") as tmp:
        for label, name, kw, trainer, settings in ROWS:
            # each trainer gets its own copies: a trainer may wrap or modify the model it is given
            p, r = copy.deepcopy(policy), copy.deepcopy(ref)
            if trainer == "cpo":
                theirs = trl_cpo(p, tok, data, rows, str(Path(tmp) / "cpo"), settings)
            else:
                theirs = trl_dpo(p, r, tok, data, rows, str(Path(tmp) / "dpo"), settings, trainer == "dpo_per_pair")
                if tokenisation is None:
                    tokenisation = describe_tokenisation(tok, rows, theirs.pop("trl_rows"))
                theirs.pop("trl_rows", None)
            mine = ours[label]
            diff = abs(mine["loss"] - theirs["loss"])
            margin_diff = abs(mine["rewards/margin"] - theirs["rewards/margin"])
            trl_name = {"dpo": "DPOTrainer", "dpo_per_pair": "DPOTrainer (1 pair/call)",
                        "cpo": "CPOTrainer"}[trainer] + f" {settings['loss_type']}"
            results.append({"row": label, "rlvr_loss": name, "rlvr_kwargs": kw, "trl": trl_name,
                            "trl_settings": settings,
                            "rlvr": mine["loss"], "trl_value": theirs["loss"], "abs_diff": diff,
                            "rlvr_margin": mine["rewards/margin"], "trl_margin": theirs["rewards/margin"],
                            "margin_abs_diff": margin_diff})
            table.append({"rlvr loss": label, "TRL": trl_name, "rlvr": f"{mine['loss']:.8f}",
                          "TRL value": f"{theirs['loss']:.8f}", "|diff|": f"{diff:.2e}",
                          "margin |diff|": f"{margin_diff:.2e}"})

    print(f"preference losses, rlvr vs TRL {trl.__version__}: small Llama (random; policy = reference + noise), "
          f"{len(rows)} chat-format pairs, fp32, the same token ids on both sides")
    same = tokenisation["pairs_identical"]
    print(f"TRL's own tokenisation of the pairs gives rlvr's ids for prompts {same['prompt_ids']}/{len(rows)}, "
          f"chosen {same['chosen_ids']}/{len(rows)}, rejected {same['rejected_ids']}/{len(rows)}"
          + (f"; {tokenisation['note']}" if tokenisation["note"] else ""))
    print()
    print_table(table, ["rlvr loss", "TRL", "rlvr", "TRL value", "|diff|", "margin |diff|"])
    worst = max(max(r["abs_diff"], r["margin_abs_diff"]) for r in results)
    ok = worst <= a.tol
    print(f"\nlargest |diff| {worst:.2e} ({'within' if ok else 'ABOVE'} tolerance {a.tol:g})")
    write_json(a.json, {"trl_version": trl.__version__, "torch": torch.__version__, "tolerance": a.tol, "ok": ok,
                        "largest_abs_diff": worst, "pairs": len(rows), "tokenisation": tokenisation, "rows": results})
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
