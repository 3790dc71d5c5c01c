"""Object storage (rlvr.store): atomic pushes (manifest last), verified pulls, and a GRPO run killed
mid-run that resumes in a fresh directory from a real S3-compatible server (moto's server mode) alone,
with the metrics of an uninterrupted run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.faults import command, job_files, run_child, tiny_model, without_times  # noqa: E402
from rlvr.errors import UserError  # noqa: E402
from rlvr.monitor.metrics import read_metrics  # noqa: E402
from rlvr.store import MANIFEST, RunStore, StoreConfig  # noqa: E402


def fake_checkpoint(run_dir: Path, step: int) -> Path:
    ckpt = run_dir / "checkpoints" / f"step_{step}"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(bytes([step]) * 1000)
    (ckpt / "sub" / "state.json").write_text(json.dumps({"step": step}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, step + 1)))
    return ckpt


def test_push_then_pull_round_trips_and_prunes(tmp_path):
    store = RunStore(StoreConfig(url=f"file://{tmp_path / 'store'}"))
    run = tmp_path / "run"
    for step in (1, 2, 3):
        store.push_checkpoint(fake_checkpoint(run, step), run, keep=2)
    assert [s for s, _ in store.checkpoints()] == [2, 3]  # pruned to keep=2
    fresh = tmp_path / "fresh"
    assert store.restore_latest(fresh) == 3
    assert (fresh / "checkpoints" / "step_3" / "model.safetensors").read_bytes() == bytes([3]) * 1000
    assert json.loads((fresh / "checkpoints" / "step_3" / "sub" / "state.json").read_text()) == {"step": 3}
    assert len((fresh / "metrics.jsonl").read_text().splitlines()) == 3
    assert not [p for p in fresh.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_an_upload_without_its_manifest_is_never_seen_and_a_changed_file_is_refused(tmp_path, capsys):
    root = tmp_path / "store"
    store = RunStore(StoreConfig(url=str(root)))
    run = tmp_path / "run"
    store.push_checkpoint(fake_checkpoint(run, 1), run, keep=5)
    store.push_checkpoint(fake_checkpoint(run, 2), run, keep=5)
    # a push killed before its manifest: files, no manifest
    partial = root / "checkpoints" / "step_9" / "files" / "checkpoint"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"half")
    assert [s for s, _ in store.checkpoints()] == [1, 2]
    # step 2 changed after it was written: refused in one line, step 1 used instead
    (root / "checkpoints" / "step_2" / "files" / "checkpoint" / "model.safetensors").write_bytes(b"x" * 1000)
    assert store.restore_latest(tmp_path / "fresh") == 1
    assert "skipping step_2" in capsys.readouterr().out
    with pytest.raises(UserError, match="step_2/checkpoint/model.safetensors does not match its manifest"):
        store.pull("checkpoints/step_2", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_an_empty_store_restores_nothing_and_s3_needs_its_extra(tmp_path):
    assert RunStore(StoreConfig(url=f"file://{tmp_path / 'none'}")).restore_latest(tmp_path / "run") is None
    assert MANIFEST == "MANIFEST.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A real S3-compatible server (moto's server mode) on a free port, with a bucket."""
    pytest.importorskip("s3fs")
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            time.sleep(0.2)
    options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
    import s3fs

    s3fs.S3FileSystem(**options).mkdir("runs")
    yield options
    server.terminate()
    server.wait(timeout=30)


def test_a_run_killed_mid_run_resumes_in_a_fresh_directory_from_the_store_alone(tmp_path, s3):
    model, files = tiny_model(tmp_path / "model"), job_files(tmp_path / "files")

    def cmd(out: Path, prefix: str) -> list[str]:
        return command("grpo", model, out, files) + [
            "--set", f"store.url=s3://runs/{prefix}", "--set", f"store.options={json.dumps(s3)}"]

    whole = run_child(cmd(tmp_path / "whole", "whole"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    killed = run_child(cmd(tmp_path / "machine_a", "job"), fault="rollout@4:kill")
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = RunStore(StoreConfig(url="s3://runs/job", options=s3))
    assert [s for s, _ in store.checkpoints()] == [1, 2, 3]  # every step checkpointed before the kill (keep 3)
    # machine B: a fresh directory, nothing but the config and the store
    resumed = run_child(cmd(tmp_path / "machine_b", "job"), resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "store: resuming from s3://runs/job step 3" in resumed.stdout
    assert without_times(read_metrics(tmp_path / "machine_b")) == without_times(read_metrics(tmp_path / "whole"))
    assert store.manifest("final") is not None  # the final model is in the store too


def test_task_and_pair_files_read_from_object_storage_name_the_url(s3, monkeypatch, tmp_path):
    import s3fs

    from rlvr.tasks.files import load_tasks
    from rlvr.tasks.pairs import load_pairs
    from rlvr.tasks.rows import TaskFileConfig

    fs = s3fs.S3FileSystem(**s3)
    fs.pipe("runs/data/tasks.jsonl", b'{"prompt": "Compute: 1 + 1", "answer": "2"}\n{"prompt": "Compute: 2 + 2", "answer": "4"}\n')
    fs.pipe("runs/data/bad.jsonl", b'{"prompt": "Compute: 1 + 1", "answer": "2"}\nnot json\n')
    fs.pipe("runs/data/pairs.jsonl", b'{"prompt": "Compute: 1 + 1", "chosen": "2", "rejected": "3"}\n')
    # credentials and endpoint from the environment, as for any s3 client
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint_url"])
    tasks, dropped = load_tasks(TaskFileConfig(path="s3://runs/data/tasks.jsonl", verifier="math"))
    assert dropped == []
    assert [t.spec.payload["answer"] for t in tasks] == ["2", "4"]
    assert [p.chosen for p in load_pairs("s3://runs/data/pairs.jsonl")] == ["2"]
    with pytest.raises(UserError, match=r"s3://runs/data/bad.jsonl:2: "):
        load_tasks(TaskFileConfig(path="s3://runs/data/bad.jsonl", verifier="math"))
    with pytest.raises(UserError, match=r"s3://runs/data/none.jsonl"):
        load_tasks(TaskFileConfig(path="s3://runs/data/none.jsonl", verifier="math"))


@pytest.mark.parametrize("job", ["sft", "dpo"])
def test_sft_and_dpo_resume_elsewhere_from_the_store(tmp_path, job):
    model, files = tiny_model(tmp_path / "model"), job_files(tmp_path / "files")

    def cmd(out: Path, prefix: str) -> list[str]:
        return command(job, model, out, files) + ["--set", f"store.url=file://{tmp_path / 'store' / prefix}"]

    whole = run_child(cmd(tmp_path / "whole", "whole"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    killed = run_child(cmd(tmp_path / "machine_a", "job"), fault="metrics@7:kill")
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run_child(cmd(tmp_path / "machine_b", "job"), resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "store: resuming from" in resumed.stdout and "step 6" in resumed.stdout
    assert without_times(read_metrics(tmp_path / "machine_b")) == without_times(read_metrics(tmp_path / "whole"))
    assert RunStore(StoreConfig(url=f"file://{tmp_path / 'store' / 'job'}")).manifest("final") is not None
