"""What running tools under their grants costs: one tool call in the trainer's process (the body
called directly, as before grants) against the same call as a sandbox job under its grant
(``run_granted``), for the ``calculator`` and ``read_file`` tools, and a whole ``code.repair``
expert episode (every tool call sandboxed).

    python benchmarks/tool_grants.py [--calls 50] [--rounds 5] [--json PATH]

Each round makes ``--calls`` calls per side, sides alternated; reported: median milliseconds per
call over the rounds, the spread (min–max of the rounds' medians), and the added milliseconds per
call. The sandbox has 2 workers. Idle CPU at the start is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, write_json  # noqa: E402

import rlvr.tasks  # noqa: E402,F401
from rlvr.envs.base import make_env, play  # noqa: E402
from rlvr.envs.bodies import files  # noqa: E402
from rlvr.envs.bodies.calculator import calculate  # noqa: E402
from rlvr.envs.code_repair import CodeRepairEnv  # noqa: E402
from rlvr.envs.grants import run_granted  # noqa: E402
from rlvr.envs.tool_use import ToolUseEnv  # noqa: E402
from rlvr.sandbox import Sandbox  # noqa: E402
from rlvr.sandbox.workspace import Workspace  # noqa: E402
from rlvr.tasks.base import generate_tasks  # noqa: E402


def per_call_ms(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e3 * (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"idle CPU at start: {idle_cpu():.0%}")
    ws = Workspace.create({"ops.py": "def f(x):\n    return x + 1\n" * 20}, writable=True)
    task = generate_tasks(["code.repair"], "train", 1, seed=0)[0]
    with Sandbox(workers=2) as sb:
        cwd = os.getcwd()

        def read_in_process():
            os.chdir(ws.path)
            try:
                files.read_file("ops.py")
            finally:
                os.chdir(cwd)

        sides = {
            "calculator in-process": lambda: calculate("347 * 58 + 12"),
            "calculator granted": lambda: run_granted(sb, "calculator", calculate, ToolUseEnv.grants["calculator"],
                                                      {"expression": "347 * 58 + 12"}),
            "read_file in-process": read_in_process,
            "read_file granted": lambda: run_granted(sb, "read_file", files.read_file, CodeRepairEnv.grants["read_file"],
                                                     {"path": "ops.py"}, workdir=ws.path),
        }
        rounds: dict[str, list[float]] = {k: [] for k in sides}
        episode: list[float] = []
        env = make_env("code.repair", sandbox=sb)
        for _ in range(args.rounds):
            for name, fn in sides.items():
                rounds[name].append(per_call_ms(fn, args.calls))
            start = time.perf_counter()
            _, verdict = play(env, task, list(task.actions))
            episode.append(1e3 * (time.perf_counter() - start))
            assert verdict.passed, verdict
        env.close()
    ws.close()
    out = {"calls": args.calls, "rounds": args.rounds, "episode_tool_calls": len(task.actions)}
    for name, values in rounds.items():
        out[name] = {"median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values)}
        print(f"{name:<22} {statistics.median(values):8.3f} ms per call  [{min(values):.3f}–{max(values):.3f}]")
    for tool in ("calculator", "read_file"):
        added = out[f"{tool} granted"]["median_ms"] - out[f"{tool} in-process"]["median_ms"]
        out[f"{tool} added_ms"] = added
        print(f"{tool}: +{added:.2f} ms per call under its grant")
    out["code.repair expert episode"] = {"median_ms": statistics.median(episode), "min_ms": min(episode),
                                         "max_ms": max(episode)}
    print(f"code.repair expert episode ({len(task.actions)} calls, hidden tests included): "
          f"{statistics.median(episode):.1f} ms [{min(episode):.1f}–{max(episode):.1f}]")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
