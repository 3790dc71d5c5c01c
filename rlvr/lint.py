"""A light process score for model-written Python: how clean ruff finds the program.

    lint_score = 0                      if the program is blank or does not parse (ast.parse)
               = 1 / (1 + violations)   otherwise (1.0 clean, 0.5 for one violation, 0.33 for two, ...)

``violations`` counts ruff diagnostics of the fixed rule set ``RULES``: pyflakes (F: unused
imports and variables, undefined names, ...), pycodestyle errors and warnings (E, W: statement
layout, trailing whitespace, long lines, ...) and bugbear (B: likely bugs such as mutable default
arguments). Ruff's own defaults are ignored (``--isolated``): the score does not depend on the
project's ruff configuration.

Nothing is executed: ``ast.parse`` and ruff only parse the source. ``lint_scores`` runs ruff once
for a whole batch (programs written to a temporary directory, identical programs linted once).
If ruff is missing, times out or fails, every program of the batch scores 0 and a warning is
logged once per process: a lint failure never stops training.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

RULES = ("E", "F", "W", "B")
"""Ruff rule families counted as violations (ruff's stable rules only, no preview)."""
TIMEOUT_S = 10.0
"""Wall-clock limit of one ruff call (a batch of 128 programs takes well under a second)."""
RUFF = [sys.executable, "-m", "ruff"]
"""How ruff is started (the ``ruff`` package is a dependency of rlvr)."""

_RULE_CODE = re.compile(r"^[A-Z]+[0-9]+$")  # syntax errors come without a rule code
_log = logging.getLogger(__name__)
_warned = False


def lint_scores(programs: Sequence[str]) -> list[float]:
    """Lint score in [0, 1] of each program (see the module docstring); one ruff call per batch."""
    unique = list(dict.fromkeys(programs))
    scores = {p: 0.0 for p in unique}
    to_lint = [p for p in unique if p.strip() and _parses(p)]
    if to_lint:
        counts = _ruff_violations(to_lint)
        if counts is not None:
            scores.update({p: 1.0 / (1.0 + counts[p]) for p in to_lint})
    return [scores[p] for p in programs]


def _parses(program: str) -> bool:
    """True when ``program`` is valid Python for this interpreter (parsed only, never compiled to code)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for e.g. invalid escape sequences
            ast.parse(program)
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        return False
    return True


def _ruff_violations(programs: list[str]) -> dict[str, int] | None:
    """Violations of ``RULES`` per program from one ruff run, or None if ruff failed."""
    with tempfile.TemporaryDirectory(prefix="rlvr-lint-") as tmp:
        files = {}
        for program in programs:
            name = hashlib.sha256(program.encode()).hexdigest()[:24] + ".py"
            text = program if program.endswith("\n") else program + "\n"  # no W292 for our own cut
            Path(tmp, name).write_text(text, encoding="utf-8")
            files[name] = program
        cmd = [*RUFF, "check", "--output-format", "json", "--no-cache", "--isolated", "--exit-zero",
               "--select", ",".join(RULES), "--target-version", f"py3{sys.version_info.minor}", "."]
        try:
            proc = subprocess.run(cmd, check=False, cwd=tmp, capture_output=True, text=True, timeout=TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"exit status {proc.returncode}: {proc.stderr.strip()[-300:]}")
            diagnostics = json.loads(proc.stdout or "[]")
            counts = dict.fromkeys(programs, 0)
            for d in diagnostics:
                if _RULE_CODE.match(str(d.get("code") or "")):
                    counts[files[Path(d["filename"]).name]] += 1
        except Exception as e:  # noqa: BLE001 - missing ruff, timeout, unexpected output: score 0, keep training
            _warn_once(f"ruff lint failed ({type(e).__name__}: {e}); the process reward term is 0 "
                       f"for this batch (this warning is shown once)")
            return None
    return counts


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        _log.warning(message)
