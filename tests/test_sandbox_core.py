"""The sandbox's API and behaviour on the default backend (attacks live in test_sandbox_attacks)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from rlvr.errors import UserError
from rlvr.sandbox import Job, Limits, Sandbox, choose, detect, plaindata
from rlvr.sandbox.audit import read_audit
from rlvr.sandbox.harness import count_tests
from rlvr.sandbox.verdict import interpret
from rlvr.sandbox.worker import Capture

ADD = "def add(a, b):\n    return a + b\n"
CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"

strict = pytest.mark.skipif(not choose("auto").strict, reason="no strict sandbox backend here")


@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    audit = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    with Sandbox(workers=2, audit_path=str(audit)) as box:
        box.audit_file = audit
        yield box


# ---- pure parts ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, True, 0, -(10**30), 1.5, float("inf"), 2 + 3j, "é\n",
                                   b"\x00\xff", [1, (2, 3)], {"a": [1], 2: None}, {1, 2},
                                   frozenset({"x"}), ()])
def test_plaindata_roundtrip(value):
    assert plaindata.same(plaindata.loads(plaindata.dumps(value)), value)


def test_plaindata_is_type_strict():
    assert not plaindata.same(True, 1)
    assert not plaindata.same((1, 2), [1, 2])
    assert not plaindata.same(1, 1.0)
    assert plaindata.same(0.1 + 0.2, 0.3)
    assert plaindata.same(float("nan"), float("nan"))

    class Eq:
        def __eq__(self, other):
            return True

    with pytest.raises(plaindata.NotPlainData):
        plaindata.encode(Eq())
    with pytest.raises(plaindata.NotPlainData):
        plaindata.encode(type("MyInt", (int,), {})(3))  # subclasses can override __eq__
    with pytest.raises(plaindata.NotPlainData):
        plaindata.decode(["object", "x"])


def test_count_tests():
    assert count_tests(CHECK) == 1
    assert count_tests("def test_a():\n    pass\ndef test_b():\n    pass\ndef helper():\n    pass\n") == 2


def test_capture_keeps_head_and_tail():
    cap = Capture(head=10, tail=5)
    for _ in range(100):
        cap.add(b"0123456789")
    text = cap.text()
    assert text.startswith("0123456789") and text.endswith("56789")
    assert cap.truncated and cap.total == 1000 and "bytes cut" in text


def test_interpret_rejects_forged_and_missing_reports():
    job = Job.with_tests(ADD, CHECK, "add")
    good = {"status": "ok", "report": 'N {"passed": 1, "failed": 0}\n'}
    assert interpret(job, good, "N", "x").passed
    forged = {"status": "ok", "report": 'N {"passed": 1, "failed": 0}\nX {"passed": 1, "failed": 0}\n'}
    assert not interpret(job, forged, "N", "x").passed
    assert not interpret(job, {"status": "ok", "report": ""}, "N", "x").passed
    wrong_nonce = {"status": "ok", "report": 'M {"passed": 1, "failed": 0}\n'}
    assert not interpret(job, wrong_nonce, "N", "x").passed
    timeout = {"status": "timeout", "report": 'N {"passed": 1, "failed": 0}\n'}
    assert not interpret(job, timeout, "N", "x").passed


def test_choose_names_allowed_backends():
    with pytest.raises(UserError, match="forkserver"):
        choose("docker")


def test_weak_backend_is_refused_unless_allowed():
    caps = detect.Capabilities(platform="darwin", root=False, user_namespaces=False,
                               landlock_abi=0, seccomp=False, bwrap=None)
    backend = choose("auto", caps)
    assert backend.name == "weak" and not backend.strict
    assert any("filesystem" in m for m in backend.missing)
    with pytest.raises(UserError, match="not available"):
        choose("forkserver", caps)


# ---- jobs on the default backend -----------------------------------------------------------

def test_io_job_outputs_are_compared_here(sb):
    r = sb.run(Job.io(ADD, "add", [(1, 2), (2.5, 0.5), ("a", "b"), ([1], [2])]))
    assert r.status == "ok" and r.report_ok
    assert [o["ok"] for o in r.outputs] == [3, 3.0, "ab", [1, 2]]
    assert r.compare([3, 3.0, "ab", [1, 2]]) == 4
    assert r.compare([3, 3, "ab", (1, 2)]) == 2  # type-strict: 3.0 != 3, list != tuple


def test_io_job_reports_errors_per_input(sb):
    prog = "def inv(x):\n    return 1 / x\n"
    r = sb.run(Job.io(prog, "inv", [(2,), (0,)]))
    assert r.outputs[0] == {"ok": 0.5}
    assert "ZeroDivisionError" in r.outputs[1]["error"]
    assert r.compare([0.5, None]) == 1
    missing = sb.run(Job.io(ADD, "sub", [(1, 2)]))
    assert "load" in missing.outputs[0]["error"] and missing.compare([3]) == 0
    syntax = sb.run(Job.io("def add(:", "add", [(1, 2)]))
    assert "SyntaxError" in syntax.outputs[0]["error"]


def test_tests_job_counts_and_failures(sb):
    assert sb.run(Job.with_tests(ADD, CHECK, "add")).passed
    wrong = sb.run(Job.with_tests(ADD.replace("a + b", "a - b"), CHECK, "add"))
    assert not wrong.passed and wrong.report_ok and wrong.tests_failed == 1
    assert "AssertionError" in wrong.failures[0]
    tests = ("def test_one():\n    assert add(1, 1) == 2\n"
             "def test_two():\n    assert add(2, 2) == 5\n")
    r = sb.run(Job.with_tests(ADD, tests, "add"))
    assert (r.tests_total, r.tests_passed, r.tests_failed) == (2, 1, 1) and not r.passed


def test_tests_job_candidate_exceptions_keep_their_type(sb):
    prog = "def parse(s):\n    return int(s)\n"
    tests = ("def check(candidate):\n    try:\n        candidate('x')\n    except ValueError:\n"
             "        pass\n    else:\n        raise AssertionError('no ValueError')\n"
             "    assert candidate('7') == 7\n")
    assert sb.run(Job.with_tests(prog, tests, "parse")).passed


def test_program_job_stdin_stdout_exit(sb):
    prog = "import sys\ndata = sys.stdin.read()\nprint(data.upper(), end='')\nsys.exit(3)\n"
    r = sb.run(Job.run_program(prog, stdin="hello"))
    assert (r.status, r.exit_code, r.stdout) == ("ok", 3, "HELLO")
    crash = sb.run(Job.run_program("raise KeyError('k')"))
    assert crash.exit_code == 1 and "KeyError" in crash.stderr


def test_program_job_sees_only_its_workspace(sb):
    prog = ("import os\nprint(sorted(os.listdir('.')))\nprint(open('data/in.txt').read())\n"
            "open('out.txt', 'w').write('x')\nprint(os.getcwd() != '/')\n")
    r = sb.run(Job.run_program(prog, files={"data/in.txt": "payload"}))
    assert r.exit_code == 0, r.stderr
    assert "['data']" in r.stdout and "payload" in r.stdout


def test_command_job(sb):
    r = sb.run(Job.command(["python3", "-c", "import sys; print(sys.argv[1:])", "a"]))
    assert r.exit_code == 0 and r.stdout.strip() == "['a']"
    r = sb.run(Job.command(["sh", "-c", "echo $HOME; exit 4"]))
    assert r.exit_code == 4


def test_protected_files_are_hash_checked(sb):
    prog = ("import os\nos.chmod('test_x.py', 0o666)\n"
            "open('test_x.py', 'w').write('def test(): pass')\n")
    r = sb.run(Job.run_program(prog, files={"test_x.py": "assert False"}, protected=("test_x.py",)))
    assert r.exit_code != 0  # read-only and not the candidate's: chmod is refused
    prog2 = "import os\nos.rename('test_x.py', 'moved.py')\nopen('test_x.py', 'w').write('')\n"
    r2 = sb.run(Job.run_program(prog2, files={"test_x.py": "assert False"},
                                protected=("test_x.py",)))
    assert r2.exit_code != 0 or r2.tampered


def test_wall_timeout_and_cpu_limit(sb):
    t = time.perf_counter()
    r = sb.run(Job.run_program("while True: pass", limits=Limits(wall_s=0.5)))
    # the wall limit ends it (its CPU limit, 5 s, is far off); the bound only catches a hang
    assert r.status == "timeout" and r.timed_out and time.perf_counter() - t < 30
    # the CPU limit ends it, counted in CPU seconds: on a loaded machine 1 CPU second takes longer
    # than 1 s of wall time, so the wall limit is far away (60 s)
    r = sb.run(Job.run_program("while True: pass", limits=Limits(wall_s=60, cpu_s=1)))
    assert r.status == "killed" and not r.timed_out, r
    assert 0.9 <= r.cpu_s < 3, r.cpu_s


def test_output_is_capped(sb):
    r = sb.run(Job.run_program("import sys\nwhile True: sys.stdout.write('x' * 65536)",
                               limits=Limits(output_kb=4, output_kill_mb=1)))
    assert r.status == "output_limit" and r.truncated and len(r.stdout) < 20_000


def test_memory_limit(sb):
    r = sb.run(Job.run_program("x = bytearray(2 << 30)", limits=Limits(memory_mb=256)))
    assert r.exit_code == 1 and "MemoryError" in r.stderr


def test_map_preserves_order_and_runs_concurrently(sb):
    jobs = [Job.io(ADD, "add", [(i, i)]) for i in range(40)]
    results = sb.map(jobs)
    assert [r.outputs[0]["ok"] for r in results] == [2 * i for i in range(40)]


def test_submit_applies_backpressure():
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    with Sandbox(workers=1, queue_size=1) as box:
        slow = Job.run_program("import time; time.sleep(0.3)")
        box.submit(slow)
        box.submit(slow)  # one running, one queued
        done = threading.Event()

        def third():
            box.submit(slow).result()
            done.set()

        t0 = time.perf_counter()
        threading.Thread(target=third, daemon=True).start()
        assert not done.wait(0.1)  # the queue is full: submit blocks
        # three runs of 0.3 s one after another: never before 0.5 s (the wait only catches a hang)
        assert done.wait(60) and time.perf_counter() - t0 >= 0.5


def test_audit_log_has_one_record_per_execution(sb):
    before = len(read_audit(sb.audit_file))
    sb.run(Job.io(ADD, "add", [(1, 2)], task_id="t-1"))
    records = read_audit(sb.audit_file)
    assert len(records) == before + 1
    rec = records[-1]
    assert rec["task_id"] == "t-1" and rec["backend"] == sb.name and rec["status"] == "ok"
    assert len(rec["code_sha256"]) == 16 and rec["limits"]["wall_s"] == 5.0
    json.dumps(rec)


def test_worker_recovers_after_dying(sb):
    # Kill a worker from outside; the pool restarts it and later jobs run.
    for w in sb._workers:
        w.proc.kill()
    results = sb.map([Job.io(ADD, "add", [(1, 1)]) for _ in range(6)])
    assert sum(r.compare([2]) for r in results) >= 4
    assert all(r.status in ("ok", "error") for r in results)
    assert sb.run(Job.io(ADD, "add", [(1, 1)])).compare([2]) == 1


@strict
def test_bwrap_backend_runs_commands_in_a_fresh_root():
    if choose("auto").caps.bwrap is None or not choose("auto").caps.root:
        pytest.skip("bubblewrap (as root) not available")
    with Sandbox(workers=1, backend="bwrap") as box:
        r = box.run(Job.command(["sh", "-c", "ls /; id -u; cat /etc/hostname"]))
        assert r.exit_code != 0 and "hostname" in r.stderr
        listing = r.stdout.split()
        assert "usr" in listing and "home" not in listing and "srv" not in listing
        assert int(listing[-1]) >= 61000  # the slot's uid, not root
        assert box.run(Job.with_tests(ADD, CHECK, "add")).passed


USERNS_SCRIPT = r'''
import json, os, sys
sys.path[:0] = [REPO, SITE]
from rlvr.sandbox.worker import Worker
from rlvr.sandbox.types import Job, Limits
from rlvr.sandbox.isolate import seccomp_program
w = Worker({"backend": "forkserver-userns", "uid": None, "base": BASE, "bwrap": None,
            "seccomp_bpf": seccomp_program("forkserver-userns").hex()}, os.dup(0), os.dup(1))
out = {"seccomp": bool(w.plan.seccomp_bpf), "landlock": w.plan.landlock_abi}
trusted = json.dumps({"nonce": "n", "tests": ""}).encode()
progs = {
    "whoami": "import os; print(os.getuid(), os.getpid())",
    "net": "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)",
    "read": "print(open('/etc/passwd').read())",
    "write": "open(TMP + '/escape', 'w').write('x')",
    "fork": "import os\nfor _ in range(3): os.fork()\nprint('forked')",
}
for name, prog in progs.items():
    r = w.run(Job.run_program(prog.replace("TMP", repr(TMPDIR)), limits=Limits(wall_s=5)).untrusted_part(),
              bytearray(trusted))
    out[name] = {"exit": r["exit_code"], "stdout": r["stdout"], "stderr": r["stderr"][-300:]}
open(RESULT, "w").write(json.dumps(out))
'''


@strict
def test_user_namespace_backend_as_a_non_root_user():
    """forkserver-userns, exercised by a real unprivileged uid (needs root to switch to it)."""
    import os
    import shutil
    import subprocess
    import sys

    caps = choose("auto").caps
    if not (caps.root and caps.user_namespaces and shutil.which("setpriv")
            and os.path.exists("/usr/bin/python3")):
        pytest.skip("needs root, setpriv, /usr/bin/python3 and user namespaces")
    import pathlib
    import tempfile

    uid = 61990
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="rlvr-userns-"))  # pytest's tmp is mode 700
    request_cleanup = lambda: shutil.rmtree(tmp_path, ignore_errors=True)
    home = tmp_path / "u"
    home.mkdir()
    os.chown(home, uid, uid)
    os.chmod(tmp_path, 0o755)
    # A copy of the sandbox package (and pyseccomp) that the unprivileged user can read: the
    # checkout itself may sit in a private directory (CI clones into a mode-700 mktemp dir).
    import pyseccomp

    repo = tmp_path / "pkg"
    shutil.copytree(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/rlvr",
                    repo / "rlvr", ignore=shutil.ignore_patterns("__pycache__"))
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(pyseccomp.__file__, site)
    for d, _, fs in os.walk(tmp_path):
        os.chmod(d, 0o755)
        for f in fs:
            os.chmod(os.path.join(d, f), 0o644)
    os.chown(home, uid, uid)
    script = USERNS_SCRIPT.replace("REPO", repr(str(repo))).replace(
        "SITE", repr(str(site))).replace(
        "BASE", repr(str(home / "base"))).replace("TMPDIR", repr(str(home))).replace(
        "RESULT", repr(str(home / "result.json")))
    (tmp_path / "s.py").write_text(script)
    os.chmod(tmp_path / "s.py", 0o644)
    probe = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True)
    if probe.stdout.strip() != str(tuple(sys.version_info[:2])):
        pytest.skip("/usr/bin/python3 is another version than the venv's")
    proc = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "/usr/bin/python3", str(tmp_path / "s.py")],
                          capture_output=True, text=True, timeout=60)
    try:
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads((home / "result.json").read_text())
        escaped = (home / "escape").exists()
    finally:
        request_cleanup()
    assert out["seccomp"] and out["landlock"]
    assert out["whoami"]["stdout"].split() == ["0", "1"]  # root of its own namespaces only
    assert out["net"]["exit"] != 0
    assert out["read"]["exit"] != 0 and "root:" not in out["read"]["stdout"]
    assert out["write"]["exit"] != 0 and not escaped
    assert out["fork"]["exit"] == 0


def test_runs_refuse_the_weak_backend_unless_allowed(tmp_path):
    from rlvr.sandbox.config import SandboxConfig, open_sandbox

    with pytest.raises(UserError, match="allow_weak"):
        open_sandbox(SandboxConfig(backend="weak"), tmp_path)
    printed = []
    with open_sandbox(SandboxConfig(backend="weak", allow_weak=True, workers=1), tmp_path,
                      warn=printed.append) as box:
        assert box.name == "weak"
        assert box.run(Job.io(ADD, "add", [(2, 2)])).compare([4]) == 1
        # the weak backend's own defence: no new processes
        assert box.run(Job.run_program("import os; os.fork()")).exit_code == 1
    assert printed and "does not" in printed[0]
    assert (tmp_path / "sandbox_audit.jsonl").exists()


def test_bench_measures_both_sides_and_verifies_every_execution():
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    from rlvr.sandbox.bench import format_report, run_bench, run_fresh_interpreter

    wrong = Job.with_tests(ADD.replace("a + b", "a - b"), CHECK, "add")
    assert not run_fresh_interpreter(wrong).passed  # the baseline verifies too
    assert run_fresh_interpreter(Job.with_tests(ADD, CHECK, "add")).passed
    r = run_bench(n=12, rounds=1, workers=2, kind="io")
    assert [s["verified"] for s in r["sides"]] == [s["execs"] for s in r["sides"]]
    assert r["sides"][0]["pool_ratio"] == 1.0 and len(r["sides"]) >= 2
    assert all(s["execs_per_s"] > 0 and s["p50_ms"] > 0 for s in r["sides"])
    assert "pool is" in format_report(r)


PLANT = '''
import os, py_compile, sys

def plant():
    """Compile victim.py saying X = 2 into the workspace's cache, then put back a source of the
    same size and mtime saying X = 1: a cache that is read loads the planted X = 2."""
    with open("victim.py", "w") as fh:
        fh.write("X = 2\\n")
    stat = os.stat("victim.py")
    py_compile.compile("victim.py", cfile=os.path.join("__pycache__", f"victim.{sys.implementation.cache_tag}.pyc"))
    with open("victim.py", "w") as fh:
        fh.write("X = 1\\n")
    os.utime("victim.py", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    sys.path.insert(0, os.getcwd())
    import victim, csv
    return [victim.X, victim.__cached__, csv.__cached__]
'''


def test_a_planted_pyc_is_never_loaded_while_installed_modules_read_their_caches(sb, tmp_path):
    from rlvr.sandbox.worker import NO_PYCACHE

    r = sb.run(Job.io(PLANT, "plant", [()]))
    assert r.status == "ok", r
    x, victim_cache, csv_cache = r.outputs[0]["ok"]
    assert x == 1 and victim_cache.startswith(NO_PYCACHE)
    # the standard library's own cache, the host's: reading it is what makes numpy cost 0.1 s, not 0.45
    assert "/__pycache__/csv." in csv_cache and not csv_cache.startswith(NO_PYCACHE)
    # the control: an ordinary interpreter loads the planted bytecode, so the check above can fail
    import subprocess
    import sys

    (tmp_path / "plant.py").write_text(PLANT + "\nprint(plant()[0])\n")
    control = subprocess.run([sys.executable, "plant.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert control.stdout.strip() == "2", control.stderr
