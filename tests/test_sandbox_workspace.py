"""Workspace: snapshot/restore against whatever sandboxed code may leave behind."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from rlvr.sandbox.workspace import Workspace

FILES = {
    "README.md": "# demo\n",
    "src/app.py": "def add(a, b):\n    return a + b\n",
    "src/util/helpers.py": "X = 1\n" * 50,
    "tests/test_app.py": "from src.app import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "data.bin": bytes(range(256)),
}
ROOT = os.geteuid() == 0


def tree(root: str) -> dict[str, tuple]:
    """Everything under ``root``: type, mode, owner and content hash; no symlink followed."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel, st = os.path.relpath(path, root), os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, digest)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(path))
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode))
    out["."] = ("dir", stat.S_IMODE(os.lstat(root).st_mode))
    return out


@pytest.fixture
def ws(tmp_path):
    with Workspace.create(FILES) as w:
        yield w


def p(ws: Workspace, rel: str) -> str:
    return os.path.join(ws.path, rel)


# ---- basics --------------------------------------------------------------------------------

def test_create_layout_and_modes(tmp_path):
    with Workspace.create(FILES) as ws:
        assert ws.path.startswith("/dev/shm/rlvr-sandbox/ws/") or not os.path.isdir("/dev/shm")
        assert ws.list() == sorted(FILES)
        assert ws.read("src/app.py") == FILES["src/app.py"]
        assert ws.read_bytes("data.bin") == FILES["data.bin"]
        t = tree(ws.path)
        assert t["."][1] == 0o1777 and t["src"][1] == 0o1777 and t["src/util"][1] == 0o1777
        assert t["src/app.py"][1] == 0o644 and t["src/app.py"][2] == os.geteuid()
        assert ws.diff() == {"added": [], "modified": [], "deleted": []}
        assert ws.restore() == 0
        path = ws.path
    assert not os.path.exists(path)
    with pytest.raises(ValueError, match="closed"):
        ws.restore()
    with Workspace.create({"a.py": "x"}, root=str(tmp_path), writable=True) as w2:
        assert os.path.dirname(w2.path) == str(tmp_path)
        assert stat.S_IMODE(os.stat(p(w2, "a.py")).st_mode) == 0o666


def test_create_refuses_bad_layouts():
    with pytest.raises(ValueError):
        Workspace.create({"a": "x", "a/b": "y"})
    with pytest.raises(ValueError):
        Workspace.create({"../evil": "x"})


@pytest.mark.parametrize("rel", ["../x", "/etc/x", "a/../../x", "src/../../x", "", "a//b",
                                 "./a", "a/./b", "x\0y"])
def test_path_escape_refused(ws, rel):
    with pytest.raises(ValueError):
        ws.write(rel, "pwned")
    with pytest.raises(ValueError):
        ws.read(rel)
    with pytest.raises(ValueError):
        ws.delete(rel)
    assert not os.path.exists(os.path.join(os.path.dirname(ws.path), "x"))


# ---- restore ---------------------------------------------------------------------------------

def test_restore_after_modify_add_delete(ws):
    before = tree(ws.path)
    ws.write("src/app.py", "broken")
    ws.write("new/deep/file.py", "new")
    ws.delete("README.md")
    ws.delete("src/util")
    assert ws.diff() == {"added": ["new/deep/file.py"], "modified": ["src/app.py"],
                         "deleted": ["README.md", "src/util/helpers.py"]}
    assert ws.restore() == 5  # src/app.py, new/, README.md, src/util/, src/util/helpers.py
    assert tree(ws.path) == before
    assert ws.diff() == {"added": [], "modified": [], "deleted": []}
    assert ws.restore() == 0


def test_restore_forged_same_size_edit(ws):
    """Edited in place, same size, atime/mtime put back with utime: only ctime tells."""
    before = tree(ws.path)
    path = p(ws, "src/app.py")
    st = os.stat(path)
    fd = os.open(path, os.O_WRONLY)
    os.write(fd, b"DEF")  # overwrite the first bytes, no truncate
    os.close(fd)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns,
                                                                st.st_ino)
    assert ws.diff()["modified"] == ["src/app.py"]
    assert ws.restore() == 1
    assert tree(ws.path) == before
    # utime alone (same bytes) is not a modification, but restore still rewrites it to be safe
    os.utime(path, ns=(1, 1))
    assert ws.diff()["modified"] == []
    ws.restore()
    assert tree(ws.path) == before


