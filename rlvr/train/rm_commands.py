"""``rlvr rm train | steps``: reward-model training and step-labelled data (docs/reward-models.md)."""

from __future__ import annotations

import json


def add_parser(sub, config_args) -> None:
    p = sub.add_parser("rm", help="reward models: train one on preference pairs or step labels; label steps")
    actions = p.add_subparsers(dest="rm_action", required=True)
    t = actions.add_parser("train", help="train a reward model (outcome: pairs; process: step labels)")
    config_args(t, resume=True)
    t.add_argument("--model", help="causal-LM directory the backbone starts from (same as --set model=DIR)")
    t.add_argument("--pairs", action="append", default=[], metavar="FILE",
                   help="preference pairs (the formats rlvr dpo reads; rlvr pairs writes them; repeatable)")
    t.add_argument("--eval-pairs", action="append", default=[], metavar="FILE", help="held-out pairs (repeatable)")
    t.add_argument("--steps", action="append", default=[], metavar="FILE",
                   help="step-labelled solutions for a process reward model (rlvr rm steps writes them)")
    t.set_defaults(fn=cmd_train)
    s = actions.add_parser("steps", help="step-labelled solutions from a model's samples (math.arith, math.word)")
    config_args(s)
    s.add_argument("--model", help="the model sampled (same as --set model=DIR)")
    s.set_defaults(fn=cmd_steps)


def _data(args) -> dict:
    from rlvr.config import apply_overrides, read_yaml

    overrides = list(args.overrides) + ([f"out={args.out}"] if args.out else [])
    data = apply_overrides(read_yaml(args.config) if args.config else {}, overrides)
    if args.model:
        data["model"] = args.model
    return data


def cmd_train(args) -> None:
    from rlvr.config import from_dict
    from rlvr.train.reward_model import RMConfig, run_rm

    data = _data(args)
    for flag, key in ((args.pairs, "pair_files"), (args.eval_pairs, "eval_pair_files"), (args.steps, "step_files")):
        if flag:
            data[key] = list(data.get(key, [])) + list(flag)
    if args.steps and "kind" not in data:
        data["kind"] = "process"
    cfg = from_dict(RMConfig, data)
    print(json.dumps(run_rm(cfg, resume=args.resume), indent=2))
    print(f"reward model: {cfg.out}/final")


def cmd_steps(args) -> None:
    from rlvr.config import from_dict
    from rlvr.rm.process import StepsConfig, run_steps

    print(json.dumps(run_steps(from_dict(StepsConfig, _data(args))), indent=2))
