"""Live trackers (verl's ``trainer.logger``, here ``runtime.logger``): each iteration's metrics, as the run
writes them, to the console, TensorBoard, wandb, mlflow or a JSONL file, under verl's metric names where verl
has the concept (``critic/score/mean``, ``response_length/mean``, ``actor/pg_loss``, ``actor/entropy``,
``actor/ppo_kl``, ``actor/grad_norm``, ``timing_s/step``, ``perf/throughput``) beside ours (placement:
``placement/actor_dp``, reshards, weight-sync seconds).

The coordinator owns one :class:`TrackerPump`: it follows ``RUN_DIR/metrics.jsonl`` (appended by the actor
leader as each iteration ends), maps each new row with :func:`verl_metrics` and hands it to every tracker. Each
tracker's library is imported only when the tracker opens (wandb, mlflow and tensorboardX are optional
installs). Everything a tracker writes goes under ``RUN_DIR/tracking/``: ``tensorboard/`` (event files),
``wandb/`` (wandb's run directory; ``WANDB_MODE=offline`` works without a server), ``mlruns/`` (mlflow's local
file store, unless ``MLFLOW_TRACKING_URI`` names another) and ``metrics.jsonl`` (``file``). A restarted
coordinator goes on after the last iteration it logged (``tracking/logged.json``), in the same wandb and
mlflow runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from slurm_rl.fsio import append_bytes, atomic_write_json
from slurm_rl.metrics import METRICS_FILE

TRACKING_DIR = "tracking"
LOGGED_FILE = "logged.json"
#: our row key -> verl's metric name
VERL_NAMES = {
    "reward_mean": "critic/score/mean",
    "response_length_mean": "response_length/mean",
    "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm",
    "lr": "actor/lr",
    "kl": "actor/kl_loss",
    "seconds": "timing_s/step",
}


def verl_metrics(row: dict[str, Any], gpus: int, loss_is_pg_loss: bool) -> dict[str, float]:
    """The scalars of one ``metrics.jsonl`` row: verl's names where verl has the metric, ours beside them.
    ``perf/throughput`` is verl's: tokens (prompt and response) per second per GPU of the allocation. Our
    ``loss`` is the whole actor loss: it is verl's ``actor/pg_loss`` only without a KL loss and entropy bonus
    (``loss_is_pg_loss``), else ``actor/loss``."""
    out: dict[str, float] = {}
    if isinstance(row.get("loss"), (int, float)):
        out["actor/pg_loss" if loss_is_pg_loss else "actor/loss"] = float(row["loss"])
    for key, value in row.items():
        if key in ("iteration", "time", "plan", "losses", "loss", "actor_dp", "prompts_digest", "critic/vf_losses", "actor_tp"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[VERL_NAMES.get(key, key if "/" in key else f"slurm_rl/{key}")] = float(value)
    if row.get("tokens") and row.get("seconds"):
        out["perf/throughput"] = float(row["tokens"]) / float(row["seconds"]) / max(gpus, 1)
        out["perf/total_num_tokens"] = float(row["tokens"])
    plan = row.get("plan") or []
    if plan:  # ours: how the actor was placed over the iteration's mini-batches
        out["placement/actor_dp"] = float(row.get("actor_dp", 0))
        out["placement/actor_tp"] = float(max(row.get("actor_tp") or [1]))
        out["placement/epochs"] = float(len({e.get("epoch") for e in plan}))
        out["placement/reshards"] = float(sum(1 for e in plan if e.get("resharded")))
    return out


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class ConsoleTracker:
    """One line per iteration on the coordinator's stdout (``logs/coordinator.log`` under sbatch), as verl's."""

    def __init__(self, print_fn: Callable[[str], None]) -> None:
        self.print = print_fn

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.print(f"step:{step} - " + " - ".join(f"{k}:{v:.6g}" for k, v in sorted(metrics.items())))

    def close(self) -> None:
        pass


class FileTracker:
    """verl's ``file`` logger: one JSON object per iteration, ``{"step": N, "data": {...}}``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def log(self, metrics: dict[str, float], step: int) -> None:
        append_bytes(self.path, (json.dumps({"step": step, "data": metrics}) + "\n").encode())

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Event files under ``RUN_DIR/tracking/tensorboard`` (tensorboardX; no TensorFlow)."""

    def __init__(self, directory: Path) -> None:
        from slurm_rl.inspect.tensorboard import _import_tensorboardx

        self.writer = _import_tensorboardx().SummaryWriter(str(directory))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A wandb run (``WANDB_MODE=offline``: files only, ``wandb sync`` uploads them later); one run per RUN_DIR,
    resumed by a restarted coordinator."""

    def __init__(self, directory: Path, project: str, name: str, run_id: str, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=project, name=name, id=run_id, resume="allow", dir=str(directory),
                              config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An mlflow run in experiment ``project`` (``MLFLOW_TRACKING_URI``, else a local file store under
    ``RUN_DIR/tracking/mlruns``); the run id is kept in ``tracking/mlflow_run.json`` for a restarted coordinator."""

    def __init__(self, directory: Path, project: str, name: str, config: dict[str, Any]) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (directory / "mlruns").absolute().as_uri()
        if uri.startswith("file:"):  # mlflow 3 keeps the file store behind this switch (a database is its default)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        record = directory / "mlflow_run.json"
        if record.exists():
            self.run_id = json.loads(record.read_text())["run_id"]
            return
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        atomic_write_json(record, {"run_id": self.run_id, "tracking_uri": uri})
        from mlflow.entities import Param

        params = [Param(re.sub(r"[^\w\-. :/]", "_", k), str(v)[:250]) for k, v in config.items()]
        for i in range(0, len(params), 100):  # mlflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # mlflow's metric names allow letters, digits, _ - . space / : only
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: doc}


class TrackerPump:
    """Follows ``RUN_DIR/metrics.jsonl`` and logs each new row to the trackers of ``runtime.logger``."""

    def __init__(self, run_dir: Path, cfg: Any, print_fn: Callable[[str], None] = print) -> None:
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.names = list(cfg.runtime.logger)
        self.print = print_fn
        self.dir = self.run_dir / TRACKING_DIR
        self.trackers: list[Tracker] | None = None
        self.offset = 0
        logged = self.dir / LOGGED_FILE
        self.last = json.loads(logged.read_text())["iteration"] if logged.exists() else -1
        self.gpus = cfg.placement.num_slots

    def _open(self) -> list[Tracker]:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        from omegaconf import OmegaConf

        config = _flat(OmegaConf.to_container(self.cfg.raw, resolve=True))
        name = self.cfg.runtime.experiment_name or self.run_dir.name
        project = self.cfg.runtime.project_name
        trackers: list[Tracker] = []
        for kind in self.names:
            try:
                trackers.append(self._make(kind, config, name, project))
            except Exception as exc:  # noqa: BLE001  (a tracker's failure is reported; the run goes on)
                self.print(f"trackers: {kind} did not open ({type(exc).__name__}: {exc}); it logs nothing")
        return trackers

    def _make(self, kind: str, config: dict[str, Any], name: str, project: str) -> Tracker:
        if kind == "console":
            return ConsoleTracker(self.print)
        if kind == "file":
            return FileTracker(self.dir / "metrics.jsonl")
        if kind == "tensorboard":
            return TensorBoardTracker(self.dir / "tensorboard")
        if kind == "wandb":
            run_id = "".join(ch for ch in f"{name}-{self.run_dir.name}" if ch.isalnum() or ch in "-_")[:64]
            return WandbTracker(self.dir, project, name, run_id, config)
        if kind == "mlflow":
            return MlflowTracker(self.dir, project, name, config)
        raise ValueError(f"runtime.logger: {kind!r} is not a tracker")

    def poll(self) -> int:
        """Log every complete row appended since the last call; returns the last iteration logged (-1: none)."""
        if not self.names:
            return self.last
        path = self.run_dir / METRICS_FILE
        try:
            with path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.last
        end = data.rfind(b"\n")
        if end < 0:
            return self.last
        self.offset += end + 1
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            k = int(row.get("iteration", -1))
            if k <= self.last:
                continue
            if self.trackers is None:
                self.trackers = self._open()
            al = self.cfg.algorithm
            metrics = verl_metrics(row, self.gpus, loss_is_pg_loss=not al.kl_coef and not al.entropy_coeff)
            for tracker in list(self.trackers):
                try:
                    tracker.log(metrics, k)
                except Exception as exc:  # noqa: BLE001  (reported; the run goes on without that tracker)
                    self.print(f"trackers: {type(tracker).__name__} failed at iteration {k} ({type(exc).__name__}: "
                               f"{exc}); it logs nothing more")
                    self.trackers.remove(tracker)
            self.last = k
            atomic_write_json(self.dir / LOGGED_FILE, {"iteration": k}, durable=False)
        return self.last

    def drain(self, last_iteration: int, timeout_s: float) -> None:
        """Log rows until ``last_iteration``'s is in (the run's end), at most ``timeout_s``; then close."""
        deadline = time.monotonic() + timeout_s
        while self.names and self.poll() < last_iteration and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.names and self.last < last_iteration:
            self.print(f"trackers: iteration {last_iteration}'s metrics row did not appear in "
                       f"{self.run_dir / METRICS_FILE} within {timeout_s:g}s; logged up to iteration {self.last}")
        self.close()

    def close(self) -> None:
        for tracker in self.trackers or []:
            tracker.close()
        self.trackers = None
