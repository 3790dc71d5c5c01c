"""Optional trackers (MLflow, W&B offline): the same names, values and steps as metrics.jsonl, the
config as parameters, nothing sent, no process left; a bad name or a missing package is one line."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.config import from_dict, load_config, to_dict
from rlvr.errors import ConfigError, UserError
from rlvr.monitor.metrics import MetricsLogger, read_metrics
from rlvr.monitor.trackers import TRACKERS, TrackerConfig, flat_params, mlflow_name, open_trackers

STEPS = [
    (1, {"train/loss": 2.5, "train/lr": 1e-3, "eval/pass@1": 0.25, "note": "text is not a metric"}),
    (2, {"train/loss": 2.0, "train/lr": 9e-4, "rollout/pass_rate/math.arith": 0.5}),
    (3, {"train/loss": float("nan"), "train/lr": 8e-4, "train/skipped": True}),
]
PARAMS = {"model": "runs/sft/final", "seed": 3, "optim": {"lr": 0.001, "schedule": "cosine"},
          "domains": ["math.arith", "math.word"], "ref_model": None}


def logged(run_dir: Path, use: list[str]) -> dict[str, dict[int, float]]:
    """Log STEPS through a MetricsLogger with the trackers ``use``; metrics.jsonl as {name: {step: value}}."""
    trackers = open_trackers(TrackerConfig(use=use), run_dir, PARAMS)
    logger = MetricsLogger(run_dir, tensorboard=False, trackers=trackers)
    for step, metrics in STEPS:
        logger.log(step, metrics)
    logger.close()
    series: dict[str, dict[int, float]] = {}
    for row in read_metrics(run_dir):
        for name, value in row.items():
            if name != "step" and isinstance(value, float):
                series.setdefault(name, {})[row["step"]] = value
    return series


def same(a: dict[int, float], b: dict[int, float]) -> bool:
    return a.keys() == b.keys() and all(a[s] == b[s] or (math.isnan(a[s]) and math.isnan(b[s])) for s in a)


@pytest.fixture
def no_network(monkeypatch):
    """Refuse (and record) every socket connection that leaves this machine."""
    tried: list = []
    real = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            tried.append(address)
            raise OSError(f"test: no network ({address})")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield
    assert not tried, f"a tracker tried the network: {tried}"


def children() -> list[str]:
    """Command lines of this process's child processes (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid():
                out.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            continue
    return out


def test_mlflow_run_holds_the_metrics_jsonl_numbers_and_the_config(tmp_path, no_network):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    series = logged(tmp_path / "run", ["mlflow"])
    assert set(series) == {"train/loss", "train/lr", "eval/pass@1", "rollout/pass_rate/math.arith", "train/skipped"}
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rlvr").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params == flat_params(PARAMS) and run.data.params["optim.lr"] == "0.001"
    assert set(run.data.metrics) == {mlflow_name(n) for n in series}
    assert "eval/pass_at_1" in run.data.metrics  # MLflow refuses '@' in a name
    for name, values in series.items():
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, mlflow_name(name))}
        assert same(history, values), name
    assert run.data.tags["rlvr.run_dir"] == str((tmp_path / "run").resolve())
    assert not list(tmp_path.glob("run/mlruns")) and not Path("mlruns").exists()  # no file store, no stray dir

    resumed = MetricsLogger(tmp_path / "run", tensorboard=False, resume_step=2,
                            trackers=open_trackers(TrackerConfig(use=["mlflow"]), tmp_path / "run", PARAMS))
    resumed.log(3, {"train/loss": 1.5})
    resumed.close()
    second = [r for r in client.search_runs([run.info.experiment_id]) if r.info.run_id != run.info.run_id]
    assert [(m.step, m.value) for m in client.get_metric_history(second[0].info.run_id, "train/loss")] == [(3, 1.5)]


def test_mlflow_uri_set_by_the_user_is_where_the_run_goes(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    (tracker,) = open_trackers(TrackerConfig(use=["mlflow"], mlflow_uri=uri, project="p", run_name="r"),
                               tmp_path / "run", {})
    tracker.log(7, {"train/loss": 0.5})
    tracker.close()
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("p").experiment_id])
    assert run.info.run_name == "r" and run.data.metrics == {"train/loss": 0.5}
    assert not (tmp_path / "run" / "mlflow.db").exists()


def wandb_records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file: W&B's LevelDB-style log (a 7-byte header, then
    32 KiB blocks of chunks [crc32:4][length:2][type:1]; type 1 a whole record, 2/3/4 first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    records, pos, parts = [], 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4: pos + 6], "little"), data[pos + 6]
        parts += data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
        elif kind == 0:
            break
    return records


