"""``repo.fix``: a git repository at a commit as the workspace (SWE-style), judged by hidden tests.

The task's payload names the repository (``repo``: ``vendored:<name>`` or a git directory), the
``commit``, an optional ``build`` command (run once over the checkout, in the sandbox), an optional
``image`` (``rlvr.images``: the repository's dependencies), the visible ``test_cmd`` and the hidden tests (``hidden``: ``(setup, expression)`` pairs,
``expected``: their plain-data values). The tools are ``code.repair``'s (``list_files``,
``read_file``, ``write_file``, ``replace``, ``run_tests``, ``submit``), under the same grants.

The workspace is an overlay (``rlvr.sandbox.overlay``) over the commit's read-only tree
(``rlvr.tasks.repos.checkout``), created once per task and put back at every later reset of the
same task without copying the tree; without root it is a ``Workspace`` holding the tree. The
visible tests are the repository's own (``run_tests`` runs ``test_cmd`` as a sandbox command and
reports its summary line): editing, deleting or shadowing them, a ``conftest.py`` or anything else
in the workspace changes only what ``run_tests`` says. The reward is the hidden tests, which never
enter the workspace or the sandbox's files: at verify time one sandbox ``io`` job imports the
repository from the final workspace and evaluates each expression; the values come back as plain
data and are compared here, type-strictly, with expected values the sandbox never saw. Score 1 if
every hidden test passes, else 0; reasons as ``code.repair``'s.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlvr.envs.base import ENVS
from rlvr.envs.code_repair import HIDDEN_WALL_S, MAX_TESTS_OUTPUT, CodeRepairEnv, hidden_limits
from rlvr.envs.grants import Grant
from rlvr.tasks.repos import checkout, vendored
from rlvr.sandbox import plaindata
from rlvr.types import Verdict

SHIM = '''import sys
sys.dont_write_bytecode = True

def run(setup, expression):
    namespace = {"__name__": "rlvr_hidden_test"}
    exec(setup, namespace)
    return eval(expression, namespace)
'''
TIMING = re.compile(r" in [0-9.]+s")
# run_tests: installed packages (pytest) load their byte code (a cache the run could plant in the
# workspace fools only this observation, never the hidden tests), and pytest loads only the plugins
# the test command names, not every one installed on the host (2.2 s -> 0.3 s a run here).
TEST_ENV = {"PYTHONPYCACHEPREFIX": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def tree_of(payload: dict[str, Any]) -> Path:
    """The read-only checkout of the task's repository at its commit (after its ``build`` step)."""
    repo = payload["repo"]
    git_dir = vendored(repo.split(":", 1)[1])[0] if repo.startswith("vendored:") else Path(repo)
    image = ""
    if payload.get("image"):
        from rlvr.images.cache import resolve

        image = str(resolve(payload["image"]).path)
    return checkout(git_dir, payload["commit"], payload.get("build"), image)


@ENVS.register("repo.fix")
class RepoFixEnv(CodeRepairEnv):
    name = "repo.fix"
    # a repository's files are longer and more than a code.repair project's
    grants = {**CodeRepairEnv.grants,
              "list_files": Grant(read=("*",), wall_s=2.0, memory_mb=512, output_kb=16),
              "read_file": Grant(read=("*",), wall_s=2.0, memory_mb=512, output_kb=64),
              # a repository's tests may write (pytest's temporary files): the workspace is the episode's own
              "run_tests": Grant(read=("*",), write=("*",), wall_s=20.0, memory_mb=1024, output_kb=16)}
    file_limits = {"max_chars": 200_000, "max_files": 2_000}

    @staticmethod
    def _create(payload: dict[str, Any]):
        from rlvr.sandbox import overlay
        from rlvr.sandbox.workspace import Workspace

        tree = tree_of(payload)
        if overlay.available():
            return overlay.OverlayWorkspace([tree])
        files = {str(p.relative_to(tree)): p.read_text() for p in sorted(tree.rglob("*")) if p.is_file()}
        ws = Workspace.create(files, writable=True)
        ws.snapshot()
        return ws

    def _run_tests(self) -> str:
        from rlvr.sandbox.types import Job

        job = Job.command(self._payload["test_cmd"], workdir=self._ws.path, limits=self.grants["run_tests"].limits(),
                          task_id=self.task.id, image=self._image(), env=TEST_ENV)
        r = self._sandbox().run(job)
        if r.status == "timeout":
            return "error: the tests timed out"
        if r.status not in ("ok",):
            return f"error: the tests did not finish ({r.status})"
        lines = [line for line in r.stdout.strip().splitlines() if line.strip()]
        summary = TIMING.sub("", lines[-1]) if lines else (r.stderr.strip().splitlines() or ["no output"])[-1]
        return summary[-MAX_TESTS_OUTPUT:]

    def _image(self) -> str:
        name = self._payload.get("image")
        if not name:
            return ""
        from rlvr.images.cache import resolve

        return str(resolve(name).path)

    def _verify(self) -> Verdict:
        from rlvr.sandbox.types import Job
        from rlvr.verifiers.code import io_verdict

        hidden = [tuple(h) for h in plaindata.decode(self._payload["hidden"])]
        expected = plaindata.decode(self._payload["expected"])
        job = Job.io(SHIM, "run", hidden, workdir=self._ws.path, limits=hidden_limits(HIDDEN_WALL_S),
                     task_id=self.task.id, image=self._image())
        v = io_verdict(expected, {})(self._sandbox().run(job))
        return Verdict(v.passed, 1.0 if v.passed else 0.0, v.reason, {**v.details, "fraction": v.score})
