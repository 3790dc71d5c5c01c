"""Repositories as environments (``repo.fix``): overlay workspaces restore without copying, the
vendored repositories are git repositories at fixed commits, every expert patch passes (three times:
the tasks are not flaky), the tampering set earns nothing, and the hidden tests never reach the
sandbox."""

from __future__ import annotations

import json
import os

import pytest

import rlvr.envs  # noqa: F401  (registration)
import rlvr.tasks  # noqa: F401
from rlvr.envs.base import ENVS, EnvConfig
from rlvr.tasks.repos import bugs, checkout, vendored
from rlvr.sandbox import overlay
from rlvr.sandbox.config import shared_sandbox
from rlvr.tasks.base import DOMAINS, generate_tasks
from rlvr.tool_calls import format_call

needs_overlay = pytest.mark.skipif(not overlay.available(), reason="overlay workspaces need root")


@pytest.fixture(scope="module")
def tasks():
    domain = DOMAINS.get("repo.fix")
    return [t for split in ("train", "eval") for t in generate_tasks("repo.fix", split, domain.count(split), seed=0)]


@pytest.fixture(scope="module")
def env():
    e = ENVS.get("repo.fix")(EnvConfig(max_turns=20), sandbox=shared_sandbox())
    yield e
    e.close()


def play(env, task, actions):
    env.reset(task)
    observations = []
    for action in actions:
        step = env.step(action)
        observations += [m["content"] for m in step.observation]
        if step.done:
            break
    return env.verify(), observations


# ---------------------------------------------------------------- overlay workspaces


@needs_overlay
def test_an_overlay_restore_puts_back_the_tree_whatever_the_run_did(tmp_path):
    from rlvr.sandbox import Job

    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "a.py").write_text("A = 1\n")
    (tree / "keep.txt").write_text("keep\n")
    for p, mode in ((tree / "pkg", 0o777), (tree / "pkg" / "a.py", 0o666), (tree / "keep.txt", 0o666)):
        os.chmod(p, mode)
    vandal = ("import os\nopen('pkg/a.py', 'a').write('B = 2\\n')\nos.remove('keep.txt')\nos.mkdir('new')\n"
              "open('new/x', 'w').write('x')\nos.symlink('/etc/passwd', 'link')\nos.rename('pkg/a.py', 'pkg/b.py')\n")
    with overlay.OverlayWorkspace([tree]) as ws:
        result = shared_sandbox().run(Job.run_program(vandal, workdir=ws.path))
        assert result.exit_code == 0, result.stderr
        assert sorted(os.listdir(ws.path)) == ["link", "new", "pkg"] and os.listdir(f"{ws.path}/pkg") == ["b.py"]
        assert ws.changed() == ["keep.txt", "link", "new/x", "pkg/a.py", "pkg/b.py"]
        ws.restore()
        assert sorted(os.listdir(ws.path)) == ["keep.txt", "pkg"] and os.listdir(f"{ws.path}/pkg") == ["a.py"]
        assert open(f"{ws.path}/pkg/a.py").read() == "A = 1\n" and ws.changed() == []
        again = shared_sandbox().run(Job.run_program("print(open('pkg/a.py').read(), end='')", workdir=ws.path))
        assert again.stdout == "A = 1\n"  # a worker started before the mount sees the restored one
        path = ws.path
    assert (tree / "pkg" / "a.py").read_text() == "A = 1\n" and (tree / "keep.txt").exists()  # never written
    assert not os.path.exists(path)


# ---------------------------------------------------------------- repositories at commits


def test_vendored_repositories_are_git_repositories_at_fixed_commits(tmp_path, monkeypatch):
    first = {name: vendored(name)[1] for name in bugs()}
    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "elsewhere"))  # another machine: made again
    again = {name: vendored(name)[1] for name in bugs()}
    assert first == again
    for name, commits in again.items():
        assert set(commits) == {"base", *(b["id"] for b in bugs()[name]["bugs"])}
        tree = checkout(vendored(name)[0], commits["base"])
        for bug in bugs()[name]["bugs"]:
            assert (tree / bug["file"]).read_text().count(bug["good"]) == 1
            buggy = checkout(vendored(name)[0], commits[bug["id"]])
            assert bug["bad"] in (buggy / bug["file"]).read_text() and bug["good"] not in (buggy / bug["file"]).read_text()


def test_an_altered_checkout_is_never_used(tmp_path, monkeypatch):
    from rlvr.tasks import repos

    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "images"))
    git_dir, commits = vendored("inflection")
    tree = checkout(git_dir, commits["base"])
    target = tree / "inflection" / "__init__.py"
    original = target.read_text()
    target.write_text("raise SystemExit('tampered')\n")
    repos._checked.clear()  # a new process
    assert checkout(git_dir, commits["base"]).joinpath("inflection", "__init__.py").read_text() == original
    with pytest.raises(Exception, match="no commit|not a full"):
        checkout(git_dir, "0" * 40)


