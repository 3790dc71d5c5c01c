"""The ``rlvr`` command line. User errors print one line and exit 2; bugs keep their traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rlvr.errors import UserError
from rlvr.train.allocator import keep_freed_memory


def _config_args(p: argparse.ArgumentParser, *, resume: bool = False) -> None:
    p.add_argument("-c", "--config", help="YAML recipe (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set optim.lr=1e-4 (repeatable)")
    p.add_argument("--out", help="run directory (same as --set out=DIR)")
    if resume:
        p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")


def _task_args(p: argparse.ArgumentParser, *, eval_files: bool = False, conversations: bool = False) -> None:
    """The flags that bring the user's model and task files (docs/tasks.md)."""
    g = p.add_argument_group("your model and tasks")
    g.add_argument("--model", help="Hugging Face causal-LM directory (same as --set model=DIR)")
    g.add_argument("--dtype", help="weights' dtype: auto (as stored) | float32 | bfloat16 | float16")
    g.add_argument("--trust-remote-code", action="store_true", help="run the model directory's own code (auto_map)")
    g.add_argument("--chat-template", metavar="FILE", help="Jinja chat template for a tokenizer that has none")
    g.add_argument("--tasks", action="append", default=[], metavar="FILE",
                   help="task file: JSONL, CSV, Parquet or a datasets directory (repeatable); "
                        "without --domains the built-in domains are left out")
    if eval_files:
        g.add_argument("--eval-tasks", action="append", default=[], metavar="FILE",
                       help="held-out task file for the periodic eval; its items are refused as training tasks")
    if conversations:
        g.add_argument("--conversations", action="append", default=[], metavar="FILE",
                       help="SFT on conversations: rows with a 'messages' list, loss on assistant turns")
    _file_flags(g)
    g.add_argument("--domains", default=None, metavar="A,B",
                   help="built-in domains to use besides the files ('' for none)")


def _file_flags(g) -> None:
    """How the rows of task files are read: one set of flags for every command that reads them."""
    g.add_argument("--map", default="", metavar="FIELD=COLUMN,...",
                   help="columns of the task files, e.g. prompt=question,answer=solution")
    g.add_argument("--verifier", default="", help="acceptance criteria of rows without a verifier column "
                                                  "(math, number, exact, regex, choice, json, code, ...)")
    g.add_argument("--answer-at", default="", metavar="WHERE",
                   help="where the final answer must be: final | boxed | answer_line | last_line | whole")
    g.add_argument("--split", default="", help="keep only the rows whose split column equals this")
    g.add_argument("--system-prompt", default="", help="system message for prompts that have none")
    g.add_argument("--instruction", default=None,
                   help="answer-format instruction added to prompts (default: the verifier's; '' for none)")
    g.add_argument("--reward", action="append", default=[], metavar="MODULE:FN[=WEIGHT]",
                   help="custom Python reward function as the acceptance criteria (repeatable)")


def _file_entries(paths: list[str], args) -> list[dict]:
    from rlvr.tasks.rows import parse_map

    entry: dict = {}
    if args.map:
        entry["map"] = parse_map(args.map)
    for key in ("verifier", "split", "system_prompt"):
        if getattr(args, key):
            entry[key] = getattr(args, key)
    if args.instruction is not None:
        entry["instruction"] = args.instruction
    if args.answer_at:
        entry["options"] = {"answer_at": args.answer_at}
    if args.reward:
        entry["reward"] = list(args.reward)
    return [{"path": p, **entry} for p in paths]


def _apply_task_args(data: dict, args, *, eval_section: str | None = None) -> dict:
    """Put the task flags into a config dict (recipe + --set already applied)."""
    if getattr(args, "model", None):
        data["model"] = args.model
    load = {k: v for k, v in (("dtype", args.dtype), ("chat_template", args.chat_template)) if v}
    if args.trust_remote_code:
        load["trust_remote_code"] = True
    if load:
        data["model_load"] = {**data.get("model_load", {}), **load}
    sources = list(args.tasks) + list(getattr(args, "conversations", []))
    if args.tasks:
        data["task_files"] = list(data.get("task_files", [])) + _file_entries(args.tasks, args)
    if getattr(args, "conversations", None):
        data["conversation_files"] = list(data.get("conversation_files", [])) + list(args.conversations)
    if args.domains is not None:
        data["domains"] = [d.strip() for d in args.domains.split(",") if d.strip()]
    elif sources and "domains" not in data:
        data["domains"] = []  # the user's files alone
    if eval_section and getattr(args, "eval_tasks", None):
        section = data.setdefault(eval_section, {})
        section["task_files"] = list(section.get("task_files", [])) + _file_entries(args.eval_tasks, args)
        section.setdefault("domains", [])
    return data


