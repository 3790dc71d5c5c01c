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


def _load(cls, args):
    from rlvr.config import load_config

    overrides = list(args.overrides)
    if getattr(args, "out", None):
        overrides.append(f"out={args.out}")
    return load_config(cls, args.config, overrides)


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

    cfg = _load(GRPOConfig, args)
    print(json.dumps(run_grpo(cfg, resume=args.resume), indent=2))
    print(f"model: {cfg.out}/final")


def cmd_eval(args) -> None:
    from rlvr.config import apply_overrides, from_dict, read_yaml, resolve_device
    from rlvr.eval.evaluate import EvalConfig, evaluate
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.tasks.base import generate_tasks

    if args.suite != "default":
        raise UserError(f"unknown eval suite {args.suite!r}; choose one of: default")
    data = apply_overrides(read_yaml(args.config) if args.config else {}, args.overrides)
    cfg = from_dict(EvalConfig, data)
    model, tokenizer = load_model_and_tokenizer(args.model, device=resolve_device("eval.device", cfg.device))
    tasks = generate_tasks(cfg.domains, "eval", cfg.tasks, seed=cfg.seed, levels=cfg.levels)
    report = evaluate(model, tokenizer, tasks, cfg)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    summary = {d: round(s["pass@1"], 4) for d, s in report["by_domain"].items()}
    print(json.dumps({"pass@1": round(report["overall"]["pass@1"], 4), "by_domain": summary}, indent=2))
    print(f"wrote {args.out}")


def cmd_tasks(args) -> None:
    from rlvr.tasks.base import DOMAINS, generate_tasks

    if args.action == "list":
        for name in DOMAINS.names():
            d = DOMAINS.get(name)
            print(f"{name:<14} {d.version}  levels {list(d.levels)}")
    else:
        for task in generate_tasks(args.domain, args.split, args.n, seed=args.seed,
                                   levels=[args.level] if args.level else None):
            print(json.dumps(task.to_dict()))


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
        p.set_defaults(fn=fn)
    p = sub.add_parser("eval", help="held-out pass@1 / pass@k per domain and level, as JSON")
    p.add_argument("--model", required=True, help="Hugging Face causal-LM directory")
    p.add_argument("--suite", default="default")
    p.add_argument("--out", default="eval.json")
    p.add_argument("-c", "--config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("tasks", help="list domains or show generated tasks")
    p.add_argument("action", choices=["list", "show"])
    p.add_argument("--domain", default="math.arith")
    p.add_argument("--split", default="train", choices=["train", "eval"])
    p.add_argument("--level", type=int, default=0)
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_tasks)
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
