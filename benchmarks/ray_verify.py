"""Verification on Ray actors (``VerificationService``) against the in-process sandbox pool.

    python benchmarks/ray_verify.py [--n 400] [--rounds 3] [--json PATH]

Starts a local Ray instance (2 CPUs) and measures, with the sides alternating in rounds (medians):

(a) verification throughput (programs/s) of one batch of ``n`` io jobs (``Job.io``: small
    functions on 5 hidden inputs, 80% correct, 20% wrong; every result is checked against what it
    should be) through ``Sandbox.map`` in this process (the reference) and through
    ``VerificationService`` with 1 verifier actor (a pool of 2 workers, as many as cores, and of 3)
    and with 2 (pools of 1: the same 2 slots in total; pools of 2: each sized to the machine's
    cores, as ``sandbox.workers: 0`` does). Every pool is fixed (``max_slots`` = ``workers``): the
    elastic pool's extra slots are for runs that wait, and these short CPU-bound jobs do not;
(b) the Ray path's overhead: (Ray time - in-process time) / n in ms per program, the round trip
    of one actor call with a tiny payload, and of one ``run_jobs`` call with a 32-job chunk minus
    the same 32 jobs through the in-process pool (what ``chunk_size`` amortises); and the driver's
    cost per chunk when ``ActorGroup.run`` hands out 100 to 4,000 tiny chunks (its ``ray.wait``
    loop looks at every pending ref each time), against one ``ray.get`` of the same calls;
(c) the weight broadcast of ``RayWorkers.push`` (state dict to the object store, loaded and
    canary-checked by every rollout actor) for the benchmark models, 1 and 2 rollout actors.

On a 2-core machine two actors cannot double throughput: every actor's sandbox workers share
the same 2 cores. The 2-actor numbers show that the work spreads and what it costs, not scaling.
Ray's CPU reservations here are fractional (all services stay up across rounds); they are
bookkeeping, Ray pins no cores.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from code_verify import make_function
from common import (
    bench_model,
    bench_tokenizer,
    idle_cpu,
    machine_note,
    print_table,
    spread,
    write_json,
)

from rlvr.sandbox.config import SandboxConfig
from rlvr.sandbox.pool import Sandbox
from rlvr.sandbox.types import Job, Limits

CHUNK = 32
DRIVER_CHUNKS = (100, 1000, 4000)
WRONG_SHARE = 0.2


def make_jobs(n: int, seed: int = 0) -> tuple[list[Job], list[list], list[bool]]:
    """``n`` io jobs, the outputs a correct function gives, and whether each job's function is correct."""
    rng = random.Random(seed)
    jobs, expected, correct = [], [], []
    for i in range(n):
        params, body, inputs = make_function(rng)
        ref = eval(f"lambda {params}: {body}")  # our own reference expression, not a candidate
        ok = rng.random() >= WRONG_SHARE
        program = f"def f{i}({params}):\n    return {body if ok else f'({body}) + 1'}\n"
        jobs.append(Job.io(program, f"f{i}", inputs, limits=Limits(wall_s=5.0)))
        expected.append([ref(*args) for args in inputs])
        correct.append(ok)
    return jobs, expected, correct


def check(results, expected, correct) -> int:
    """How many results are what they should be (all outputs right iff the function is correct)."""
    return sum((r.compare(e) == len(e)) == ok for r, e, ok in zip(results, expected, correct))


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def median_ms(fn, repeats: int) -> float:
    return 1e3 * statistics.median(timed(fn)[0] for _ in range(repeats))


def verification(ray, n: int, rounds: int, work: Path) -> dict:
    from rlvr.workers.config import RayConfig
    from rlvr.workers.verify_service import VerificationService

    jobs, expected, correct = make_jobs(n)
    # (actors, sandbox workers per actor's pool); 0.3 CPU each keeps all six actors up on 2 CPUs
    configs = {"ray, 1 actor x pool 2": (1, 2), "ray, 1 actor x pool 3": (1, 3), "ray, 2 actors x pool 1": (2, 1),
               "ray, 2 actors x pool 2": (2, 2)}
    local = Sandbox(workers=2, max_slots=2)
    services = {name: VerificationService(RayConfig(verifier_workers=k, verifier_cpus=0.3),
                                          SandboxConfig(workers=w, max_slots=w, audit=False),
                                          work_dir=work / f"service-{k}x{w}", chunk_size=CHUNK)
                for name, (k, w) in configs.items()}
    sides = {"in-process Sandbox.map, pool 2": local.map, **{name: s.map for name, s in services.items()}}
    for fn in sides.values():  # warm-up: actors started, pools forked
        fn(jobs[:64])
    times: dict[str, list[float]] = {name: [] for name in sides}
    right: dict[str, int] = dict.fromkeys(sides, 0)
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            seconds, results = timed(sides[name], jobs)
            times[name].append(seconds)
            right[name] += check(results, expected, correct)

    # (b) round trips, one call at a time, on the 1-actor service's actor
    actor = services["ray, 1 actor x pool 2"].group.actors[0]
    chunk = jobs[:CHUNK]
    trips = {"tiny call (actor.pid)": median_ms(lambda: ray.get(actor.pid.remote()), 200)}
    chunk_ray = median_ms(lambda: ray.get(actor.run_jobs.remote(chunk)), 30)
    chunk_local = median_ms(lambda: local.map(chunk), 30)
    trips[f"{CHUNK}-job chunk, run_jobs"] = chunk_ray
    trips[f"{CHUNK}-job chunk, in-process map"] = chunk_local
    # the driver's cost per chunk of ActorGroup.run (ray.wait over every pending ref) as chunks grow
    group = services["ray, 2 actors x pool 2"].group
    driver = []
    for k in DRIVER_CHUNKS:
        loop = timed(group.run, "pid", [()] * k)[0]
        plain = timed(lambda k=k: ray.get([group.actors[i % group.size].pid.remote() for i in range(k)]))[0]
        driver.append({"chunks": k, "group_run_ms_per_chunk": 1e3 * loop / k, "plain_get_ms_per_call": 1e3 * plain / k})
    for s in services.values():
        s.close()
    local.close()

    base_rounds = times["in-process Sandbox.map, pool 2"]
    base = statistics.median(base_rounds)
    one = statistics.median(times["ray, 1 actor x pool 2"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"side": name, "programs_per_s": n / med, "wall_s": med,
                     "ratio_vs_in_process": base / med, "ratio_vs_1_actor": one / med,
                     "overhead_ms_per_program": 1e3 * (med - base) / n,
                     "per_round_ratio_vs_in_process": spread([b / t for b, t in zip(base_rounds, ts)]),
                     "right": f"{right[name]}/{n * rounds}", "per_round_s": [round(t, 3) for t in ts]})
    return {"n": n, "rounds": rounds, "chunk_size": CHUNK, "wrong_share": WRONG_SHARE,
            "all_results_right": all(v == n * rounds for v in right.values()), "sides": rows,
            "round_trip_ms": trips, "chunk_overhead_ms": chunk_ray - chunk_local, "driver_per_chunk": driver,
            "speedup_2_actors_vs_1": one / statistics.median(times["ray, 2 actors x pool 2"])}


