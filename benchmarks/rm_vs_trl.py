"""Reward-model loss: rlvr's (``rlvr rm``) vs TRL's ``RewardTrainer.compute_loss`` on the same batch.

Run it in the benchmark's own environment (TRL is not an rlvr dependency):

    make bench-rm-trl                                  # builds .venv-trl (trl==1.16.0), runs this
    .venv-trl/bin/python benchmarks/rm_vs_trl.py [--json PATH]

Setup: the ``small`` benchmark Llama (random weights) and rlvr's default tokenizer. rlvr's side is
``rlvr.rm.model.RewardModel`` on that model with a seeded head; TRL's is a
``LlamaForSequenceClassification`` (num_labels=1) holding the same backbone weights and the same head
as its ``score`` layer. 8 pairs: math.arith prompts, chosen = the reference, rejected = the next
task's reference, each with a margin (0.1 x its index). Token ids are rlvr's
(``rlvr.rm.model.encode``: the chat template, the response, EOS) for both sides; TRL batches them
with its own ``DataCollatorForPreference`` and computes its loss with its own ``compute_loss``
(the model's pooling: the last token that is not the pad token, which is not the EOS here).
rlvr: ``rlvr.train.reward_model.pair_rewards`` (right padding, explicit last-token pooling) and
``rlvr.algos.reward_model.bradley_terry``. Rows: plain, with margins, with centering 0.01, both.
Exits 1 when any |diff| of loss or of the rewards exceeds ``--tol`` (1e-5).
"""

from __future__ import annotations

import argparse
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

ROWS = [("plain", False, None), ("margin", True, None), ("center 0.01", False, 0.01), ("margin + center", True, 0.01)]


def pairs_and_ids(tok, n: int = 8):
    import rlvr.tasks  # noqa: F401
    from rlvr.rm.model import encode
    from rlvr.train.reward_model import EncodedPair
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(["math.arith"], "train", n, seed=0)
    out = []
    for i, t in enumerate(tasks):
        c, _ = encode(tok, t.prompt, t.reference, 256)
        r, _ = encode(tok, t.prompt, tasks[(i + 1) % n].reference, 256)
        out.append(EncodedPair(c, r, 0.1 * i, t.id))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import trl
    from datasets import Dataset
    from transformers import LlamaForSequenceClassification
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    from rlvr.algos.reward_model import bradley_terry
    from rlvr.rm.model import RewardModel
    from rlvr.train.reward_model import pair_rewards

    tok = bench_tokenizer()
    assert tok.pad_token_id != tok.eos_token_id, "the comparison needs a pad token that is not EOS"
    backbone = bench_model("small", tok, seed=0).eval()
    torch.manual_seed(0)
    rm = RewardModel(backbone).eval()
    pairs = pairs_and_ids(tok)

    seq_cfg = backbone.config.__class__.from_dict({**backbone.config.to_dict(), "num_labels": 1,
                                                   "pad_token_id": tok.pad_token_id})
    trl_model = LlamaForSequenceClassification(seq_cfg).eval()
    missing = trl_model.model.load_state_dict(backbone.model.state_dict())
    with torch.no_grad():
        trl_model.score.weight.copy_(rm.head.weight)
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        data = Dataset.from_list([{"chosen_ids": p.chosen, "rejected_ids": p.rejected} for p in pairs])
        for label, use_margin, centre in ROWS:
            cfg = RewardConfig(output_dir=tmp, center_rewards_coefficient=centre, bf16=False, report_to=[],
                               use_cpu=True, per_device_train_batch_size=len(pairs))
            trainer = RewardTrainer(model=trl_model, args=cfg, train_dataset=data, processing_class=tok)
            trainer.model.eval()
            examples = [{"chosen_ids": p.chosen, "rejected_ids": p.rejected, **({"margin": p.margin} if use_margin else {})}
                        for p in pairs]
            batch = DataCollatorForPreference(pad_token_id=tok.pad_token_id)(examples)
            with torch.no_grad():
                trl_loss, outputs = trainer.compute_loss(trl_model, dict(batch), return_outputs=True)
                trl_rewards = outputs.logits.squeeze(-1)
                c, r = pair_rewards(rm, pairs, tok.pad_token_id, torch.device("cpu"))
                margin = torch.tensor([p.margin for p in pairs]) if use_margin else None
                ours = bradley_terry(c, r, margin, centre or 0.0)
            d_loss = abs(float(ours) - float(trl_loss))
            d_rewards = float((torch.cat([c, r]) - trl_rewards).abs().max())
            worst = max(worst, d_loss, d_rewards)
            rows.append({"row": label, "rlvr_loss": float(ours), "trl_loss": float(trl_loss), "|diff| loss": d_loss,
                         "max |diff| reward": d_rewards})
    print(f"trl {trl.__version__}; backbone weights loaded into TRL's model: {missing}")
    print_table(rows, ["row", "rlvr_loss", "trl_loss", "|diff| loss", "max |diff| reward"])
    ok = worst <= args.tol
    print(f"{'OK' if ok else 'FAIL'}: worst |diff| {worst:.2e} (tolerance {args.tol:g})")
    write_json(args.json, {"trl_version": trl.__version__, "tolerance": args.tol, "worst": worst, "rows": rows})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