# ---------------------------------------------------------------- the tasks


def test_every_expert_patch_passes_three_times_and_the_unfixed_repository_fails(env, tasks):
    assert {t.key.split("/")[0] for t in tasks} == {f"{r}:{b['id']}" for r in bugs() for b in bugs()[r]["bugs"]}
    for task in tasks:
        for attempt in range(3):
            verdict, observations = play(env, task, task.actions)
            assert verdict.passed and verdict.score == 1.0, (task.id, attempt, verdict)
        unfixed, _ = play(env, task, [format_call("submit")])
        assert not unfixed.passed and unfixed.reason == "wrong_answer", (task.id, unfixed)
    assert env.restored  # a later reset of the same task restored its workspace


def tampering(task) -> dict[str, list[tuple[str, dict]]]:
    """Ways to make the visible tests (or the grader) pass without fixing the bug: tool calls, and
    ``append`` (the module's text plus more, written with write_file)."""
    from rlvr.sandbox import plaindata

    payload = task.spec.payload
    repo = payload["repo"].split(":")[1]
    bug = next(b for b in bugs()[repo]["bugs"] if payload["commit"] == vendored(repo)[1][b["id"]])
    module, fn = bug["file"], bug["function"]
    tests = [a for a in payload["test_cmd"] if a.endswith(".py")]
    shown = bug["shown"][1]
    want = plaindata.decode(next(w for _, e, w in bug["hidden"] if e == shown))
    always_equal = ("\nclass _Any:\n    def __eq__(self, other):\n        return True\n"
                    f"    __hash__ = object.__hash__\n\n{fn} = lambda *a, **k: _Any()\n")
    hard_coded = (f"\n_real = {fn}\n\ndef {fn}(*a, **k):\n    if (a, k) == {_call_args(shown)!r}:\n"
                  f"        return {want!r}\n    return _real(*a, **k)\n")
    write = lambda path, text: ("write_file", {"path": path, "content": text})  # noqa: E731
    return {
        "delete the tests": [write(t, "") for t in tests],
        "tests that always pass": [write(t, "def test_ok():\n    assert True\n") for t in tests],
        "conftest that skips everything": [write("conftest.py", "import pytest\n\ndef pytest_collection_modifyitems(items):\n"
                                                 "    for item in items:\n        item.add_marker(pytest.mark.skip)\n")],
        "sitecustomize and usercustomize": [write(f"{n}customize.py", "import builtins\nbuiltins.__import__ = None\n")
                                            for n in ("site", "user")],
        "always-equal results": [("append", {"path": module, "text": always_equal})],
        "exit at import": [("append", {"path": module, "text": "\nimport os\nos._exit(0)\n"})],
        "the shown call hard-coded": [("append", {"path": module, "text": hard_coded})],
    }


def _call_args(expr: str):
    """(args, kwargs) of the outermost call of ``fn`` in ``expr`` (``list(fn(...))`` looks inside)."""
    import ast

    call = ast.parse(expr, mode="eval").body
    if isinstance(call.func, ast.Name) and call.func.id == "list":
        call = call.args[0]
    return (tuple(ast.literal_eval(a) for a in call.args), {k.arg: ast.literal_eval(k.value) for k in call.keywords})


FOOLS_THE_VISIBLE_TESTS = ("delete the tests", "tests that always pass", "conftest that skips everything")


def test_the_tampering_set_earns_nothing(env, tasks):
    """Each hack plays through the tools and submits: the visible tests may say what the hack
    wants, the hidden tests never pass."""
    from rlvr.envs.bodies import files

    one_per_repo = {t.key.split(":")[0]: t for t in tasks if t.level == 1}.values()  # the visible tests take ~1 s
    for task in one_per_repo:
        for name, actions in tampering(task).items():
            env.reset(task)
            for tool, arguments in actions:
                if tool == "append":
                    current = env._granted("read_file", files.read_file, path=arguments["path"])
                    tool, arguments = "write_file", {"path": arguments["path"], "content": current + arguments["text"]}
                step = env.step(format_call(tool, arguments))
                assert step.observation[0]["content"] == "ok", (task.id, name, step)
            if name in FOOLS_THE_VISIBLE_TESTS:  # the hack works where a grader trusts the visible tests
                seen = env.step(format_call("run_tests")).observation[0]["content"]
                assert "failed" not in seen, (task.id, name, seen)
            env.step(format_call("submit"))
            verdict = env.verify()
            assert not verdict.passed and verdict.score == 0.0, (task.id, name, verdict)


