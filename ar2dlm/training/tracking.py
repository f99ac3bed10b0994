"""Experiment tracking of conversion runs, chosen in config (``tracking.backend``): TensorBoard,
Weights & Biases in offline mode, or MLflow with a local SQLite store, all written under
``results/tracking/<backend>/``. The run's ``log.jsonl`` stays the source of truth for tables; a
tracker receives the same rows (every numeric field of each step's row)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

PACKAGES = {"none": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
ENV = "AR2DLM_TRACKING"  # how the workflow hands the tracking settings to its jobs


def export(settings: dict) -> None:
    """Hand the tracking settings (backend, project, directory) to every job this process starts,
    local or on SLURM (jobs inherit the environment). They are not a rule parameter: a parameter
    change makes Snakemake rerun a job, and switching the tracker must retrain nothing."""
    os.environ[ENV] = json.dumps(settings)


def exported() -> dict:
    """The settings ``export`` handed down, or no tracking."""
    return json.loads(os.environ.get(ENV) or '{"backend": "none"}')


def missing_package(backend: str) -> str | None:
    """The package a backend needs when it is not installed, else None."""
    package = PACKAGES[backend]
    return package if package and importlib.util.find_spec(package) is None else None


class Tracker:
    """One run's tracker; ``log`` sends a step's row, ``close`` flushes. Backend ``none`` does nothing."""

    def __init__(self, backend: str, directory, project: str, name: str, config: dict):
        self.backend = backend
        if backend == "none":
            return
        if missing_package(backend):
            raise ImportError(
                f"tracking.backend {backend!r} needs the {PACKAGES[backend]} package (pip install {PACKAGES[backend]})"
            )
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if backend == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(directory / name))
        elif backend == "wandb":
            import wandb

            self._run = wandb.init(
                project=project,
                name=name,
                id=name.replace("/", "-"),
                dir=str(directory),
                mode="offline",
                config=config,
                resume="allow",
            )
        else:
            import mlflow

            mlflow.set_tracking_uri(f"sqlite:///{(directory / 'mlflow.db').resolve()}")  # MLflow's local store
            mlflow.set_experiment(project)
            self._run = mlflow.start_run(run_name=name)
            mlflow.log_params({k: str(v)[:500] for k, v in config.items()})

    def log(self, row: dict, step: int) -> None:
        scalars = {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        if self.backend == "tensorboard":
            for k, v in scalars.items():
                self._writer.add_scalar(k, v, step)
        elif self.backend == "wandb":
            self._run.log(scalars, step=step)
        elif self.backend == "mlflow":
            import mlflow

            mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        if self.backend == "tensorboard":
            self._writer.close()
        elif self.backend == "wandb":
            self._run.finish()
        elif self.backend == "mlflow":
            import mlflow

            mlflow.end_run()
