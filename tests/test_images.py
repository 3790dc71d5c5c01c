"""Environment images (``rlvr.images``): specs are checked field by field, one spec gives one key,
a build is cached, read-only and verified before use (a corrupt or partial image is never used),
``gc`` keeps a disk budget, and two images pinning conflicting versions of one package run side by
side in the sandbox and in one training run, each seeing only its own."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_images import probe_wheel as wheel  # noqa: E402
from rlvr.cli import main  # noqa: E402
from rlvr.errors import UserError  # noqa: E402
from rlvr.images import cache  # noqa: E402
from rlvr.images.build import build  # noqa: E402
from rlvr.images.spec import parse_spec, read_spec  # noqa: E402
from rlvr.sandbox.detect import available  # noqa: E402

PACKAGE = "rlvrprobe"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """A wheel directory with rlvrprobe 1.0 and 2.0, and a fresh images root (``RLVR_IMAGES``).
    A sandbox pool knows its images root from its start: the process-wide one is closed before
    (so this test's opens on its root) and after (so no later test gets a pool on this one)."""
    from rlvr.sandbox.config import close_shared_sandbox

    close_shared_sandbox()
    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "images"))
    directory = tmp_path / "wheels"
    directory.mkdir()
    yield {v: wheel(directory, v) for v in ("1.0", "2.0")}
    close_shared_sandbox()


def spec_file(tmp_path: Path, name: str, whl: Path, **extra) -> Path:
    version = whl.name.split("-")[1]
    body = {"name": name, "requirements": [f"{PACKAGE}=={version} --hash=sha256:{sha256(whl)}"],
            "find_links": str(whl.parent), **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


@pytest.mark.parametrize("body, needle", [
    ({"name": "Bad Name"}, "name: 'Bad Name' is not an image name"),
    ({"name": "x", "requirements": ["six"]}, "requirements[0]: 'six' is not pinned"),
    ({"name": "x", "requirements": ["six==1.16.0"]}, "requirements[0]: 'six==1.16.0' has no --hash"),
    ({"name": "x", "files": {"/etc/passwd": "x"}}, "files: '/etc/passwd' is not a relative path"),
    ({"name": "x", "files": {"../up": "x"}}, "files: '../up' is not a relative path"),
    ({"name": "x", "packages": []}, "unknown field 'packages'"),
    ({"name": "x", "setup": ["ls"]}, "setup: must be a string"),
])
def test_a_bad_spec_is_one_error_naming_file_and_field(tmp_path, body, needle):
    path = tmp_path / "env.yaml"
    path.write_text(json.dumps(body))
    with pytest.raises(UserError) as e:
        read_spec(path)
    assert str(e.value).startswith(str(path)) and needle in str(e.value) and "\n" not in str(e.value)


def test_one_spec_gives_one_key_and_what_decides_the_content_changes_it():
    line = f"{PACKAGE}==1.0 --hash=sha256:{'a' * 64}"
    interp = {"implementation": "cpython", "version": "3.11.7", "platform": "linux-x86_64", "libc": "glibc-2.36"}
    base = parse_spec({"name": "a", "requirements": [line]}, "t").key(interp)
    assert parse_spec({"name": "b", "requirements": [line], "find_links": "/elsewhere"}, "t").key(interp) == base
    assert parse_spec({"name": "a", "requirements": [line.replace("rlvrprobe", "RLVRProbe")]}, "t").key(interp) == base
    for changed in ({"requirements": [line.replace("a" * 64, "b" * 64)]}, {"requirements": [line], "setup": "true"},
                    {"requirements": [line], "files": {"x.txt": "1"}}):
        assert parse_spec({"name": "a", **changed}, "t").key(interp) != base, changed
    assert parse_spec({"name": "a", "requirements": [line]}, "t").key({**interp, "version": "3.12.1"}) != base


def test_a_build_is_cached_read_only_and_listed(wheels, tmp_path, capsys):
    path = spec_file(tmp_path, "probe-one", wheels["1.0"], files={"data/config.txt": "hello"},
                     setup="python -c \"import rlvrprobe; open('setup.txt', 'w').write(rlvrprobe.VERSION)\"")
    first = build(read_spec(path))
    again = build(read_spec(path))
    assert not first.cached and again.cached and again.image.key == first.image.key
    image = first.image.path
    assert (image / "files" / "data" / "config.txt").read_text() == "hello"
    assert (image / "files" / "setup.txt").read_text() == "1.0"  # setup ran on the image's python
    for p in [image / "venv", *(image / "venv").rglob("*")]:
        if not p.is_symlink():
            assert not p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), p
    assert "rlvrprobe" in (image / "build.log").read_text()
    assert cache.resolve("probe-one").key == first.image.key
    assert main(["envs", "list"]) == 0
    out = capsys.readouterr().out
    assert "probe-one" in out and first.image.key[:12] in out
    assert main(["envs", "build", str(path)]) == 0
    assert "cached" in capsys.readouterr().out


