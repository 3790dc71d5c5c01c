"""Environment images (``rlvr.images``): build time, cold and cached, and the cost of running on one.

    python benchmarks/env_images.py [--rounds 5] [--jobs 200] [--json PATH]

(a) **build**: a spec with one hashed package from a local wheel directory (offline), built into a
    fresh images root (cold: uv venv + install + read-only + digest + rename), then built again
    (cached: the interpreter's identity, the key, the verified lookup); medians of ``rounds``.
    The cached target is < 10 s.
(b) **per execution**: ``jobs`` io jobs (a small function, 5 inputs) through one sandbox pool on
    the host's interpreter (a fork of the pre-warmed worker) and on the image (a fork of the
    worker's warm worker on the image's interpreter, started on the first image job), the sides
    alternated in rounds; ms per job, medians, the image/host ratio with its spread.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import machine_note, spread, write_json


def probe_wheel(directory: Path, version: str, name: str = "rlvrprobe") -> Path:
    """A real (tiny, pure-Python) wheel of ``name`` at ``version``: a module saying its version."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: rlvr\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    out = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), text)
    return out


def probe_spec(name: str, whl: Path):
    from rlvr.images.spec import parse_spec

    version = whl.name.split("-")[1]
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    return parse_spec({"name": name, "requirements": [f"rlvrprobe=={version} --hash=sha256:{digest}"],
                       "find_links": str(whl.parent)}, name)


def bench_build(work: Path, rounds: int) -> dict:
    from rlvr.images.build import build

    whl = probe_wheel(work, "1.0")
    cold, cached = [], []
    for r in range(rounds):
        os.environ["RLVR_IMAGES"] = str(work / f"root-{r}")
        spec = probe_spec("bench", whl)
        first = build(spec)
        again = build(spec)
        assert not first.cached and again.cached
        cold.append(first.seconds)
        cached.append(again.seconds)
    return {"cold_s": statistics.median(cold), "cold_all": cold, "cached_s": statistics.median(cached),
            "cached_all": cached, "size_bytes": first.image.size_bytes}


def bench_exec(work: Path, rounds: int, jobs: int) -> dict:
    from rlvr.images.build import build
    from rlvr.sandbox import Job, Sandbox

    os.environ["RLVR_IMAGES"] = str(work / "exec-root")
    image = build(probe_spec("bench", probe_wheel(work, "1.0"))).image
    program = "def f(x):\n    return sorted(x)[len(x) // 2]\n"
    inputs = [([3, 1, 2],), ([5, 4, 9, 1],), ([7],), ([2, 2, 1],), ([9, 8, 7, 6, 5],)]
    ms = {"host": [], "image": []}
    with Sandbox(workers=2, max_slots=2) as sandbox:
        for side in ("host", "image"):  # warm both paths once
            sandbox.run(Job.io(program, "f", inputs, image=str(image.path) if side == "image" else ""))
        for r in range(rounds):
            for side in (("host", "image") if r % 2 == 0 else ("image", "host")):
                batch = [Job.io(program, "f", inputs, image=str(image.path) if side == "image" else "")
                         for _ in range(jobs)]
                t0 = time.perf_counter()
                results = sandbox.map(batch)
                elapsed = time.perf_counter() - t0
                assert all(res.compare([2, 5, 7, 2, 7]) == 5 for res in results), side
                ms[side].append(1000 * elapsed / jobs)
    ratios = [i / h for i, h in zip(ms["image"], ms["host"])]
    return {"host_ms": statistics.median(ms["host"]), "image_ms": statistics.median(ms["image"]),
            "host_all": ms["host"], "image_all": ms["image"], "ratio": spread(ratios),
            "overhead_ms": statistics.median(i - h for i, h in zip(ms["image"], ms["host"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    note = machine_note()
    with tempfile.TemporaryDirectory(prefix="rlvr-images-bench-") as tmp:
        work = Path(tmp)
        built = bench_build(work, args.rounds)
        print(f"build: cold {built['cold_s']:.2f} s, cached {built['cached_s'] * 1000:.0f} ms "
              f"(medians of {args.rounds}; {built['size_bytes'] / 1024:.0f} KiB image)")
        ran = bench_exec(work, args.rounds, args.jobs)
        print(f"per execution ({args.jobs} io jobs x {args.rounds} rounds, 2 workers): host "
              f"{ran['host_ms']:.2f} ms, image {ran['image_ms']:.2f} ms; image/host {ran['ratio']}; "
              f"+{ran['overhead_ms']:.2f} ms a job")
    print(note)
    write_json(args.json, {"build": built, "exec": ran, "machine": note,
                           "rounds": args.rounds, "jobs": args.jobs})


if __name__ == "__main__":
    main()
