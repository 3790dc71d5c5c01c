"""What checking ``cad.shapes`` answers costs, and what hostile answers cost.

    python benchmarks/cad_shapes.py [--tasks 48] [--rounds 3] [--json PATH]

Sides, alternated in each round over the same ``--tasks`` references (levels 1-4):

- ``build + measure in-process``: the reference built and measured against itself with
  manifold3d in this process (what the geometry costs; the verifier never does this);
- ``build in the sandbox``: one io job per answer (job 1: the answer's ``part()`` exported);
- ``verify``: the ``cad`` verifier's ``check_all`` (job 1 per answer, then the meshes measured 16
  to a trusted job).

Reported: medians over the rounds (per second) with the min-max spread, then each ``HOSTILE``
answer through the verifier: verdict, wall time, and the answer job's peak RSS. Idle CPU at the
start is printed.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, write_json  # noqa: E402

import rlvr.tasks  # noqa: E402,F401
from rlvr.sandbox import Sandbox  # noqa: E402
from rlvr.sandbox.types import Job  # noqa: E402
from rlvr.tasks.base import generate_tasks  # noqa: E402
from rlvr.verifiers import cad_api  # noqa: E402
from rlvr.verifiers.base import check_all  # noqa: E402
from rlvr.verifiers.cad import _limits  # noqa: E402
from rlvr.verifiers.code import extract_code, use_sandbox  # noqa: E402

HOSTILE = {
    "endless loop": "def part():\n    while True:\n        pass\n",
    "memory bomb (16M triangles)": "import manifold3d\n\ndef part():\n    return manifold3d.Manifold.sphere(10, 4000)\n",
    "80k triangles": "import manifold3d\n\ndef part():\n    return manifold3d.Manifold.sphere(10, 400)\n",
    "open mesh": "def part():\n    return polyhedron([[0, 0, 0], [9, 0, 0], [0, 9, 0], [0, 0, 9]], [[0, 2, 1], [0, 1, 3]])\n",
    "patched volume": "import manifold3d\nmanifold3d.Manifold.volume = lambda self: 1.0\n\ndef part():\n    return box(1, 1, 1)\n",
    "garbage export": "def part():\n    return box(1, 1, 1)\n\ndef export():\n    return 'x' * 1_000_000\n",
}


def in_process(programs: list[str]) -> None:
    namespace = {k: v for k, v in vars(cad_api).items() if not k.startswith("__")}
    for program in programs:
        exec(program, namespace)
        cad_api.measure(cad_api.json.dumps(cad_api._mesh_of(namespace["part"]())), program)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"idle CPU at start: {idle_cpu():.0%}")
    tasks = generate_tasks(["cad.shapes"], "train", args.tasks, seed=0)
    programs = [extract_code(t.reference) for t in tasks]
    api = inspect.getsource(cad_api)
    out: dict = {"tasks": len(tasks), "rounds": args.rounds, "sandbox_workers": 2}
    with Sandbox(workers=2) as sb:
        previous = use_sandbox(sb)
        check_all([(tasks[0], tasks[0].reference)])  # warm the pool
        rates: dict[str, list[float]] = {"build + measure in-process": [], "build in the sandbox": [], "verify": []}
        for _ in range(args.rounds):
            start = time.perf_counter()
            in_process(programs)
            rates["build + measure in-process"].append(len(tasks) / (time.perf_counter() - start))
            start = time.perf_counter()
            jobs = [sb.submit(Job.io(api + "\n" + p, "export", [()], limits=_limits(10.0))) for p in programs]
            results = [j.result() for j in jobs]
            rates["build in the sandbox"].append(len(tasks) / (time.perf_counter() - start))
            assert all(r.status == "ok" and "ok" in r.outputs[0] for r in results)
            start = time.perf_counter()
            verdicts = check_all([(t, t.reference) for t in tasks])
            rates["verify"].append(len(tasks) / (time.perf_counter() - start))
            assert all(v.passed for v in verdicts)
        for name, values in rates.items():
            out[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            print(f"{name:<28} {statistics.median(values):8.1f} /s  [{min(values):.1f}-{max(values):.1f}]")
        hostile = {}
        for name, program in HOSTILE.items():
            answer = f"```python\n{program}```"
            start = time.perf_counter()
            verdict = check_all([(tasks[0], answer)])[0]
            wall = time.perf_counter() - start
            r = sb.submit(Job.io(api + "\n" + program, "export", [()], limits=_limits(10.0))).result()
            hostile[name] = {"reason": verdict.reason, "verify_s": wall, "answer_job_rss_mb": r.max_rss_kb / 1024}
            assert not verdict.passed, name
            print(f"{name:<28} {verdict.reason:<15} {wall:6.2f} s  answer job peak RSS {r.max_rss_kb / 1024:.0f} MB")
        use_sandbox(previous)
    out["hostile"] = hostile
    out["hostile_worst"] = {"verify_s": max(h["verify_s"] for h in hostile.values()),
                            "answer_job_rss_mb": max(h["answer_job_rss_mb"] for h in hostile.values())}
    print(f"worst: {out['hostile_worst']['verify_s']:.2f} s, {out['hostile_worst']['answer_job_rss_mb']:.0f} MB")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
