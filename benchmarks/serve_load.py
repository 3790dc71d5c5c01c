"""Benchmark: HTTP load on real ``rlvr serve`` processes, issue 34's load test.

    python benchmarks/serve_load.py [--json PATH] [--rounds 2] [--requests 128] [--clients 16]
                                    [--max-tokens 64] [--side-timeout 120] [--sides ...]
                                    [--target DIR|medium] [--draft DIR] [--spec-tokens 4]
                                    [--ignore-eos]

Each side is a real ``python -m rlvr.serve.cli`` process on a free 127.0.0.1 port (loopback only),
``--device cpu``, started with ``OMP_NUM_THREADS=1`` (one torch thread: the server gets one core,
the 16 client threads the other on a 2-core machine), waited on ``/health``, and stopped before
the next side starts, so no two servers share the CPU:

- ``one_at_a_time``: ``--batching none`` (the baseline);
- ``continuous``: the normal mode (continuous batching, the default);
- ``fast``: ``--fast`` (continuous batching + prefix cache);
- ``fast_int8``: ``--fast --quantize int8`` (the same with int8 decoder weights: the fast mode's
  full configuration on CPU);
- ``fast_draft``: ``--fast --draft DIR`` (speculative decoding in waves, ``--spec-tokens`` K);
- ``fast_ngram``: ``--fast --draft ngram`` (prompt-lookup drafts, no draft model; same K);
- ``continuous_filter``: ``--filter all`` (every content rule over every completion, streaming-safe;
  its requests ask for no token ids, which a filtered server refuses);
- ``continuous_capture``: ``--capture DIR`` (every completed request appended to the traffic log,
  the flywheel's input; a fresh directory each round).

Target: the quickstart's GRPO policy (0.9M parameters; default), a directory, or ``medium``: a
random-weight 26M-parameter Llama with the quickstart's tokenizer (``serve_models.medium_target``,
built once into ``runs/bench/serve_medium``), where a forward is compute-bound; its answers are
noise, so it runs with ``--ignore-eos`` (every request generates ``--max-tokens``) and without the
draft sides.

Workload: held-out (eval split) math.arith + math.word task prompts as chat requests behind a
fixed system prompt (the benchmarks' ``SYSTEM``, 123 tokens: the target's context is 256 tokens,
so a longer one would not leave room for the question and ``--max-tokens``), greedy
(temperature 0), ``max_tokens`` bounded, stop at EOS, ``return_token_ids``. ``--clients`` threads,
each with its own official ``openai`` client, pull the ``--requests`` requests from a shared
queue (non-streamed); a side that runs past ``--side-timeout`` seconds stops handing out
requests and is reported ``aborted``. Before timing, a warm-up wave (one request per client, other
held-out prompts) runs; after timing, one streamed request per client, all at once, gives the
time to first token (p50/p99: how long a burst of 16 waits for its first token).

Per side: completion tokens/s (sum of ``usage.completion_tokens`` over the wall time),
requests/s, p50/p99 request latency, TTFT; the server's decode steps and prefix-cache hits from
``/metrics``. Sides alternate over ``--rounds`` (the order rotates), each round a fresh server;
medians over rounds, and the ratios continuous/one_at_a_time, fast/continuous,
fast_draft/continuous, fast_ngram/continuous, fast_int8/continuous per round (median [min-max]). Greedy token ids are
asserted identical across one_at_a_time, continuous, fast, fast_draft and fast_ngram, request by request and
round by round; int8 is not exact by design: its agreement with continuous is reported. Idle CPU
is noted at the start and at the end.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu, machine_note, print_table, spread, write_json
from serve_models import SYSTEM, distil_draft, medium_target, target_dir

ROOT = Path(__file__).resolve().parents[1]
EXACT = ("one_at_a_time", "continuous", "fast", "fast_draft", "fast_ngram", "continuous_capture")
SIDES = ("one_at_a_time", "continuous", "fast", "fast_int8", "fast_draft", "fast_ngram", "continuous_filter",
         "continuous_capture")
MODEL_NAME = "target"


def side_flags(side: str, draft: str, spec_tokens: int, log_dir: str = "") -> list[str]:
    return {"one_at_a_time": ["--batching", "none"],
            "continuous": [],
            "fast": ["--fast"],
            "fast_draft": ["--fast", "--draft", draft, "--spec-tokens", str(spec_tokens)],
            "fast_ngram": ["--fast", "--draft", "ngram", "--spec-tokens", str(spec_tokens)],
            "fast_int8": ["--fast", "--quantize", "int8"],
            "continuous_filter": ["--filter", "all"],
            "continuous_capture": ["--capture", str(Path(log_dir) / f"traffic_{time.monotonic_ns()}")]}[side]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``rlvr serve`` process on a loopback port; its output goes to a log file."""

    def __init__(self, model: str, flags: list[str], log_dir: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "RLVR_ADMIN_TOKEN": "", "RLVR_API_KEY": ""}
        self.log_path = Path(log_dir) / f"serve_{self.port}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115  (open for the process's life, closed in stop)
        self.proc = subprocess.Popen([sys.executable, "-m", "rlvr.serve.cli", "--model", model, "--host", "127.0.0.1",
                                      "--port", str(self.port), "--model-name", MODEL_NAME, "--device", "cpu",
                                      "--max-batch", "16", *flags],
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}): {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready in {timeout} s: {self.log_path.read_text()[-2000:]}")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            for name in ("rlvr_serve_steps_total", "rlvr_serve_generated_tokens_total",
                         "rlvr_serve_prefix_cache_hits_total"):
                if line.startswith(name + " "):
                    out[name[len("rlvr_serve_"):-len("_total")]] = float(line.split()[1])
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def workload(n: int, seed: int) -> list[list[dict]]:
    """``n`` held-out chat requests (messages): the system prompt + one eval-split math task."""
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.tasks.base import generate_tasks

    tasks = generate_tasks(["math.arith", "math.word"], "eval", n, seed=seed)
    return [[{"role": "system", "content": SYSTEM}, *t.prompt] for t in tasks]


