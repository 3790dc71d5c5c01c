"""What pushing alerts costs the training step: ``AlertLog.write`` with no webhook, a live local
receiver, a receiver that hangs every request past the timeout, and a port nobody listens on.

    python benchmarks/alert_push.py [--alerts 200] [--rounds 5] [--json PATH]

The step's only work for a pushed alert is ``AlertLog.write`` (the JSONL line, then ``push``, which
enqueues; the POST runs on the pusher's thread). Each round writes ``--alerts`` alerts per side,
sides alternated; reported: median microseconds per write over the rounds, its spread, and each
side's ratio to no webhook. Idle CPU at the start is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import idle_cpu  # noqa: E402

from rlvr.monitor.alerts import AlertLog  # noqa: E402
from rlvr.monitor.push import AlertPusher, PushConfig  # noqa: E402

ALERT = {"step": 1, "detector": "tampering", "severity": "critical", "evidence": {"flagged": 1, "samples": 64,
         "notes": {"1-3": "verdict tampered; os._exit"}}, "trajectory_ids": ["1-3"], "action": "logged"}


def receiver(hang_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(hang_s)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def write_us(directory: Path, url: str | None, n: int) -> float:
    directory.mkdir(parents=True)
    pusher = AlertPusher(PushConfig(url=url, timeout_s=2.0, retries=1, backoff_s=0.5)) if url else None
    log = AlertLog(directory, echo=None, pusher=pusher)
    start = time.perf_counter()
    for step in range(n):
        log.write({**ALERT, "step": step})
    took = time.perf_counter() - start
    log.close(wait_s=0.0)
    return 1e6 * took / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--alerts", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(f"idle CPU at start: {100 * idle_cpu():.0f}%")
    live, hanging = receiver(0.0), receiver(30.0)
    sides = {"no webhook": None, "live receiver": f"http://127.0.0.1:{live.server_address[1]}/",
             "receiver hangs (timeout 2 s)": f"http://127.0.0.1:{hanging.server_address[1]}/",
             "nobody listening": "http://127.0.0.1:9/"}
    times: dict[str, list[float]] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, url in sides.items():
                times[name].append(write_us(Path(tmp) / f"{r}-{list(sides).index(name)}", url, args.alerts))
    base = statistics.median(times["no webhook"])
    rows = {name: {"median_us": round(statistics.median(v), 1), "min_us": round(min(v), 1),
                   "max_us": round(max(v), 1), "ratio": round(statistics.median(v) / base, 2)}
            for name, v in times.items()}
    print(f"{'side':<30} {'us/write':>9} {'spread':>16} {'x none':>7}")
    for name, row in rows.items():
        print(f"{name:<30} {row['median_us']:>9} {row['min_us']:>7}-{row['max_us']:<8} {row['ratio']:>7}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"alerts": args.alerts, "rounds": args.rounds, "sides": rows}, indent=2))
    live.shutdown()


if __name__ == "__main__":
    main()