def test_a_corrupt_partial_or_missing_image_is_never_used(wheels, tmp_path):
    image = build(read_spec(spec_file(tmp_path, "probe-one", wheels["1.0"]))).image
    module = next((image.path / "venv").rglob("rlvrprobe/__init__.py"))
    os.chmod(module, 0o644)
    module.write_text("VERSION = 'tampered'\n")
    cache._verified.clear()  # a new process: nothing verified yet
    with pytest.raises(UserError, match="is corrupt: its tree digest"):
        cache.resolve("probe-one")
    with pytest.raises(UserError, match="is corrupt"):  # a build of the spec does not paper over it
        build(read_spec(spec_file(tmp_path, "probe-one", wheels["1.0"])))
    (image.path / cache.MANIFEST).unlink()
    with pytest.raises(UserError, match=r"is incomplete \(no image.json\)"):
        cache.resolve("probe-one")
    assert cache.gc(1 << 40, remove_corrupt=True) == [image.key]
    with pytest.raises(UserError, match="'probe-one' is not built"):
        cache.resolve("probe-one")
    leftover = cache.root() / ".staging" / "0123456789abcdef-999999999"
    leftover.mkdir(parents=True)  # a build killed mid-way: its pid is gone
    assert cache.images() == [] and "staging/0123456789abcdef-999999999" in cache.gc(1 << 40)


def test_gc_removes_the_least_recently_used_beyond_the_budget(wheels, tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "TOUCH_EVERY_S", 0.0)  # every use recorded (a run records one a minute)
    one = build(read_spec(spec_file(tmp_path, "one", wheels["1.0"]))).image
    two = build(read_spec(spec_file(tmp_path, "two", wheels["2.0"]))).image
    cache.resolve("one")  # used last
    assert cache.gc(one.size_bytes + two.size_bytes) == []
    assert cache.gc(max(one.size_bytes, two.size_bytes)) == [two.key]
    assert cache.resolve("one").key == one.key
    with pytest.raises(UserError, match="'two' is not built"):
        cache.resolve("two")


def test_a_build_without_free_space_is_refused_before_it_starts(wheels, tmp_path):
    with pytest.raises(UserError, match="MiB free under .* a build needs"):
        build(read_spec(spec_file(tmp_path, "one", wheels["1.0"])), min_free_bytes=1 << 60)
    assert cache.images() == []


def test_a_failed_build_leaves_nothing_usable(wheels, tmp_path):
    path = spec_file(tmp_path, "one", wheels["1.0"], setup="exit 3")
    with pytest.raises(UserError, match=r"image one: setup failed \(exit 3\).*failed-builds/one.log"):
        build(read_spec(path))
    assert cache.images() == [] and not list((cache.root() / ".staging").iterdir())
    assert "$ /bin/sh -c exit 3" in (cache.root() / "failed-builds" / "one.log").read_text()


@pytest.fixture
def two_images(wheels, tmp_path):
    return [build(read_spec(spec_file(tmp_path, f"probe-{v}", wheels[v]))).image for v in ("1.0", "2.0")]


STRICT = [b for b in ("forkserver", "bwrap", "forkserver-userns") if available(b)]  # the ones here


