"""Start one rank: discover it, start its heartbeat (and the coordinator on rank 0), run the loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from slurm_rl.config import Config, ReusableConfig, load_config
from slurm_rl.control.activity import announce_phase
from slurm_rl.control.heartbeats import HeartbeatWriter
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.launch import zygote
from slurm_rl.launch.rank_env import RankInfo, bind_accelerators, check_node, discover_rank
from slurm_rl.resume.restart import read_resume_point
from slurm_rl.resume.stop import install_stop_handlers
from slurm_rl.worker.errors import CoordinatorFailed
from slurm_rl.worker.runtime import Roles, RunStopped, WorkerRuntime

COORDINATOR_RANK = 0


def make_roles(cfg: Config, info: RankInfo, paths: RunPaths) -> Roles:
    """The one iteration protocol over the compute of ``runtime.device`` (engines load lazily)."""
    from slurm_rl.worker.compute import make_compute
    from slurm_rl.worker.protocol import IterationProtocol

    from slurm_rl.worker.activity import RecordingCompute

    if cfg.runtime.device != "emulated":
        announce_phase(paths, info.rank, info.host, f"importing torch, joining the process group, building the "
                                                    f"actor model ({cfg.runtime.device})")
    compute = RecordingCompute(make_compute(cfg, info, paths), paths, info.rank, info.host,
                               builds_engines=cfg.runtime.device != "emulated")
    return IterationProtocol(cfg, info, paths, compute)


def start_coordinator(run_dir: Path, log_dir: Path) -> subprocess.Popen:
    """The coordinator as its own process next to rank 0 (separate interpreter: no GIL sharing; forked
    by a zygote where one serves, :func:`slurm_rl.launch.zygote.command`)."""
    log = open(log_dir / "coordinator.log", "ab")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(zygote.command("slurm_rl.scheduler.coordinator", [str(run_dir)], "emulated", env),
                            stdout=log, stderr=subprocess.STDOUT, env=env)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class CoordinatorSupervisor:
    """Rank 0's watch over the coordinator process: one killed mid-run (by a signal, the OOM
    killer, a crash outside its own error handling) is restarted up to
    ``runtime.coordinator_restarts`` times; the new generation takes the lease and carries on
    from the files. A coordinator that recorded a failure in its status is not restarted."""

    def __init__(self, run_dir: Path, log_dir: Path, restarts: int) -> None:
        self.run_dir, self.log_dir, self.restarts_left = run_dir, log_dir, restarts
        self.proc: subprocess.Popen = start_coordinator(run_dir, log_dir)
        self.restarted = 0

    def __call__(self) -> None:
        """Raise when the coordinator is gone for good; restart it when it may be."""
        rc = self.proc.poll()
        if rc in (None, 0):
            return
        status = read_coordinator_status(RunPaths(self.run_dir))
        if (status is not None and status.failed) or self.restarts_left <= 0:
            raise CoordinatorFailed(f"coordinator process {self.proc.pid} exited with code {rc} "
                                    f"({self.restarted} restarts; see logs/coordinator.log): {(status.error if status else None) or ''}")
        self.restarts_left -= 1
        self.restarted += 1
        print(f"rank 0: coordinator process {self.proc.pid} exited with code {rc}; starting generation "
              f"{self.restarted + 1} of this incarnation ({self.restarts_left} restarts left)", file=sys.stderr, flush=True)
        self.proc = start_coordinator(self.run_dir, self.log_dir)


def run_worker(run_dir: Path, loaded: ReusableConfig | None = None) -> int:
    """Run one rank to the end; returns its exit code (0 on success). ``loaded``: the run's config as
    the process that forked this rank read it (taken where the file and environment read the same)."""
    info = discover_rank()
    config_path = run_dir / "config.yaml"
    cfg = load_config(config_path) if loaded is None else loaded.get(config_path)
    paths = RunPaths(run_dir)
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"[rank {info.rank}/{info.world_size} host {info.host} source {info.source}] run dir {run_dir}", flush=True)
    if info.world_size != cfg.placement.world_size:
        print(
            f"rank {info.rank}: the launcher started {info.world_size} ranks but the placement needs "
            f"{cfg.placement.world_size} (cluster.component_placement)",
            file=sys.stderr,
        )
        return 2
    wrong_node = check_node(cfg.placement, info)
    if wrong_node is not None:
        print(wrong_node, file=sys.stderr)
        return 2
    # The rank's own accelerators (several when it owns several slots); a co-execution group
    # member keeps the node's list: it computes on the GPU of its group slot.
    if cfg.mux.group_dir is None:
        visible = bind_accelerators(cfg.placement, info, os.environ)
        print(f"[rank {info.rank}] slots {list(cfg.placement.slots_of_rank[info.rank])} "
              f"CUDA_VISIBLE_DEVICES={visible if visible is not None else os.environ.get('CUDA_VISIBLE_DEVICES', '')}",
              flush=True)
    # Slurm's --signal (forwarded by sbatch/train.sh), submitit's USR2 and preemption's SIGTERM
    # must not kill the rank: they ask for a checkpoint and a stop at the next iteration gate.
    install_stop_handlers(run_dir, f"rank {info.rank}", lambda m: print(m, file=sys.stderr, flush=True))
    point = read_resume_point(run_dir)
    heartbeat = HeartbeatWriter(paths, info.rank, info.host, cfg.runtime.heartbeat_interval_s)
    heartbeat.start()
    announce_phase(paths, info.rank, info.host, "started")
    coordinator = (CoordinatorSupervisor(run_dir, log_dir, cfg.runtime.coordinator_restarts)
                   if info.rank == COORDINATOR_RANK else None)
    roles = make_roles(cfg, info, paths)
    if point is not None and point.checkpoint is not None:
        print(f"[rank {info.rank}] resuming at iteration {point.iteration} from {point.checkpoint}", flush=True)
        roles.restore(run_dir / point.checkpoint)
    runtime = WorkerRuntime(
        info=info,
        paths=paths,
        poll_interval_s=cfg.runtime.poll_interval_s,
        wait_timeout_s=cfg.runtime.wait_timeout_s,
        num_iterations=cfg.train.num_iterations,
        roles_impl=roles,
        watchdog=coordinator,
        first_iteration=point.iteration if point is not None else 0,
        after_epoch=point.after_epoch if point is not None else -1,
    )
    try:
        try:
            runtime.run()
        except RunStopped as stopped:
            print(f"[rank {info.rank}] {stopped}", flush=True)
            runtime.report("stopped")
            roles.close(finished=False)
        if coordinator is not None:
            rc = coordinator.proc.wait(timeout=cfg.runtime.ack_timeout_s)
            if rc != 0:
                print(f"rank {info.rank}: coordinator exited with code {rc} (see logs/coordinator.log)", file=sys.stderr)
                return 1
        return 0
    except Exception as exc:
        traceback.print_exc()
        try:
            runtime.report("failed", error=f"{type(exc).__name__}: {exc}")
        except Exception:
            pass
        return 1
    finally:
        heartbeat.stop()
        _stop(None if coordinator is None else coordinator.proc)
        time.sleep(0)
