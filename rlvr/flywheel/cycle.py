"""``rlvr flywheel cycle`` and ``rollback``: one turn of the loop, recorded so it can be audited and undone.

A cycle, in ``DIR/cycles/NNNN/``:

1. **served**: ask the server which weights it serves (``/v1/models``: ``root``, ``version``);
   recorded in ``cycle.json``, they are the cycle's baseline and its starting point.
2. **harvest** the captured traffic into ``harvest/`` (``rlvr.flywheel.harvest``); fewer than
   ``min_tasks`` training tasks ends the cycle, refused.
3. **train**: GRPO from the served weights on ``harvest/train.jsonl`` (``train``: any GRPO config
   keys, e.g. ``steps``, ``optim``, ``lora`` with ``save: merged``), in ``train/``, checkpointed; a
   cycle killed here resumes from its newest checkpoint when the command runs again.
4. **evaluate** the served weights and the candidate on the acceptance suite (the user's
   ``eval_files`` + the harvest's held-out split) and on the regression suite (a built-in or
   YAML suite, ``regression_suite``), with the same decoding (``eval``): ``eval/*.json``.
5. **gate** (``rlvr.eval.gate``): the acceptance suite's overall ``metric`` must rise by at least
   ``gate.margin`` points, and no domain of either suite may drop by more than
   ``gate.tolerance``. A failed gate names each failing rule.
6. **push** the candidate to the server (``/v1/weights``) when the gate passed and the server
   still serves the baseline (else refused: someone else changed it mid-cycle); a cycle cut right
   after its push finds the server serving its candidate and records the push.
7. **record**: ``result.json`` and a line of ``DIR/history.jsonl`` (inputs, model paths and
   versions, scores, gate, pushed or why not).

Running the command again resumes the newest cycle that has no ``result.json``; otherwise it
starts the next. ``rollback`` puts back the weights served before the newest pushed cycle that
is not rolled back yet (the server must still serve that cycle's weights), and records it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.atomic import write_text_atomic
from rlvr.config import check_range, from_dict, resolve_device
from rlvr.errors import ConfigError, UserError
from rlvr.flywheel.harvest import HarvestConfig, harvest, load_criteria
from rlvr.flywheel.server import push_weights, served
from rlvr.serve.capture import utc_now
from rlvr.tasks.rows import TaskFileConfig, as_file_config

RESULT, STATE, HISTORY = "result.json", "cycle.json", "history.jsonl"


@dataclass
class GateConfig:
    margin: float = 2.0
    """Points the acceptance suite's overall metric must rise by."""
    tolerance: float = 2.0
    """Points any domain of either suite may drop."""
    metric: str = "pass@1"