def _load(cls, args, *, eval_section: str | None = None):
    from rlvr.config import apply_overrides, from_dict, read_yaml

    overrides = list(args.overrides)
    if getattr(args, "out", None):
        overrides.append(f"out={args.out}")
    data = apply_overrides(read_yaml(args.config) if args.config else {}, overrides)
    if hasattr(args, "tasks"):
        data = _apply_task_args(data, args, eval_section=eval_section)
    return from_dict(cls, data)


def cmd_quickstart(args) -> None:
    from rlvr.train.quickstart import QuickstartConfig, run_quickstart

    run_quickstart(_load(QuickstartConfig, args), resume=args.resume)


def cmd_pretrain(args) -> None:
    from rlvr.train.pretrain import PretrainConfig, run_pretrain

    cfg = _load(PretrainConfig, args)
    print(json.dumps(run_pretrain(cfg, resume=args.resume), indent=2))
    print(f"model: {cfg.out}/final")


def cmd_sft(args) -> None:
    from rlvr.train.sft import SFTConfig, run_sft

    cfg = _load(SFTConfig, args)
    print(json.dumps(run_sft(cfg), indent=2))
    print(f"model: {cfg.out}/final")


def cmd_train(args) -> None:
    from rlvr.train.grpo import GRPOConfig, run_grpo

    cfg = _load(GRPOConfig, args, eval_section="eval")
    result = run_grpo(cfg, resume=args.resume)
    print(json.dumps(result, indent=2))
    if "eval_report" in result:
        from rlvr.eval.table import print_eval

        print_eval(json.loads(Path(result["eval_report"]).read_text()))
    print(f"model: {cfg.out}/final")


def cmd_pairs(args) -> None:
    from rlvr.train.verified_pairs import PairsConfig, run_pairs

    print(json.dumps(run_pairs(_load(PairsConfig, args)), indent=2))


def cmd_dpo(args) -> None:
    from rlvr.config import apply_overrides, from_dict, read_yaml
    from rlvr.train.dpo import DPOConfig, run_dpo

    overrides = list(args.overrides) + ([f"out={args.out}"] if args.out else [])
    data = apply_overrides(read_yaml(args.config) if args.config else {}, overrides)
    for key in ("model", "ref_model"):
        if getattr(args, key):
            data[key] = getattr(args, key)
    if args.pairs:
        entry = {k: v for k, v in (("system_prompt", args.system_prompt),) if v}
        if args.map:
            from rlvr.tasks.rows import parse_map

            entry["map"] = parse_map(args.map)
        data["pair_files"] = list(data.get("pair_files", [])) + [{"path": p, **entry} for p in args.pairs]
    cfg = from_dict(DPOConfig, data)
    print(json.dumps(run_dpo(cfg, resume=args.resume), indent=2))
    print(f"model: {cfg.out}/final")