@pytest.mark.parametrize("backend", STRICT)
def test_conflicting_images_run_side_by_side_each_seeing_only_its_own(two_images, backend):
    from rlvr.sandbox import Job, Sandbox

    one, two = two_images
    program = "import rlvrprobe, sys\ndef f():\n    return rlvrprobe.VERSION\n"
    peek = ("import os\ndef f(path):\n    try:\n        return sorted(os.listdir(path))\n"
            "    except OSError as e:\n        return type(e).__name__\n")
    write = ("def f(path):\n    try:\n        open(path, 'w').write('x')\n        return 'wrote'\n"
             "    except OSError as e:\n        return type(e).__name__\n")
    with Sandbox(workers=2, backend=backend) as sandbox:
        jobs = {v: [Job.io(program, "f", [()], image=str(i.path)) for _ in range(4)] for v, i in (("1.0", one), ("2.0", two))}
        futures = {v: [sandbox.submit(j) for j in js] for v, js in jobs.items()}  # interleaved in the pool
        for version, fs in futures.items():
            assert [f.result().outputs for f in fs] == [[{"ok": version}]] * 4
        host = sandbox.run(Job.io(program, "f", [()]))
        assert "No module named 'rlvrprobe'" in host.outputs[0]["error"]
        assert sandbox.run(Job.io(peek, "f", [(str(two.path),)], image=str(one.path))).outputs == [{"ok": "PermissionError"}]
        assert sandbox.run(Job.io(peek, "f", [(str(one.path / "venv"),)], image=str(one.path))).outputs[0]["ok"] != "PermissionError"
        target = str(next((one.path / "venv").rglob("rlvrprobe/__init__.py")))
        assert sandbox.run(Job.io(write, "f", [(target,)], image=str(one.path))).outputs == [{"ok": "PermissionError"}]
        tests = "def check(candidate):\n    assert candidate() == '2.0'\n"
        assert sandbox.run(Job.with_tests(program, tests, "f", image=str(two.path))).passed
        assert not sandbox.run(Job.with_tests(program, tests, "f", image=str(one.path))).passed
        cmd = sandbox.run(Job.command(["python", "-c", "import rlvrprobe; print(rlvrprobe.VERSION)"], image=str(two.path)))
        assert cmd.status == "ok" and cmd.stdout.strip() == "2.0"
        prog = sandbox.run(Job.run_program("import rlvrprobe; print(rlvrprobe.VERSION)", image=str(one.path)))
        assert prog.exit_code == 0 and prog.stdout.strip() == "1.0"
        outside = sandbox.run(Job.io(program, "f", [()], image="/usr"))
        assert outside.status != "ok" and "not under this pool's images root" in outside.stderr


@pytest.mark.parametrize("backend, warm", [("forkserver", True), ("weak", False)])
def test_image_runs_fork_from_a_warm_worker_or_exec_a_fresh_interpreter(two_images, backend, warm):
    """Strict backends relay an image's jobs to a warm worker on its interpreter (the run is a fork
    of it: the worker module is already in memory); the weak backend execs the image's interpreter
    per run. Either way the run sees only its image, and the weak one refuses a tests job there."""
    from rlvr.sandbox import Job, Sandbox

    if not available(backend):
        pytest.skip(f"no {backend} backend here")
    one, _ = two_images
    probe = ("import sys, rlvrprobe\ndef f():\n    return [rlvrprobe.VERSION, 'rlvr.sandbox.worker' in sys.modules,"
             " sys.executable]\n")
    with Sandbox(workers=1, backend=backend, allow_weak=True) as sandbox:
        for _ in range(3):
            result = sandbox.run(Job.io(probe, "f", [()], image=str(one.path)))
            assert result.outputs == [{"ok": ["1.0", warm, str(one.path / "venv" / "bin" / "python")]}], result
        tests = sandbox.run(Job.with_tests(probe, "def check(c):\n    assert c()[0] == '1.0'\n", "f", image=str(one.path)))
        assert tests.passed == warm and (warm or "needs a strict backend" in tests.stderr)