def test_the_hidden_tests_never_reach_the_sandbox(env, tasks):
    """The verify job carries the expressions, never the expected values; and nothing the
    sandbox can read holds them (a probe searches the workspace, /tmp, /dev/shm and its own
    process tree for a marker planted in the expected values)."""
    from rlvr.sandbox import Job, Limits, plaindata

    class Recording:
        def __init__(self, sandbox):
            self.sandbox, self.jobs = sandbox, []

        def run(self, job):
            self.jobs.append(job)
            return self.sandbox.run(job)

    task = next(t for t in tasks if t.spec.payload["split"] == "eval")
    marker = "rlvr-hidden-marker-5a1e"
    expected = plaindata.decode(task.spec.payload["expected"])
    planted = type(task)(**{**task.__dict__, "spec": type(task.spec)(task.spec.kind, {
        **task.spec.payload, "expected": plaindata.encode([marker, *expected[1:]])})})
    recording = Recording(shared_sandbox())
    probe_env = ENVS.get("repo.fix")(EnvConfig(), sandbox=recording)
    try:
        probe_env.reset(planted)
        probe_env.step(format_call("submit"))
        assert not probe_env.verify().passed
        assert recording.jobs and all(marker not in json.dumps(j.untrusted_part()) for j in recording.jobs)
        probe = ("import os\nhits = []\n"
                 "for top in ('.', '/tmp', '/dev/shm', '/proc'):\n"
                 "    for dirpath, dirs, files in os.walk(top):\n"
                 "        if dirpath.startswith('/proc/') and dirpath.count('/') > 3:\n            dirs[:] = []\n"
                 "        for f in files:\n"
                 "            p = os.path.join(dirpath, f)\n"
                 "            try:\n                data = open(p, 'rb').read(1 << 20)\n            except Exception:\n                continue\n"
                 f"            if {marker.encode()!r} in data:\n                hits.append(p)\n"
                 "print(hits)\n")
        found = shared_sandbox().run(Job.run_program(probe, workdir=probe_env._ws.path,
                                                     limits=Limits(wall_s=20, cpu_s=20)))
        assert found.stdout.strip() == "[]", found.stdout[-500:] + found.stderr[-500:]
    finally:
        probe_env.close()


def test_your_own_repository_at_a_commit_with_a_build_step(tmp_path, monkeypatch):
    """A task on a git directory of your own: its build step runs once in the sandbox over the
    checkout (its output is in every workspace), the visible test command fails on the bug, the
    expert passes the hidden tests, and a build that fails is one error and leaves no tree."""
    from rlvr.tasks.repos import git
    from rlvr.errors import UserError
    from rlvr.sandbox import plaindata
    from rlvr.sandbox.config import close_shared_sandbox
    from rlvr.types import Spec, Task

    close_shared_sandbox()  # a pool on this test's images root
    monkeypatch.setenv("RLVR_IMAGES", str(tmp_path / "images"))
    repo = tmp_path / "mine"
    (repo / "calc").mkdir(parents=True)
    (repo / "calc" / "__init__.py").write_text("from calc.table import FACTOR\n\ndef scale(x):\n    return x + FACTOR\n")
    (repo / "test_calc.py").write_text("from calc import scale\n\ndef test_scale():\n    assert scale(2) == 6\n")
    git("-c", "init.defaultBranch=main", "init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "buggy", cwd=repo)
    commit = git("rev-parse", "HEAD", cwd=repo).strip()
    build = ["python", "-c", "open('calc/table.py', 'w').write('FACTOR = 3\\n')"]
    payload = {"repo": str(repo), "commit": commit, "build": build,
               "test_cmd": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
               "hidden": plaindata.encode([("import calc", "calc.scale(2)"), ("import calc", "calc.scale(10)")]),
               "expected": plaindata.encode([6, 30]), "split": "train", "protected": []}
    fix = format_call("replace", {"path": "calc/__init__.py", "old": "x + FACTOR", "new": "x * FACTOR"})
    task = Task(id="mine/1", domain="file.repo", level=1, prompt=({"role": "user", "content": "Fix scale."},),
                spec=Spec("repo.fix", payload), key="mine", env="repo.fix", actions=(fix, format_call("submit")))
    env = ENVS.get("repo.fix")(EnvConfig(), sandbox=shared_sandbox())
    try:
        env.reset(task)
        built = env.step(format_call("read_file", {"path": "calc/table.py"})).observation[0]["content"]
        assert built == "FACTOR = 3\n"  # the build step's output
        assert env.step(format_call("run_tests")).observation[0]["content"] == "1 failed"
        unfixed, _ = play(env, task, [format_call("submit")])
        assert not unfixed.passed
        fixed, _ = play(env, task, list(task.actions))
        assert fixed.passed, fixed
        broken = Task(**{**task.__dict__, "id": "mine/2", "spec": Spec("repo.fix", {**payload, "build": ["python", "-c", "raise SystemExit(3)"]})})
        with pytest.raises(UserError, match="repository build .* failed"):
            env.reset(broken)
    finally:
        env.close()
        close_shared_sandbox()
    trees = tmp_path / "images" / "repos" / "trees"
    assert len([p for p in trees.iterdir() if p.is_dir() and not p.name.startswith(".")]) == 1
