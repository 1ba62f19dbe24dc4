"""Launch a co-execution group: prepare its directory, start the group scheduler and every job.

``prepare_group`` validates the group file and every job config (``ConfigError``: exit 2, nothing
created), creates ``GROUP_DIR`` (0700) with ``group.json`` (the resolved group) and one ordinary
RUN_DIR per job under ``GROUP_DIR/jobs/<name>`` whose ``config.yaml`` carries ``mux.group_dir`` and
``mux.job``. ``run_group_local`` starts the group scheduler and each job's ranks on this machine;
a job that fails is stopped alone, the others go on. Under Slurm, ``sbatch/mux.sh`` starts the
same processes with ``srun`` (one step per job, all steps on the group's GPUs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from slurm_rl.control.atomic import atomic_write_json
from slurm_rl.fsio import stat_key
from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.paths import RunPaths, create_run_dir
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.config import ConfigError
from slurm_rl.mux.group_file import GroupSpec, load_group
from slurm_rl.mux.group_admission import admit
from slurm_rl.mux.group_state import group_json_path, read_group_json, removed
from slurm_rl.launch import forkserver, zygote
from slurm_rl.launch.local import LaunchError, LocalJob
from slurm_rl.launch.prepare import prepare_run


@dataclass
class GroupResult:
    """How each job ended (``finished`` or the failure) and the group's wall time."""

    group_dir: Path
    seconds: float
    jobs: dict[str, str] = field(default_factory=dict)
    scheduler_rc: int | None = None

    @property
    def ok(self) -> bool:
        return self.scheduler_rc == 0 and all(v in ("finished", "stopped") for v in self.jobs.values())


def prepare_group(path: str | Path, overrides: Sequence[str] = ()) -> GroupSpec:
    """Validate, create ``GROUP_DIR`` and every job's RUN_DIR; the resolved spec."""
    spec = load_group(path, overrides)
    issues, figures = admit(spec, spec.host_memory_gb, spec.gpus_per_node)
    if issues:
        raise ConfigError(issues)
    if spec.dir.exists() and (spec.dir / "control" / "grants").is_dir():
        raise FileExistsError(f"group dir {spec.dir} already holds a group (control/grants); pick another group.dir")
    create_run_dir(spec.dir)
    GroupPaths(spec.dir).ensure()
    (spec.dir / "logs").mkdir(mode=0o700, exist_ok=True)
    (spec.dir / "jobs").mkdir(mode=0o700, exist_ok=True)
    doc = {**spec.to_json(), "admission": figures}
    for job in spec.jobs:
        job_dir = GroupPaths(spec.dir).job_dir(job.name)
        extra = [f"runtime.run_dir={job_dir}", f"mux.group_dir={spec.dir}", f"mux.job={job.name}",
                 f"mux.park_s={spec.park_s}"]
        prepare_run(job.config_path, [*job.overrides, *extra])
        doc["jobs"][job.name]["run_dir"] = str(job_dir)
        doc["jobs"][job.name]["heartbeat_timeout_s"] = job.cfg.runtime.heartbeat_timeout_s
    atomic_write_json(group_json_path(spec.dir), doc)
    return spec


def start_group_scheduler(group_dir: Path) -> subprocess.Popen | zygote.ZygoteProcess:
    """The group scheduler as its own process (log: ``GROUP_DIR/logs/group-scheduler.log``)."""
    with open(group_dir / "logs" / "group-scheduler.log", "ab") as log:
        return zygote.popen("slurm_rl.mux.group_scheduler", [str(group_dir)], "emulated",
                            dict(os.environ, OMP_NUM_THREADS="1"), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


class SrunJob:
    """One job of a group as an ``srun --overlap`` step of the allocation (``sbatch/mux.sh``): where the job's
    ranks fill the allocation's tasks, every node the same number, a task per node
    (:mod:`slurm_rl.launch.node` imports once and forks the node's ranks, as ``sbatch/train.sh`` starts a run),
    each rank where a task per rank would have been; else (``SLURM_RL_FORKSERVER=0`` too) a task per rank."""

    def __init__(self, name: str, run_dir: Path, world_size: int, port: int) -> None:
        self.name = name
        het = int(os.environ.get("SLURM_HET_SIZE", "1"))
        env = dict(os.environ, SLURM_RL_MASTER_PORT=str(port))
        cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
        task = ["-m", "slurm_rl.worker", str(run_dir)]
        if het > 1:  # one step over every component; its tasks are the allocation's (component 0 first)
            tasks = sum(int(os.environ[f"SLURM_NTASKS_HET_GROUP_{c}"]) for c in range(het))
            if world_size != tasks:
                raise LaunchError(f"job {name} has {world_size} ranks but the heterogeneous allocation has "
                                  f"{tasks} tasks")
            placement = [f"--het-group={','.join(str(c) for c in range(het))}"]
        elif per_node := node_step(world_size, env):
            placement = [f"--nodes={len(per_node)}", f"--ntasks={len(per_node)}", "--ntasks-per-node=1",
                         f"--cpus-per-task={cpus * per_node[0]}"]
            env.pop("SLURM_NTASKS_PER_NODE", None)
            task = ["-m", "slurm_rl.launch.node", str(run_dir), "--ranks-per-node", ",".join(map(str, per_node))]
        else:
            placement = [f"--ntasks={world_size}", f"--cpus-per-task={cpus}"]
        log = open(run_dir / "logs" / "srun.log", "ab")
        self.proc = subprocess.Popen(["srun", "--overlap", "--kill-on-bad-exit=1", *placement, sys.executable, *task],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def poll(self) -> dict[int, int] | None:
        rc = self.proc.poll()
        if rc is None:
            return None
        if rc != 0:
            raise LaunchError(f"srun step of job {self.name} exited with code {rc}")
        return {}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def node_step(world_size: int, env: dict[str, str]) -> list[int] | None:
    """The ranks per node of a job's step with a task per node: the allocation's tasks per node
    (``SLURM_TASKS_PER_NODE``) where they hold exactly the job's ranks, every node as many; else None."""
    from slurm_rl.launch.node import tasks_per_node

    if not forkserver.enabled(env):
        return None
    try:
        per_node = tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""))
    except ValueError:
        return None
    if not per_node or sum(per_node) != world_size or len(set(per_node)) != 1:
        return None
    return per_node


