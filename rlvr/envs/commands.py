"""``rlvr envs``: the registered environments and the built environment images (``list``), what
each tool of one may touch (``show NAME``: its declared grants, ``rlvr.envs.grants``), and the
images' life cycle (``build SPEC...``, ``gc --budget SIZE``; ``rlvr.images``). This file only
parses flags and prints."""

from __future__ import annotations

import json
import sys

from rlvr.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("envs", help="environments and their tools' grants (what each tool may touch)")
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the registered environments and their tools, then the built images")
    b = actions.add_parser("build", help="build environment images from spec files (cached by content key)")
    b.add_argument("specs", nargs="+", help="image spec YAML files (docs/images.md)")
    b.add_argument("--store", default="", help="an object store URL (s3://, file://): fetch the image from there "
                   "instead of building it; push what is built here")
    g = actions.add_parser("gc", help="remove least recently used images beyond a disk budget, and crashed builds")
    g.add_argument("--budget", default="5G", help="keep images up to this size in all, e.g. 500M, 5G (default 5G)")
    g.add_argument("--remove-corrupt", action="store_true", help="also verify every image and remove corrupt ones")
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


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise UserError(f"--budget: {text!r} is not a size (e.g. 500M, 5G)") from None


def _images(args) -> int:
    from rlvr.images import cache
    from rlvr.images.build import build
    from rlvr.images.spec import read_spec

    if args.action == "build":
        from rlvr.store import StoreConfig

        for path in args.specs:
            done = build(read_spec(path), store=StoreConfig(url=args.store))
            i = done.image
            how = {"cache": "cached", "store": f"fetched from {args.store}", "built": "built"}[done.source]
            print(f"{i.name:<20} {i.key[:12]}  {how} in {done.seconds:.2f} s  {i.size_bytes / 2**20:.1f} MiB  "
                  f"python {i.python}  {i.path}")
        return 0
    removed = cache.gc(parse_size(args.budget), remove_corrupt=args.remove_corrupt)
    print(f"removed {len(removed)}: {', '.join(r[:20] for r in removed)}" if removed else "nothing to remove")
    return 0


def cmd_envs(args) -> int:
    from rlvr.envs import ENVS

    if args.action in ("build", "gc"):
        return _images(args)
    if args.action == "list":
        for name in sorted(ENVS):
            tools = declaration(name)["tools"]
            print(f"{name:<14} {', '.join(tools) if tools else '(no tools: one answer, judged by the task verifier)'}")
        from rlvr.images import cache

        built = cache.images()
        print(f"\nimages in {cache.root()}: {len(built)}" + ("" if built else " (rlvr envs build SPEC)"))
        for i in built:
            print(f"  {i.name:<20} {i.key[:12]}  {i.size_bytes / 2**20:.1f} MiB  python {i.python}  "
                  f"built in {i.build_s:.1f} s")
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