@dataclass
class FlywheelConfig:
    """One flywheel: where its traffic, criteria and cycles are, which server it feeds, its gate."""

    server: str = "http://127.0.0.1:8000"
    """The running rlvr serve."""
    admin_token: str = ""
    """The server's admin token (default: env RLVR_ADMIN_TOKEN)."""
    api_key: str = ""
    """The server's API key, if it has one (default: env RLVR_API_KEY)."""
    traffic: str = ""
    """The server's capture directory (rlvr serve --capture DIR)."""
    criteria: str = ""
    """The criteria YAML file (rlvr.flywheel.harvest)."""
    dir: str = "runs/flywheel"
    """Cycles and history."""
    eval_files: list[TaskFileConfig | str] = field(default_factory=list)
    """The user's held-out task files: the acceptance suite, with the harvest's held-out split."""
    regression_suite: str = "default"
    """A built-in suite name or a suite YAML file the candidate must not regress on; empty: none."""
    regression_tasks: int = 200
    """Most tasks drawn from the regression suite."""
    held_out: float = 0.2
    near_dup: float = 0.8
    min_tasks: int = 8
    """Fewer harvested training tasks than this: the cycle is refused before training."""
    seed: int = 0
    gate: GateConfig = field(default_factory=GateConfig)
    train: dict[str, Any] = field(default_factory=dict)
    """GRPO config keys over the defaults (model, out, domains and task_files are the cycle's)."""
    eval: dict[str, Any] = field(default_factory=dict)
    """Decoding keys of both evaluations: samples, temperature, k, max_new_tokens, batch_size, device, precision."""

    def __post_init__(self) -> None:
        self.admin_token = self.admin_token or os.environ.get("RLVR_ADMIN_TOKEN", "")
        self.api_key = self.api_key or os.environ.get("RLVR_API_KEY", "")
        self.eval_files = [as_file_config(f) for f in self.eval_files]
        for key in ("traffic", "criteria"):
            if not getattr(self, key):
                raise ConfigError(f"flywheel needs '{key}' (--{key})")
        check_range("min_tasks", self.min_tasks, 1)
        check_range("regression_tasks", self.regression_tasks, 1)
        for key in ("model", "out", "domains", "task_files"):
            if key in self.train:
                raise ConfigError(f"config key 'train.{key}' is set by the cycle; remove it")
        allowed = ("samples", "temperature", "k", "max_new_tokens", "batch_size", "device", "precision", "env")
        for key in self.eval:
            if key not in allowed:
                raise ConfigError(f"config key 'eval.{key}' is not a decoding key; choose from: {', '.join(allowed)}")
        if self.gate.margin < 0 or self.gate.tolerance < 0:
            raise ConfigError("gate.margin and gate.tolerance are points >= 0")
        grpo = self.grpo_config("model", "out", "train.jsonl")  # a typo in 'train' or 'eval' stops here, naming the key
        if grpo.lora.enabled and grpo.lora.save != "merged":
            raise ConfigError("train.lora.save must be 'merged' in a flywheel: the server loads whole model directories")
        self.eval_config()

    def grpo_config(self, model: str, out: str, tasks: str):
        """The cycle's GRPO config: ``train`` over the defaults, from ``model`` on the ``tasks`` file."""
        from rlvr.train.grpo import GRPOConfig

        data = {"seed": self.seed, **self.train, "model": model, "out": out, "domains": [], "task_files": [tasks]}
        return from_dict(GRPOConfig, data, "train")

    def eval_config(self):
        from rlvr.eval.evaluate import EvalConfig

        return from_dict(EvalConfig, {**self.eval, "domains": [], "task_files": []}, "eval")


