"""The fault-injection matrix: short GRPO, SFT and DPO jobs in child processes, each stopped by a fault
(SIGKILL at a named point, a full disk, damaged files), then resumed; every row compared with an
uninterrupted run of the same job.

    python benchmarks/faults.py [--rows NAME ...] [--json PATH] [--work DIR]

A row is a job (``grpo``: ``rlvr train`` with a random tiny Llama on a task file whose user reward
varies from the first step, 6 steps, checkpoints every step; ``sft``: ``rlvr sft`` on
``math.arith``, 8 steps, checkpoints every 2; ``dpo``: ``rlvr dpo`` on 16 arithmetic pairs, 8
steps, checkpoints every 2), a fault
(``RLVR_FAULT=POINT@N:ACTION``, ``rlvr/faults.py``; or ``damage``: a file of the newest checkpoint
truncated, or a metrics line cut short, after a kill) and what is expected: the child dies by
SIGKILL (``kill``) or exits 2 with one ``rlvr: error: no space left on device`` line
(``enospc``); then ``--resume`` (no fault) finishes the job. Reported per row, and asserted by
``tests/test_faults.py``:

- ``stopped_as_expected``: the exit status (and, for ENOSPC, the one-line error);
- ``records_lost``: metrics rows of steps up to the newest complete checkpoint that the stopped run
  had logged and that are missing or unreadable afterwards (expected 0);
- ``recovered``: the resumed run finished (``final/`` written);
- ``equal``: its per-step metrics (times aside) equal the uninterrupted run's.

Three rows are of services that must survive a fault, not resume from one (``expect`` =
``survive``, or the server's ``kill``):

- ``grpo_ray``: the GRPO job on a local Ray cluster (``--backend ray``), one verifier actor
  SIGKILLed right after a chunk was sent to it; the run finishes by itself, and ``equal`` compares
  its metrics with an uninterrupted Ray run's (``workers/*`` counters aside: they count the retry);
- ``sandbox``: 24 programs verified by a sandbox pool (2 workers), one worker SIGKILLed while its
  run goes; ``equal``: every verdict equals the uninterrupted batch's, ``records_lost`` the
  verdicts that differ, and no process of the pool outlives it;
- ``serve``: ``rlvr serve`` SIGKILLed while 4 streams are mid-generation; ``records_lost``: the
  requests that neither finished nor failed within 10 s (hung), ``recovered``: a server started
  again on the port answers, ``equal``: with the same greedy completion as before the kill.

Everything runs with one thread and a fixed seed (the equality needs it); ``time/*`` metrics differ.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.monitor.metrics import read_metrics  # noqa: E402


@dataclass(frozen=True)
class Row:
    name: str
    job: str      # grpo | sft | dpo | grpo_ray | sandbox | serve
    fault: str    # RLVR_FAULT value, or "" (damage only, or the server's SIGKILL)
    expect: str   # kill | enospc (the job stops, then resumes) | survive (it finishes despite the fault)
    damage: str = ""  # after the stop: truncate_checkpoint | cut_metrics_line


ROWS = [
    Row("grpo kill in rollout", "grpo", "rollout@4:kill", "kill"),
    Row("grpo kill in verify", "grpo", "verify@4:kill", "kill"),
    Row("grpo kill before optimizer step", "grpo", "optimizer_step@4:kill", "kill"),
    Row("grpo kill inside checkpoint write", "grpo", "checkpoint@3:kill", "kill"),
    Row("grpo kill mid-file in checkpoint", "grpo", "checkpoint_mid_file@3:kill", "kill"),
    Row("grpo kill before checkpoint rename", "grpo", "checkpoint_publish@3:kill", "kill"),
    Row("grpo kill mid metrics line", "grpo", "metrics_line@4:kill", "kill"),
    Row("grpo full disk in checkpoint", "grpo", "checkpoint@3:enospc", "enospc"),
    Row("grpo full disk in metrics", "grpo", "metrics@4:enospc", "enospc"),
    Row("grpo newest checkpoint truncated", "grpo", "rollout@5:kill", "kill", damage="truncate_checkpoint"),
    Row("grpo metrics line cut, then resumed", "grpo", "rollout@5:kill", "kill", damage="cut_metrics_line"),
    Row("sft kill inside checkpoint write", "sft", "checkpoint@2:kill", "kill"),
    Row("sft kill before checkpoint rename", "sft", "checkpoint_publish@2:kill", "kill"),
    Row("sft full disk in checkpoint", "sft", "checkpoint@2:enospc", "enospc"),
    Row("sft newest checkpoint truncated", "sft", "metrics@7:kill", "kill", damage="truncate_checkpoint"),
    Row("dpo kill inside checkpoint write", "dpo", "checkpoint@2:kill", "kill"),
    Row("dpo full disk in checkpoint", "dpo", "checkpoint@2:enospc", "enospc"),
    Row("dpo newest checkpoint truncated", "dpo", "metrics@7:kill", "kill", damage="truncate_checkpoint"),
    Row("grpo on ray: verifier actor killed mid-batch", "grpo_ray", "actor_chunk@3:kill", "survive"),
    Row("sandbox worker killed mid-batch", "sandbox", "sandbox_run@7:kill", "survive"),
    Row("server killed with 4 requests in flight", "serve", "", "kill"),
]
QUICK = ["grpo kill inside checkpoint write", "grpo full disk in checkpoint", "grpo newest checkpoint truncated",
         "sandbox worker killed mid-batch"]
"""The rows of the default test tier (the whole matrix runs in the slow tier)."""


def tiny_model(directory: Path) -> str:
    """A random tiny Llama with a tokenizer trained on the math corpus (as the tests build)."""
    import rlvr.tasks  # noqa: F401
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 200)
    tokenizer = train_tokenizer(docs, vocab_size=320)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                             intermediate_size=64), tokenizer, seed=0)
    return str(save_model_dir(directory, model, tokenizer))


def job_files(directory: Path) -> Path:
    """The GRPO job's task file and reward: 12 prompts, reward = the share of digits in the
    completion (it varies on a random model, so every step updates)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "digits.py").write_text(
        "def digits(prompts, completions, **columns):\n"
        "    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]\n")
    (directory / "tasks.jsonl").write_text("".join(json.dumps({"prompt": f"Write digits ({i})."}) + "\n"
                                                   for i in range(12)))
    import rlvr.tasks  # noqa: F401
    from rlvr.tasks.base import generate_tasks

    pairs = []  # the DPO job's: a math.arith reference answer against the same with a wrong number
    for i, t in enumerate(generate_tasks(["math.arith"], "train", 16, seed=0)):
        answer = t.spec.payload["answer"]
        wrong = t.reference.replace(str(answer), str(int(float(answer)) + 1 + i % 9))
        pairs.append({"prompt": list(t.prompt), "chosen": t.reference, "rejected": wrong})
    (directory / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return directory


def command(job: str, model: str, out: Path, files: Path) -> list[str]:
    if job in ("grpo", "grpo_ray"):
        sets = ["steps=6", "checkpoint_every=1", "keep_checkpoints=3", "rollout.tasks_per_step=3",
                "rollout.samples_per_task=4", "rollout.max_new_tokens=6", "optim.lr=1e-2", "optim.warmup_steps=0",
                "save_trajectories_every=1"]
        head = ["train", "--tasks", str(files / "tasks.jsonl"), "--reward", f"{files / 'digits.py'}:digits"]
        head += ["--backend", "ray"] if job == "grpo_ray" else []
    elif job == "sft":
        sets = ["steps=8", "checkpoint_every=2", "log_every=1", "domains=[math.arith]", "train_tasks=32",
                "batch_size=8"]
        head = ["sft"]
    else:  # dpo: 16 pairs, batches of 4, 2 epochs = 8 steps
        sets = ["batch_size=4", "epochs=2", "checkpoint_every=2", "log_every=1", "optim.lr=3e-3",
                "optim.warmup_steps=0"]
        head = ["dpo", "--pairs", str(files / "pairs.jsonl")]
    return [sys.executable, "-m", "rlvr.cli", *head, "--model", model, "--out", str(out),
            *[a for s in sets for a in ("--set", s)]]


def run_child(cmd: list[str], fault: str = "", resume: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "RLVR_FAULT": fault}
    return subprocess.run(cmd + (["--resume"] if resume else []), env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def without_times(rows: list[dict]) -> list[dict]:
    """Metrics rows without what a fault may change: wall times, and the worker-retry counters."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "workers/"))} for r in rows]


def newest_checkpoint_step(out: Path) -> int:
    from rlvr.model.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(out)
    return int(ckpt.name.split("_")[1]) if ckpt else 0


def damage(out: Path, how: str) -> None:
    if how == "truncate_checkpoint":
        from rlvr.model.checkpoint import latest_checkpoint

        weights = latest_checkpoint(out) / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    elif how == "cut_metrics_line":
        with (out / "metrics.jsonl").open("a") as f:
            f.write('{"step": 99, "rollout/rew')


SANDBOX_BATCH = r'''
import json, os, sys
from rlvr.sandbox import Job, Sandbox
from rlvr.sandbox.attacks import TESTS, descendants
programs = ["def add(a, b):\n    return a + b\n" if i % 3 else "def add(a, b):\n    return a - b\n"
            for i in range(24)]
with Sandbox(workers=2) as sb:
    results = sb.map([Job.with_tests(p, TESTS, "add") for p in programs])
    family = descendants([os.getpid()])
    restarts = sb.worker_restarts
print(json.dumps({"verdicts": [[r.passed, r.status] for r in results], "restarts": restarts, "family": family}))
'''


def _alive(pids: list[int]) -> list[int]:
    from rlvr.sandbox.attacks import proc_table

    table = proc_table()
    return [p for p in pids if p in table and table[p]["state"] != "Z"]


def run_sandbox_row(row: Row) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    def batch(fault: str) -> tuple[subprocess.CompletedProcess, dict]:
        done = subprocess.run([sys.executable, "-c", SANDBOX_BATCH], env={**env, "RLVR_FAULT": fault},
                              capture_output=True, text=True, timeout=300, check=False)
        return done, json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}

    start = time.perf_counter()
    _, reference = batch("")
    done, faulted = batch(row.fault)
    verdicts, expected = faulted.get("verdicts", []), reference.get("verdicts", [])
    lost = sum(a != b for a, b in zip(verdicts, expected)) + abs(len(verdicts) - len(expected))
    return {"stopped_as_expected": done.returncode == 0 and faulted.get("restarts", 0) >= 1,
            "stop_exit": done.returncode, "checkpoint_at_stop": "-", "records_lost": lost,
            "recovered": done.returncode == 0 and not _alive(faulted.get("family", [])),
            "equal": bool(expected) and verdicts == expected, "seconds": round(time.perf_counter() - start, 1),
            "detail": f"worker restarts {faulted.get('restarts')}; {len(verdicts)} verdicts",
            "stderr_tail": done.stderr[-600:] if done.returncode else ""}


def _stream(port: int, max_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = {"model": "tiny", "prompt": [5], "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _serve(model: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    rlvr = Path(sys.executable).parent / "rlvr"
    proc = subprocess.Popen([str(rlvr), "serve", "--model", model, "--port", str(port), "--model-name", "tiny",
                             "--device", "cpu", "--max-batch", "4"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    end = time.monotonic() + 120
    while time.monotonic() < end and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"rlvr serve did not start (exit {proc.poll()})")


def _greedy(port: int) -> tuple[str, int]:
    """A greedy 8-token completion (``ignore_eos``): its text and how many tokens it has."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": [5], "max_tokens": 8,
                                                        "temperature": 0, "ignore_eos": True}),
                 {"Content-Type": "application/json"})
    body = json.loads(conn.getresponse().read())
    return body["choices"][0]["text"], body["usage"]["completion_tokens"]