def broadcast(ray, sizes: list[str], repeats: int, work: Path) -> list[dict]:
    """``RayWorkers.push`` of each model size to 1 and 2 rollout actors, alternating."""
    from rlvr.envs.base import EnvConfig
    from rlvr.rollout.engine import SamplingParams
    from rlvr.workers.config import RayConfig
    from rlvr.workers.ray_rollout import RayWorkers

    tokenizer = bench_tokenizer()
    rows = []
    for size in sizes:
        model = bench_model(size, tokenizer)
        nbytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
        groups = {k: RayWorkers(model, tokenizer, params=SamplingParams(), batch_size=8, verify=None,
                                cfg=RayConfig(rollout_workers=k, verifier_workers=1, rollout_cpus=0.4,
                                              verifier_cpus=0.1),
                                env_cfg=EnvConfig(), sandbox_cfg=SandboxConfig(workers=1), needs_sandbox=False,
                                run_dir=work / f"push-{size}-{k}", version=0)
                  for k in (1, 2)}
        for k, w in groups.items():  # warm-up: one push each, not timed
            w.push(model, 1)
        times: dict[int, list[float]] = {1: [], 2: []}
        for v in range(2, repeats + 2):
            for k in ((1, 2) if v % 2 else (2, 1)):
                times[k].append(timed(groups[k].push, model, v)[0])
                assert groups[k].version == v
        for w in groups.values():
            w.close()
        for k, ts in times.items():
            rows.append({"model": size, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                         "state_dict_mb": nbytes / 1e6, "rollout_actors": k,
                         "push_ms": 1e3 * statistics.median(ts)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=400, help="jobs per batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--push-sizes", nargs="*", default=["small", "medium"],
                   help="benchmark models whose weight broadcast is timed (none: skip)")
    p.add_argument("--push-repeats", type=int, default=5)
    p.add_argument("--json", dest="json_path")
    args = p.parse_args()

    import ray

    idle = idle_cpu()
    print(machine_note())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="ray-verify-") as tmp:
            v = verification(ray, args.n, args.rounds, Path(tmp))
            push = broadcast(ray, args.push_sizes, args.push_repeats, Path(tmp)) if args.push_sizes else []
    finally:
        ray.shutdown()
    idle_after = idle_cpu()

    print(f"\n(a) {args.n} io jobs ({WRONG_SHARE:.0%} wrong functions), chunks of {CHUNK}, "
          f"median of {args.rounds} alternating rounds; every result right: {v['all_results_right']}")
    print_table(v["sides"], ["side", "programs_per_s", "wall_s", "ratio_vs_in_process", "per_round_ratio_vs_in_process",
                             "ratio_vs_1_actor", "overhead_ms_per_program", "right"])
    print("\n(b) one call at a time, median ms: "
          + ", ".join(f"{k} {ms:.2f}" for k, ms in v["round_trip_ms"].items())
          + f"; a chunk's Ray overhead {v['chunk_overhead_ms']:.2f} ms ({v['chunk_overhead_ms'] / CHUNK:.3f} ms/job)")
    print("\n(b) the driver's cost per chunk, tiny calls on 2 actors: ActorGroup.run against one ray.get of them all")
    print_table(v["driver_per_chunk"], ["chunks", "group_run_ms_per_chunk", "plain_get_ms_per_call"])
    if push:
        print(f"\n(c) RayWorkers.push, median of {args.push_repeats}")
        print_table(push, ["model", "params_m", "state_dict_mb", "rollout_actors", "push_ms"])
    print(f"\n{os.cpu_count()} cores: 2 actors share them with each other, so they cannot double "
          "throughput here; the 2-actor rows show the overhead and that the work spreads, not scaling. "
          f"Idle CPU at start {idle:.0%}, at the end {idle_after:.0%}.")
    write_json(args.json_path, {"machine": machine_note(), "idle_cpu_before": idle, "idle_cpu_after": idle_after,
                                "cpu_count": os.cpu_count(),
                                "ray_version": ray.__version__, "verification": v, "weight_broadcast": push})
    return 0 if v["all_results_right"] else 1


if __name__ == "__main__":
    sys.exit(main())
