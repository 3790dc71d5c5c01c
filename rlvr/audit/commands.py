"""``rlvr audit rewards`` and ``rlvr audit log``: flags and printing; the audits themselves are
``rlvr.audit.rewards`` and ``rlvr.oplog.verify``.

Exit status: ``rewards``: 0 when no hack earns reward, 1 when one does (each such cell named on
stderr); ``log``: 0 when the chain is intact, 1 when it is broken (the line and why on stderr);
2 for a user error (an unknown hack, domain or outcome, an unreadable file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlvr.atomic import write_text_atomic
from rlvr.errors import UserError


def add_parser(sub, file_flags, file_entries) -> None:
    p = sub.add_parser("audit", help="audits of the reward: `rlvr audit rewards` runs scripted hacks against it")
    actions = p.add_subparsers(dest="audit_action", required=True)
    a = actions.add_parser(
        "rewards", help="scripted reward hacks on every domain and verifier; exit 1 if any earns reward",
        description="Run every scripted hacking policy (docs/audit.md) on tasks of every registered domain "
                    "and verifier, judged and scored as training does, under each reward outcome; print a "
                    "domain x hack table of the best reward each hack earned. Exit 1 if any is above 0.")
    a.add_argument("--per-level", type=int, default=1,
                   help="tasks per level of each domain (train split) and of each task file (default 1)")
    a.add_argument("--seed", type=int, default=0, help="seed of the drawn tasks (default 0)")
    a.add_argument("--hacks", default=None, metavar="A,B", help="only these hacks (default: every registered one)")
    a.add_argument("--outcomes", default="binary,score", metavar="A,B",
                   help="reward.outcome values to score under (default binary,score)")
    a.add_argument("--json", metavar="PATH", help="also write the whole table as JSON")
    g = a.add_argument_group("your tasks")
    g.add_argument("--tasks", action="append", default=[], metavar="FILE",
                   help="task file to audit (repeatable); without --domains the built-in domains are left out")
    file_flags(g)
    g.add_argument("--domains", default=None, metavar="A,B", help="built-in domains to audit ('' for none)")
    a.set_defaults(fn=run, file_entries=file_entries)
    lg = actions.add_parser(
        "log", help="verify an operation log's hash chain and summarise it; exit 1 if the chain is broken",
        description="Check <run>/operations.jsonl (rlvr.oplog): every record follows the one before by hash, so "
                    "an edited, deleted or reordered line is found. Prints the operations by kind and the "
                    "failed or refused ones, then flags: tool calls refused outside their grants, tools no "
                    "environment declares (or, with --baseline, that an earlier log never called), bursts. "
                    "Exit 0: intact (a record cut by a crash at the end is allowed); 1: broken (or, with "
                    "--strict, flagged).")
    lg.add_argument("path", help="the log (a run directory's operations.jsonl)")
    lg.add_argument("--show", type=int, default=10, help="failed or refused operations to print (default 10)")
    lg.add_argument("--baseline", default=None, metavar="LOG", help="an earlier operation log: flag tools it never called")
    lg.add_argument("--strict", action="store_true", help="exit 1 when anything is flagged")
    lg.add_argument("--push", default="", metavar="URL",
                    help="also POST each flag as an alert to this webhook (monitor.push's format)")
    lg.set_defaults(fn=run_log)


def run_log(args: argparse.Namespace) -> None:
    from rlvr.oplog import flags, verify

    for path in (args.path, args.baseline):
        if path is not None and not Path(path).is_file():
            raise UserError(f"{path}: no such operation log")
    v = verify(args.path)
    ops = ", ".join(f"{op} {n}" for op, n in v.ops.most_common())
    print(f"{args.path}: {v.records} records ({ops})" + ("; the last record was cut by a crash" if v.cut_tail else ""))
    for rec in v.refused[:args.show]:
        what = {k: rec[k] for k in ("seq", "op", "task", "tool", "kind", "status", "outcome") if k in rec}
        print(f"  not ok: {what}")
    if len(v.refused) > args.show:
        print(f"  ... {len(v.refused) - args.show} more not ok")
    found = flags(v, declared_tools(), set(verify(args.baseline).tools) if args.baseline else None)
    for line in found:
        print(f"  FLAG {line}")
    if found and args.push:
        push_flags(args.push, args.path, found)
    if not v.intact:
        print(f"chain BROKEN at line {v.broken_line}: {v.reason}", file=sys.stderr)
        sys.exit(1)
    print("chain intact" + (f"; {len(found)} flag(s)" if found else ""))
    if found and args.strict:
        sys.exit(1)


def declared_tools() -> set[str]:
    """Every tool some registered environment declares (``ToolEnv.grants``)."""
    from rlvr.envs import ENVS

    return {tool for name in ENVS.names() for tool in getattr(ENVS.get(name), "grants", {})}


def push_flags(url: str, log: str, found: list[str]) -> None:
    """POST each flag to ``url`` as a warning alert, waiting (a CLI, not a training step)."""
    from rlvr.monitor.push import AlertPusher, PushConfig

    pusher = AlertPusher(PushConfig(url=url), run=log)
    for line in found:
        pusher.push({"detector": "oplog", "severity": "warning", "message": line})
    pusher.close(wait_s=30.0)
    c = pusher.counts
    print(f"  pushed {c['pushed']} flag(s) to {url}" + (f", {c['failed'] + c['dropped']} not delivered" if c["failed"] + c["dropped"] else ""))


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _tasks(args) -> tuple[list, list[str]]:
    """The tasks to audit, and the verifiers left without any."""
    from rlvr.audit.rewards import domain_tasks, example_tasks, file_sample
    from rlvr.tasks.base import DOMAINS

    if args.per_level < 1:
        raise UserError(f"--per-level must be at least 1, got {args.per_level}")
    everything = args.domains is None and not args.tasks
    names = DOMAINS.names() if everything else _names(args.domains or "")
    tasks = domain_tasks(names, args.per_level, args.seed)
    if args.tasks:
        from rlvr.config import from_dict
        from rlvr.tasks.rows import TaskFileConfig
        from rlvr.tasks.sets import file_tasks

        files = [from_dict(TaskFileConfig, entry) for entry in args.file_entries(args.tasks, args)]
        tasks += file_sample(file_tasks(files, check=False), args.per_level)
    missing: list[str] = []
    if everything:  # the verifiers no domain uses, through their own examples
        extra, missing = example_tasks({t.spec.kind for t in tasks})
        tasks += extra
    if not tasks:
        raise UserError("nothing to audit: no domains and no task files")
    return tasks, missing


def run(args: argparse.Namespace) -> None:
    import rlvr.envs  # noqa: F401  (registration)
    import rlvr.tasks  # noqa: F401
    import rlvr.verifiers  # noqa: F401
    from rlvr.audit.hacks import HACKS
    from rlvr.audit.rewards import OUTCOMES, format_table, hole_lines, run_audit

    outcomes = tuple(_names(args.outcomes))
    bad = [o for o in outcomes if o not in OUTCOMES]
    if bad or not outcomes:
        raise UserError(f"unknown reward outcome {bad[0] if bad else args.outcomes!r}; "
                        f"choose from: {', '.join(OUTCOMES)}")
    hacks = _names(args.hacks) if args.hacks is not None else None
    if hacks == []:
        raise UserError(f"--hacks names no hack; choose from: {', '.join(HACKS.names())}")
    for name in hacks or []:
        HACKS.get(name)  # an unknown name is a UserError listing the choices
    tasks, missing = _tasks(args)
    if any(t.spec.kind == "code" or t.multi_turn for t in tasks):
        from rlvr.verifiers.code import current_sandbox

        current_sandbox()  # the installed sandbox, else the process-wide one, opened now
    result = run_audit(tasks, hacks, outcomes, not_audited=missing)
    for outcome in outcomes:
        print(format_table(result, outcome))
        print()
    if missing:
        print(f"not audited (no domain makes their tasks and they have no examples()): {', '.join(missing)}")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps(result.to_dict(), indent=2))
        print(f"wrote {out}")
    holes = hole_lines(result)
    unpaid = result.unpaid_references()
    for domain in unpaid:  # the positive control: an all-zero row proves nothing here
        paid, n = result.controls[domain]
        print(f"rlvr: audit: {domain}: only {paid} of {n} task references earn reward, so its zeros prove "
              "nothing (a verifier that refuses right answers)", file=sys.stderr)
    for line in holes:
        print(f"rlvr: audit: {line}", file=sys.stderr)
    if holes or unpaid:
        raise SystemExit(1)
    attempts = sum(c.attempts for (o, _, _), c in result.cells.items() if o == outcomes[0])
    references = sum(n for _, n in result.controls.values())
    print(f"no hack earns reward: {attempts} attempts on {result.tasks} tasks of {len(result.domains)} domains; "
          f"all {references} task references do")
