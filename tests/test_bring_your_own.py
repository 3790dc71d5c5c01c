"""The user's path end to end, through the command line only: a Hugging Face model directory and
CSV/JSONL files of their own -> GRPO -> eval report; SFT from their conversations and from a
reference column; eval items refused as training tasks."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main

FAST = ["--set", "steps=2", "--set", "rollout.tasks_per_step=2", "--set", "rollout.samples_per_task=4",
        "--set", "rollout.max_new_tokens=6", "--set", "checkpoint_every=2", "--set", "optim.lr=1e-2"]


def write_csv(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return str(path)


def qa_rows(start: int, n: int) -> list[dict]:  # answers are bare numbers, no \boxed{}
    return [{"question": f"Tom has {a} apples and buys {a % 7 + 2} more. How many apples now?",
             "answer": str(a + a % 7 + 2), "level": 1 + a % 2, "topic": "apples" if a % 2 else "shopping"}
            for a in range(start, start + n)]


def weights(model_dir) -> dict[str, torch.Tensor]:
    return load_file(f"{model_dir}/model.safetensors")


def test_train_on_a_csv_then_eval_on_the_held_out_file(tiny_model_dir, tmp_path, capsys):
    train = write_csv(tmp_path / "train.csv", qa_rows(1, 12))
    held_out = write_csv(tmp_path / "eval.csv", qa_rows(40, 6))
    run = tmp_path / "run"
    files = ["--map", "prompt=question", "--verifier", "number"]
    assert main(["train", "--model", tiny_model_dir, "--tasks", train, "--eval-tasks", held_out, *files,
                 "--out", str(run), *FAST, "--set", "eval.max_new_tokens=6"]) == 0
    final_eval = json.loads((run / "eval" / "final.json").read_text())  # --eval-tasks: the final model's report
    assert final_eval["overall"]["n_tasks"] == 6 and "file.number" in capsys.readouterr().out
    assert (run / "final" / "model.safetensors").is_file() and (run / "checkpoints" / "step_2").is_dir()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all("rollout/pass_rate/file.number" in s for s in steps)
    resolved = (run / "config.yaml").read_text()
    assert "domains: []" in resolved and "verifier: number" in resolved  # the user's file alone
    capsys.readouterr()

    out = tmp_path / "eval.json"
    assert main(["eval", "--model", str(run / "final"), "--tasks", held_out, *files, "--out", str(out),
                 "--set", "max_new_tokens=6"]) == 0
    printed = capsys.readouterr().out
    assert "file.number" in printed and "all" in printed
    report = json.loads(out.read_text())
    assert report["overall"]["n_tasks"] == 6 and set(report["by_domain"]) == {"file.number"}
    assert set(report["by_domain"]["file.number"]["by_level"]) == {"1", "2"}
    assert len(report["tasks"]) == 6 and report["tasks"][0]["task"]["spec"]["kind"] == "number"


def test_eval_reports_by_tag_and_failures_feed_the_next_round(tiny_model_dir, tmp_path, capsys):
    rows = [{**r, "tags": r.pop("topic")} for r in qa_rows(1, 6)]
    path = write_csv(tmp_path / "eval.csv", rows)
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", tiny_model_dir, "--tasks", path, "--map", "prompt=question", "--verifier",
                 "number", "--out", str(out), "--set", "max_new_tokens=4"]) == 0
    report = json.loads(out.read_text())
    assert set(report["by_tag"]) == {"apples", "shopping"}
    assert sum(s["n_tasks"] for s in report["by_tag"].values()) == 6
    capsys.readouterr()
    failures = tmp_path / "next.jsonl"
    assert main(["tasks", "from-failures", str(out), "--out", str(failures)]) == 0
    n_failed = sum(t["correct"] < t["samples"] for t in report["tasks"])
    assert len(failures.read_text().splitlines()) == n_failed > 0  # a random tiny model fails them
    # training on them is refused unless allowed
    assert main(["train", "--model", tiny_model_dir, "--tasks", str(failures), "--out", str(tmp_path / "r"),
                 *FAST]) == 2
    assert "came from an eval result" in capsys.readouterr().err


def test_training_refuses_items_of_its_eval_file(tiny_model_dir, tmp_path, capsys):
    rows = qa_rows(1, 6)
    train = write_csv(tmp_path / "train.csv", rows)
    held_out = write_csv(tmp_path / "eval.csv", rows[4:])
    args = ["train", "--model", tiny_model_dir, "--tasks", train, "--eval-tasks", held_out, "--map",
            "prompt=question", "--verifier", "number", "--out", str(tmp_path / "run"), *FAST]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "2 training task(s) are also eval tasks" in err and "allow_eval_tasks=true" in err


def test_sft_on_the_users_conversations_and_reference_column(tiny_model_dir, tmp_path):
    convs = tmp_path / "chats.jsonl"
    convs.write_text("".join(json.dumps({"messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"What is {i} + 1?"},
        {"role": "assistant", "content": f"{i + 1}"},
        {"role": "user", "content": "And doubled?"},
        {"role": "assistant", "content": f"{2 * (i + 1)}"}]}) + "\n" for i in range(8)))
    run = tmp_path / "sft"
    sft = ["--set", "steps=2", "--set", "batch_size=4"]
    assert main(["sft", "--model", tiny_model_dir, "--conversations", str(convs), "--out", str(run), *sft]) == 0
    before, after = weights(tiny_model_dir), weights(run / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = [{"question": f"What is {i} + 2?", "answer": str(i + 2), "worked": f"{i} + 2 = {i + 2}\nAnswer: {i + 2}"}
            for i in range(6)]
    tasks = write_csv(tmp_path / "t.csv", rows)
    assert main(["sft", "--model", tiny_model_dir, "--tasks", tasks, "--map", "prompt=question,reference=worked",
                 "--verifier", "number", "--out", str(tmp_path / "sft2"), *sft]) == 0


@pytest.mark.parametrize("rows, needle", [
    ([{"question": "2+2?", "answer": "4"}], "field 'reference' is missing"),
])
def test_sft_without_a_reference_column_says_which_option_supplies_it(tiny_model_dir, tmp_path, capsys, rows, needle):
    path = write_csv(tmp_path / "t.csv", rows)
    assert main(["sft", "--model", tiny_model_dir, "--tasks", path, "--map", "prompt=question",
                 "--out", str(tmp_path / "run"), "--set", "steps=1"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "--map reference=COLUMN" in err


def test_bad_conversation_rows_are_located(tiny_model_dir, tmp_path, capsys):
    convs = tmp_path / "chats.jsonl"
    convs.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
                     + "\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["sft", "--model", tiny_model_dir, "--conversations", str(convs), "--out", str(tmp_path / "r")]) == 2
    assert "chats.jsonl:2: field 'messages' has no assistant message" in capsys.readouterr().err


def test_a_model_directory_without_a_tokenizer_is_one_line_exit_2(tiny_model_dir, tmp_path, capsys):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{tiny_model_dir}/{name}", bare / name)
    tasks = write_csv(tmp_path / "t.csv", qa_rows(1, 3))
    for argv in (["train", "--model", str(bare), "--tasks", tasks, "--map", "prompt=question", "--out", str(tmp_path / "r")],
                 ["eval", "--model", str(bare), "--tasks", tasks, "--map", "prompt=question", "--out", str(tmp_path / "e.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(bare) in err and "no tokenizer files" in err


def test_grpo_on_a_csv_with_the_users_reward_changes_the_weights_and_raises_the_held_out_score(
        tiny_model_dir, tmp_path, capsys):
    """Through the command line only: the user's reward function (the share of digits; a sample
    passes at 1.0) on their CSV; the held-out file's greedy pass@1 before and after, by `rlvr eval`."""
    (tmp_path / "digits.py").write_text("def digits(prompts, completions, **columns):\n"
                                        "    return [sum(c.isdigit() for c in t) / max(len(t), 1) for t in completions]\n")
    train = write_csv(tmp_path / "train.csv", [{"question": f"Write digits ({i})."} for i in range(16)])
    held_out = write_csv(tmp_path / "eval.csv", [{"question": f"Write digits ({i})."} for i in range(100, 110)])
    files = ["--map", "prompt=question", "--reward", f"{tmp_path / 'digits.py'}:digits"]

    def pass_at_1(model) -> float:
        out = tmp_path / f"eval-{len(list(tmp_path.glob('eval-*')))}.json"
        assert main(["eval", "--model", str(model), "--tasks", held_out, *files, "--out", str(out),
                     "--set", "max_new_tokens=6"]) == 0
        return json.loads(out.read_text())["overall"]["pass@1"]

    before = pass_at_1(tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", "--model", tiny_model_dir, "--tasks", train, *files, "--out", str(run),
                 "--set", "steps=25", "--set", "rollout.tasks_per_step=4", "--set", "rollout.samples_per_task=8",
                 "--set", "rollout.max_new_tokens=6", "--set", "optim.lr=1e-2", "--set", "optim.warmup_steps=0",
                 "--set", "checkpoint_every=25"]) == 0
    after = pass_at_1(run / "final")
    start, end = weights(tiny_model_dir), weights(run / "final")
    assert [k for k in start if torch.equal(start[k], end[k])] == []  # every tensor trained
    assert after >= before + 0.3, (before, after)
    print(f"held-out pass@1 {before} -> {after}")
