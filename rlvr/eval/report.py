"""The eval report: ``evaluate``'s output under a header naming what was measured, as JSON.

One function builds it for every caller: ``rlvr eval`` (``rlvr.cli.cmd_eval``), the periodic and
final evals of a GRPO run (``rlvr.train.grpo.eval_report``) and the quickstart's stage evals
(``rlvr.train.quickstart``). Key order of the header: ``model``, ``suite``, ``fingerprint``,
``settings``; then ``evaluate``'s keys (``overall``, ``by_domain``, ...). ``rlvr eval compare``
and ``rlvr report`` read it back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlvr.atomic import write_text_atomic
from rlvr.eval.evaluate import EvalConfig, evaluate
from rlvr.eval.suites import fingerprint
from rlvr.types import Task

SETTINGS = ("samples", "temperature", "max_new_tokens", "k", "precision")
"""The ``EvalConfig`` fields a report's ``settings`` keeps (``rlvr eval compare`` checks them)."""


def eval_report(model, tokenizer, tasks: list[Task], cfg: EvalConfig, *, seed: int, model_name: str | None,
                suite: dict[str, Any] | None = None, settings: bool = False, path: Path | None = None) -> dict:
    """``evaluate(model, tokenizer, tasks, cfg, seed=seed)`` under the header ``{"model":
    model_name, "suite": suite (when given), "fingerprint": fingerprint(tasks), "settings": cfg's
    SETTINGS (when ``settings``)}``; ``model_name`` None: no header, ``evaluate``'s output alone
    (the quickstart's stage evals). Written to ``path`` (``json.dumps(indent=2)``, parent
    directories made) when given; returned either way."""
    head: dict[str, Any] = {}
    if model_name is not None:
        head = {"model": model_name, **({"suite": suite} if suite is not None else {}),
                "fingerprint": fingerprint(tasks),
                **({"settings": {k: getattr(cfg, k) for k in SETTINGS}} if settings else {})}
    report = {**head, **evaluate(model, tokenizer, tasks, cfg, seed=seed)}
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(report, indent=2))
    return report