def test_a_verifier_worker_on_a_new_node_builds_the_runs_images_from_their_specs(wheels, tmp_path, monkeypatch):
    """A Ray verifier actor gets the run's specs (``RayWorkers(images=...)``): on a node whose cache
    lacks them it builds them before taking work, then its jobs run on them; one whose cache holds
    them only verifies them."""
    from rlvr.sandbox import Job
    from rlvr.sandbox.config import SandboxConfig
    from rlvr.workers.actors import VerifierWorker

    spec = read_spec(spec_file(tmp_path, "probe-one", wheels["1.0"]))
    assert cache.images() == []  # this node's cache is empty
    worker = VerifierWorker(None, SandboxConfig(workers=1), str(tmp_path / "verifier-0"), False, (spec,))
    assert [i.name for i in cache.images()] == ["probe-one"]
    image = cache.resolve("probe-one")
    results, _ = worker.run_jobs([Job.io("import rlvrprobe\ndef f():\n    return rlvrprobe.VERSION\n", "f", [()],
                                         image=str(image.path))])
    assert results[0].outputs == [{"ok": "1.0"}]
    built_at = (image.path / cache.MANIFEST).stat().st_mtime
    VerifierWorker(None, SandboxConfig(workers=1), str(tmp_path / "verifier-1"), False, (spec,))
    assert (image.path / cache.MANIFEST).stat().st_mtime == built_at  # found and verified, not rebuilt

    from rlvr.images.remote import push
    from rlvr.store import StoreConfig

    store = StoreConfig(url=f"file://{tmp_path / 'store'}")
    push(image, store)
    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "node-3"))  # a third node, with the run's store
    fetched_before = set((tmp_path / "store").rglob("*"))
    VerifierWorker(None, SandboxConfig(workers=1), str(tmp_path / "verifier-2"), False, (spec,), store)
    node3 = cache.resolve("probe-one")
    assert node3.key == image.key and (node3.path / "build.log").read_text() == (image.path / "build.log").read_text()
    assert set((tmp_path / "store").rglob("*")) == fetched_before  # fetched, nothing built and pushed again


def test_an_image_travels_through_the_store_and_is_verified_on_arrival(wheels, tmp_path, monkeypatch):
    """Built and pushed on one machine, fetched (not built) on another; a tar changed in the store,
    or an upload whose tree no longer matches its own manifest, is refused and leaves nothing."""
    import tarfile

    from rlvr.store import RunStore, StoreConfig

    store = StoreConfig(url=f"file://{tmp_path / 'store'}")
    spec = read_spec(spec_file(tmp_path, "probe-one", wheels["1.0"]))
    first = build(spec, store=store)
    assert first.source == "built"
    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "machine-b"))
    second = build(spec, store=store)
    assert second.source == "store" and second.image.key == first.image.key
    assert (second.image.path / "build.log").read_text() == (first.image.path / "build.log").read_text()
    assert main(["envs", "build", str(spec_file(tmp_path, "probe-one", wheels["1.0"])), "--store", store.url]) == 0

    key = first.image.key
    tar = tmp_path / "store" / "images" / key / "files" / "image.tar"
    good = tar.read_bytes()
    tar.write_bytes(good[:-1024] + b"x" * 1024)
    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "machine-c"))
    with pytest.raises(UserError, match="does not match its manifest"):
        build(spec, store=store)
    assert cache.images() == [] and not (cache.root() / key).exists()

    altered = tmp_path / "altered"  # a well-formed upload whose tree was changed after the build
    tar.write_bytes(good)
    with tarfile.open(tar) as t:
        t.extractall(altered, filter="fully_trusted")
    module = next(altered.rglob("rlvrprobe/__init__.py"))
    os.chmod(module, 0o644)
    module.write_text("VERSION = 'evil'\n")
    repacked = tmp_path / "image.tar"
    with tarfile.open(repacked, "w") as t:
        t.add(altered / key, arcname=key)
    RunStore(store).push(f"images/{key}", {"image.tar": repacked})
    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "machine-d"))
    with pytest.raises(UserError, match="is corrupt"):
        build(spec, store=store)
    assert cache.images() == [] and not (cache.root() / key).exists()


