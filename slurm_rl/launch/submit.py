"""Launch a run with submitit: ``submit(config, overrides, executor="slurm"|"local") -> submitit.Job``.

The run dir is prepared here, on the submitting side; every task of the job then runs the same
worker entry point as ``srun`` would (rank discovery reads ``submitit.JobEnvironment``).

:class:`SlurmOptions` carries the Slurm options of ``slurm-rl submit`` (``--partition``,
``--account``, ``--qos``, ``--time``, ``--nodes``, ``--gpus-per-node``, ``--constraint``,
``--exclusive``, ``--slurm KEY=VALUE``) to the parameters of ``submitit.SlurmExecutor``, which
writes them as ``#SBATCH`` lines. ``--nodes`` and ``--gpus-per-node`` describe the allocation: they
must agree with the config's ``cluster`` section (a contradiction is refused, naming both), and
``--gpus-per-node`` fills in ``cluster.gpus_per_node`` where the config leaves it to the allocation.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import submitit

from slurm_rl.job_limits import job_timeout_s
from slurm_rl.config import Config, ConfigError, ConfigIssue, load_config
from slurm_rl.errors import InputError, LaunchError
from slurm_rl.launch.prepare import prepare_run

EXECUTORS = ("slurm", "local")


class SubmitError(InputError):
    """Bad submit arguments (names the argument, the value and what is allowed)."""


# --slurm KEY=VALUE: keys slurm_rl writes itself (the job's shape, its log files, the signal that
# checkpoints ahead of the time limit), keys with their own option, and submitit's non-sbatch knobs.
_SET_BY_SLURM_RL = {
    "nodes": "--nodes", "time": "--time", "partition": "--partition", "account": "--account", "qos": "--qos",
    "constraint": "--constraint", "exclusive": "--exclusive", "gpus_per_node": "--gpus-per-node",
    "ntasks_per_node": None, "ntasks": None, "output": None, "error": None, "open_mode": None, "array": None,
    "signal": None, "wrap": None,
}
_NOT_SBATCH = {"setup", "teardown", "srun_args", "use_srun", "array_parallelism", "stderr_to_stdout",
               "signal_delay_s", "map_count", "additional_parameters", "folder", "command", "num_gpus"}
_SLURM_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_TIME_FORMS = ("minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes",
               "days-hours:minutes:seconds")


def parse_slurm_time(text: str | int) -> int:
    """Minutes (rounded up) of a Slurm time limit: ``90``, ``90:30``, ``1:30:00``, ``2-0``, ``2-12:30``,
    ``2-12:30:00``. submitit counts the job's time in whole minutes (its requeue logic reads them)."""
    allowed = f"a positive time limit in minutes or in Slurm's forms {', '.join(_TIME_FORMS)}"
    raw = str(text).strip()
    days, dash, rest = raw.partition("-")
    if not dash:
        days, rest = "0", raw
    parts = rest.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or len(parts) > 3:
        raise SubmitError(f"--time: got {raw!r}; allowed: {allowed}")
    n = [int(p) for p in parts]
    if dash:  # days-hours[:minutes[:seconds]]
        h, m, sec = (n + [0, 0])[:3]
    elif len(n) == 3:  # hours:minutes:seconds
        h, m, sec = n
    else:  # minutes[:seconds]
        h, m, sec = 0, n[0], (n[1] if len(n) == 2 else 0)
    minutes = int(days) * 1440 + h * 60 + m + (1 if sec else 0)
    if minutes < 1:
        raise SubmitError(f"--time: got {raw!r}; allowed: {allowed}")
    return minutes


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm options of ``slurm-rl submit``; :meth:`params` maps them to ``submitit.SlurmExecutor``
    parameters (``slurm_<name>`` under ``submitit.AutoExecutor``)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    constraint: str | None = None
    exclusive: bool = False
    extra: tuple[tuple[str, str], ...] = ()  # --slurm KEY=VALUE, in order (a later KEY wins)

    @classmethod
    def from_cli(cls, partition: str | None = None, account: str | None = None, qos: str | None = None,
                 time: str | int | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
                 constraint: str | None = None, exclusive: bool = False,
                 slurm: Sequence[str] | None = None) -> "SlurmOptions":
        """Check and normalise the command line's values; ``SubmitError`` names the bad one."""
        for name, value in (("--partition", partition), ("--account", account), ("--qos", qos),
                            ("--constraint", constraint)):
            if value is not None and (not value.strip() or any(c in value for c in "\n\r\0")):
                raise SubmitError(f"{name}: got {value!r}; allowed: a non-empty name on one line")
        for name, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
            if value is not None and value < 1:
                raise SubmitError(f"{name}: got {value}; allowed: a positive int")
        extra = tuple(_slurm_item(item) for item in (slurm or ()))
        return cls(partition=partition, account=account, qos=qos,
                   time_min=None if time is None else parse_slurm_time(time), nodes=nodes,
                   gpus_per_node=gpus_per_node, constraint=constraint, exclusive=bool(exclusive), extra=extra)

    def given(self) -> list[str]:
        """The options given, as their command-line names."""
        names = [("--partition", self.partition), ("--account", self.account), ("--qos", self.qos),
                 ("--time", self.time_min), ("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node),
                 ("--constraint", self.constraint), ("--exclusive", self.exclusive or None),
                 ("--slurm", self.extra or None)]
        return [n for n, v in names if v is not None]

    def params(self) -> dict[str, Any]:
        """``SlurmExecutor.update_parameters`` keywords: partition, account, qos, time (minutes),
        constraint, exclusive, submitit's own name for a known ``--slurm`` key (mem, gres,
        cpus_per_task, ...), ``additional_parameters`` for any other sbatch option. The job's shape
        (nodes, tasks per node, GPUs) is set by the caller from the config."""
        out: dict[str, Any] = {}
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.time_min is not None:
            out["time"] = self.time_min
        if self.exclusive:
            out["exclusive"] = True
        known = _submitit_parameters()
        additional: dict[str, Any] = {}
        for key, value in self.extra:
            flag: Any = True if value == "" else value  # KEY= : a bare flag (#SBATCH --KEY)
            if key in known:
                out[key] = flag
            else:
                additional[key] = flag
        if additional:
            out["additional_parameters"] = additional
        return out


def _submitit_parameters() -> set[str]:
    from submitit.slurm.slurm import _get_default_parameters

    return set(_get_default_parameters())


def _slurm_item(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--slurm`` -> (submitit-style key, value); ``SubmitError`` when malformed."""
    key, eq, value = item.partition("=")
    key = key.strip().lstrip("-")
    if not eq or not key:
        raise SubmitError(f"--slurm: got {item!r}; allowed: KEY=VALUE with an sbatch option as KEY, e.g. "
                          "--slurm mem=64G or --slurm reservation=gpu-week (KEY= gives a bare flag)")
    if not _SLURM_KEY.match(key):
        raise SubmitError(f"--slurm: got key {key!r} in {item!r}; allowed: an sbatch option name "
                          "(letters, digits, '-' and '_')")
    if any(c in value for c in "\n\r\0"):
        raise SubmitError(f"--slurm: got {item!r}; allowed: a value on one line")
    norm = key.replace("-", "_").lower()
    if norm in _SET_BY_SLURM_RL:
        own = _SET_BY_SLURM_RL[norm]
        how = f"use {own}" if own else "slurm_rl sets it from the config (the job's shape, log files, checkpoint signal)"
        raise SubmitError(f"--slurm: got {item!r}; allowed: an sbatch option other than {key} ({how})")
    if norm in _NOT_SBATCH:
        raise SubmitError(f"--slurm: got {item!r}; allowed: an sbatch option ({key} is a submitit setting, not one)")
    return norm, value


def requests_gpus(cfg: Config, gpus_per_node: int | None, partition_has_gpus: bool = False) -> bool:
    """Whether the job asks Slurm for GPUs: ``runtime.device: cuda``, or ``auto`` (decided by each rank
    where it runs) with ``--gpus-per-node`` given or a partition whose nodes have GPUs; ``cpu`` and
    ``emulated`` runs ask for none."""
    from slurm_rl.launch.gpu_request import written_device

    written = written_device(cfg)
    return written == "cuda" or cfg.runtime.device == "cuda" or (
        written == "auto" and (gpus_per_node is not None or partition_has_gpus))


# what the submitting shell's own allocation (if any) says about GPUs and tasks per node: not the new job's
_ALLOCATION_SHAPE_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_GPUS",
                          "SLURM_STEP_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS", "SLURM_TRES_PER_NODE")


def allocation_env(options: SlurmOptions | None, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment the config is loaded with. ``--gpus-per-node G`` stands for the new job's
    allocation as ``SLURM_NTASKS_PER_NODE=G`` (one task per slot), which fills in
    ``cluster.gpus_per_node`` where the config leaves it out; the submitting shell's own allocation
    variables are left out then. Without the option: the environment as it is (None: ``os.environ``)."""
    if options is None or options.gpus_per_node is None:
        return None if env is None else dict(env)
    base = {k: v for k, v in (os.environ if env is None else env).items() if k not in _ALLOCATION_SHAPE_VARS}
    return {**base, "SLURM_NTASKS_PER_NODE": str(options.gpus_per_node)}


def check_shape(cfg: Config, options: SlurmOptions | None) -> None:
    """``--nodes`` / ``--gpus-per-node`` against the config's cluster section: ``SubmitError`` naming
    both when they contradict (nothing is created)."""
    if options is None:
        return
    if options.nodes is not None and options.nodes != cfg.cluster.num_nodes:
        raise SubmitError(f"--nodes: got {options.nodes}, but the config has cluster.num_nodes={cfg.cluster.num_nodes}; "
                          f"allowed: {cfg.cluster.num_nodes} (or change the config: cluster.num_nodes={options.nodes} "
                          "and a placement that fits)")
    per_node = sorted(set(cfg.placement.slots_per_node))
    if options.gpus_per_node is not None and per_node != [options.gpus_per_node]:
        has = (f"cluster.gpus_per_node={per_node[0]}" if len(per_node) == 1
               else f"slots per node {list(cfg.placement.slots_per_node)} (cluster.node_groups)")
        raise SubmitError(f"--gpus-per-node: got {options.gpus_per_node}, but the config has {has}; allowed: "
                          f"{per_node[0] if len(per_node) == 1 else 'the same count on every node'} (or leave "
                          "cluster.gpus_per_node out of the config: --gpus-per-node then sets it)")


STOP_WAIT_S = 50.0  # within submitit's signal_delay_s (60): the run reaches its gate and checkpoints


class RankTask(submitit.helpers.Checkpointable):
    """What each submitit task runs: the ranks of its node (``per_node``, one task per node: forked
    from the task once it imported what they need, as :mod:`slurm_rl.launch.node` under ``srun``), or
    one rank (one task per rank), as child processes.

    Checkpointable the submitit way: when Slurm signals the job ahead of its time limit or a
    preemption (submitit's USR2), submitit calls :meth:`checkpoint` on task 0, which asks the
    run to checkpoint at its next gate, waits for it to stop, prepares the run dir for the next
    incarnation and hands submitit the same task to requeue. The ranks run in child processes
    so that this handler can wait while they work.
    """

    def __init__(self, per_node: bool = False) -> None:
        self.per_node = per_node
        self.ranks: set[int] = set()

    def __call__(self, run_dir: str) -> int:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if self.per_node:
            code = self._serve_node(run_dir)
        else:
            self.child = subprocess.Popen([sys.executable, "-m", "slurm_rl.worker", run_dir], env=dict(os.environ))
            code = self.child.wait()
        if code != 0:
            raise LaunchError(f"rank failed with exit code {code}; see {run_dir}/logs")
        return code

    def _serve_node(self, run_dir: str) -> int:
        from slurm_rl.config import ReusableConfig
        from slurm_rl.launch import node as node_task
        from slurm_rl.launch.forkserver import ignored_signals

        job = submitit.JobEnvironment()
        loaded = ReusableConfig.load(Path(run_dir) / "config.yaml")
        placement = loaded.config.placement
        node = job.node  # one task per node: task k serves the placement's node k, where Slurm put it
        ranks = [r for r in range(placement.world_size) if placement.node_of_rank(r) == node]
        local = job.cluster != "slurm"
        environ = dict(os.environ)
        envs = {r: submitit_rank_env(environ, r, i, placement.world_size, node, local) for i, r in enumerate(ranks)}
        node_task.become_subreaper()
        return node_task.serve_ranks(run_dir, loaded, node, envs, ignored_signals(), started=self.ranks.update)

    def _ranks_ended(self) -> bool:
        child = getattr(self, "child", None)
        if child is not None:
            return child.poll() is not None
        from slurm_rl.launch.zygote import running

        return not any(running(pid) for pid in self.ranks)

    def checkpoint(self, run_dir: str) -> submitit.helpers.DelayedSubmission:  # type: ignore[override]
        """Stop the run at its next gate with a checkpoint, then requeue this task."""
        from slurm_rl.control.paths import RunPaths
        from slurm_rl.control.status import read_coordinator_status
        from slurm_rl.resume.restart import prepare_resume
        from slurm_rl.resume.stop import request_stop

        root = Path(run_dir)
        request_stop(root, "submitit checkpoint (time limit or preemption)")
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            status = read_coordinator_status(RunPaths(root))
            stopped = status is not None and status.state == "stopped"
            if stopped and self._ranks_ended():
                break
            time.sleep(0.2)
        else:
            print(f"slurm_rl: the run did not stop within {STOP_WAIT_S:.0f}s; it resumes from its last checkpoint",
                  file=sys.stderr, flush=True)
        prepare_resume(root, log=lambda m: print(f"slurm_rl: {m}", flush=True))
        return submitit.helpers.DelayedSubmission(RankTask(self.per_node), run_dir)


def submitit_rank_env(environ: Mapping[str, str], rank: int, local_rank: int, world_size: int, node: int,
                      local: bool) -> dict[str, str]:
    """The environment of a rank forked by a submitit task that serves its node: what
    ``submitit.JobEnvironment`` reads (``SUBMITIT_LOCAL_*`` for the local executor, else srun's
    variables) made the rank's, as if it were a task of its own."""
    if not local:
        from slurm_rl.launch.node import rank_env

        return rank_env(dict(environ), rank, local_rank, world_size, node)
    return dict(environ, SUBMITIT_LOCAL_GLOBALID=str(rank), SUBMITIT_LOCAL_LOCALID=str(local_rank),
                SUBMITIT_LOCAL_NTASKS=str(world_size), SUBMITIT_LOCAL_NODEID=str(node))


def task_per_node() -> bool:
    """Whether a submitit job has a task per node that forks the node's ranks (default), or a task per rank
    (``SLURM_RL_FORKSERVER=0``)."""
    from slurm_rl.launch.forkserver import enabled

    return enabled()


def make_executor(cfg: Config, run_dir: Path, executor: str, slurm_params: dict[str, Any] | None = None,
                  options: SlurmOptions | None = None) -> Any:
    """A submitit executor with a task per node (:func:`task_per_node`); ``options`` (the Slurm options of
    the command line) go on top of the shape taken from the config, ``slurm_params`` on top of both."""
    import submitit

    if executor not in EXECUTORS:
        raise SubmitError(f"--executor: got {executor!r}; allowed: {', '.join(EXECUTORS)}")
    options = options or SlurmOptions()
    folder = run_dir / "logs" / "submitit"
    world = cfg.placement.world_size
    timeout_min = options.time_min or max(1, int(job_timeout_s(cfg.runtime.run_timeout_s, cfg.runtime.checkpoint_margin_s)
                                                 // 60) + 1)
    if executor == "local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(nodes=1, tasks_per_node=1 if task_per_node() else world, timeout_min=timeout_min)
        return ex
    nodes = cfg.cluster.num_nodes
    per_node = cfg.placement.ranks_per_node()
    if len(set(per_node)) != 1:
        raise SubmitError(f"cluster.component_placement: got {list(per_node)} ranks per node; allowed: the same "
                          "number on every node with submitit (sbatch/train.sh starts any layout)")
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=3)  # time limits requeue (RankTask.checkpoint)
    per_task = world // nodes if task_per_node() else 1  # ranks each task serves
    params: dict[str, Any] = dict(
        nodes=nodes,
        ntasks_per_node=world // nodes // per_task,
        time=timeout_min,
        job_name="slurm-rl",
        signal_delay_s=60,
    )
    if requests_gpus(cfg, options.gpus_per_node, _partition_has_gpus(cfg, options)):
        params["gres"] = f"gpu:{max(cfg.placement.slots_per_node)}"
    params.update(options.params())
    params.update(slurm_params or {})
    if per_task > 1:  # a task serves its node's ranks: the CPUs of all of them (cpus_per_task given: per rank)
        params["cpus_per_task"] = int(params.get("cpus_per_task") or 1) * per_task
    ex.update_parameters(**params)
    return ex


def _partition_has_gpus(cfg: Config, options: SlurmOptions) -> bool:
    """Under ``runtime.device: auto``: whether ``sinfo`` lists GPUs on the nodes of the job's partition."""
    from slurm_rl.launch.gpu_request import partition_gpus, written_device

    return written_device(cfg) == "auto" and partition_gpus(options.partition) > 0


def check_executor_options(executor: str, options: SlurmOptions | None) -> None:
    """``--executor local`` takes ``--time`` only: the other options are Slurm's."""
    if executor not in EXECUTORS:
        raise SubmitError(f"--executor: got {executor!r}; allowed: {', '.join(EXECUTORS)}")
    slurm_only = [n for n in (options.given() if options else []) if n != "--time"]
    if executor == "local" and slurm_only:
        raise SubmitError(f"{', '.join(slurm_only)}: given with --executor local; allowed: only with "
                          "--executor slurm (the local executor takes --time only)")


def submit(
    config_path: str | Path,
    overrides: Sequence[str] = (),
    executor: str = "slurm",
    slurm_params: dict[str, Any] | None = None,
    options: SlurmOptions | None = None,
) -> Any:
    """Validate, prepare the run dir, submit a task per node (each forks its node's ranks); returns the ``submitit.Job``.

    ``options``: the command line's Slurm options; ``--nodes``/``--gpus-per-node`` are checked
    against the config before anything is created (``SubmitError``, exit 2)."""
    check_executor_options(executor, options)
    env = allocation_env(options)
    try:
        if options is not None and (options.nodes is not None or options.gpus_per_node is not None):
            check_shape(load_config(config_path, overrides, env=env), options)
        cfg, run_dir = prepare_run(config_path, overrides, env=env)
    except ConfigError as err:  # outside an allocation the slots per node come from --gpus-per-node
        hinted = [ConfigIssue(i.key, i.value, f"{i.allowed}; slurm-rl submit: --gpus-per-node G")
                  if i.key == "cluster.gpus_per_node" and i.value is None else i for i in err.issues]
        raise ConfigError(hinted) from err
    ex = make_executor(cfg, run_dir, executor, slurm_params, options)
    per_node = task_per_node()
    job = ex.submit(RankTask(per_node), str(run_dir))
    world = cfg.placement.world_size
    tasks = (1 if executor == "local" else cfg.cluster.num_nodes) if per_node else world
    print(f"run dir: {run_dir}", flush=True)
    print(f"submitted {executor} job {job.job_id} with {tasks} tasks for {world} ranks", flush=True)
    return job