def test_restore_modes_and_dirs(ws):
    before = tree(ws.path)
    os.chmod(p(ws, "src/app.py"), 0o4777)  # setuid + world-writable
    os.chmod(p(ws, "src/util"), 0)
    os.chmod(p(ws, "tests"), 0o755)
    os.makedirs(p(ws, "junk/a/b/c"))
    with open(p(ws, "junk/a/b/c/f"), "w") as f:
        f.write("x")
    os.chmod(p(ws, "junk/a/b"), 0)
    os.chmod(p(ws, "junk"), 0)
    assert ws.diff() == {"added": ["junk/a/b/c/f"], "modified": ["src/app.py"], "deleted": []}
    ws.restore()
    assert tree(ws.path) == before
    os.chmod(p(ws, "src/app.py"), 0o6755)  # snapshotted without its setuid/setgid bits
    ws.snapshot()
    ws.restore()
    assert stat.S_IMODE(os.stat(p(ws, "src/app.py")).st_mode) == 0o755


def test_restore_type_swaps_symlinks_and_fifos(ws, tmp_path):
    host = tmp_path / "host.txt"
    host.write_text("host secret\n")
    before = tree(ws.path)
    os.unlink(p(ws, "src/app.py"))
    os.symlink(str(host), p(ws, "src/app.py"))  # file -> symlink to a host file
    os.symlink("/etc", p(ws, "etc"))  # extra symlink to a host dir
    os.mkfifo(p(ws, "fifo"))  # extra fifo (opening it would block)
    os.unlink(p(ws, "README.md"))
    os.mkfifo(p(ws, "README.md"))  # file -> fifo
    os.unlink(p(ws, "data.bin"))
    os.makedirs(p(ws, "data.bin/inner"))  # file -> directory
    os.rename(p(ws, "src/util"), p(ws, "moved"))
    with open(p(ws, "src/util"), "w") as f:  # directory -> file
        f.write("not a dir")
    os.symlink(str(tmp_path), p(ws, "tests/link"))
    diff = ws.diff()
    assert diff["modified"] == ["README.md", "src/app.py"]
    assert set(diff["added"]) == {"etc", "fifo", "moved/helpers.py", "src/util", "tests/link"}
    assert diff["deleted"] == ["data.bin", "src/util/helpers.py"]
    ws.restore()
    assert tree(ws.path) == before
    assert host.read_text() == "host secret\n" and os.path.isdir("/etc")
    assert sorted(os.listdir(tmp_path)) == ["host.txt"]


def test_symlink_planting_never_followed(ws, tmp_path):
    """The sandbox replaced files/dirs by symlinks to host paths; trusted calls (root) must not
    write, read or delete through them, and restore fixes the workspace."""
    host = tmp_path / "host.txt"
    host.write_text("host secret\n")
    host_dir = tmp_path / "hostdir"
    host_dir.mkdir()
    (host_dir / "helpers.py").write_text("host file\n")
    before = tree(ws.path)

    os.unlink(p(ws, "src/app.py"))
    os.symlink(str(host), p(ws, "src/app.py"))
    with pytest.raises(OSError):
        ws.read("src/app.py")
    ws.write("src/app.py", "trusted write")
    assert host.read_text() == "host secret\n"
    assert not os.path.islink(p(ws, "src/app.py"))
    assert ws.read("src/app.py") == "trusted write"

    os.rename(p(ws, "src/util"), p(ws, "gone"))
    os.symlink(str(host_dir), p(ws, "src/util"))  # a parent directory -> symlink
    with pytest.raises(NotADirectoryError):
        ws.write("src/util/helpers.py", "pwned")
    with pytest.raises(NotADirectoryError):
        ws.write("src/util/new.py", "pwned")
    with pytest.raises(NotADirectoryError):
        ws.read("src/util/helpers.py")
    with pytest.raises(NotADirectoryError):
        ws.delete("src/util/helpers.py")
    assert sorted(os.listdir(host_dir)) == ["helpers.py"]
    assert (host_dir / "helpers.py").read_text() == "host file\n"

    os.symlink(str(host), p(ws, "hostlink"))
    ws.delete("hostlink")  # removes the link only
    assert host.exists()

    ws.restore()
    assert tree(ws.path) == before
    assert host.read_text() == "host secret\n"
    assert (host_dir / "helpers.py").read_text() == "host file\n"


