"""``rlvr audit rewards``, ``rlvr audit learnability`` and ``rlvr audit log``: flags and printing;
the audits themselves are ``rlvr.audit.rewards``, ``rlvr.audit.learnability`` and ``rlvr.oplog.verify``.

Exit status: ``rewards``: 0 when no hack earns reward, 1 when one does (each such cell named on
stderr); ``learnability``: 0 when held-out pass@1 rose on every domain and no noisy arm always
passes, 1 otherwise; ``log``: 0 when the chain is intact, 1 when it is broken (the line and why on stderr);
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
    le = actions.add_parser(
        "learnability", help="GRPO on each domain's reference policy with noise: does its reward teach?",
        description="For each domain, a policy over noise arms of its tasks' references (the clean reference "
                    "first; numbers off or in the wrong scale, jittered coordinates, ungrounded or laundered "
                    "answers) starts mostly noisy and is trained with GRPO on the real verifier's rewards; "
                    "prints held-out pass@1 before and after and what each arm earns (docs/audit.md). Exit 1 "
                    "if pass@1 did not rise or an arm other than the reference always passes.")
    le.add_argument("--domains", default="", metavar="A,B",
                    help="built-in domains whose spec kind has noise arms (number, svg, cad, data.analysis)")
    le.add_argument("--levels", default="1,2", metavar="1,2", help="levels to draw tasks from (default 1,2)")
    le.add_argument("--steps", type=int, default=15, help="GRPO steps (default 15)")
    le.add_argument("--tasks-per-step", type=int, default=8, help="training tasks a step (default 8)")
    le.add_argument("--samples", type=int, default=8, help="arms sampled per task, the GRPO group (default 8)")
    le.add_argument("--eval-tasks", type=int, default=40, help="held-out tasks (default 40)")
    le.add_argument("--start", type=float, default=0.05, help="the reference arm's probability at the start")
    le.add_argument("--outcome", default="binary", choices=("binary", "score"),
                    help="reward.outcome: binary, or score (partial credit)")
    le.add_argument("--seed", type=int, default=0)
    le.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    g = le.add_argument_group("your tasks")
    g.add_argument("--tasks", action="append", default=[], metavar="FILE",
                   help="task file (repeatable): every fifth row held out (at most --eval-tasks), the rest "
                        "trained on; rows whose reference fails their own criteria are left out")
    file_flags(g)
    le.set_defaults(fn=run_learnability_cmd, file_entries=file_entries)
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


def run_learnability_cmd(args: argparse.Namespace) -> None:
    import rlvr.tasks  # noqa: F401  (registration)
    from rlvr.audit.learnability import LearnabilityConfig, arms_for, run_learnability, summary, to_dict
    from rlvr.tasks.base import DOMAINS

    try:
        levels = tuple(int(x) for x in _names(args.levels))
    except ValueError:
        raise UserError(f"--levels must be comma-separated integers, got {args.levels!r}") from None
    for name in _names(args.domains):
        bad = [lv for lv in levels if lv not in DOMAINS.get(name).levels]  # an unknown domain lists the choices
        if bad or not levels:
            raise UserError(f"--levels: {name} has levels {list(DOMAINS.get(name).levels)}, not {bad or args.levels!r}")
        try:
            arms_for(DOMAINS.get(name).generate("train", levels[0], 0, args.seed))
        except ValueError as e:
            raise UserError(f"{name}: {e}") from None
    for flag, value, least in (("--steps", args.steps, 0), ("--tasks-per-step", args.tasks_per_step, 1),
                               ("--samples", args.samples, 2), ("--eval-tasks", args.eval_tasks, 1)):
        if value < least:
            raise UserError(f"{flag} must be at least {least}, got {value}")
    if not 0 < args.start < 1:
        raise UserError(f"--start must be in (0, 1), got {args.start}")
    if not _names(args.domains) and not args.tasks:
        raise UserError("nothing to check: give --domains, --tasks FILE, or both")

    def config(name: str) -> LearnabilityConfig:
        return LearnabilityConfig(name, levels=levels, steps=args.steps, tasks_per_step=args.tasks_per_step,
                                  samples_per_task=args.samples, start=args.start, outcome=args.outcome,
                                  eval_tasks=args.eval_tasks, seed=args.seed)

    targets = [(name, None) for name in _names(args.domains)]
    targets += list(zip(args.tasks, args.file_entries(args.tasks, args)))
    results, failed = [], []
    for name, entry in targets:  # a built-in domain (no entry) or a task file
        r = run_learnability(config(name)) if entry is None else _learn_file(name, entry, config(name))
        print(summary(r))
        results.append(to_dict(r))
        always = [a for a in r.arms[1:] if r.arm_pass[a] == 1.0]
        if always:
            failed.append(f"{name}: the noisy arm(s) {', '.join(always)} pass every held-out task")
        if args.steps and r.pass_after <= r.pass_before:
            failed.append(f"{name}: held-out pass@1 did not rise ({r.pass_before:.1%} -> {r.pass_after:.1%})")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps({"levels": list(levels), "domains": results}, indent=2))
        print(f"wrote {out}")
    for line in failed:
        print(f"rlvr: audit learnability: {line}", file=sys.stderr)
    if failed:
        raise SystemExit(1)


def _learn_file(path: str, entry: dict, cfg):
    """``learn_tasks`` on one task file's rows (a row failing its own criteria left out)."""
    from rlvr.audit.learnability import learn_tasks
    from rlvr.config import from_dict
    from rlvr.tasks.rows import TaskFileConfig
    from rlvr.tasks.sets import file_tasks

    try:
        return learn_tasks(cfg, file_tasks([from_dict(TaskFileConfig, entry)]))
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None


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
