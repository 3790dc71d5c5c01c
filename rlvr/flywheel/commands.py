"""``rlvr flywheel harvest | cycle | rollback``: flags and printing (docs/flywheel.md).

Exit status: ``harvest`` 0; ``cycle`` 0 when the candidate was pushed, 1 when the gate refused
it (each failing rule on stderr); ``rollback`` 0; 2 for a user error (a bad flag or file, an
unreachable server, a refused push).
"""

from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("flywheel", help="served traffic -> verified tasks -> GRPO -> gate -> deploy (docs/flywheel.md)")
    actions = p.add_subparsers(dest="flywheel_action", required=True)
    h = actions.add_parser("harvest", help="captured traffic (rlvr serve --capture) to train/held-out task files",
                           description="Turn captured requests with a reference (a correction, your checker, an "
                                       "approved answer) into task files: deduplicated, decontaminated against "
                                       "--eval files, validated, split by a stable key; a report of what was "
                                       "kept and why the rest was dropped.")
    h.add_argument("--traffic", required=True, metavar="DIR", help="the capture directory")
    h.add_argument("--criteria", required=True, metavar="FILE", help="criteria YAML: verifier, options, checker, ...")
    h.add_argument("--out", required=True, metavar="DIR", help="where train.jsonl, heldout.jsonl and report.json go")
    h.add_argument("--eval", action="append", default=[], metavar="FILE",
                   help="eval file whose items never become training tasks (repeatable)")
    h.add_argument("--held-out", type=float, default=0.2, help="share of kept tasks held out (default 0.2)")
    h.add_argument("--near-dup", type=float, default=0.8,
                   help="5-gram Jaccard similarity (same numbers) at which prompts are one (default 0.8)")
    h.set_defaults(fn=cmd_harvest)

    c = actions.add_parser("cycle", help="harvest, train, evaluate, gate and push (or resume an unfinished cycle)",
                           description="One turn of the loop from the weights the server serves; exit 1 when "
                                       "the gate refuses the candidate (the server keeps its weights).")
    c.add_argument("-c", "--config", help="flywheel YAML (rlvr.flywheel.cycle.FlywheelConfig keys)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    for flag, key in (("--server", "server"), ("--traffic", "traffic"), ("--criteria", "criteria"), ("--dir", "dir")):
        c.add_argument(flag, dest=key, default=None, help=f"config key '{key}'")
    c.add_argument("--eval", action="append", default=[], metavar="FILE",
                   help="acceptance task file (repeatable; added to eval_files)")
    c.set_defaults(fn=cmd_cycle)

    r = actions.add_parser("rollback", help="put back the weights served before the newest pushed cycle")
    r.add_argument("--dir", default="runs/flywheel", help="the flywheel directory (default runs/flywheel)")
    r.add_argument("--server", default="http://127.0.0.1:8000")
    r.add_argument("--admin-token", default="", help="default: env RLVR_ADMIN_TOKEN")
    r.set_defaults(fn=cmd_rollback)


def cmd_harvest(args) -> None:
    from rlvr.flywheel.harvest import HarvestConfig, harvest, print_report

    cfg = HarvestConfig(traffic=args.traffic, criteria=args.criteria, out=args.out, eval_files=args.eval,
                        held_out=args.held_out, near_dup=args.near_dup)
    print_report(harvest(cfg), args.out)


def flywheel_config(args):
    from rlvr.config import apply_overrides, from_dict, read_yaml
    from rlvr.flywheel.cycle import FlywheelConfig

    data = apply_overrides(read_yaml(args.config) if args.config else {}, args.overrides)
    for key in ("server", "traffic", "criteria", "dir"):
        if getattr(args, key):
            data[key] = getattr(args, key)
    if args.eval:
        data["eval_files"] = list(data.get("eval_files", [])) + list(args.eval)
    return from_dict(FlywheelConfig, data)


def cmd_cycle(args) -> None:
    from rlvr.flywheel.cycle import run_cycle

    result = run_cycle(flywheel_config(args))
    for name in ("acceptance", "regression"):
        got = result.get("gate", {}).get(name)
        if got:
            print(f"{name}: {100 * got['baseline']:.1f}% -> {100 * got['candidate']:.1f}% "
                  f"({got['change_pts']:+.1f} pts)")
    if result["pushed"]:
        print(f"cycle {result['cycle']}: pushed {result['after']['path']} (version {result['after']['version']})")
        return
    for line in result["gate"]["failures"]:
        print(f"gate: {line}", file=sys.stderr)
    print(f"cycle {result['cycle']}: refused; the server keeps {result['before']['path']}", file=sys.stderr)
    raise SystemExit(1)


def cmd_rollback(args) -> None:
    import os

    from rlvr.flywheel.cycle import rollback

    entry = rollback(args.dir, args.server, args.admin_token or os.environ.get("RLVR_ADMIN_TOKEN", ""))
    print(json.dumps(entry, indent=2))
