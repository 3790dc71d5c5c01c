"""``repo.fix``: fix an injected bug in a real repository at a commit (SWE-style), judged by hidden tests.

The repositories are vendored (``repo_data/``: inflection 0.5.1, MIT; toolz 1.0.0, BSD; see each
``SOURCE.md``); ``bugs.json`` lists per repository its visible test command and, per bug, the file,
the correct line (``good``) and the injected one (``bad``), a call that shows it, an issue text, the
split it belongs to (chosen by hand: every repository has bugs in both), and the hidden tests:
``(setup, expression, expected)`` with the expected values computed from the unmodified code and
kept plain-data encoded. A task is the repository at the bug's commit (``rlvr.tasks.repos``), run in
the ``repo.fix`` environment.

Levels: 1 names the function and file and shows a call with what it should return; 2 gives only
the issue text. The scripted expert patches the injected line back and submits. The set is fixed
(``count(split)`` tasks a split; ``generate_tasks`` asked for more says how many exist).
"""

from __future__ import annotations

import random

from rlvr.sandbox import plaindata
from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.tasks.code_repair import OK, transcript
from rlvr.tasks.repos import bugs, vendored
from rlvr.tool_calls import format_call
from rlvr.types import Spec

NAME = "repo.fix"


def problems() -> list[tuple[str, dict]]:
    return [(repo, bug) for repo, spec in sorted(bugs().items()) for bug in spec["bugs"]]


class RepoFixDomain(Domain):
    name = NAME
    levels = (1, 2)
    needs_sandbox = True
    env = NAME

    def count(self, split: str) -> int:
        """How many distinct tasks ``split`` holds: a fixed set (one per bug of the split and level)."""
        return len(self.levels) * sum(bug["split"] == split for _, bug in problems())

    def in_split(self, problem: Problem, split: str) -> bool:
        return problem.spec.payload["split"] == split  # chosen per bug in bugs.json

    def sample(self, level: int, rng: random.Random) -> Problem:
        repo, bug = rng.choice(problems())
        spec = bugs()[repo]
        _, commits = vendored(repo)
        commit = commits[bug["id"]]
        hidden = [(setup, expr) for setup, expr, _ in bug["hidden"]]
        expected = [plaindata.decode(want) for *_, want in bug["hidden"]]
        shown_setup, shown_expr = bug["shown"]  # one of the hidden cases (bugs.json is checked by the tests)
        shown_want = expected[[e for _, e in hidden].index(shown_expr)]
        command = " ".join(spec["test_cmd"])
        if level == 1:
            what = (f"In {bug['file']}, {bug['function']} is wrong: after `{shown_setup}`, `{shown_expr}` should "
                    f"return {shown_want!r} and does not.")
        else:
            what = bug["issue"]
        prompt = (f"Repository {repo} at commit {commit[:12]}. {what} The tests run with `{command}`. "
                  "Fix the bug with the file tools, then submit.")
        payload = {"repo": f"vendored:{repo}", "commit": commit, "test_cmd": list(spec["test_cmd"]),
                   "hidden": plaindata.encode(hidden), "expected": plaindata.encode(expected),
                   "split": bug["split"], "protected": []}
        turns = [(format_call("replace", {"path": bug["file"], "old": bug["bad"], "new": bug["good"]}), OK),
                 (format_call("submit"), None)]
        return Problem(key=f"{repo}:{bug['id']}/L{level}", prompt=prompt, spec=Spec(NAME, payload),
                       reference=transcript(prompt, turns), actions=tuple(a for a, _ in turns))

    def corpus_text(self, problem: Problem, rng: random.Random) -> str:
        return problem.reference


DOMAINS.register(NAME)(RepoFixDomain())