def local_job(name: str, run_dir: Path, world_size: int, port: int) -> LocalJob:
    """One job of a group as local processes (``slurm-rl mux``)."""
    return LocalJob(run_dir, world_size)


def run_group_local(group_dir: Path, log: Callable[[str], None] = print,
                    start_job: Callable[[str, Path, int, int], Any] = local_job) -> GroupResult:
    """Run every job of the prepared group at ``group_dir`` (the group scheduler too), starting
    each with ``start_job(name, run_dir, ranks, port)`` (default: on this machine; ``SrunJob``
    under ``sbatch/mux.sh``). Jobs that ``slurm-rl mux add`` admits while the group runs are
    started as they appear in ``group.json``. A failed job is stopped alone, the others go on."""
    started = time.monotonic()
    result = GroupResult(group_dir=group_dir, seconds=0.0)
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if _main_thread() else None
    group = read_group_json(group_dir)
    scheduler = start_group_scheduler(group_dir)
    running: dict[str, Any] = {}
    launched: set[str] = set()
    group_key: Any = None
    try:
        deadline = time.monotonic() + float(group["timeout_s"])
        while True:
            if stat_key(group_json_path(group_dir)) != group_key:  # the members, joins included
                group_key = stat_key(group_json_path(group_dir))
                for name, run_dir, world, port in job_steps(group_dir):
                    if name not in launched:
                        launched.add(name)
                        running[name] = start_job(name, run_dir, world, port)
                        log(f"job {name}: {world} ranks, run dir {run_dir}")
            for name, job in list(running.items()):
                try:
                    codes = job.poll()
                except LaunchError as exc:
                    result.jobs[name] = f"failed: {exc}"
                    log(f"job {name} failed (the other jobs go on): {str(exc).splitlines()[0]}")
                    del running[name]
                    continue
                if codes is not None:
                    result.jobs[name] = _how_it_ended(group_dir, name)
                    log(f"job {name} {result.jobs[name]} after {time.monotonic() - started:.1f}s")
                    del running[name]
            state = _scheduler_state(group_dir)
            if not running and state == "finished":
                break
            if scheduler.poll() not in (None, 0) and state != "finished":
                raise LaunchError(f"group scheduler exited with code {scheduler.returncode} "
                                  f"(see {group_dir / 'logs' / 'group-scheduler.log'}); stopping every job")
            if time.monotonic() > deadline:
                raise LaunchError(f"group did not finish within group.timeout_s={group['timeout_s']}s; "
                                  f"jobs still running: {sorted(running)}")
            time.sleep(0.05)
        try:
            result.scheduler_rc = scheduler.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise LaunchError("group scheduler did not stop within 30s after every job ended") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for job in running.values():
            job.kill()
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
    result.seconds = time.monotonic() - started
    return result


def run_group_task(group_dir: str) -> dict[str, str]:
    """What the one submitit task of ``submit_group`` runs; raises when a job failed."""
    result = run_group_local(Path(group_dir))
    if not result.ok:
        raise LaunchError(f"group {group_dir}: {result.jobs} (group scheduler exit {result.scheduler_rc})")
    return result.jobs


