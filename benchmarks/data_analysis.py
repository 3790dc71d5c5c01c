"""What a ``data.analysis`` episode costs, per level: a tool turn (one sandboxed query) and the
verdict (every query rerun on the three perturbed copies in one job, golds recomputed).

    python benchmarks/data_analysis.py [--episodes 8] [--rounds 3] [--json PATH]

Each round plays the scripted expert on ``--episodes`` train tasks of each level (one query, then
the deliverable) in a 2-worker sandbox, and a three-query episode (a look at the data, a count,
the expert's query). Reported per level: median milliseconds per tool turn and per verdict over
the rounds, with the min-max spread, and the table's rows. Idle CPU at the start is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, write_json  # noqa: E402

import rlvr.envs  # noqa: E402,F401
import rlvr.tasks  # noqa: E402,F401
from rlvr.envs.base import make_env  # noqa: E402
from rlvr.sandbox import Sandbox  # noqa: E402
from rlvr.tasks.base import DOMAINS  # noqa: E402
from rlvr.tasks.data_analysis import rows_for  # noqa: E402
from rlvr.tool_calls import format_call  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"idle CPU at start: {idle_cpu():.0%}")
    domain = DOMAINS.get("data.analysis")
    out: dict = {"episodes": args.episodes, "rounds": args.rounds, "sandbox_workers": 2}
    with Sandbox(workers=2) as sb:
        env = make_env("data.analysis", sandbox=sb)
        turn_ms: dict[int, list[float]] = {level: [] for level in domain.levels}
        verdict_ms: dict[int, list[float]] = {level: [] for level in domain.levels}
        for _ in range(args.rounds):
            for level in domain.levels:
                turns, verdicts = [], []
                for i in range(args.episodes):
                    task = domain.generate("train", level, i, 0)
                    looks = [format_call("sql", {"query": "SELECT * FROM orders LIMIT 20"}),
                             format_call("sql", {"query": "SELECT COUNT(*) FROM orders"})] if i % 2 else []
                    env.reset(task)
                    for action in [*looks, task.actions[0]]:
                        start = time.perf_counter()
                        step = env.step(action)
                        turns.append(1e3 * (time.perf_counter() - start))
                        assert not step.done
                    env.step(task.actions[1])
                    start = time.perf_counter()
                    verdict = env.verify()
                    verdicts.append(1e3 * (time.perf_counter() - start))
                    assert verdict.passed, (task.id, verdict)
                turn_ms[level].append(statistics.median(turns))
                verdict_ms[level].append(statistics.median(verdicts))
        env.close()
    for level in domain.levels:
        rows = len(rows_for(domain.generate("train", level, 0, 0).spec.payload["seed"], level))
        t, v = turn_ms[level], verdict_ms[level]
        out[f"L{level}"] = {"rows": rows, "turn_ms": {"median": statistics.median(t), "min": min(t), "max": max(t)},
                            "verdict_ms": {"median": statistics.median(v), "min": min(v), "max": max(v)}}
        print(f"L{level} ({rows:>4} rows): tool turn {statistics.median(t):6.1f} ms [{min(t):.1f}-{max(t):.1f}]   "
              f"verdict {statistics.median(v):6.1f} ms [{min(v):.1f}-{max(v):.1f}]")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
