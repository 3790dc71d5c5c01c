"""Repository workspaces: restore time against tree size, and the repo.fix tasks' reliability.

    python benchmarks/repo_workspace.py [--sizes 1000 10000 50000] [--rounds 30] [--json PATH]

(a) **restore** of a repository-like tree of N files (~120 bytes each, 100 packages x 7 modules
    deep) after an episode that edits 5 files, adds one and deletes one, by four methods, the
    methods alternated every round, p50 and p99 of ``rounds`` restores each:
    ``overlay`` (``OverlayWorkspace.restore``: unmount, drop the upper layer, mount),
    ``snapshot`` (``rlvr.sandbox.Workspace.restore``: the in-memory snapshot, one walk of the tree),
    ``copy`` (``rmtree`` + ``copytree`` of a pristine tree), ``git`` (``git checkout -- .`` +
    ``git clean -fdq`` in a git working tree). Target: overlay p99 <= 100 ms at 50k files.
(b) **tasks**: every repo.fix task's expert patch played 3 times (pass rate: not flaky), the
    unfixed repository submitted (must fail), and the seconds a verify takes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import machine_note, write_json

GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@x", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}


def make_tree(path: Path, n: int) -> None:
    for i in range(n):
        d = path / f"pkg{i % 100}" / f"sub{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 3)


def episode(root: str) -> None:
    """What an agent does: edits 5 files, adds one, deletes one."""
    for i in range(5):
        with open(f"{root}/pkg{i}/sub{i % 7}/mod{i}.py", "a") as f:
            f.write("# edited\n")
    with open(f"{root}/pkg0/new_module.py", "w") as f:
        f.write("X = 1\n")
    os.remove(f"{root}/pkg9/sub{9 % 7}/mod9.py")


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"p50_ms": 1000 * statistics.median(ordered), "p99_ms": 1000 * p99, "max_ms": 1000 * ordered[-1]}


def bench_restore(n: int, rounds: int, work: Path) -> dict:
    from rlvr.sandbox import overlay
    from rlvr.sandbox.workspace import Workspace

    tree = work / f"tree-{n}"
    make_tree(tree, n)
    methods = {}
    if overlay.available():
        ov = overlay.OverlayWorkspace([tree])
        methods["overlay"] = (ov.path, ov.restore, ov.close)
    files = {str(p.relative_to(tree)): p.read_text() for p in tree.rglob("*.py")}
    snap = Workspace.create(files, root=str(work))
    snap.snapshot()
    methods["snapshot"] = (snap.path, snap.restore, snap.close)
    copy_dir = work / f"copy-{n}"
    shutil.copytree(tree, copy_dir)

    def recopy() -> None:
        shutil.rmtree(copy_dir)
        shutil.copytree(tree, copy_dir)
    methods["copy"] = (str(copy_dir), recopy, lambda: shutil.rmtree(copy_dir, ignore_errors=True))
    git_dir = work / f"git-{n}"
    shutil.copytree(tree, git_dir)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=git_dir, env=GIT_ENV, check=True)

    def git_restore() -> None:
        subprocess.run(["git", "checkout", "-q", "--", "."], cwd=git_dir, env=GIT_ENV, check=True)
        subprocess.run(["git", "clean", "-fdq"], cwd=git_dir, env=GIT_ENV, check=True)
    methods["git"] = (str(git_dir), git_restore, lambda: shutil.rmtree(git_dir, ignore_errors=True))
    times: dict[str, list[float]] = {m: [] for m in methods}
    order = list(methods)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            path, restore, _ = methods[name]
            episode(path)
            t0 = time.perf_counter()
            restore()
            times[name].append(time.perf_counter() - t0)
            assert not os.path.exists(f"{path}/pkg0/new_module.py") and os.path.exists(f"{path}/pkg9/sub2/mod9.py"), name
    for _, _, close in methods.values():
        close()
    shutil.rmtree(tree)
    return {name: percentiles(values) for name, values in times.items()}


def bench_tasks() -> dict:
    import rlvr.envs  # noqa: F401
    import rlvr.tasks  # noqa: F401
    from rlvr.envs.base import ENVS, EnvConfig
    from rlvr.sandbox.config import shared_sandbox
    from rlvr.tasks.base import DOMAINS, generate_tasks
    from rlvr.tool_calls import format_call

    domain = DOMAINS.get("repo.fix")
    tasks = [t for s in ("train", "eval") for t in generate_tasks("repo.fix", s, domain.count(s), seed=0)]
    env = ENVS.get("repo.fix")(EnvConfig(), sandbox=shared_sandbox())
    passed = runs = unfixed_passed = 0
    verify_s = []
    for task in tasks:
        for _ in range(3):
            env.reset(task)
            for action in task.actions:
                env.step(action)
            t0 = time.perf_counter()
            passed += env.verify().passed
            verify_s.append(time.perf_counter() - t0)
            runs += 1
        env.reset(task)
        env.step(format_call("submit"))
        unfixed_passed += env.verify().passed
    env.close()
    return {"tasks": len(tasks), "expert_runs": runs, "expert_passed": passed, "unfixed_passed": unfixed_passed,
            "verify_ms_p50": 1000 * statistics.median(verify_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    note = machine_note()
    out: dict = {"restore": {}, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="rlvr-repo-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        for n in args.sizes:
            out["restore"][n] = res = bench_restore(n, args.rounds, Path(tmp))
            print(f"{n:>6} files: " + "; ".join(f"{m} p50 {v['p50_ms']:.2f} / p99 {v['p99_ms']:.2f} ms" for m, v in res.items()))
    out["tasks"] = tasks = bench_tasks()
    print(f"repo.fix: {tasks['tasks']} tasks, expert patches {tasks['expert_passed']}/{tasks['expert_runs']} passed "
          f"(3 runs each), unfixed {tasks['unfixed_passed']}/{tasks['tasks']} passed; verify p50 {tasks['verify_ms_p50']:.0f} ms")
    print(note)
    out["machine"] = note
    write_json(args.json, out)


if __name__ == "__main__":
    main()