def submit_group(path: str | Path, overrides: Sequence[str] = (), executor: str = "slurm",
                 slurm_params: dict[str, Any] | None = None, options: Any = None) -> Any:
    """Validate and prepare the group, then submit it with submitit: one task on one node runs
    the group scheduler and every job's ranks (``sbatch/mux.sh`` spans several nodes).

    ``options`` (a :class:`slurm_rl.launch.submit.SlurmOptions`): the command line's Slurm options;
    ``--nodes`` must be 1 and ``--gpus-per-node`` must agree with ``group.gpus_per_node``."""
    import submitit

    from slurm_rl.launch.submit import SlurmOptions, SubmitError, check_executor_options, requests_gpus

    options = options or SlurmOptions()
    check_executor_options(executor, options)
    if options.nodes is not None and options.nodes != 1:
        raise SubmitError(f"--nodes: got {options.nodes}; allowed: 1 with --group (submit --group runs the group "
                          "on one node; sbatch/mux.sh starts a group over several)")
    if options.gpus_per_node is not None:
        gpn = load_group(path, overrides).gpus_per_node
        if options.gpus_per_node != gpn:
            raise SubmitError(f"--gpus-per-node: got {options.gpus_per_node}, but the group file has "
                              f"group.gpus_per_node={gpn}; allowed: {gpn} (or group.gpus_per_node={options.gpus_per_node})")
    spec = prepare_group(path, overrides)
    folder = spec.dir / "logs" / "submitit"
    timeout_min = options.time_min or max(1, int(spec.timeout_s // 60) + 1)
    cpus = max(len(spec.slots), max(j.cfg.placement.world_size for j in spec.jobs))
    if executor == "local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=timeout_min)
    else:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        params: dict[str, Any] = dict(nodes=1, ntasks_per_node=1, cpus_per_task=cpus, time=timeout_min,
                                      job_name="slurm-rl-mux")
        if requests_gpus(spec.jobs[0].cfg, options.gpus_per_node):
            params["gres"] = f"gpu:{len(spec.slots)}"
        params.update(options.params())
        params.update(slurm_params or {})
        ex.update_parameters(**params)
    job = ex.submit(run_group_task, str(spec.dir))
    print(f"group dir: {spec.dir}", flush=True)
    print(f"submitted {executor} job {job.job_id}: {len(spec.jobs)} jobs on {len(spec.slots)} slots", flush=True)
    return job


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def job_steps(group_dir: Path) -> list[tuple[str, Path, int, int]]:
    """(job, run dir, ranks, master port) per job still to run (not finished, failed or removed),
    in group order: one ``srun`` step each.

    Every step of an allocation shares ``SLURM_JOB_ID``, so each job gets its own port (from the
    job id's default port upward) for its torch.distributed rendezvous."""
    from slurm_rl.launch.rank_env import port_for_job
    from slurm_rl.mux.group_requeue import member_states

    group = read_group_json(group_dir)
    base = port_for_job(os.environ.get("SLURM_JOB_ID", "local"))
    names = group.get("members") or list(group["jobs"])
    out = removed(group_dir) | {j for j, s in member_states(group_dir).items() if s in ("finished", "failed")}
    return [(name, Path(group["jobs"][name]["run_dir"]), int(group["jobs"][name]["world_size"]), base + 1 + i)
            for i, name in enumerate(names) if name not in out]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slurm_rl.mux.launcher steps GROUP_DIR``: one line per job (name run_dir ranks port);
    ``python -m slurm_rl.mux.launcher srun GROUP_DIR``: run the group inside a Slurm allocation, one
    ``srun`` step per job (joins included); exit 0 when every job finished."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m slurm_rl.mux.launcher")
    parser.add_argument("what", choices=["steps", "srun"])
    parser.add_argument("group_dir", type=Path)
    args = parser.parse_args(argv)
    if args.what == "srun":
        log = lambda msg: print(f"slurm_rl: {msg}", flush=True)  # noqa: E731
        het = int(os.environ.get("SLURM_HET_SIZE", "1"))
        if het > 1:
            tasks = sum(int(os.environ[f"SLURM_NTASKS_HET_GROUP_{c}"]) for c in range(het))
            log(f"heterogeneous allocation, {het} components, {tasks} tasks")
        result = run_group_local(args.group_dir.absolute(), log=log, start_job=SrunJob)
        for name, how in sorted(result.jobs.items()):
            log(f"job {name}: {how}")
        log(f"group scheduler exit code {result.scheduler_rc}; inspect with: slurm-rl inspect {args.group_dir}")
        return 0 if result.ok else 1
    for name, run_dir, world, port in job_steps(args.group_dir):
        print(name, run_dir, world, port)
    return 0


def _how_it_ended(group_dir: Path, name: str) -> str:
    """``stopped`` (a stop request: removed, preempted) or ``finished``, for a job whose ranks exited 0."""
    status = read_coordinator_status(RunPaths(GroupPaths(group_dir).job_dir(name)))
    return "stopped" if status is not None and status.state == "stopped" else "finished"


def _scheduler_state(group_dir: Path) -> str | None:
    """``finished`` once the group scheduler saw every job leave (exit 1: some job failed)."""
    status = read_coordinator_status(GroupPaths(group_dir))
    return status.state if status is not None else None


def _raise_terminated(signum: int, frame: object) -> None:
    raise LaunchError(f"group launcher received signal {signum}; stopping every job")


if __name__ == "__main__":
    sys.exit(main())
