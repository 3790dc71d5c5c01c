"""The ``rlvr`` command line. User errors print one line and exit 2; bugs keep their traceback."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path

from rlvr.errors import UserError
from rlvr.train.allocator import keep_freed_memory


def _config_args(p: argparse.ArgumentParser, *, resume: bool = False) -> None:
    """Add the recipe flags every training command takes: -c/--config, --set, --out (and --resume)."""
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
    """One task-file config entry per path, carrying the file flags (--map, --verifier, --answer-at, ...)."""
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
    """The typed config ``cls``: YAML recipe, then --set (+ --out, --backend, --ray-address), then task flags."""
    from rlvr.config import apply_overrides, from_dict, read_yaml

    overrides = list(args.overrides)
    if getattr(args, "out", None):
        overrides.append(f"out={args.out}")
    if getattr(args, "backend", None):
        overrides.append(f"backend={args.backend}")
    if getattr(args, "ray_address", None):
        overrides.append(f"ray.address={args.ray_address}")
    data = apply_overrides(read_yaml(args.config) if args.config else {}, overrides)
    if hasattr(args, "tasks"):
        data = _apply_task_args(data, args, eval_section=eval_section)
    return from_dict(cls, data)


def cmd_quickstart(args) -> None:
    """``rlvr quickstart``: run the whole recipe (pretrain -> SFT -> [pairs -> DPO] -> GRPO, evals, report)."""
    from rlvr.train.quickstart import QuickstartConfig, run_quickstart

    run_quickstart(_load(QuickstartConfig, args), resume=args.resume)


def cmd_pretrain(args) -> None:
    """``rlvr pretrain``: tokenizer + tiny model from the procedural corpus; prints the result and the model dir."""
    from rlvr.train.pretrain import PretrainConfig, run_pretrain

    cfg = _load(PretrainConfig, args)
    print(json.dumps(run_pretrain(cfg, resume=args.resume), indent=2))
    print(f"model: {cfg.out}/final")


def cmd_sft(args) -> None:
    """``rlvr sft``: supervised fine-tuning (--nproc N relaunches under torchrun: data parallel,
    sft.shard, sft.sequence_parallel); rank 0 prints the result and the model dir."""
    from rlvr.train.distributed import launched
    from rlvr.train.sft import SFTConfig, run_sft

    if args.nproc > 1 and launched().world == 1:
        return data_parallel_launch(args.nproc, args.argv)
    cfg = _load(SFTConfig, args)
    result = run_sft(cfg, resume=args.resume)
    if launched().is_main:
        print(json.dumps(result, indent=2))
        print(f"model: {cfg.out}/final")
    return None


def cmd_train(args) -> None:
    """``rlvr train``: GRPO in process, on Ray (--backend ray) or data parallel (--nproc N relaunches under
    torchrun); rank 0 prints the result, the eval table if there was one, and the model dir."""
    from rlvr.train.distributed import launched
    from rlvr.train.grpo import GRPOConfig, run_grpo

    if args.nproc > 1 and launched().world == 1:
        return data_parallel_launch(args.nproc, args.argv)
    cfg = _load(GRPOConfig, args, eval_section="eval")
    if not launched().is_main:  # data parallel: rank 0 reports
        run_grpo(cfg, resume=args.resume)
        return None
    if cfg.backend == "ray":
        from rlvr.train.ray_train import run_on_ray

        result = run_on_ray(cfg, resume=args.resume)
    else:
        result = run_grpo(cfg, resume=args.resume)
    print(json.dumps(result, indent=2))
    if "eval_report" in result:
        from rlvr.eval.table import print_eval

        print_eval(json.loads(Path(result["eval_report"]).read_text()))
    print(f"model: {cfg.out}/final")


def data_parallel_launch(nproc: int, argv: list[str]) -> None:
    """``rlvr train --nproc N ...``: the same command in N processes on this machine, under
    ``torch.distributed.run`` (torchrun), which sets each one's rank."""
    import subprocess

    code = subprocess.run(torchrun_command(nproc, argv), check=False).returncode
    if code:
        raise UserError(f"the {nproc} training processes (torchrun) exited with status {code}; their output is above")


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """torchrun running ``rlvr argv`` in ``nproc`` local processes, without ``--nproc N`` (torchrun
    would take it for its own ``--nproc-per-node``)."""
    rest = [a for i, a in enumerate(argv)
            if a != "--nproc" and not a.startswith("--nproc=") and (i == 0 or argv[i - 1] != "--nproc")]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "rlvr.cli", *rest]


