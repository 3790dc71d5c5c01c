"""Reward models (rlvr rm): the Bradley-Terry loss, pooling and its refusals, training, scoring
across tokenizers, process-reward step labels and training."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rlvr.algos.reward_model import bradley_terry, pairwise_metrics
from rlvr.cli import main
from rlvr.config import from_dict
from rlvr.errors import UserError
from rlvr.model.load import load_model_and_tokenizer
from rlvr.monitor.metrics import read_metrics
from rlvr.reward_sources.models import RewardScorer
from rlvr.rm.model import (PaddingError, RewardMeta, RewardModel, encode, last_token_index, load_reward_model,
                           save_reward_model)
from rlvr.rm.process import equation_value, label_steps, step_rows
from rlvr.train.reward_model import RMConfig, run_rm
from rlvr.tasks import generate_tasks


def test_bradley_terry_matches_a_plain_reference():
    g = torch.Generator().manual_seed(0)
    c, r, m = torch.randn(7, generator=g), torch.randn(7, generator=g), torch.rand(7, generator=g)
    plain = sum(-torch.log(1 / (1 + torch.exp(-(ci - ri - mi)))) for ci, ri, mi in zip(c, r, m)) / 7
    centre = sum((ci + ri) ** 2 for ci, ri in zip(c, r)) / 7
    assert bradley_terry(c, r, m).item() == pytest.approx(plain.item(), abs=1e-6)
    assert bradley_terry(c, r, m, center_coef=0.01).item() == pytest.approx((plain + 0.01 * centre).item(), abs=1e-6)
    assert bradley_terry(c, c).item() == pytest.approx(0.6931472, abs=1e-6)  # a tie is log 2, whatever the scores
    m = pairwise_metrics(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 3.0]))
    assert m["accuracy"] == pytest.approx(1 / 3)  # a tie is not a win
    assert m["margin"] == pytest.approx(0.0)


def test_pooling_reads_the_last_real_token_and_refuses_other_padding():
    assert last_token_index(torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])).tolist() == [2, 0, 3]
    with pytest.raises(PaddingError, match="right padded.*row 0"):
        last_token_index(torch.tensor([[0, 1, 1], [1, 1, 0]]))  # left padding would pool a pad token
    with pytest.raises(PaddingError, match="row 1"):
        last_token_index(torch.tensor([[1, 1, 1], [1, 0, 1]]))  # a hole
    with pytest.raises(PaddingError):
        last_token_index(torch.tensor([[1, 1], [0, 0]]))  # an empty row


def test_pad_equal_to_eos_still_scores_chosen_and_rejected_apart(tiny_model_dir):
    """The TRL-users' trap: pad == EOS and "first pad token" pooling give both sides one score.
    Pooling by the attention mask reads each row's own last token, and padding changes nothing."""
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    rm = RewardModel(model).eval()
    eos = tok.eos_token_id
    prompt = [{"role": "user", "content": "Compute: 2 + 3"}]
    a, _ = encode(tok, prompt, "2 + 3 = 5\nAnswer: 5", 128)
    b, _ = encode(tok, prompt, "Answer: 7", 128)
    width = max(len(a), len(b))
    ids = torch.tensor([a + [eos] * (width - len(a)), b + [eos] * (width - len(b))])  # padded with EOS itself
    mask = torch.tensor([[1] * len(a) + [0] * (width - len(a)), [1] * len(b) + [0] * (width - len(b))])
    with torch.no_grad():
        both = rm(ids, mask)
        alone = [rm(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long)).item() for s in (a, b)]
    assert both.tolist() == pytest.approx(alone, abs=1e-5)
    assert abs(both[0] - both[1]).item() > 1e-4


