"""repo.fix held-out pass@1: scripted policies through the real reward pipeline, and a tiny model
after SFT and after GRPO.

    python benchmarks/repo_fix_policies.py [--sft-steps 150] [--grpo-steps 10] [--json PATH]

(a) **scripted policies** on every task of both splits, each episode played in the ``repo.fix``
    environment and verified by its hidden tests: the expert (patches the injected line back),
    submit without a change, and the tampering set of ``tests/test_repo_fix.py`` (tests deleted or
    rewritten to pass, a conftest that skips everything): the reward each earns;
(b) **a tiny Llama** (hidden 128, 4 layers, 1,024 positions; a byte-level BPE trained on the
    domain's transcripts) fine-tuned on the 8 train tasks' expert episodes (``rlvr sft``), then
    GRPO on them (``rlvr train``), held-out pass@1 on the 4 eval tasks (greedy) after each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import machine_note, write_json


def scripted(tasks) -> dict:
    from rlvr.envs.base import ENVS, EnvConfig
    from rlvr.sandbox.config import shared_sandbox
    from rlvr.tool_calls import format_call

    def hack(task, name):
        tests = [a for a in task.spec.payload["test_cmd"] if a.endswith(".py")]
        write = lambda path, text: format_call("write_file", {"path": path, "content": text})  # noqa: E731
        return {"delete the tests": [write(t, "") for t in tests],
                "tests that always pass": [write(t, "def test_ok():\n    pass\n") for t in tests],
                "conftest skips all": [write("conftest.py", "import pytest\n\ndef pytest_collection_modifyitems(items):\n"
                                             "    for i in items:\n        i.add_marker(pytest.mark.skip)\n")]}[name]

    policies = {"expert": lambda t: list(t.actions), "submit unchanged": lambda t: [format_call("submit")],
                **{name: (lambda t, n=name: [*hack(t, n), format_call("submit")])
                   for name in ("delete the tests", "tests that always pass", "conftest skips all")}}
    env = ENVS.get("repo.fix")(EnvConfig(max_turns=10), sandbox=shared_sandbox())
    out = {}
    for name, policy in policies.items():
        rewards = []
        for task in tasks:
            env.reset(task)
            for action in policy(task):
                if env.step(action).done:
                    break
            rewards.append(env.verify().score)
        out[name] = sum(rewards) / len(rewards)
    env.close()
    return out


def tiny_model(work: Path) -> str:
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("repo.fix").corpus(0, 200) + DOMAINS.get("math.arith").corpus(0, 200)
    tokenizer = train_tokenizer(docs, vocab_size=512)
    model = build_tiny_model(TinyModelConfig(max_positions=1024), tokenizer, seed=0)
    path = work / "base"
    save_model_dir(path, model, tokenizer)
    return str(path)


def held_out(model_dir: str) -> dict:
    from rlvr.envs.base import EnvConfig
    from rlvr.eval.evaluate import EvalConfig, evaluate
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.sandbox.config import shared_sandbox
    from rlvr.tasks.base import DOMAINS, generate_tasks

    tasks = generate_tasks("repo.fix", "eval", DOMAINS.get("repo.fix").count("eval"), seed=1234)
    model, tokenizer = load_model_and_tokenizer(model_dir)
    cfg = EvalConfig(domains=["repo.fix"], levels=[1, 2], max_new_tokens=160,
                     env=EnvConfig(max_turns=4, turn_tokens=160, max_tokens=640, max_context=1024))
    report = evaluate(model, tokenizer, tasks, cfg, sandbox=shared_sandbox())
    return {"pass@1": report["overall"]["pass@1"], "tasks": len(tasks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--grpo-steps", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import rlvr.envs  # noqa: F401
    import rlvr.tasks  # noqa: F401
    from rlvr.config import load_config
    from rlvr.tasks.base import DOMAINS, generate_tasks
    from rlvr.train.grpo import GRPOConfig, run_grpo
    from rlvr.train.sft import SFTConfig, run_sft

    note = machine_note()
    domain = DOMAINS.get("repo.fix")
    tasks = [t for s in ("train", "eval") for t in generate_tasks("repo.fix", s, domain.count(s), seed=0)]
    out: dict = {"scripted": scripted(tasks)}
    print("scripted policies, mean reward over", len(tasks), "tasks:",
          ", ".join(f"{k} {v:.2f}" for k, v in out["scripted"].items()))
    with tempfile.TemporaryDirectory(prefix="rlvr-repo-fix-") as tmp:
        work = Path(tmp)
        base = tiny_model(work)
        t0 = time.perf_counter()
        sft = load_config(SFTConfig, None, [f"model={base}", f"out={work / 'sft'}", "domains=[repo.fix]", "levels=[1,2]",
                                             "train_tasks=8", f"steps={args.sft_steps}", "batch_size=8",
                                             "checkpoint_every=100000", "env.max_context=1024"])
        run_sft(sft, progress=False)
        out["sft"] = {**held_out(str(work / "sft" / "final")), "seconds": time.perf_counter() - t0}
        print(f"SFT ({args.sft_steps} steps): held-out pass@1 {out['sft']['pass@1']:.3f} on {out['sft']['tasks']} tasks")
        t0 = time.perf_counter()
        grpo = load_config(GRPOConfig, None, [
            f"model={work / 'sft' / 'final'}", f"out={work / 'grpo'}", "domains=[repo.fix]", "levels=[1,2]",
            "train_tasks=8", f"steps={args.grpo_steps}", "rollout.tasks_per_step=4", "rollout.samples_per_task=4",
            "rollout.max_new_tokens=160", "env.max_turns=4", "env.turn_tokens=160", "env.max_tokens=640",
            "env.max_context=1024", "checkpoint_every=100000"])
        run_grpo(grpo, progress=False)
        out["grpo"] = {**held_out(str(work / "grpo" / "final")), "seconds": time.perf_counter() - t0}
        print(f"GRPO ({args.grpo_steps} steps): held-out pass@1 {out['grpo']['pass@1']:.3f}")
    print(note)
    out["machine"] = note
    write_json(args.json, out)


if __name__ == "__main__":
    main()
