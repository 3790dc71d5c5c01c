"""The quickstart end to end at toy budgets: report, plots, cache, and a plain-transformers final model."""

from __future__ import annotations

import json

import pytest

from rlvr.config import load_config
from rlvr.train.quickstart import QuickstartConfig, run_quickstart

TOY = [
    "pretrain.steps=8", "pretrain.docs_per_domain=60", "pretrain.batch_size=8", "pretrain.seq_len=64",
    "pretrain.model.hidden_size=32", "pretrain.model.num_layers=1", "pretrain.model.intermediate_size=64",
    "pretrain.model.num_heads=2", "pretrain.model.num_kv_heads=2", "pretrain.compile=false",
    "sft.steps=3", "sft.train_tasks=32", "sft.batch_size=8",
    "grpo.steps=2", "grpo.train_tasks=16", "grpo.rollout.tasks_per_step=2", "grpo.rollout.samples_per_task=4",
    "grpo.rollout.max_new_tokens=8", "eval.tasks=16", "eval.max_new_tokens=8",
]


def test_quickstart_writes_report_plots_and_a_plain_hf_model(tmp_path, capsys):
    cfg = load_config(QuickstartConfig, None, TOY + [f"out={tmp_path}/qs"])
    report = run_quickstart(cfg)
    out = tmp_path / "qs"
    saved = json.loads((out / "report.json").read_text())
    assert saved == json.loads(json.dumps(report))
    for domain in ("math.arith", "math.word"):
        assert {"sft_pass@1", "rl_pass@1"} <= set(saved["domains"][domain])
    assert set(saved["stage_seconds"]) == {"pretrain", "sft", "eval_sft", "grpo", "eval_rl"}
    assert saved["eval"]["disjoint_from_training"] is True
    for png in ("reward_curve.png", "eval_before_after.png"):
        assert (out / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    assert "held-out pass@1" in capsys.readouterr().out

    # acceptance 3: plain transformers loads the final model; the template renders our prompt format
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "grpo" / "final")
    tok = AutoTokenizer.from_pretrained(out / "grpo" / "final")
    text = tok.apply_chat_template([{"role": "user", "content": "Compute: 34 + 52"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == "<|bos|><|user|>\nCompute: 34 + 52<|end|>\n<|assistant|>\n"
    ids = tok.apply_chat_template([{"role": "user", "content": "Compute: 34 + 52"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert model(input_ids=ids).logits.shape[-1] == len(tok)

    # a second run reuses the cached pretrained model
    again = run_quickstart(cfg)
    assert again["stage_seconds"]["pretrain"] == 0.0


def test_quickstart_resume_continues_the_stage_it_stopped_in(tmp_path, monkeypatch):
    """Stopped inside SFT's third step (checkpoints every step): ``resume`` reuses the pretrained
    model, trains SFT's steps 3 and 4 only, and runs the stages after it."""
    import rlvr.train.sft as sft
    from rlvr.monitor.metrics import read_metrics

    cfg = load_config(QuickstartConfig, None, TOY + [f"out={tmp_path}/qs", "sft.steps=4", "sft.checkpoint_every=1",
                                                     "sft.log_every=1"])
    real_step, calls, stop_at = sft.sft_step, [], [3]

    def counted(*args, **kw):
        calls.append(1)
        if len(calls) == stop_at[0]:
            raise KeyboardInterrupt
        return real_step(*args, **kw)

    monkeypatch.setattr(sft, "sft_step", counted)
    with pytest.raises(KeyboardInterrupt):
        run_quickstart(cfg)
    calls.clear()
    stop_at[0] = None
    report = run_quickstart(cfg, resume=True)
    assert len(calls) == 2  # steps 3 and 4
    assert report["stage_seconds"]["pretrain"] == 0.0  # the pretrained model reused
    assert [m["step"] for m in read_metrics(tmp_path / "qs" / "sft")] == [1, 2, 3, 4]
    assert (tmp_path / "qs" / "grpo" / "final").is_dir() and "rl_pass@1" in report["domains"]["math.arith"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_a_stage_device_this_machine_lacks_stops_the_quickstart_before_pretraining(tmp_path):
    from rlvr.errors import ConfigError

    cfg = load_config(QuickstartConfig, None, [f"out={tmp_path}/q", "grpo.device=cuda"])
    with pytest.raises(ConfigError, match="config key 'grpo.device'"):
        run_quickstart(cfg)
    assert not (tmp_path / "q" / "pretrain").exists()


def test_eval_disjointness_is_checked_not_asserted():
    from rlvr.errors import UserError
    from rlvr.tasks.base import generate_tasks
    from rlvr.train.quickstart import eval_disjointness

    train = generate_tasks(["math.arith", "code.gen"], "train", 60, seed=0)
    held_out = generate_tasks(["math.arith", "code.gen"], "eval", 20, seed=0)
    assert eval_disjointness(train, held_out) == {"disjoint_from_training": True, "train_tasks_checked": 60,
                                                  "eval_tasks_seen_in_training": 0}
    leaked = held_out[:5] + [train[7]]  # one eval task that is also trained on
    with pytest.raises(UserError, match=r"1 of 6 eval tasks are also trained on"):
        eval_disjointness(train, leaked)


def test_a_leaked_eval_task_stops_the_quickstart_before_any_eval(tmp_path, monkeypatch):
    import rlvr.train.quickstart as qs
    from rlvr.errors import UserError

    real = qs.generate_tasks

    def leaky(domains, split, n, seed, levels=None, weights=None):
        tasks = real(domains, split, n, seed, levels, weights)
        return tasks[:-1] + real(domains, "train", 1, 0, levels) if split == "eval" else tasks  # SFT seed 0

    monkeypatch.setattr(qs, "generate_tasks", leaky)
    cfg = load_config(QuickstartConfig, None, TOY + [f"out={tmp_path}/qs"])
    with pytest.raises(UserError, match="eval tasks are also trained on"):
        run_quickstart(cfg)
    assert not (tmp_path / "qs" / "eval").exists()


def test_the_pipeline_runs_sft_dpo_grpo_and_reports_every_stage(tmp_path, capsys):
    import textwrap

    from rlvr.config import from_dict
    from rlvr.train.verified_pairs import PairsConfig

    # a toy prior rarely solves arithmetic, so the pairs come from a format reward anyone can pass sometimes
    (tmp_path / "digits.py").write_text(textwrap.dedent('''
        def has_digit(prompts, completions, **columns):
            return [float(any(ch.isdigit() for ch in c)) for c in completions]
    '''))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"question": f"Name a number near {a}."}) + "\n" for a in range(6)))
    cfg = load_config(QuickstartConfig, None, TOY + [f"out={tmp_path}/pl", "stages=[sft,dpo,grpo]",
                                                     "dpo.batch_size=4", "dpo.log_every=1"])
    files = [{"path": str(tmp_path / "t.jsonl"), "map": {"prompt": "question"},
              "reward": [f"{tmp_path / 'digits.py'}:has_digit"]}]
    cfg.pairs = from_dict(PairsConfig, {"domains": [], "task_files": files, "samples": 8, "max_new_tokens": 8})
    report = run_quickstart(cfg)
    assert {"pairs", "dpo", "eval_dpo"} <= set(report["stage_seconds"])
    for domain in ("math.arith", "math.word"):
        assert {"sft_pass@1", "dpo_pass@1", "rl_pass@1"} <= set(report["domains"][domain])
    out = tmp_path / "pl"
    assert (out / "pairs.jsonl").is_file() and (out / "dpo" / "final" / "model.safetensors").is_file()
    assert json.loads((out / "grpo" / "config.yaml").read_text().split("model: ")[1].split("\n")[0].join('""')) \
        == str(out / "dpo" / "final")
    assert "SFT + DPO + GRPO" in capsys.readouterr().out


@pytest.mark.parametrize("native, compiler, precision, compiled", [
    ("bf16", True, "bf16", True), ("bf16", False, "bf16", False), ("model", True, "model", False)])
def test_the_prior_is_bf16_and_compiled_only_where_the_machine_pays_for_it(monkeypatch, native, compiler,
                                                                           precision, compiled):
    import rlvr.train.quickstart as qs

    monkeypatch.setattr(qs, "native_precision", lambda: native)
    monkeypatch.setattr(qs, "cpu_compiler_found", lambda: compiler)
    pre = QuickstartConfig().pretrain
    assert (pre.precision, pre.compile, pre.steps) == (precision, compiled, 1200)
    grpo = QuickstartConfig().grpo  # the GRPO stage stays in the model's precision
    assert (grpo.algo.precision, grpo.rollout.precision) == ("model", "model")


def test_stages_are_checked():
    with pytest.raises(Exception, match="stages"):
        load_config(QuickstartConfig, None, ["stages=[dpo,sft]"])