def arithmetic_pairs(path, n=48, seed=0):
    """math.arith train prompts: the reference (with its answer line) vs the working alone (no
    answer): a preference a random tiny model can learn in a few steps."""
    rows = []
    for t in generate_tasks(["math.arith"], "train", n, seed=seed):
        rows.append({"id": t.id, "prompt": list(t.prompt), "chosen": t.reference,
                     "rejected": t.reference.rsplit("\n", 1)[0] if "\n" in t.reference else "I do not know.",
                     "gap": 1.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rm_config(tiny_model_dir, pairs, out, **over) -> RMConfig:
    data = {"model": tiny_model_dir, "pair_files": [pairs], "out": str(out), "batch_size": 8, "epochs": 3,
            "eval_fraction": 0.25, "log_every": 1, "checkpoint_every": 4, "max_length": 96,
            "optim": {"lr": 3e-3, "warmup_steps": 0}, **over}
    return from_dict(RMConfig, data)


def test_reward_model_training_changes_the_weights_and_learns_the_pairs(tiny_model_dir, tmp_path):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl")
    cfg = rm_config(tiny_model_dir, pairs, tmp_path / "rm", margin_key="gap", center_coef=0.01)
    before = {k: v.clone() for k, v in load_model_and_tokenizer(tiny_model_dir)[0].state_dict().items()}
    result = run_rm(cfg, progress=False)
    rows = read_metrics(tmp_path / "rm")
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    assert result["held_out"] > 0 and "eval/accuracy" in result
    rm, tok, meta = load_reward_model(tmp_path / "rm" / "final")
    after = rm.backbone.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
    assert meta.kind == "outcome" and meta.metrics["eval/accuracy"] == result["eval/accuracy"]
    # stored normalisation: the training responses' rewards have mean ~0, std ~1 once normalised
    scorer = RewardScorer(str(tmp_path / "rm" / "final"))
    data = [json.loads(line) for line in open(pairs)]
    items = [(tuple(d["prompt"]), d[side]) for d in data for side in ("chosen", "rejected")]
    scores = torch.tensor(scorer.score(items))
    assert abs(scores.mean().item()) < 0.5 and 0.5 < scores.std().item() < 1.5
    assert (scores[0::2] > scores[1::2]).float().mean().item() > 0.8  # answered above unanswered


def test_rm_train_cli_and_resume(tiny_model_dir, tmp_path):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl", n=24)
    args = ["rm", "train", "--model", tiny_model_dir, "--pairs", pairs, "--out", str(tmp_path / "rm"),
            "--set", "batch_size=4", "--set", "epochs=1", "--set", "checkpoint_every=2", "--set", "max_length=96"]
    assert main(args) in (0, None)
    assert (tmp_path / "rm" / "final" / "reward_model.json").is_file()
    assert main(args + ["--resume"]) in (0, None)  # resumes from the newest checkpoint and finishes again


def test_a_pair_cut_to_identical_ids_is_refused_naming_it(tiny_model_dir, tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "Compute: 1 + 1", "chosen": "1 + 1 = 2\nAnswer: 2" + " x" * 40,
                                "rejected": "1 + 1 = 2\nAnswer: 3" + " x" * 40}) + "\n")
    cfg = rm_config(tiny_model_dir, str(path), tmp_path / "rm", max_length=8, eval_fraction=0.0)
    with pytest.raises(UserError, match=r"pairs.jsonl:1: chosen and rejected are the same .* rm.max_length=8"):
        run_rm(cfg, progress=False)


