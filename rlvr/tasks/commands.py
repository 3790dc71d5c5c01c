"""``rlvr tasks``: list and show built-in domains; validate, stats, export and from-failures for
the user's task files. The logic lives in ``rlvr.tasks.validate``; this file only parses flags
and prints."""

from __future__ import annotations

import argparse
import json

from rlvr.errors import UserError


def add_parser(sub, file_flags, file_entries) -> None:
    p = sub.add_parser("tasks", help="built-in domains; validate, stats, export, from-failures for task files")
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("list", help="the built-in domains and their levels")
    a = actions.add_parser("show", help="print generated tasks of a built-in domain as JSONL")
    a.add_argument("--domain", default="math.arith")
    a.add_argument("--split", default="train", choices=["train", "eval"])
    a.add_argument("--level", type=int, default=0)
    a.add_argument("--n", type=int, default=3)
    a.add_argument("--seed", type=int, default=0)
    for name, help_ in [("validate", "check a task file: every problem with file, line and field; exit 2 if any"),
                        ("stats", "counts by domain, level, verifier and tag; prompt and answer lengths"),
                        ("export", "write a task file as rlvr JSONL (one Task per line)")]:
        a = actions.add_parser(name, help=help_)
        a.add_argument("file", help="JSONL, CSV, Parquet or datasets directory")
        file_flags(a.add_argument_group("how rows are read"))
        if name == "validate":
            a.add_argument("--eval", action="append", default=[], metavar="EVAL_FILE",
                           help="eval set(s) the file must not overlap (ids and normalised prompts)")
            a.add_argument("--no-answers", action="store_true",
                           help="skip checking each gold answer/reference against its own verifier")
        if name == "export":
            a.add_argument("--out", required=True)
        a.set_defaults(file_entries=file_entries)
    a = actions.add_parser("from-failures", help="the failed items of an `rlvr eval` result as a task file")
    a.add_argument("result", help="eval.json written by `rlvr eval --out`")
    a.add_argument("--out", required=True)
    a.add_argument("--below", type=float, default=1.0,
                   help="keep tasks whose pass rate is below this (default 1: any failed sample)")
    p.set_defaults(fn=run)


def _file_config(args, path: str):
    from rlvr.config import from_dict
    from rlvr.tasks.rows import TaskFileConfig

    return from_dict(TaskFileConfig, args.file_entries([path], args)[0])


def run(args: argparse.Namespace) -> None:
    from rlvr.tasks import validate as v

    if args.action == "list":
        from rlvr.tasks.base import DOMAINS

        width = max(map(len, DOMAINS.names()))
        for name in DOMAINS.names():
            d = DOMAINS.get(name)
            print(f"{name:<{width}} {d.version}  levels {list(d.levels)}")
        for hint in DOMAINS.lazy_hints():
            print(f"{hint}  (made on first use)")
    elif args.action == "show":
        from rlvr.tasks.base import generate_tasks

        for task in generate_tasks(args.domain, args.split, args.n, seed=args.seed,
                                   levels=[args.level] if args.level else None):
            print(json.dumps(task.to_dict()))
    elif args.action == "validate":
        cfg = _file_config(args, args.file)
        problems = v.validate(cfg, [_file_config(args, e) for e in args.eval], check_answers=not args.no_answers)
        for p in problems:
            print(p)
        if problems:
            raise UserError(f"{len(problems)} problem(s) in {args.file}")
        print(f"{args.file}: no problems")
    elif args.action in ("stats", "export"):
        from rlvr.tasks.files import load_tasks

        tasks, _ = load_tasks(_file_config(args, args.file), check_solutions=False)
        if args.action == "stats":
            print(json.dumps(v.stats(tasks), indent=2))
        else:
            print(f"wrote {len(tasks)} tasks to {v.export(tasks, args.out)}")
    else:
        tasks = v.from_failures(args.result, below=args.below)
        print(f"wrote {len(tasks)} failed tasks of {args.result} to {v.export(tasks, args.out)} "
              "(marked from_eval: training refuses them unless allow_eval_tasks=true)")