def cmd_eval(args) -> None:
    from rlvr.config import apply_overrides, from_dict, read_yaml, resolve_device
    from rlvr.eval.evaluate import EvalConfig, evaluate
    from rlvr.eval.table import print_eval
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.tasks.sets import build_task_set, needs_sandbox

    if args.suite != "default":
        raise UserError(f"unknown eval suite {args.suite!r}; choose one of: default")
    data = apply_overrides(read_yaml(args.config) if args.config else {}, args.overrides)
    data = _apply_task_args(data, args)
    model_dir = data.pop("model", None) or args.model
    if not model_dir:
        raise UserError("rlvr eval needs --model DIR (a Hugging Face causal-LM directory)")
    cfg = from_dict(EvalConfig, data)
    model, tokenizer = load_model_and_tokenizer(model_dir, device=resolve_device("eval.device", cfg.device),
                                                options=cfg.model_load)
    tasks = build_task_set(cfg.domains, "eval", cfg.tasks, seed=cfg.seed, levels=cfg.levels, files=cfg.task_files)
    if needs_sandbox(cfg.domains, tasks):
        from rlvr.sandbox.config import shared_sandbox

        shared_sandbox()
    report = {"model": str(model_dir), **evaluate(model, tokenizer, tasks, cfg)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print_eval(report)
    print(f"wrote {args.out}")


def cmd_tasks(args) -> None:
    from rlvr.tasks import commands

    commands.run(args)


def cmd_sandbox(args) -> None:
    from rlvr.sandbox import detect

    if args.action == "info":
        backend = detect.choose(args.backend)
        print(f"backend: {backend.describe()}")
        print(f"machine: {detect.describe_caps(backend.caps)}")
        return
    if args.action == "check":
        from rlvr.sandbox.attacks import check

        code = check(backend=args.backend, allow_weak=args.allow_weak, workers=args.workers or 2)
    else:
        from rlvr.sandbox import bench

        code = bench.run_from_args(args)
    if code:
        raise SystemExit(code)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlvr", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_, resume in [
        ("quickstart", cmd_quickstart, "pretrain -> SFT -> eval -> GRPO -> eval -> report on the tiny default", True),
        ("pretrain", cmd_pretrain, "build the tokenizer and pretrain the tiny default model", True),
        ("sft", cmd_sft, "supervised fine-tuning on chat pairs (loss on assistant tokens)", False),
        ("train", cmd_train, "GRPO-family RL with verifiable rewards", True),
    ]:
        p = sub.add_parser(name, help=help_)
        _config_args(p, resume=resume)
        if name in ("sft", "train"):
            _task_args(p, eval_files=name == "train", conversations=name == "sft")
        p.set_defaults(fn=fn)
    p = sub.add_parser("pairs", help="preference pairs from a model's verified rollouts (passed vs failed)")
    _config_args(p)
    _task_args(p)
    p.set_defaults(fn=cmd_pairs)
    p = sub.add_parser("dpo", help="DPO-family preference training (sigmoid, ipo, robust, simpo) on pairs")
    _config_args(p, resume=True)
    p.add_argument("--model", help="Hugging Face causal-LM directory to start from (same as --set model=DIR)")
    p.add_argument("--ref-model", help="the frozen reference (default: --model)")
    p.add_argument("--pairs", action="append", default=[], metavar="FILE",
                   help="preference pairs: JSONL, CSV, Parquet or a datasets directory (repeatable)")
    p.add_argument("--map", default="", metavar="FIELD=COLUMN,...", help="columns of the pair files, e.g. prompt=question")
    p.add_argument("--system-prompt", default="", help="system message for prompts that have none")
    p.set_defaults(fn=cmd_dpo)
    p = sub.add_parser("eval", help="held-out pass@1 / pass@k per domain, level and tag, as JSON and a table")
    p.add_argument("--suite", default="default")
    p.add_argument("--out", default="eval.json")
    p.add_argument("-c", "--config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    _task_args(p)
    p.set_defaults(fn=cmd_eval)
    from rlvr.tasks.commands import add_parser as add_tasks_parser

    add_tasks_parser(sub, _file_flags, _file_entries)
    p = sub.add_parser("sandbox", help="sandbox self-test (attack suite), benchmark, or info")
    p.add_argument("action", choices=["check", "bench", "info"])
    p.add_argument("--allow-weak", action="store_true", help="check: run even on the weak backend")
    from rlvr.sandbox.bench import add_arguments

    add_arguments(p)  # --backend, --workers, --n, --rounds, --kind, --json (bench)
    p.set_defaults(fn=cmd_sandbox, quiet=False)
    return parser


def _quiet_libraries() -> None:
    """rlvr draws its own progress bars; silence transformers' per-load/save bars and advisories."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    keep_freed_memory()  # no page faults for each step's tensors (rlvr/train/allocator.py)
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", True):
        _quiet_libraries()
    try:
        args.fn(args)
    except UserError as e:
        print(f"rlvr: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlvr: interrupted; continue with --resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