def test_a_reward_model_with_another_tokenizer_scores_the_text_not_the_policy_ids(tiny_model_dir, tmp_path):
    """The reward model's vocabulary differs from the policy's: the source re-templates the text."""
    import rlvr.tasks  # noqa: F401
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.reward_sources.base import apply_sources, forget_sources
    from rlvr.rewards import RewardConfig
    from rlvr.tasks.base import DOMAINS
    from rlvr.types import Scored, Trajectory, Verdict

    other_tok = train_tokenizer(DOMAINS.get("math.word").corpus(1, 100), vocab_size=280)
    other = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                                             intermediate_size=64), other_tok, seed=1)
    rm = RewardModel(other)
    save_reward_model(tmp_path / "rm", rm, other, other_tok, RewardMeta(max_length=128))
    _, policy_tok = load_model_and_tokenizer(tiny_model_dir)
    task = generate_tasks(["math.arith"], "train", 1, seed=0)[0]
    text = task.reference
    policy_ids = tuple(policy_tok(text, add_special_tokens=False)["input_ids"])
    assert policy_ids != tuple(other_tok(text, add_special_tokens=False)["input_ids"])
    traj = Trajectory(task_id=task.id, group_id=0, messages=(), completion=text, token_ids=policy_ids,
                      loss_mask=(1,) * len(policy_ids), logprobs=(0.0,) * len(policy_ids), finish_reason="stop")
    s = Scored(task=task, trajectory=traj, verdict=Verdict(passed=True, score=1.0, reason="ok"), reward=1.0,
               terms={"outcome": 1.0})
    forget_sources()
    cfg = RewardConfig(sources=[{"kind": "reward_model", "path": str(tmp_path / "rm"), "clip": 0}])
    got = apply_sources([s], cfg)[0]
    want = RewardScorer(str(tmp_path / "rm")).score([(tuple(task.prompt), text)])[0]
    assert got.scores["reward_model"] == pytest.approx(want, abs=1e-5)
    assert got.terms == {"outcome": 1.0, "reward_model": pytest.approx(want, abs=1e-5)}
    forget_sources()


# --------------------------------------------------------------------------- process rewards


def word_task(ops_text: str):
    for t in generate_tasks(["math.word"], "train", 40, seed=0, levels=[3]):
        if len(t.reference.splitlines()) == 3:
            return t
    raise AssertionError("no two-step task")


def test_step_labels_follow_the_reference_and_the_first_error_decides():
    t = word_task("")
    ref = t.reference.splitlines()  # e.g. "26 - 11 = 15", "15 - 14 = 1", "Answer: 1"
    gold = t.spec.payload["answer"]
    assert label_steps(t, t.reference) == [1, 1, 1]
    assert label_steps(t, f"Answer: {gold}") == [1]  # a skipped equation is no error
    first = ref[0].split("=")[0].strip()
    wrong_value = int(equation_value(ref[0])) + 1
    assert label_steps(t, f"{first} = {wrong_value}\n{ref[1]}\n{ref[2]}") == [0, 0, 0]  # bad arithmetic
    assert label_steps(t, f"1 + 1 = 2\n{ref[1]}\n{ref[2]}") == [0, 0, 0]  # true, but not this problem's step
    assert label_steps(t, f"{ref[0]}\n{ref[1]}\nAnswer: {int(float(gold)) + 1}") == [1, 1, 0]
    assert label_steps(t, f"{ref[0]}\nso the answer is near\n{ref[2]}") == [1, 0, 0]  # unreadable step
    assert label_steps(t, f"{ref[0]}\n{ref[1]}\n{ref[1]}\n{ref[2]}") == [1, 1, 0, 0]  # an extra step
    assert equation_value("2 ** 99999 = 1") is None and equation_value("__import__('os') = 1") is None
    assert equation_value("6 / 0 = 1") is None


def test_process_reward_model_learns_held_out_step_labels(tiny_model_dir, tmp_path):
    from rlvr.reward_sources.models import RewardScorer, aggregate
    from rlvr.rm.process import write_step_file

    tasks = generate_tasks(["math.word"], "train", 80, seed=0, levels=[3])
    rng = random.Random(0)
    samples = []
    for g, t in enumerate(tasks):
        lines = t.reference.splitlines()
        samples.append((g, t.reference))
        bad = rng.choice(["so it is a lot", "maybe more", "I think so"])  # learnable by a random tiny model
        samples.append((g, "\n".join([bad, *lines[1:]])))
    rows = step_rows(tasks, samples)
    assert {tuple(r["labels"]) for r in rows} >= {(1, 1, 1), (0, 0, 0)}
    write_step_file(str(tmp_path / "steps.jsonl"), rows)
    cfg = from_dict(RMConfig, {"model": tiny_model_dir, "kind": "process", "step_files": [str(tmp_path / "steps.jsonl")],
                               "out": str(tmp_path / "prm"), "batch_size": 16, "epochs": 6, "eval_fraction": 0.2,
                               "max_length": 128, "optim": {"lr": 3e-3, "warmup_steps": 0}})
    result = run_rm(cfg, progress=False)
    assert result["eval/step_accuracy"] > 0.75, result
    scorer = RewardScorer(str(tmp_path / "prm" / "final"), kind="process")
    t = tasks[0]
    good, bad = scorer.step_probs([(tuple(t.prompt), t.reference), (tuple(t.prompt), samples[1][1])])
    assert len(good) == len(bad) == 3
    assert aggregate(good, "min") > aggregate(bad, "min")