def cmd_pairs(args) -> None:
    """``rlvr pairs``: preference pairs from a model's verified samples (passed vs failed); prints the summary."""
    from rlvr.train.verified_pairs import PairsConfig, run_pairs

    print(json.dumps(run_pairs(_load(PairsConfig, args)), indent=2))


def cmd_dpo(args) -> None:
    """``rlvr dpo``: DPO-family training on pair files (--model, --ref-model, --pairs with --map and
    --system-prompt over the recipe and --set); prints the result and the model dir."""
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


def _read_report(path: str, which: str) -> dict:
    """Read an eval report (a JSON object); a UserError naming ``which`` report if it is not one."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{which} report {path}: not a readable eval result ({e})") from None
    if not isinstance(report, dict):
        raise UserError(f"{which} report {path}: not an eval result (no JSON object)")
    return report


def _gate_args(p: argparse.ArgumentParser) -> None:
    """Add the regression-gate flags: --gate, --tolerance, --metric, --allow-different-suite."""
    from rlvr.eval.gate import DEFAULT_TOLERANCE

    g = p.add_argument_group("regression gate (docs/evaluation.md)")
    g.add_argument("--gate", action="store_true",
                   help="exit 1 (one line per domain) when a domain's pass@1 drops more than --tolerance points")
    g.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="POINTS",
                   help=f"per-domain drop the gate accepts, in points (default {DEFAULT_TOLERANCE:g})")
    g.add_argument("--metric", default="pass@1", help="the compared value (default pass@1; pass@k if both reports have it)")
    g.add_argument("--allow-different-suite", action="store_true",
                   help="compare reports whose task sets differ (otherwise refused with exit 2)")


def _compare(baseline: dict, now: dict, args, labels: tuple[str, str]) -> None:
    """Print the comparison; exit 2 on different task sets (unless allowed), 1 on a regression with --gate."""
    from rlvr.eval.gate import compare, print_gate

    result = compare(baseline, now, tolerance=args.tolerance, metric=args.metric)
    if not result.same_suite and not args.allow_different_suite:
        raise UserError(result.suite_line() + "; compare reports of one suite, or pass --allow-different-suite")
    print_gate(result, labels=labels)
    if not result.same_suite:
        print(f"note: {result.suite_line()} (--allow-different-suite)")
    if args.gate:
        if not result.passed:
            for line in result.regression_lines():
                print(f"rlvr: regression: {line}", file=sys.stderr)
            raise SystemExit(1)
        print(f"gate passed: no domain dropped more than {args.tolerance:g} points of {args.metric}")


def _labels(baseline: str, now: str) -> tuple[str, str]:
    """How the table and the radar name two reports: their file stems, or whole paths when those agree."""
    labels = (Path(baseline).stem, Path(now).stem)
    return (baseline, now) if labels[0] == labels[1] else labels


def _radar(reports: dict[str, dict], path: str | Path, metric: str) -> None:
    """Draw the per-domain ``metric`` of the labelled reports as one radar PNG at ``path`` and print its path."""
    from rlvr.eval.plots import domain_scores, radar

    series = {label: domain_scores(r, metric) for label, r in reports.items()}
    if not any(series.values()):
        raise UserError(f"no {metric} per domain in the report(s) to draw; choose --metric among their pass@k")
    print(f"wrote {radar(series, path, metric=metric)}")


def cmd_eval(args) -> None:
    """``rlvr eval``: evaluate a model on a suite (or task files), write the report to --out, print the table,
    draw the radar; with --baseline (same task set unless allowed) print the change, and gate with --gate."""
    from rlvr.config import apply_overrides, from_dict, read_yaml, resolve_device
    from rlvr.eval.evaluate import EvalConfig
    from rlvr.eval.report import eval_report
    from rlvr.eval.suites import (
        SELECTION_KEYS,
        fingerprint,
        get_suite,
        report_fingerprint,
        selection_changes,
    )
    from rlvr.eval.table import print_eval
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.tasks.sets import build_task_set, needs_sandbox

    suite = get_suite(args.suite)
    data = apply_overrides(read_yaml(args.config) if args.config else {}, args.overrides)
    data = _apply_task_args(data, args)
    model_dir = data.pop("model", None) or args.model
    if not model_dir:
        raise UserError("rlvr eval needs --model DIR (a Hugging Face causal-LM directory)")
    modified = selection_changes(suite, data)
    data = {**{k: v for k, v in suite.eval_fields().items() if k in SELECTION_KEYS}, **data}
    cfg = from_dict(EvalConfig, data)
    baseline = _read_report(args.baseline, "baseline") if args.baseline else None
    tasks = build_task_set(cfg.domains, "eval", cfg.tasks, seed=cfg.seed, levels=cfg.levels, files=cfg.task_files)
    fp = fingerprint(tasks)
    if baseline is not None and report_fingerprint(baseline) != fp and not args.allow_different_suite:
        raise UserError(f"baseline {args.baseline} was measured on another task set (fingerprint "
                        f"{(report_fingerprint(baseline) or 'unknown')[:12]}, this suite's {fp[:12]}); run its "
                        f"suite, or pass --allow-different-suite")
    model, tokenizer = load_model_and_tokenizer(model_dir, device=resolve_device("eval.device", cfg.device),
                                                options=cfg.model_load)
    if needs_sandbox(cfg.domains, tasks):
        from rlvr.sandbox.config import shared_sandbox

        shared_sandbox()
    out = Path(args.out)
    if args.op_log:
        from rlvr import oplog

        oplog.open_log(args.op_log, actor="eval")
        oplog.write("model_load", model=str(model_dir), outcome="ok")
    try:
        report = eval_report(model, tokenizer, tasks, cfg, seed=0, model_name=str(model_dir), settings=True, path=out,
                             suite={**suite.record(modified), "domains": list(cfg.domains)})
    finally:
        if args.op_log:
            oplog.close_log()
    print_eval(report)
    print(f"wrote {out}")
    labels = _labels(args.baseline, str(out)) if baseline is not None else ("", out.stem)
    if not args.no_radar:
        series = {labels[1]: report, **({f"{labels[0]} (baseline)": baseline} if baseline is not None else {})}
        _radar(series, args.radar or out.with_name(f"{out.stem}_radar.png"), args.metric)
    if baseline is not None:
        _compare(baseline, report, args, labels)


def cmd_eval_suites(args) -> None:
    """``rlvr eval suites``: describe the named suites or suite YAML files (default: every built-in suite)."""
    from rlvr.eval.suites import SUITES, describe, get_suite

    for spec in args.files or SUITES.names():
        print(describe(get_suite(spec)))


def cmd_eval_compare(args) -> None:
    """``rlvr eval compare A B``: per-domain change from baseline A to B (optional radar); --gate exits 1 on a drop."""
    baseline, now = _read_report(args.baseline, "baseline"), _read_report(args.current, "current")
    labels = _labels(args.baseline, args.current)
    if args.radar:
        _radar({labels[1]: now, f"{labels[0]} (baseline)": baseline}, args.radar, args.metric)
    _compare(baseline, now, args, labels)


def cmd_eval_contamination(args) -> None:
    """``rlvr eval contamination``: training task files against eval tasks (files and/or a suite) by id, canonical
    key or normalised prompt; prints the matches and exits 1 if any."""
    from collections import Counter

    from rlvr.config import from_dict
    from rlvr.eval.suites import get_suite, tasks_of
    from rlvr.tasks.rows import TaskFileConfig
    from rlvr.tasks.sets import file_tasks
    from rlvr.tasks.validate import contamination, contamination_text

    if not args.train:
        raise UserError("rlvr eval contamination needs --train FILE (the training task files)")

    def files(paths: list[str]) -> list[TaskFileConfig]:
        """Task-file configs for ``paths`` with the file flags."""
        return [from_dict(TaskFileConfig, entry) for entry in _file_entries(paths, args)]

    train = file_tasks(files(args.train), check=False)
    eval_tasks = file_tasks(files(args.eval), check=False) if args.eval else []
    if args.suite or not args.eval:
        suite = get_suite(args.suite or "default")
        eval_tasks += tasks_of(suite, check=False)
        print(f"eval: suite {suite.name} {suite.version}" + (f" + {', '.join(args.eval)}" if args.eval else ""))
    found = contamination(train, eval_tasks)
    if not found:
        print(f"clean: none of {len(train)} training tasks is among the {len(eval_tasks)} eval tasks "
              f"(same id, canonical key or normalised prompt)")
        return
    per_domain = Counter(c.eval.domain for c in found)
    print(f"{len(found)} of {len(train)} training tasks are eval tasks; per eval domain: "
          + ", ".join(f"{d} {n}" for d, n in sorted(per_domain.items())))
    for c in found[: args.show]:
        where = c.train.meta.get("where", c.train.id)
        print(f"  {where}: same {c.how} as {c.eval.id} ({c.eval.domain}): {contamination_text(c.eval)[:100]!r}")
    raise SystemExit(1)


def cmd_tasks(args) -> None:
    """``rlvr tasks ...``: handed to ``rlvr.tasks.commands.run``."""
    from rlvr.tasks import commands

    commands.run(args)


def cmd_sandbox(args) -> None:
    """``rlvr sandbox info | check | bench``: the backend and what the machine allows; the attack suite; the
    throughput benchmark. Exits with check's or bench's status when it is not 0."""
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


def cmd_report(args) -> None:
    """``rlvr report RUN_DIR``: write the run's report.html (or --out) and print its path."""
    from rlvr.report import write_report

    if args.per_step < 0:
        raise UserError(f"--per-step must be 0 or more, got {args.per_step}")
    print(f"wrote {write_report(args.run_dir, args.out, per_step=args.per_step)}")