def test_write_replaces_hardlinked_file(ws, tmp_path):
    outside = os.path.join(os.path.dirname(ws.path), "outside-" + os.path.basename(ws.path))
    os.link(p(ws, "README.md"), outside)  # a second name for the file, outside the workspace
    try:
        ws.write("README.md", "new")
        with open(outside) as f:
            assert f.read() == FILES["README.md"]
    finally:
        os.unlink(outside)


def test_racy_files_get_a_content_check(ws):
    """Without multigrain timestamps, files changed near a manifest are content-checked."""
    ws._racy_ns = 10**18  # treat every file as racy
    ws.restore()
    assert ws._racy and ws.restore() == 0  # racy but intact: kept
    before = tree(ws.path)
    ws.write("src/app.py", "x" * len(FILES["src/app.py"]))
    assert ws.restore() == 1
    assert tree(ws.path) == before


def test_deep_tree_removed(ws):
    """Deeper than PATH_MAX and the fd limit: restore and close still remove it."""
    before = tree(ws.path)
    fd = os.open(ws.path, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):
        os.mkdir("dddd", dir_fd=fd)
        sub = os.open("dddd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    with pytest.raises(ValueError, match="deeper"):
        ws.list()
    ws.restore()
    assert tree(ws.path) == before


# ---- snapshot / diff -------------------------------------------------------------------------

def test_snapshot_moves_the_baseline(ws):
    ws.write("src/app.py", "v2")
    ws.write("extra/new.py", "new", mode=0o600)
    ws.delete("README.md")
    os.symlink("/etc/passwd", p(ws, "link"))
    ws.snapshot()
    assert ws.diff() == {"added": ["link"], "modified": [], "deleted": []}  # never snapshotted
    baseline = tree(ws.path)
    del baseline["link"]
    ws.write("src/app.py", "v3")
    ws.write("README.md", "back")
    ws.delete("extra")
    ws.restore()
    assert tree(ws.path) == baseline
    assert ws.read("src/app.py") == "v2" and ws.read("extra/new.py") == "new"
    # an in-place, same-size, utime-forged edit between snapshots is re-read, not reused
    path = p(ws, "src/util/helpers.py")
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b"Y")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    ws.snapshot()
    ws.write("src/util/helpers.py", "other")
    ws.restore()
    assert ws.read("src/util/helpers.py") == "Y" + FILES["src/util/helpers.py"][1:]


def test_diff_contents_not_timestamps(ws):
    os.utime(p(ws, "README.md"), ns=(0, 0))
    ws.write("src/app.py", FILES["src/app.py"])  # same bytes again
    assert ws.diff() == {"added": [], "modified": [], "deleted": []}
    os.chmod(p(ws, "README.md"), 0o600)
    ws.write("new.txt", "n")
    ws.delete("tests/test_app.py")
    assert ws.diff() == {"added": ["new.txt"], "modified": ["README.md"],
                         "deleted": ["tests/test_app.py"]}


@pytest.mark.skipif(not ROOT, reason="owners are restored only as root")
def test_owner_restored(ws):
    os.chown(p(ws, "src/app.py"), 61999, 61999)
    ws.snapshot()
    baseline = tree(ws.path)
    ws.write("src/app.py", "changed")
    os.unlink(p(ws, "src/app.py"))
    ws.restore()
    assert tree(ws.path) == baseline
    assert os.stat(p(ws, "src/app.py")).st_uid == 61999


# ---- with the real sandbox -------------------------------------------------------------------

STEP = "for n in ('own.py', 'own2.py'):\n    open(n, 'w').write('mine = 1\\n')\n"  # sandbox-owned