def make_clients(url: str, n: int, timeout: float):
    import openai

    return [openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout) for _ in range(n)]


def chat(client, messages, max_tokens: int, ignore_eos: bool, token_ids: bool = True):
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0, max_tokens=max_tokens,
                                         extra_body={"return_token_ids": token_ids, "ignore_eos": ignore_eos})


def run_load(clients, requests: list, max_tokens: int, time_limit: float, ignore_eos: bool = False,
             token_ids: bool = True) -> dict:
    """Every client pulls requests from one queue until it is empty or ``time_limit`` passes."""
    todo: queue.Queue = queue.Queue()
    for i in range(len(requests)):
        todo.put(i)
    results: list = [None] * len(requests)
    errors: list[str] = []
    deadline = time.perf_counter() + time_limit

    def worker(client):
        while time.perf_counter() < deadline:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            try:
                r = chat(client, requests[i], max_tokens, ignore_eos, token_ids)
            except Exception as e:  # noqa: BLE001  (reported, not raised: a side may fail under load)
                errors.append(f"{type(e).__name__}: {e}"[:200])
                continue
            lat = time.perf_counter() - t0
            results[i] = (lat, r.usage.completion_tokens, list(r.choices[0].token_ids) if token_ids else None)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.perf_counter()) + 60)
    wall = time.perf_counter() - t0
    done = [r for r in results if r is not None]
    lat = sorted(r[0] for r in done)
    tokens = sum(r[1] for r in done)
    return {"wall_s": wall, "completed": len(done), "aborted": len(done) < len(requests), "errors": errors[:5],
            "n_errors": len(errors), "completion_tokens": tokens, "tokens_per_s": tokens / wall,
            "requests_per_s": len(done) / wall, "p50_s": pct(lat, 0.5), "p99_s": pct(lat, 0.99),
            "token_ids": [r[2] if r else None for r in results],
            "usage_matches_ids": all(r[2] is None or r[1] == len(r[2]) for r in done)}


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def ttft_burst(clients, requests: list, max_tokens: int, ignore_eos: bool = False) -> dict:
    """One streamed request per client, all sent together: time to the first content token."""
    ttft: list[float] = []

    def worker(client, messages):
        t0 = time.perf_counter()
        stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                                max_tokens=max_tokens, stream=True,
                                                extra_body={"ignore_eos": ignore_eos})
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t0
        if first is not None:
            ttft.append(first)

    threads = [threading.Thread(target=worker, args=(c, m), daemon=True) for c, m in zip(clients, requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    ttft.sort()
    return {"ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "ttft_n": len(ttft)}


def run_side(side: str, model: str, flags: list[str], a, requests, warm, burst, log_dir: str) -> dict:
    srv = Server(model, flags, log_dir)
    try:
        ready_s = srv.wait_ready()
        clients = make_clients(srv.url, a.clients, timeout=a.side_timeout)
        ids = "--filter" not in flags  # a filtered server refuses token-level output
        run_load(clients, warm, a.max_tokens, a.side_timeout, a.ignore_eos, ids)  # warm-up wave, untimed
        m0 = srv.metrics()
        res = run_load(clients, requests, a.max_tokens, a.side_timeout, a.ignore_eos, ids)
        m1 = srv.metrics()
        res.update(ttft_burst(clients, burst, a.max_tokens, a.ignore_eos) if a.ttft else {})
        res["server_ready_s"] = ready_s
        res["server"] = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
        for c in clients:
            c.close()
    finally:
        srv.stop()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=128, help="timed requests per side and round")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--side-timeout", type=float, default=120, help="seconds; a side past it is aborted")
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument("--target", default=None, help="model directory, or medium (default: the quickstart policy)")
    ap.add_argument("--ignore-eos", action="store_true", help="every request generates --max-tokens (on with medium)")
    ap.add_argument("--draft", default=None, help="default: the distilled draft in runs/bench/draft (made if missing)")
    ap.add_argument("--spec-tokens", type=int, default=4)
    ap.add_argument("--no-ttft", dest="ttft", action="store_false", help="skip the streamed TTFT burst")
    a = ap.parse_args()

    idle0 = idle_cpu()
    note = machine_note()
    if a.target == "medium":
        tdir = medium_target(target_dir(), "runs/bench/serve_medium")
        a.ignore_eos = True
        a.sides = [s for s in a.sides if s not in ("fast_draft", "fast_ngram")]
    else:
        tdir = Path(a.target) if a.target else target_dir()
    ddir = Path(a.draft) if a.draft else (distil_draft(tdir, "runs/bench/draft") if "fast_draft" in a.sides else None)
    requests = workload(a.requests, seed=34)
    warm = workload(a.clients, seed=340)
    burst = workload(a.clients, seed=341)
    runs: dict[str, list[dict]] = {s: [] for s in a.sides}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serve_load_") as log_dir:
        for r in range(a.rounds):
            order = a.sides[r % len(a.sides):] + a.sides[:r % len(a.sides)]
            for side in order:
                res = run_side(side, str(tdir), side_flags(side, str(ddir), a.spec_tokens, log_dir), a, requests, warm,
                               burst, log_dir)
                runs[side].append(res)
                print(f"round {r} {side}: {res['completed']}/{len(requests)} requests, "
                      f"{res['tokens_per_s']:.0f} tokens/s, p50 {res['p50_s']:.3f} s, p99 {res['p99_s']:.3f} s"
                      + (" ABORTED" if res["aborted"] else ""), flush=True)

    # greedy outputs: the exact sides must agree request by request, round by round
    ref_side = "continuous" if "continuous" in runs else a.sides[0]
    ref = runs[ref_side][0]["token_ids"]
    identical = {}
    for side, rs in runs.items():
        same = [sum(x is not None and x == y for x, y in zip(res["token_ids"], ref)) for res in rs]
        identical[side] = {"requests_identical_per_round": same, "of": len(ref)}
        if side in EXACT and not any(res["aborted"] for res in rs):
            assert all(s == len(ref) for s in same), f"{side}: greedy token ids differ from {ref_side}'s: {same}"
    rows = []
    for side, rs in runs.items():
        def med(k, rs=rs):
            vals = [x[k] for x in rs if x.get(k) is not None]
            return statistics.median(vals) if vals else None

        row = {"side": side, "requests": min(x["completed"] for x in rs), "tokens": rs[0]["completion_tokens"],
               "tokens_per_s": med("tokens_per_s"), "requests_per_s": med("requests_per_s"),
               "p50_s": med("p50_s"), "p99_s": med("p99_s"),
               "ttft_p50_s": med("ttft_p50_s") if a.ttft else None,
               "aborted": any(x["aborted"] for x in rs),
               "identical": (f"{min(identical[side]['requests_identical_per_round'])}/{len(ref)}"
                             if any(t is not None for t in rs[0]["token_ids"]) else "(no ids)"),
               "steps": statistics.median(x["server"].get("steps", 0) for x in rs),
               "prefix_hits": statistics.median(x["server"].get("prefix_cache_hits", 0) for x in rs)}
        rows.append(row)
    ratios = {}
    for num, den in (("continuous", "one_at_a_time"), ("fast", "continuous"), ("fast_draft", "continuous"),
                     ("fast_ngram", "continuous"), ("fast_int8", "continuous"), ("fast_draft", "fast"),
                     ("continuous_filter", "continuous"), ("continuous_capture", "continuous")):
        if num in runs and den in runs:
            per_round = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs[num], runs[den])]
            ratios[f"{num}/{den}"] = {"per_round": per_round, "median": statistics.median(per_round),
                                      "summary": spread(per_round)}
    print(note, "| servers: OMP_NUM_THREADS=1, --device cpu, 127.0.0.1")
    print_table(rows, ["side", "requests", "tokens", "tokens_per_s", "requests_per_s", "p50_s", "p99_s",
                       "ttft_p50_s", "steps", "prefix_hits", "identical", "aborted"])
    for k, v in ratios.items():
        print(f"tokens/s {k}: {v['summary']}")
    idle1 = idle_cpu()
    print(f"idle CPU {idle0:.0%} at the start, {idle1:.0%} at the end; {time.perf_counter() - t_start:.0f} s of load")
    for rs in runs.values():
        for x in rs:
            x.pop("token_ids")
    write_json(a.json, {"machine": note, "idle_cpu_at_start": idle0, "idle_cpu_at_end": idle1,
                        "server_env": {"OMP_NUM_THREADS": "1"}, "target": str(tdir), "draft": str(ddir),
                        "spec_tokens": a.spec_tokens, "ignore_eos": a.ignore_eos, "clients": a.clients, "requests": a.requests,
                        "max_tokens": a.max_tokens, "rounds": a.rounds, "side_timeout_s": a.side_timeout,
                        "rows": rows, "ratios": ratios, "identical_to": ref_side, "identical": identical,
                        "runs": runs, "total_s": time.perf_counter() - t_start})


if __name__ == "__main__":
    main()