def run_serve_row(row: Row, model: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    server = _serve(model, port)
    try:
        before = _greedy(port)
        streams = [_stream(port, 400) for _ in range(4)]
        for _, response in streams:
            response.readline()  # each stream is generating
        os.kill(server.pid, signal.SIGKILL)
        t0, outcomes = time.monotonic(), []
        for _, response in streams:
            try:
                outcomes.append("finished" if b"[DONE]" in response.read() else "failed")
            except (OSError, http.client.HTTPException):
                outcomes.append("failed")
        failed_fast = time.monotonic() - t0 < 10
        killed = server.wait(timeout=10) == -signal.SIGKILL
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    again = _serve(model, port)
    try:
        after = _greedy(port)
    finally:
        again.terminate()
        again.wait(timeout=30)
    hung = 0 if failed_fast else sum(o == "failed" for o in outcomes)
    return {"stopped_as_expected": killed and "finished" not in outcomes, "stop_exit": -signal.SIGKILL,
            "checkpoint_at_stop": "-", "records_lost": hung, "recovered": after[1] == 8,
            "equal": after == before, "seconds": round(time.perf_counter() - start, 1),
            "detail": f"in-flight streams: {', '.join(outcomes)}", "stderr_tail": ""}


def run_row(row: Row, model: str, work: Path, reference: dict[str, list[dict]]) -> dict:
    head = {"row": row.name, "job": row.job, "fault": row.fault or "-", "damage": row.damage or "-"}
    if row.job == "sandbox":
        return head | run_sandbox_row(row)
    if row.job == "serve":
        return head | run_serve_row(row, model)
    out = work / row.name.replace(" ", "_").replace(":", "")
    shutil.rmtree(out, ignore_errors=True)
    cmd = command(row.job, model, out, work / "files")
    start = time.perf_counter()
    stopped = run_child(cmd, row.fault)
    if row.expect == "survive":  # the run finishes by itself: nothing to resume
        after = without_times(read_metrics(out))
        retries = sum(1 for line in (out / "workers.jsonl").open() if '"retry"' in line) \
            if (out / "workers.jsonl").is_file() else 0
        return head | {"stopped_as_expected": stopped.returncode == 0 and retries >= 1, "stop_exit": stopped.returncode,
                       "checkpoint_at_stop": "-", "records_lost": sum(1 for r in reference[row.job] if r not in after),
                       "recovered": stopped.returncode == 0 and (out / "final").is_dir(),
                       "equal": after == reference[row.job], "seconds": round(time.perf_counter() - start, 1),
                       "detail": f"{retries} chunk(s) retried on a replacement actor",
                       "stderr_tail": stopped.stderr[-600:] if stopped.returncode else ""}
    if row.expect == "kill":
        as_expected = stopped.returncode == -signal.SIGKILL
    else:
        errors = [line for line in stopped.stderr.splitlines() if line.startswith("rlvr: error:")]
        as_expected = stopped.returncode == 2 and len(errors) == 1 and "no space left on device" in errors[0]
    checkpointed = newest_checkpoint_step(out)
    logged = {r["step"]: r for r in without_times(read_metrics(out)) if r["step"] <= checkpointed}
    if row.damage:
        damage(out, row.damage)
    resumed = run_child(cmd, resume=True)
    after = without_times(read_metrics(out))
    kept = {r["step"]: r for r in after}
    lost = sum(1 for step, r in logged.items() if kept.get(step) != r)
    return head | {
            "stopped_as_expected": as_expected, "stop_exit": stopped.returncode,
            "checkpoint_at_stop": checkpointed, "records_lost": lost,
            "recovered": resumed.returncode == 0 and (out / "final").is_dir(),
            "equal": after == reference[row.job], "seconds": round(time.perf_counter() - start, 1), "detail": "",
            "stderr_tail": (stopped.stderr + resumed.stderr)[-600:] if resumed.returncode or not as_expected else ""}


def run_matrix(names: list[str], work: Path) -> list[dict]:
    model = tiny_model(work / "model")
    job_files(work / "files")
    rows = [r for r in ROWS if r.name in names]
    reference = {}
    for job in sorted({r.job for r in rows} - {"sandbox", "serve"}):
        out = work / f"reference_{job}"
        shutil.rmtree(out, ignore_errors=True)
        done = run_child(command(job, model, out, work / "files"))
        if done.returncode != 0:
            raise RuntimeError(f"the uninterrupted {job} run failed: {done.stderr[-2000:]}")
        reference[job] = without_times(read_metrics(out))
    return [run_row(r, model, work, reference) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", default=[r.name for r in ROWS], metavar="NAME",
                        help="rows to run (default: all): " + "; ".join(r.name for r in ROWS))
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--work", help="directory for the runs (default: a temporary one, removed)")
    args = parser.parse_args()
    unknown = set(args.rows) - {r.name for r in ROWS}
    if unknown:
        parser.error(f"unknown rows: {sorted(unknown)}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rlvr-faults-"))
    try:
        results = run_matrix(args.rows, work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'row':<46} {'stopped':>8} {'ckpt':>5} {'lost':>5} {'resumed':>8} {'equal':>6} {'s':>6}  detail")
    for r in results:
        print(f"{r['row']:<46} {str(r['stopped_as_expected']):>8} {r['checkpoint_at_stop']:>5} "
              f"{r['records_lost']:>5} {str(r['recovered']):>8} {str(r['equal']):>6} {r['seconds']:>6}  {r['detail']}")
    ok = all(r["stopped_as_expected"] and r["recovered"] and r["equal"] and r["records_lost"] == 0 for r in results)
    print(f"{sum(r['recovered'] and r['equal'] for r in results)} of {len(results)} rows recovered to the "
          f"uninterrupted metrics; records lost: {sum(r['records_lost'] for r in results)}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps({"rows": results, "all_recovered": ok,
                                                    "matrix": [asdict(r) for r in ROWS if r.name in args.rows]},
                                                   indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