ATTACK = r'''
import os
open("src/app.py", "r+").write("HACKED")              # in place (files are 0o666)
st = os.stat("own.py")
with open("own.py", "r+b") as f:
    f.write(b"M")                                      # same size ...
os.utime("own.py", ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and mtime forged (its owner)
open("new.py", "w").write("new")
os.makedirs("junk/a/b")
open("junk/a/b/f", "w").write("x")
os.symlink("/etc/passwd", "passwd")
os.symlink("/etc", "src/etc")
os.mkfifo("fifo")
os.chmod("junk/a", 0)
os.chmod("junk", 0)
os.chmod("own2.py", 0o4700)                            # setuid, on its own file
for victim in ("README.md", "src/util"):
    try:
        os.rename(victim, victim + ".bak")             # sticky dirs: refused
    except OSError as e:
        print("refused", victim, e.errno)
try:
    os.utime("README.md", ns=(0, 0))                   # not its file: refused
except OSError as e:
    print("refused utime", e.errno)
print("done")
'''


@pytest.fixture(scope="module")
def sandbox():
    from rlvr.sandbox import Sandbox, choose

    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    with Sandbox(workers=1) as sb:
        yield sb


def test_end_to_end_with_sandbox(sandbox):
    from rlvr.sandbox import Job

    with Workspace.create(FILES, writable=True) as ws:
        r = sandbox.run(Job.run_program(STEP, workdir=ws.path))
        assert r.status == "ok" and r.exit_code == 0, r.stderr
        assert ws.diff()["added"] == ["own.py", "own2.py"]
        ws.snapshot()
        before = tree(ws.path)
        assert before["own.py"][2] != os.geteuid() or not ROOT  # the sandbox's uid
        with open("/etc/passwd", "rb") as f:
            passwd = f.read()
        r = sandbox.run(Job.run_program(ATTACK, workdir=ws.path))
        assert r.status == "ok" and r.exit_code == 0, (r.stdout, r.stderr)
        assert "done" in r.stdout and r.stdout.count("refused") == 3
        assert tree(ws.path) != before
        diff = ws.diff()
        assert diff["modified"] == ["own.py", "own2.py", "src/app.py"]
        assert set(diff["added"]) == {"new.py", "junk/a/b/f", "passwd", "src/etc", "fifo"}
        assert ws.restore() > 0
        assert tree(ws.path) == before  # byte for byte, modes and owners too
        with open("/etc/passwd", "rb") as f:
            assert f.read() == passwd
        # and the sandbox sees the restored files in the next run
        r = sandbox.run(Job.run_program("print(open('src/app.py').read(), end='')",
                                        workdir=ws.path))
        assert r.stdout == FILES["src/app.py"]


def test_sandbox_cannot_edit_readonly_workspace(sandbox):
    from rlvr.sandbox import Job

    with Workspace.create(FILES) as ws:  # files 0o644, owned by the trusted user
        prog = ("try:\n    open('src/app.py', 'w').write('x')\nexcept PermissionError:\n"
                "    print('denied')\nopen('mine.txt', 'w').write('ok')\n")
        r = sandbox.run(Job.run_program(prog, workdir=ws.path))
        assert r.stdout.strip() == "denied", r.stderr
        assert ws.read("src/app.py") == FILES["src/app.py"]
        assert ws.diff()["added"] == ["mine.txt"]
        ws.restore()
        assert ws.list() == sorted(FILES)


def test_readonly_file_in_writable_workspace(sandbox):
    from rlvr.sandbox import Job

    with Workspace.create(FILES, writable=True) as ws:
        ws.write("tests/test_app.py", FILES["tests/test_app.py"], mode=0o444)
        ws.snapshot()
        prog = ("import os\nfor op in (lambda: open('tests/test_app.py', 'w'),\n"
                "           lambda: os.unlink('tests/test_app.py'),\n"
                "           lambda: os.chmod('tests/test_app.py', 0o666)):\n"
                "    try:\n        op()\n    except PermissionError:\n        print('denied')\n"
                "open('src/app.py', 'w').write('edited')\n")
        r = sandbox.run(Job.run_program(prog, workdir=ws.path,
                                        protected=("tests/test_app.py",)))
        assert r.stdout.split() == ["denied"] * 3 and not r.tampered, r.stderr
        assert ws.diff() == {"added": [], "modified": ["src/app.py"], "deleted": []}


def test_garbage_collected_workspace_is_removed():
    import gc

    ws = Workspace.create({"a.py": "x"})
    path = ws.path
    del ws
    gc.collect()
    assert not os.path.exists(path)