def test_wandb_offline_run_holds_the_metrics_jsonl_numbers_and_the_config(tmp_path, monkeypatch, no_network):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")  # the tracker stays offline whatever the environment says
    series = logged(tmp_path / "run", ["wandb"])
    (run_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[str, dict[int, float]] = {}
    config: dict = {}
    run_name = ""
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for name, value in row.items():
                if not name.startswith("_"):
                    history.setdefault(name, {})[row["_step"]] = float(value)
        elif kind in ("run", "config"):  # the run record carries the config given to init
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
            run_name = record.run.display_name or run_name
    assert history.keys() == series.keys()
    for name, values in series.items():
        assert same(history[name], values), name
    assert {k: config[k] for k in PARAMS} == PARAMS and run_name == "run"
    assert not [c for c in children() if "wandb" in c], "close() left the wandb service running"


def test_metrics_logger_forwards_numbers_and_closes_each_tracker_once(tmp_path):
    class Memory:
        def __init__(self):
            self.rows, self.closed = [], 0

        def log(self, step, metrics):
            self.rows.append((step, metrics))

        def close(self):
            self.closed += 1

    tracker = Memory()
    logger = MetricsLogger(tmp_path, tensorboard=False, trackers=[tracker])
    logger.log(4, {"train/loss": 1, "note": "x", "flag": True})
    logger.close()
    logger.close()
    assert tracker.rows == [(4, {"train/loss": 1.0, "flag": 1.0})] and tracker.closed == 1


def test_unknown_tracker_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"'trackers.use\[1\]' = 'neptune' .*\['mlflow', 'wandb'\]"):
        TrackerConfig(use=["mlflow", "neptune"])
    with pytest.raises(ConfigError, match="TensorBoard is always written"):
        TrackerConfig(use=["tensorboard"])
    from rlvr.train.sft import SFTConfig

    with pytest.raises(ConfigError, match=r"unknown config key 'trackers.uses'"):
        from_dict(SFTConfig, {"trackers": {"uses": ["mlflow"]}})


@pytest.mark.parametrize("blocked,extra", [("mlflow", "mlflow"), ("sqlalchemy", "mlflow"), ("wandb", "wandb")])
def test_missing_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, blocked, extra):
    monkeypatch.setitem(sys.modules, blocked, None)  # `import <blocked>` now raises ImportError
    with pytest.raises(UserError) as err:
        open_trackers(TrackerConfig(use=[extra]), tmp_path, {})
    assert f"pip install 'rlvr[{extra}]'" in str(err.value) and "\n" not in str(err.value)


def test_importing_rlvr_imports_no_tracker_package():
    code = ("import sys, rlvr.monitor.metrics, rlvr.monitor.trackers as t; t.TrackerConfig(use=['mlflow', 'wandb']); "
            "print([m for m in ('mlflow', 'wandb', 'sqlalchemy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class Recorder:
    """A throwaway tracker that keeps what the trainer gives it."""
    seen: list[Recorder] = []

    def __init__(self, run_dir, cfg, params):
        self.run_dir, self.params, self.rows, self.closed = run_dir, params, [], False
        Recorder.seen.append(self)

    def log(self, step, metrics):
        self.rows.append({"step": step, **metrics})

    def close(self):
        self.closed = True


def test_each_trainer_hands_its_metrics_and_config_to_the_trackers(tiny_model_dir, tmp_path):
    import rlvr.tasks  # noqa: F401  (registers the built-in domains)
    from rlvr.train import dpo, grpo, pretrain, sft

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{i} + 1 =", "chosen": str(i + 1), "rejected": str(i)}) + "\n"
                             for i in range(4)))
    runs = {
        "pretrain": (pretrain.PretrainConfig, pretrain.run_pretrain,
                     ["docs_per_domain=20", "batch_size=4", "seq_len=32", "model.hidden_size=32", "model.num_layers=1",
                      "model.intermediate_size=64", "model.num_heads=2", "model.num_kv_heads=2", "steps=2",
                      "log_every=1"]),
        "sft": (sft.SFTConfig, sft.run_sft,
                [f"model={tiny_model_dir}", "train_tasks=8", "steps=2", "batch_size=4", "log_every=1"]),
        "dpo": (dpo.DPOConfig, dpo.run_dpo,
                [f"model={tiny_model_dir}", f"pair_files=[{pairs}]", "batch_size=2", "log_every=1"]),
        "grpo": (grpo.GRPOConfig, grpo.run_grpo,
                 [f"model={tiny_model_dir}", "domains=[math.arith]", "levels=[1]", "train_tasks=8", "steps=2",
                  "rollout.tasks_per_step=2", "rollout.samples_per_task=2", "rollout.max_new_tokens=4"]),
    }
    with TRACKERS.temporary("recorder", Recorder):
        for name, (cls, run, overrides) in runs.items():
            Recorder.seen.clear()
            cfg = load_config(cls, None, overrides + [f"out={tmp_path / name}", "trackers.use=[recorder]"])
            run(cfg, progress=False)
            (tracker,) = Recorder.seen
            assert tracker.closed and tracker.params == to_dict(cfg), name
            assert tracker.rows == read_metrics(tmp_path / name) and len(tracker.rows) == 2, name


def test_a_line_cut_short_by_a_crash_is_dropped_and_earlier_lines_kept(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        logger.log(step, {"train/loss": float(step)})
    logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "train/lo')  # the process died inside this write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]  # readable as it is
    resumed = MetricsLogger(tmp_path, tensorboard=False, resume_step=2)  # the checkpoint was step 2
    resumed.log(3, {"train/loss": 30.0})
    resumed.close()
    assert [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert not list(tmp_path.glob("*.tmp"))

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    with pytest.raises(UserError, match=r"metrics.jsonl:2: not a JSON metrics row"):
        read_metrics(tmp_path)  # damage before the last line is not a crash's: named, not skipped