def _report_parser(sub) -> None:
    """Add the ``rlvr report`` subcommand."""
    p = sub.add_parser("report", help="one self-contained report.html of a run (curves, evals, alerts, trajectories)",
                       description="Write a self-contained HTML report of a GRPO run or quickstart directory, "
                                   "a crashed one too (docs/report.md).")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (rlvr train --out) or a quickstart's out")
    p.add_argument("--out", metavar="HTML", help="where to write it (default: RUN_DIR/report.html)")
    p.add_argument("--per-step", type=int, default=4, metavar="N",
                   help="trajectory samples shown per saved step, besides the flagged ones (default 4)")
    p.set_defaults(fn=cmd_report)


def _eval_parser(sub) -> None:
    """Add ``rlvr eval`` (a model on a suite) and its subcommands suites, compare and contamination."""
    p = sub.add_parser("eval", help="held-out pass@1 / pass@k per domain, level and tag, as JSON, a table and a radar",
                       description="Evaluate a model on a suite (`rlvr eval suites` lists them), or: "
                                   "`rlvr eval compare A.json B.json [--gate]`, `rlvr eval contamination --train FILE`.")
    p.add_argument("--suite", default="default", metavar="NAME|FILE",
                   help="built-in suite (rlvr eval suites) or a suite YAML file (default: default)")
    p.add_argument("--out", default="eval.json")
    p.add_argument("-c", "--config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--radar", metavar="PNG", help="per-domain radar chart (default: <out stem>_radar.png beside --out)")
    p.add_argument("--no-radar", action="store_true", help="write no radar chart")
    p.add_argument("--baseline", metavar="JSON", help="an earlier eval report: print the per-domain change against it")
    p.add_argument("--op-log", metavar="PATH", help="operation log (rlvr.oplog): the model load, every tool call and "
                                                   "sandbox execution of the evaluation, hash-chained")
    _gate_args(p)
    _task_args(p)
    p.set_defaults(fn=cmd_eval)
    actions = p.add_subparsers(dest="eval_action", metavar="{suites,compare,contamination}")
    q = actions.add_parser("suites", help="list the built-in suites (or describe suite YAML files)")
    q.add_argument("files", nargs="*", metavar="SUITE", help="suite names or YAML files to describe")
    q.set_defaults(fn=cmd_eval_suites)
    q = actions.add_parser("compare", help="compare two eval reports per domain; --gate exits 1 on a regression")
    q.add_argument("baseline", help="the baseline eval report (JSON)")
    q.add_argument("current", help="the eval report to check (JSON)")
    q.add_argument("--radar", metavar="PNG", help="also draw both reports' per-domain radar")
    _gate_args(q)
    q.set_defaults(fn=cmd_eval_compare)
    q = actions.add_parser("contamination", help="is any training task an eval task? (id, canonical key or "
                                                 "normalised prompt); exit 1 if so")
    q.add_argument("--train", action="append", default=[], metavar="FILE", help="training task file (repeatable)")
    q.add_argument("--eval", action="append", default=[], metavar="FILE", help="eval task file (repeatable)")
    q.add_argument("--suite", default=None, metavar="NAME|FILE",
                   help="eval suite to check against (default: default, unless --eval files are given)")
    q.add_argument("--show", type=int, default=5, help="matches to print (default 5)")
    _file_flags(q)
    q.set_defaults(fn=cmd_eval_contamination)


