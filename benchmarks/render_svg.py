"""What checking ``render.svg`` answers costs, and the worst a hostile SVG can do.

    python benchmarks/render_svg.py [--tasks 64] [--rounds 3] [--json PATH]

Sides, alternated in each round over the same ``--tasks`` references (levels 1-4):

- ``render in-process``: resvg called in this process, one render per SVG (what rendering costs
  without the sandbox; the verifier never does this);
- ``render in the sandbox``: one io job per SVG through a 2-worker sandbox (``render_job``);
- ``render in the sandbox, 16 a job``: ``CHUNK`` SVGs per job, as the verifier sends them;
- ``verify``: the ``svg`` verifier's ``check_all`` on (task, reference) pairs (hard checks,
  ``CHUNK`` answers and their references a job, scoring).

Reported: medians over the rounds (per second) with the min-max spread. Then every SVG of
``rlvr.verifiers.svg_attacks`` twice: through the verifier (its verdict and time) and rendered
anyway in the sandbox with the hard checks bypassed (status, wall time, peak RSS); the worst
case of each. Idle CPU at the start is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, write_json  # noqa: E402

import rlvr.tasks  # noqa: E402,F401
from rlvr.sandbox import Sandbox  # noqa: E402
from rlvr.tasks.base import generate_tasks  # noqa: E402
from rlvr.verifiers.base import check_all  # noqa: E402
from rlvr.verifiers.code import use_sandbox  # noqa: E402
from rlvr.verifiers.svg import CHUNK, render_job  # noqa: E402
from rlvr.verifiers.svg_attacks import hostile_svgs  # noqa: E402


def in_process(svgs: list[str]) -> None:
    import resvg_py

    for s in svgs:
        resvg_py.svg_to_bytes(svg_string=s, width=100, height=100, background="white", skip_system_fonts=True)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"idle CPU at start: {idle_cpu():.0%}")
    tasks = generate_tasks(["render.svg"], "train", args.tasks, seed=0)
    svgs = [t.reference for t in tasks]
    out: dict = {"tasks": len(tasks), "rounds": args.rounds, "sandbox_workers": 2}
    with Sandbox(workers=2) as sb:
        previous = use_sandbox(sb)
        check_all([(tasks[0], svgs[0])])  # warm the pool
        rates: dict[str, list[float]] = {"render in-process": [], "render in the sandbox": [],
                                         f"render in the sandbox, {CHUNK} a job": [], "verify": []}
        for _ in range(args.rounds):
            start = time.perf_counter()
            in_process(svgs)
            rates["render in-process"].append(len(svgs) / (time.perf_counter() - start))
            start = time.perf_counter()
            results = [f.result() for f in [sb.submit(render_job([s], 100)) for s in svgs]]
            rates["render in the sandbox"].append(len(svgs) / (time.perf_counter() - start))
            assert all(r.status == "ok" and "ok" in r.outputs[0] for r in results)
            start = time.perf_counter()
            chunks = [svgs[k: k + CHUNK] for k in range(0, len(svgs), CHUNK)]
            results = [f.result() for f in [sb.submit(render_job(c, 100)) for c in chunks]]
            rates[f"render in the sandbox, {CHUNK} a job"].append(len(svgs) / (time.perf_counter() - start))
            assert all(r.status == "ok" and all("ok" in o for o in r.outputs) for r in results)
            start = time.perf_counter()
            verdicts = check_all(list(zip(tasks, svgs)))
            rates["verify"].append(len(svgs) / (time.perf_counter() - start))
            assert all(v.passed for v in verdicts)
        for name, values in rates.items():
            out[name] = spread(values)
            print(f"{name:<34} {statistics.median(values):8.1f} /s  [{min(values):.1f}-{max(values):.1f}]")
        hostile = {}
        for name, text in hostile_svgs().items():
            start = time.perf_counter()
            verdict = check_all([(tasks[0], text)])[0]
            check_s = time.perf_counter() - start
            r = sb.submit(render_job([text], 100)).result() if len(text) < 5_000_000 else None
            hostile[name] = {"reason": verdict.reason, "verify_s": check_s,
                             "rendered_anyway": None if r is None else
                             {"status": r.status, "output": sorted((r.outputs or [{}])[0]), "wall_s": r.duration_s,
                              "max_rss_mb": r.max_rss_kb / 1024}}
            assert not verdict.passed, name
        use_sandbox(previous)
    print(f"{'hostile SVG':<26} {'verdict':<13} {'verify ms':>9}   rendered anyway: status, wall s, RSS MB")
    for name, h in hostile.items():
        r = h["rendered_anyway"]
        tail = "not sent (over 5 MB)" if r is None else f"{r['status']} {'/'.join(r['output'])}, {r['wall_s']:.3f}, {r['max_rss_mb']:.0f}"
        print(f"{name:<26} {h['reason']:<13} {1e3 * h['verify_s']:9.2f}   {tail}")
    rendered = [h["rendered_anyway"] for h in hostile.values() if h["rendered_anyway"]]
    out["hostile"] = hostile
    out["hostile_worst"] = {"verify_s": max(h["verify_s"] for h in hostile.values()),
                            "rendered_wall_s": max(r["wall_s"] for r in rendered),
                            "rendered_max_rss_mb": max(r["max_rss_mb"] for r in rendered)}
    w = out["hostile_worst"]
    print(f"worst: verifier {1e3 * w['verify_s']:.1f} ms; rendered anyway {w['rendered_wall_s']:.3f} s, "
          f"{w['rendered_max_rss_mb']:.0f} MB peak RSS")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