def test_a_lora_reward_model_trains_adapters_and_saves_a_merged_backbone(tiny_model_dir, tmp_path):
    pairs = arithmetic_pairs(tmp_path / "pairs.jsonl", n=24)
    cfg = rm_config(tiny_model_dir, pairs, tmp_path / "rm", epochs=2, lora={"enabled": True, "r": 4},
                    eval_fraction=0.0)
    result = run_rm(cfg, progress=False)
    rows = read_metrics(tmp_path / "rm")
    assert rows[-1]["train/loss"] < rows[0]["train/loss"], result
    rm, _, meta = load_reward_model(tmp_path / "rm" / "final")  # a plain HF directory: no adapter files
    assert not (tmp_path / "rm" / "final" / "adapter_config.json").exists()
    base = load_model_and_tokenizer(tiny_model_dir)[0].state_dict()
    merged = rm.backbone.state_dict()
    changed = [k for k in base if k in merged and not torch.equal(base[k], merged[k])]
    assert changed and all("proj" in k for k in changed)  # the adapted linear layers, merged in


def test_an_ensemble_source_combines_its_members_scores(tiny_model_dir, tmp_path):
    from rlvr.reward_sources.base import apply_sources, forget_sources
    from rlvr.reward_sources.models import combine
    from rlvr.rewards import RewardConfig
    from rlvr.types import Scored, Trajectory, Verdict

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    dirs = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        save_reward_model(tmp_path / f"rm{seed}", RewardModel(model), model, tok, RewardMeta(max_length=96, std=0.5))
        dirs.append(str(tmp_path / f"rm{seed}"))
    tasks = generate_tasks(["math.arith"], "train", 3, seed=0)
    batch = [Scored(task=t, trajectory=Trajectory(task_id=t.id, group_id=i, messages=(), completion=t.reference,
                                                  token_ids=(1,), loss_mask=(1,), logprobs=(0.0,), finish_reason="stop"),
                    verdict=Verdict(True, 1.0, "ok"), reward=1.0, terms={"outcome": 1.0}) for i, t in enumerate(tasks)]
    members = [RewardScorer(d, clip=0).score([(tuple(t.prompt), t.reference) for t in tasks]) for d in dirs]
    for how in ("mean", "min", "mean_minus_std"):
        forget_sources()
        cfg = RewardConfig(sources=[{"kind": "reward_model", "path": dirs[0], "ensemble": dirs[1:], "clip": 0,
                                     "ensemble_aggregate": how, "ensemble_std_coef": 0.5}])
        got = [s.scores["reward_model"] for s in apply_sources(batch, cfg)]
        want = [combine(list(v), how, 0.5) for v in zip(*members)]
        assert got == pytest.approx(want, abs=1e-5)
    forget_sources()
    values = [1.0, 2.0, 4.0]
    assert combine(values, "mean", 1) == pytest.approx(7 / 3) and combine(values, "min", 1) == 1.0
    std = (sum((v - 7 / 3) ** 2 for v in values) / 3) ** 0.5
    assert combine(values, "mean_minus_std", 2.0) == pytest.approx(7 / 3 - 2 * std)
    assert min(members[0]) != max(members[0]) and members[0] != members[1]  # the members differ