def build_parser() -> argparse.ArgumentParser:
    """The ``rlvr`` argument parser with every subcommand; each sets ``fn``, the function that runs it."""
    parser = argparse.ArgumentParser(prog="rlvr", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_, resume in [
        ("quickstart", cmd_quickstart, "pretrain -> SFT -> eval -> GRPO -> eval -> report on the tiny default", True),
        ("pretrain", cmd_pretrain, "build the tokenizer and pretrain the tiny default model", True),
        ("sft", cmd_sft, "supervised fine-tuning on chat pairs (loss on assistant tokens)", True),
        ("train", cmd_train, "GRPO-family RL with verifiable rewards", True),
    ]:
        p = sub.add_parser(name, help=help_)
        _config_args(p, resume=resume)
        if name in ("sft", "train"):
            _task_args(p, eval_files=name == "train", conversations=name == "sft")
        if name == "train":
            p.add_argument("--backend", choices=["local", "ray"],
                           help="where rollouts, verification and training run (same as --set backend=...; "
                                "docs/distributed.md)")
            p.add_argument("--ray-address", metavar="local|auto|HOST:PORT",
                           help="with --backend ray: start a local instance, join this machine's cluster, or a head")
            p.add_argument("--nproc", type=int, default=1, metavar="N",
                           help="data parallel: run N processes on this machine with torchrun (needs "
                                "distributed.rollout_chunk; docs/distributed.md)")
        if name == "sft":
            p.add_argument("--nproc", type=int, default=1, metavar="N",
                           help="run N processes on this machine with torchrun: data parallel, or "
                                "sft.shard / sft.sequence_parallel (docs/distributed.md)")
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
    _eval_parser(sub)
    _report_parser(sub)
    from rlvr.tasks.commands import add_parser as add_tasks_parser

    add_tasks_parser(sub, _file_flags, _file_entries)
    from rlvr.audit.commands import add_parser as add_audit_parser

    add_audit_parser(sub, _file_flags, _file_entries)  # rlvr audit rewards
    from rlvr.envs.commands import add_parser as add_envs_parser

    add_envs_parser(sub)  # rlvr envs list|show
    from rlvr.flywheel.commands import add_parser as add_flywheel_parser

    add_flywheel_parser(sub)  # rlvr flywheel harvest|cycle|rollback
    from rlvr.train.rm_commands import add_parser as add_rm_parser

    add_rm_parser(sub, _config_args)  # rlvr rm train|steps
    p = sub.add_parser("sandbox", help="sandbox self-test (attack suite), benchmark, or info")
    p.add_argument("action", choices=["check", "bench", "info"])
    p.add_argument("--allow-weak", action="store_true", help="check: run even on the weak backend")
    from rlvr.sandbox.bench import add_arguments

    add_arguments(p)  # --backend, --workers, --n, --rounds, --kind, --json (bench)
    p.set_defaults(fn=cmd_sandbox, quiet=False)
    from rlvr.serve.cli import add_parser as add_serve_parser

    add_serve_parser(sub)  # rlvr serve (docs/serve.md)
    return parser


def _quiet_libraries() -> None:
    """rlvr draws its own progress bars; silence transformers' per-load/save bars and advisories."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    """Run one ``rlvr`` command (offline Hugging Face, freed memory kept); 0, 2 on a UserError (one line),
    130 on Ctrl-C."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    keep_freed_memory()  # no page faults for each step's tensors (rlvr/train/allocator.py)
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
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
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        print(f"rlvr: error: no space left on device ({e.filename or e.strerror}); the newest complete checkpoint "
              "is intact: free space, then continue with --resume", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
