"""``rlvr envs``: the registered environments (``list``) and what each tool of one may touch
(``show NAME``: its declared grants, ``rlvr.envs.grants``). This file only parses flags and prints."""

from __future__ import annotations

import json
import sys

from rlvr.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("envs", help="environments and their tools' grants (what each tool may touch)")
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the registered environments and their tools")
    a = actions.add_parser("show", help="one environment's tools and the grant of each")
    a.add_argument("name", help="an environment, e.g. code.repair (see `rlvr envs list`)")
    a.add_argument("--json", action="store_true", help="print the declaration as JSON")
    p.set_defaults(fn=cmd_envs)


def declaration(name: str) -> dict:
    """Environment ``name``'s tools as data: per tool its grant (``describe()``), or None for a
    control tool that runs no code."""
    from rlvr.envs import ENVS

    if name not in ENVS:
        raise UserError(f"no environment {name!r}; environments: {', '.join(sorted(ENVS))}")
    cls = ENVS.get(name)
    grants = getattr(cls, "grants", {})
    doc = sys.modules[cls.__module__].__doc__ if cls.__module__ != "rlvr.envs.base" else cls.__doc__
    return {"env": name, "doc": (doc or "").strip().split("\n")[0],
            "tools": {tool: (g.describe() if g is not None else None) for tool, g in grants.items()}}


def cmd_envs(args) -> int:
    from rlvr.envs import ENVS

    if args.action == "list":
        for name in sorted(ENVS):
            tools = declaration(name)["tools"]
            print(f"{name:<14} {', '.join(tools) if tools else '(no tools: one answer, judged by the task verifier)'}")
        return 0
    d = declaration(args.name)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    from rlvr.envs.grants import Grant

    print(f"{d['env']}: {d['doc']}")
    if not d["tools"]:
        print("  no tools")
    for tool, g in d["tools"].items():
        grant = "control tool: runs no code, touches nothing" if g is None else Grant(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()}).summary()
        print(f"  {tool:<12} {grant}")
    return 0