def test_a_task_file_names_the_image_of_all_its_rows(wheels, tmp_path):
    """``options: {image: NAME}`` on a HumanEval-style file: every row's code runs on that image
    (its reference passes there, and fails on an image with the other version)."""
    from rlvr.tasks.files import load_tasks
    from rlvr.tasks.rows import TaskFileConfig

    for v in ("1.0", "2.0"):
        build(read_spec(spec_file(tmp_path, f"probe-{v.replace('.', '')}", wheels[v])))
    rows = [{"task_id": f"probe/{i}", "prompt": "import rlvrprobe\n\ndef version():\n",
             "canonical_solution": "    return rlvrprobe.VERSION\n", "entry_point": "version",
             "test": "def check(candidate):\n    assert candidate() == '1.0'\n"} for i in range(3)]
    path = tmp_path / "humaneval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, dropped = load_tasks(TaskFileConfig(path=str(path), options={"image": "probe-10"}))
    assert len(kept) == 3 and not dropped and all(t.spec.payload["image"] == "probe-10" for t in kept)
    with pytest.raises(UserError, match="every task fails its own acceptance criteria"):
        load_tasks(TaskFileConfig(path=str(path), options={"image": "probe-20"}))
    with pytest.raises(UserError, match="every task fails"):  # the host has no rlvrprobe at all
        load_tasks(TaskFileConfig(path=str(path)))


def code_task(i: int, image: str, version: str) -> dict:
    solution = "import rlvrprobe\n\ndef version():\n    return rlvrprobe.VERSION\n"
    return {"id": f"probe-{image}-{i}", "domain": f"file.{image}", "level": 1,
            "prompt": [{"role": "user", "content": f"Write version() returning rlvrprobe's version ({i})."}],
            "spec": {"kind": "code", "payload": {"entry_point": "version", "image": image,
                                                 "test": f"def check(candidate):\n    assert candidate() == {version!r}\n"}},
            "key": f"{image}-{i}", "reference": f"```python\n{solution}```"}


def test_one_training_run_uses_both_images_each_task_on_its_own(wheels, tmp_path, tiny_model_dir, capsys):
    """Tasks of both images in one GRPO run (its ``images:`` built at the start, one process-wide
    sandbox): every task's reference answer passes, each on its own image, and the run trains;
    the same tasks pointed at the other image all fail their acceptance criteria and the run stops.
    (The tiny random policy writes no code block, so its own samples never reach the sandbox.)"""
    from rlvr.config import load_config
    from rlvr.train.grpo import GRPOConfig, run_grpo

    specs = [spec_file(tmp_path, f"probe-{v.replace('.', '')}", wheels[v]) for v in ("1.0", "2.0")]
    rows = [code_task(i, "probe-10", "1.0") for i in range(4)] + [code_task(i, "probe-20", "2.0") for i in range(4)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [f"model={tiny_model_dir}", "domains=[]", f"task_files=[{tasks}]", f"images=[{specs[0]},{specs[1]}]",
              "rollout.tasks_per_step=4", "rollout.samples_per_task=2", "rollout.max_new_tokens=8",
              "checkpoint_every=100"]
    assert cache.images() == []
    summary = run_grpo(load_config(GRPOConfig, None, [*common, f"out={tmp_path / 'run'}", "steps=2"]), progress=False)
    assert f"kept 8 of 8 tasks from {tasks}" in capsys.readouterr().out
    assert sorted(i.name for i in cache.images()) == ["probe-10", "probe-20"]  # built by the run
    assert summary is not None and (tmp_path / "run" / "final").is_dir()
    swapped = [dict(r, spec={**r["spec"], "payload": {**r["spec"]["payload"], "image": "probe-20"}}) for r in rows[:4]]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in swapped))
    with pytest.raises(UserError, match="every task fails its own acceptance criteria"):
        run_grpo(load_config(GRPOConfig, None, [*common, f"out={tmp_path / 'swapped'}", "steps=1"]), progress=False)