# -- the cycle's state on disk --------------------------------------------------------------------
def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _write(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def history(fly: Path) -> list[dict]:
    path = fly / HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _append_history(fly: Path, entry: dict) -> None:
    with (fly / HISTORY).open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def open_cycle(cfg: FlywheelConfig) -> tuple[Path, dict]:
    """The unfinished newest cycle (resumed), or a new one started from what the server serves."""
    cycles = Path(cfg.dir) / "cycles"
    cycles.mkdir(parents=True, exist_ok=True)
    existing = sorted(p for p in cycles.iterdir() if p.name.isdigit() and (p / STATE).is_file())
    if existing and not (existing[-1] / RESULT).is_file():
        state = _read(existing[-1] / STATE)
        print(f"flywheel: resuming cycle {state['cycle']} (started {state['started']})")
        return existing[-1], state
    number = int(existing[-1].name) + 1 if existing else 1
    now = served(cfg.server, cfg.api_key)
    path = cycles / f"{number:04d}"
    path.mkdir()
    state = {"cycle": number, "started": utc_now(), "server": cfg.server,
             "served": {"path": now.path, "version": now.version, "model": now.model}, "done": []}
    _write(path / STATE, state)
    print(f"flywheel: cycle {number} from {now.path} (version {now.version})")
    return path, state


def _done(path: Path, state: dict, stage: str) -> None:
    state["done"].append(stage)
    _write(path / STATE, state)


# -- the stages -------------------------------------------------------------------------------------
def _train(cfg: FlywheelConfig, path: Path, base: str, progress: bool) -> str:
    from rlvr.train.grpo import run_grpo

    grpo = cfg.grpo_config(base, str(path / "train"), str(path / "harvest" / "train.jsonl"))
    run_grpo(grpo, resume=True, progress=progress)  # resume: the newest checkpoint, if a run was cut
    return str((path / "train" / "final").resolve())


def _suites(cfg: FlywheelConfig, path: Path) -> dict[str, tuple[list, dict]]:
    """``{name: (tasks, suite record)}``: ``acceptance`` and (unless none) ``regression``."""
    from rlvr.eval.suites import get_suite
    from rlvr.tasks.sets import build_task_set

    heldout = path / "harvest" / "heldout.jsonl"
    files = list(cfg.eval_files) + ([as_file_config(str(heldout))] if heldout.stat().st_size else [])
    if not files:
        raise UserError("no acceptance suite: name eval_files (--eval FILE), or harvest a held-out split (held_out > 0)")
    out = {"acceptance": (build_task_set([], "eval", 1, seed=0, files=files, warn=lambda *_: None),
                          {"name": "flywheel-acceptance", "files": [f.path for f in files]})}
    if cfg.regression_suite:
        suite = get_suite(cfg.regression_suite)
        tasks = build_task_set(suite.resolved_domains(), "eval", min(suite.tasks, cfg.regression_tasks),
                               seed=suite.seed, levels=list(suite.levels), files=list(suite.task_files))
        out["regression"] = (tasks, {**suite.record(["tasks"] if cfg.regression_tasks < suite.tasks else []),
                                     "tasks": len(tasks)})
    return out


def _evaluate(cfg: FlywheelConfig, path: Path, models: dict[str, str]) -> dict[str, dict[str, dict]]:
    """``{who: {suite: report}}`` for ``models`` ``{who: model dir}``; reports written once, reused."""
    from rlvr.eval.report import eval_report
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.tasks.sets import needs_sandbox

    ecfg = cfg.eval_config()
    suites = None
    reports: dict[str, dict[str, dict]] = {}
    for who, model_dir in models.items():
        reports[who] = {}
        todo = [name for name in ("acceptance", "regression") if not (path / "eval" / f"{who}_{name}.json").is_file()]
        if todo:
            suites = suites or _suites(cfg, path)
            if any(needs_sandbox([], tasks) for tasks, _ in suites.values()):
                from rlvr.sandbox.config import shared_sandbox

                shared_sandbox()
            model, tokenizer = load_model_and_tokenizer(model_dir, device=resolve_device("eval.device", ecfg.device))
            for name in todo:
                if name in suites:
                    tasks, record = suites[name]
                    eval_report(model, tokenizer, tasks, ecfg, seed=cfg.seed, model_name=model_dir, suite=record,
                                settings=True, path=path / "eval" / f"{who}_{name}.json")
        for name in ("acceptance", "regression"):
            report = path / "eval" / f"{who}_{name}.json"
            if report.is_file():
                reports[who][name] = _read(report)
    return reports


def gate(cfg: FlywheelConfig, reports: dict[str, dict[str, dict]]) -> dict:
    """The gate's verdict: ``{"passed", "failures": [...], "acceptance": {...}, "regression": {...}}``."""
    from rlvr.eval.gate import compare

    failures: list[str] = []
    out: dict[str, Any] = {}
    for name in ("acceptance", "regression"):
        if name not in reports["baseline"]:
            continue
        result = compare(reports["baseline"][name], reports["candidate"][name], tolerance=cfg.gate.tolerance,
                         metric=cfg.gate.metric)
        out[name] = {"baseline": result.overall.baseline, "candidate": result.overall.now,
                     "change_pts": result.overall.change,
                     "domains": {c.domain: {"baseline": c.baseline, "candidate": c.now} for c in result.domains}}
        failures += [f"{name} suite: {line}" for line in result.regression_lines()]
        if name == "acceptance" and (result.overall.change or 0.0) < cfg.gate.margin:
            failures.append(f"acceptance suite: {cfg.gate.metric} {100 * result.overall.baseline:.1f}% -> "
                            f"{100 * result.overall.now:.1f}% ({result.overall.change:+.1f} pts; "
                            f"the gate asks for +{cfg.gate.margin:g})")
    return {"passed": not failures, "failures": failures, **out}


def run_cycle(cfg: FlywheelConfig, *, progress: bool = True) -> dict:
    """One cycle (or the rest of an unfinished one); its result (also ``result.json`` and history)."""
    fly = Path(cfg.dir)
    path, state = open_cycle(cfg)
    base = state["served"]["path"]
    started = time.monotonic()
    if "harvest" not in state["done"]:
        report = harvest(HarvestConfig(traffic=cfg.traffic, criteria=cfg.criteria, out=str(path / "harvest"),
                                       eval_files=list(cfg.eval_files), held_out=cfg.held_out,
                                       near_dup=cfg.near_dup), load_criteria(cfg.criteria))
        _done(path, state, "harvest")
    report = _read(path / "harvest" / "report.json")
    from rlvr.flywheel.harvest import print_report

    print_report(report, str(path / "harvest"))
    result: dict[str, Any] = {"type": "cycle", "cycle": state["cycle"], "started": state["started"],
                              "before": state["served"], "harvest": {k: report[k] for k in
                                                                     ("responses", "feedback", "kept", "dropped")},
                              "traffic": cfg.traffic, "criteria": cfg.criteria, "after": None, "pushed": False}
    if report["kept"]["train"] < cfg.min_tasks:
        return _finish(fly, path, {**result, "gate": {"passed": False, "failures": [
            f"harvest: {report['kept']['train']} training task(s), min_tasks is {cfg.min_tasks}"]}})
    candidate = str((path / "train" / "final").resolve())
    if "train" not in state["done"]:
        candidate = _train(cfg, path, base, progress)
        _done(path, state, "train")
    reports = _evaluate(cfg, path, {"baseline": base, "candidate": candidate})
    verdict = gate(cfg, reports)
    result = {**result, "candidate": candidate, "gate": verdict}
    if verdict["passed"]:
        _push(cfg, path, state, candidate, result, verdict)
    result["seconds"] = round(time.monotonic() - started, 1)
    return _finish(fly, path, result)


def _push(cfg: FlywheelConfig, path: Path, state: dict, candidate: str, result: dict, verdict: dict) -> None:
    """Push ``candidate`` if the server still serves the cycle's baseline; a cycle cut after its own
    push (``push`` started, the server serving the candidate) counts it as pushed."""
    now = served(cfg.server, cfg.api_key)
    if "push" in state["done"] and Path(now.path).resolve() == Path(candidate).resolve():
        result.update(after={"path": candidate, "version": now.version, "model": now.model}, pushed=True)
        return
    base = state["served"]
    if now.version != base["version"] or Path(now.path).resolve() != Path(base["path"]).resolve():
        verdict["passed"] = False
        verdict["failures"].append(f"the server changed during the cycle (serves {now.path} version {now.version}, "
                                   f"the cycle started from {base['path']} version {base['version']}); nothing pushed")
        return
    _done(path, state, "push")
    version = push_weights(cfg.server, candidate, cfg.admin_token)
    result.update(after={"path": candidate, "version": version, "model": now.model}, pushed=True)


def _finish(fly: Path, path: Path, result: dict) -> dict:
    result["finished"] = utc_now()
    _write(path / RESULT, result)
    _append_history(fly, result)
    return result


def rollback(fly_dir: str, server: str, admin_token: str, api_key: str = "") -> dict:
    """Put back the weights served before the newest pushed cycle not yet rolled back."""
    fly = Path(fly_dir)
    entries = history(fly)
    undone = {e["cycle"] for e in entries if e.get("type") == "rollback"}
    pushed = [e for e in entries if e.get("type") == "cycle" and e.get("pushed") and e["cycle"] not in undone]
    if not pushed:
        raise UserError(f"{fly / HISTORY}: no pushed cycle left to roll back")
    last = pushed[-1]
    now = served(server, api_key)
    if Path(now.path).resolve() != Path(last["after"]["path"]).resolve():
        raise UserError(f"the server serves {now.path}, not cycle {last['cycle']}'s {last['after']['path']}: "
                        "it was changed outside the flywheel; nothing rolled back")
    version = push_weights(server, last["before"]["path"], admin_token)
    entry = {"type": "rollback", "cycle": last["cycle"], "time": utc_now(), "restored": last["before"]["path"],
             "replaced": last["after"]["path"], "version": version}
    _append_history(fly, entry)
    return entry
