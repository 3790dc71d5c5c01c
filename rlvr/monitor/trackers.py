"""Optional experiment trackers beside TensorBoard: MLflow and Weights & Biases, both local.

A tracker gets what ``metrics.jsonl`` gets (every numeric value, under the same name and step)
and the run's resolved config as parameters. Nothing is sent anywhere: MLflow writes a SQLite
database in the run directory unless ``mlflow_uri`` names another store, and W&B always runs in
offline mode under ``<run dir>/wandb`` (``wandb sync`` uploads it later, if the user wants).
Neither package is imported until a tracker is opened; a missing one is a one-line ``UserError``
naming its extra. A resumed run opens a new tracker run that starts after the checkpoint's step.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlvr.config import check_choice
from rlvr.errors import ConfigError, UserError
from rlvr.registry import Registry


class Tracker(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


TRACKERS: Registry[type] = Registry("tracker")


@dataclass
class TrackerConfig:
    use: list[str] = field(default_factory=list)
    """Trackers written beside metrics.jsonl and TensorBoard (those two always are): mlflow | wandb."""
    project: str = "rlvr"
    """The MLflow experiment / W&B project the run is filed under."""
    run_name: str | None = None
    """The run's name in the tracker; None = the run directory's name."""
    mlflow_uri: str | None = None
    """MLflow tracking URI; None = sqlite:///<run dir>/mlflow.db (a local file). Set a server's URI
    to log there instead: the only way a tracker sends anything."""

    def __post_init__(self) -> None:
        for i, name in enumerate(self.use):
            if name == "tensorboard":
                raise ConfigError(f"config key 'trackers.use[{i}]' = 'tensorboard': TensorBoard is always "
                                  f"written; list only the extra trackers, from: {TRACKERS.names()}")
            check_choice(f"trackers.use[{i}]", name, TRACKERS.names())
        if len(set(self.use)) < len(self.use):
            raise ConfigError(f"config key 'trackers.use' = {self.use!r} names a tracker twice")


def open_trackers(cfg: TrackerConfig, run_dir: str | Path, params: dict[str, Any]) -> list[Tracker]:
    """Open the trackers ``cfg.use`` names for ``run_dir``, each given ``params`` (the resolved
    config); if one fails to open, the ones already open are closed before the error goes up."""
    opened: list[Tracker] = []
    try:
        for name in cfg.use:
            opened.append(TRACKERS.get(name)(Path(run_dir), cfg, params))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened


def require(module: str, extra: str):
    """Import ``module`` or raise a UserError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"tracker '{extra}' needs the package {module!r} ({e}): "
                        f"pip install 'rlvr[{extra}]'") from None


def flat_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"optim.lr": "0.001", ...}``: leaves (lists too) as their str()."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
        else:
            out[name] = str(value)
    return out


def mlflow_name(name: str) -> str:
    """The metric name MLflow accepts (alphanumerics, ``_ - . / : space``): ``@`` reads ``_at_``
    (``eval/pass@1`` -> ``eval/pass_at_1``), any other refused character ``_``."""
    return re.sub(r"[^/\w.\- :]", "_", name.replace("@", "_at_"))


@TRACKERS.register("mlflow")
class MlflowTracker:
    def __init__(self, run_dir: Path, cfg: TrackerConfig, params: dict[str, Any]):
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # read when mlflow is first imported
        uri = cfg.mlflow_uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        require("mlflow", "mlflow")
        if uri.startswith("sqlite:"):
            require("sqlalchemy", "mlflow")
            require("alembic", "mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        for noisy in ("alembic", "mlflow.store.db.utils"):  # "Creating initial MLflow database tables..."
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self._metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(cfg.project)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            artifacts = None if cfg.mlflow_uri else (run_dir / "mlflow-artifacts").resolve().as_uri()
            experiment_id = self.client.create_experiment(cfg.project, artifact_location=artifacts)
        run = self.client.create_run(experiment_id, run_name=cfg.run_name or run_dir.resolve().name,
                                     tags={"rlvr.run_dir": str(run_dir.resolve())})
        self.run_id = run.info.run_id
        items = [Param(k, v[:6000]) for k, v in flat_params(params).items()]
        for i in range(0, len(items), 100):  # MLflow's per-call limit on params
            self.client.log_batch(self.run_id, params=items[i: i + 100])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._metric(mlflow_name(k), v, stamp, step)
                                                    for k, v in metrics.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


@TRACKERS.register("wandb")
class WandbTracker:
    def __init__(self, run_dir: Path, cfg: TrackerConfig, params: dict[str, Any]):
        os.environ["WANDB_ERROR_REPORTING"] = "false"
        require("wandb", "wandb")  # a missing package: the one-line error naming the extra
        import wandb

        self._wandb = wandb
        settings = wandb.Settings(silent=True, console="off", save_code=False, disable_git=True,
                                  x_disable_stats=True)
        self.run = wandb.init(mode="offline", dir=str(run_dir.resolve()), project=cfg.project,
                              name=cfg.run_name or run_dir.resolve().name, config=params,
                              settings=settings)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()
        self._wandb.teardown()  # stops the wandb-core service process this run started
