"""The live coordinator: read progress, run the policy, publish epochs, wait for acks.

It runs as its own process on the node of rank 0 (started by rank 0, so it never slows rank 0's
work) and holds the coordinator lease for the whole run. Desired state is the epoch it publishes;
observed state is acks and progress files (level-triggered, like a Kubernetes controller).

When every rank waits at an iteration gate, the policy sees phase ``start`` (e.g. return to the
initial placement); then the iteration is released. Inside an iteration the policy is consulted
every ``defaults.LIVE_TICK_S`` and whenever the actor's mini-batch cutter waits at a boundary
(its progress ``boundary_at``; answered through the status field ``checked_at``), on a
``SchedState`` built from the ranks' progress counters. Decisions for the iteration boundary wait
for the gate; a placement that fails validation is logged (``rejected`` event) and not published;
an epoch that is not acknowledged in ``runtime.ack_timeout_s`` (or whose missing rank has a stale
heartbeat) fails the run with an error naming the epoch, ranks and hosts. Each published decision
logs its decision latency (state read -> published) and switch latency (published -> all acked).

The actor's tensor-parallel size in force starts at ``actor.tensor_parallel`` (a restarted
coordinator takes it from the last epoch; a resumed run starts on its config's placement and size);
a decision's ``actor_tp`` changes it. Every
epoch carries it in ``placement["actor"]["tp"]`` and in ``extra["actor_tp"]`` (also while the
actor holds no ranks); a decision with the same ranks but another size is a new epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from slurm_rl.config import Config, load_config
from slurm_rl.control.acks import AckWaiter
from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.epochs import Epoch, EpochStore
from slurm_rl.control.events import append_event
from slurm_rl.control.heartbeats import stale_ranks
from slurm_rl.control.lease import CoordinatorLease
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import ProgressReader, RankProgress
from slurm_rl.control.status import read_coordinator_status, write_coordinator_status
from slurm_rl.job_limits import run_limit
from slurm_rl.control.errors import ControlError, DeadRankError, WaitTimeout
from slurm_rl.metrics import read_metrics
from slurm_rl.resume import checkpoints
from slurm_rl.resume.restart import read_resume_point
from slurm_rl.resume.stop import install_stop_handlers, read_stop, request_stop
from slurm_rl.scheduler import defaults
from slurm_rl.scheduler.cost_model import reshard_fraction
from slurm_rl.scheduler.errors import CheckpointFailed
from slurm_rl.scheduler.history import History
from slurm_rl.scheduler.live_state import (
    PolicyFn,
    build_policy,
    build_state,
    check_setup,
    epoch_actor_tp,
    initial_decision,
    last_minibatch,
    live_tick,
    placement_json,
    policy_config,
    restart_decision,
    start_placement,
)
from slurm_rl.scheduler.placement_ops import mid_iteration_problems, placement_problems
from slurm_rl.scheduler.recorder import HistoryRecorder
from slurm_rl.scheduler.state import Decision, RankMap, SchedState, normalize_placement
from slurm_rl.trackers import TrackerPump

TRACK_EVERY_S = 0.5  # how often the coordinator looks for new metrics rows for runtime.logger's trackers
TRACK_DRAIN_S = 60.0  # at the end, how long it waits for the last iteration's row (the actor leader appends it)


@dataclass
class CoordinatorLoop:
    """One coordinator generation driving one run."""

    cfg: Config
    paths: RunPaths
    generation: int
    policy: PolicyFn
    log: Callable[[str], None] = lambda msg: print(msg, flush=True)

    def __post_init__(self) -> None:
        self.store = EpochStore(self.paths)
        self.world = list(range(self.cfg.placement.world_size))
        self.progress = ProgressReader(self.paths, self.world)
        self.runtime = self.cfg.runtime
        self.released_epoch: int | None = None  # the epoch in force when the last iteration was released
        self.rejected: set[str] = set()
        self.dead_hosts: list[str] = []  # hosts of the ranks found dead (to exclude on requeue)
        self.checked_at = 0.0  # state-read time of the last policy call that answered a boundary
        self.tick_s = max(self.runtime.poll_interval_s, defaults.LIVE_TICK_S)
        self.current: Epoch | None = self.store.latest()  # not None when a coordinator restarts
        self.resume = read_resume_point(self.paths.run_dir)
        # A new incarnation (resumed run) starts from its checkpoint's gate with the config's placement.
        self.fresh = self.current is None or (self.resume is not None and self.current.epoch == self.resume.after_epoch)
        self.first_iteration = self.resume.iteration if self.resume is not None else 0
        self.released = self.first_iteration - 1
        if not self.fresh:  # a restarted coordinator carries on from what its predecessor released
            previous = read_coordinator_status(self.paths)
            if previous is not None and previous.state in ("starting", "running", "checkpointing"):
                if previous.released_iteration is not None:
                    self.released = previous.released_iteration
                self.released_epoch = previous.released_epoch
                self.checked_at = float(previous.checked_at or 0.0)
        # what the run measured about itself (the plan policy's forecast reads it); a restarted or
        # resumed coordinator goes on from the history its predecessor wrote
        history = None
        if self.paths.history.exists():
            try:
                history = History.from_json(read_json(self.paths.history))
            except (ControlError, KeyError, TypeError, ValueError) as exc:
                self.log(f"history {self.paths.history} not used ({exc}); the forecast starts afresh")
        # a resumed run's ranks may still report the iteration before its gate: that one is in the history
        self.recorder = HistoryRecorder(history, first_iteration=self.first_iteration)
        self.released_at = time.time()
        self.measuring = self.fresh  # a restarted generation saw only part of the iteration in flight
        self.seen_minibatch = -1
        self.seen_switch: float | None = None
        self.seen_growth = 0.0  # fraction of the actor's state the last switch moved
        # DP of the ranks holding the actor's state (a held-back actor leaves it there)
        self.actor_state_dp: int | None = None
        # the actor's tensor-parallel size in force: the configured one, or the last epoch's
        self.actor_tp: int = self.cfg.actor.tensor_parallel
        self.trackers = TrackerPump(self.paths.run_dir, self.cfg, self.log)  # runtime.logger
        if self.current is not None:
            self.actor_tp = epoch_actor_tp(self.current) or self.actor_tp

    # -- publishing -----------------------------------------------------------------------------
    def _hosts(self) -> dict[int, str]:
        progress = self.progress.read()
        return {r: doc.host or "?" for r, doc in progress.items()}

    def publish(self, decision: Decision, iteration: int, state_read_at: float,
                state: SchedState | None = None) -> Epoch:
        """Publish the decision as the next epoch and wait until every rank acknowledged it."""
        number = 0 if self.current is None else self.current.epoch + 1
        tp = self._decision_tp(decision)
        epoch = Epoch(
            epoch=number,
            generation=self.generation,
            created_at=time.time(),
            reason=decision.reason,
            iteration=iteration,
            boundary=decision.boundary,
            placement=placement_json(decision, actor_tp=tp),
            previous=None if self.current is None else self.current.epoch,
            extra={"migrate_from": list(decision.migrate_from), "actor_tp": tp},
        )
        self.store.publish(epoch, generation=self.generation)
        published = time.time()
        acks = AckWaiter(
            self.paths,
            number,
            self.world,
            hosts=self._hosts(),
            heartbeat_timeout_s=self.runtime.heartbeat_timeout_s,
            poll_interval_s=self.runtime.poll_interval_s,
        ).wait(self.runtime.ack_timeout_s)
        last_ack = max(float(a.get("applied_at", published)) for a in acks.values())
        append_event(
            self.paths,
            "decision",
            {
                "epoch": number,
                "generation": self.generation,
                "iteration": iteration,
                "reason": decision.reason,
                "boundary": decision.boundary,
                "actor_tp": tp,
                "phase": None if state is None else state.phase,
                "mid_iteration": state is not None and state.phase != "start",
                "progress": None if state is None else _progress_summary(state),
                "decision_latency_s": published - state_read_at,
                "forecast_end_s": decision.forecast_end_s,  # seconds into the iteration (None: no forecast)
                "switch_latency_s": max(0.0, last_ack - published),
                "published_at": published,
            },
        )
        self.current = epoch
        self.actor_tp = tp
        growth = 0.0
        if decision.placement.get("actor"):
            new_dp = len(decision.placement["actor"]) // tp
            old_dp = self.actor_state_dp
            if old_dp is None:  # not moved yet: epoch 0's actor ranks hold it (the ranks build it there)
                old_dp = len(start_placement(self.cfg).get("actor", ())) // tp
            growth, self.actor_state_dp = reshard_fraction(old_dp, new_dp), new_dp
        if state is not None and state.phase != "start":
            self.seen_switch = max(0.0, last_ack - state_read_at)
            self.seen_growth = growth
        return epoch

    def status(self, state: str, **extra: Any) -> None:
        doc = {"generation": self.generation, "state": state, "released_iteration": self.released,
               "released_epoch": self.released_epoch,
               "checked_at": self.checked_at, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
        doc.update(extra)
        write_coordinator_status(self.paths, doc)

    # -- loop -----------------------------------------------------------------------------------
    def check_alive(self) -> None:
        stale = stale_ranks(self.paths, self.world, self.runtime.heartbeat_timeout_s, time.time())
        if stale:
            hosts = self._hosts()
            self.dead_hosts = sorted({hosts.get(r, "?") for r in stale} - {"?"})
            described = ", ".join(
                f"rank {r} (host {hosts.get(r, '?')}, last heartbeat "
                + ("never" if age is None else f"{age:.1f}s ago")
                + ")"
                for r, age in sorted(stale.items())
            )
            raise DeadRankError(f"dead ranks (heartbeat older than {self.runtime.heartbeat_timeout_s}s): {described}")

    def _decision_tp(self, decision: Decision) -> int:
        """The actor's tensor-parallel size under ``decision``: its ``actor_tp``, else the size in force."""
        return self.actor_tp if decision.actor_tp is None else decision.actor_tp

    def _resume_tp(self) -> int:
        """The size a resumed run starts with: ``actor.tensor_parallel`` of the config it resumes
        with, as it starts on the configured placement (the ranks re-build the actor at that size
        and load the full checkpoint; a policy may change it later)."""
        return self.cfg.actor.tensor_parallel

    def _usable(self, decision: Decision) -> list[str]:
        """Why ``decision`` cannot be carried out (empty when it can)."""
        return placement_problems(decision.placement, self.world, policy_config(self.cfg),
                                  self.cfg.train.global_batch_size, self.cfg.train.micro_batch_size,
                                  allow_empty_actor=True, actor_tp=self._decision_tp(decision))

    def decide_mid_iteration(self, iteration: int, progress: Mapping[int, RankProgress], read_at: float) -> Epoch | None:
        """Consult the policy inside ``iteration`` (level-triggered); publish what it decides.

        Decisions for the iteration boundary wait for the gate; a placement that fails validation
        is logged once and not published (the placement in force stays: the fallback).
        """
        assert self.current is not None
        state = build_state(self.cfg, self.current, progress, iteration, at_gate=False,
                            elapsed_s=max(0.0, read_at - self.released_at), actor_state_dp=self.actor_state_dp,
                            actor_tp=self.actor_tp)
        state = dataclasses.replace(state, history=self._observe(state, progress))
        decision = self.policy(state)
        if decision is None or decision.boundary == "iteration":
            return None
        current = self._placement()
        if self._keeps(decision, current):
            return None
        problems = self._usable(decision) + mid_iteration_problems(current, decision.placement)
        if problems:
            key = repr((sorted(decision.placement.items()), decision.actor_tp))
            if key not in self.rejected:
                self.rejected.add(key)
                append_event(self.paths, "rejected", {"iteration": iteration, "reason": decision.reason,
                                                      "problems": problems, "phase": state.phase})
                self.log(f"iteration {iteration}: policy decision not carried out ({'; '.join(problems)})")
            return None
        return self.publish(decision, iteration=iteration, state_read_at=read_at, state=state)

    def _placement(self) -> RankMap:
        """The placement of the epoch in force, as the policies write theirs."""
        assert self.current is not None
        return normalize_placement({c: s["ranks"] for c, s in self.current.placement.items()})

    def _keeps(self, decision: Decision, current: RankMap) -> bool:
        """The decision leaves the placement ``current`` and the actor's TP in force as they are."""
        return decision.placement == current and decision.actor_tp in (None, self.actor_tp)

    def _observe(self, state: SchedState, progress: Mapping[int, RankProgress]) -> History:
        """Record what the ranks report into the run's history (``scheduler.history``)."""
        mb = last_minibatch(progress, state.iteration)
        seen = None
        if mb is not None and mb.index > self.seen_minibatch:
            self.seen_minibatch = mb.index
            if mb.seconds and not mb.resharded:  # a reshard's time is not training
                seen = (mb.dp // self.actor_tp, mb.seconds, mb.tokens or 0)
        switch, self.seen_switch = self.seen_switch, None
        return self.recorder.observe(live_tick(state, progress, seen, switch, self.seen_growth))

    def run(self) -> None:
        """Drive the run from epoch 0 to the release of the final gate."""
        num_iterations = self.cfg.train.num_iterations
        self.status("starting")
        if self.cfg.scheduler.policy in ("auto", "plan"):
            check_setup(self.cfg)
        checkpoints.remove_staging(self.paths.run_dir)  # left by a coordinator killed while checkpointing
        if self.fresh:
            decision = initial_decision(self.cfg)
            if self.resume is not None:
                decision = dataclasses.replace(decision, reason=f"resumed at iteration {self.first_iteration} "
                                                                f"(incarnation {self.resume.incarnation})",
                                               actor_tp=self._resume_tp())
            self.publish(decision, iteration=self.first_iteration, state_read_at=time.time())
        else:  # a new generation re-publishes the placement in force, which fences the old one
            restart = restart_decision(self.current, f"coordinator restarted (generation {self.generation})")
            self.publish(restart, iteration=self.current.iteration, state_read_at=time.time())
        self.status("running")
        limit = run_limit(self.runtime.run_timeout_s, self.runtime.checkpoint_margin_s)
        self.log(f"run time limit: {limit.describe()}")
        limit_stop = False
        last_track = 0.0
        last_liveness = 0.0
        last_tick = 0.0
        dynamic = self.cfg.scheduler.policy != "static"
        while self.released < num_iterations:
            read_at = time.time()
            progress = self.progress.read()
            gate = _all_at_gate(progress, self.world)
            if gate is not None and gate > self.released:
                if self.released >= self.first_iteration and self.measuring:
                    history = self.recorder.end_iteration(read_at - self.released_at)
                    atomic_write_json(self.paths.history, history.to_json(), durable=False)
                    self.seen_minibatch = -1
                if self.at_gate_checkpoint(gate, progress):
                    self.trackers.poll()
                    self.trackers.close()
                    return  # stopped after the checkpoint (preemption, time limit, slurm-rl stop)
                if gate < num_iterations:
                    state = build_state(self.cfg, self.current, progress, gate, at_gate=True,
                                        history=self.recorder.history, actor_state_dp=self.actor_state_dp,
                                        actor_tp=self.actor_tp)
                    decision = self.policy(state)
                    if decision is not None and self._keeps(decision, self._placement()):  # say why, publish nothing
                        append_event(self.paths, "kept", {"iteration": gate, "reason": decision.reason})
                        self.log(f"iteration {gate}: placement kept ({decision.reason})")
                    elif decision is not None:
                        self.publish(decision, iteration=gate, state_read_at=read_at, state=state)
                self.released = gate
                self.released_at = time.time()
                self.measuring = True
                self.released_epoch = self.current.epoch if self.current is not None else None
                append_event(self.paths, "release", {"iteration": gate, "released_at": time.time()})
                self.status("running")
                continue
            boundary = max((d.boundary_at or 0.0 for d in progress.values()), default=0.0)
            asked = boundary > self.checked_at  # the actor waits at a mini-batch boundary for a decision
            if not dynamic and 0 <= self.released < num_iterations and time.monotonic() - last_tick >= self.tick_s:
                last_tick = time.monotonic()  # static: nothing to decide, the history is still recorded
                assert self.current is not None
                self._observe(build_state(self.cfg, self.current, progress, self.released, at_gate=False,
                                          elapsed_s=max(0.0, read_at - self.released_at),
                                          actor_tp=self.actor_tp), progress)
            if dynamic and 0 <= self.released < num_iterations and (asked or time.monotonic() - last_tick >= self.tick_s):
                last_tick = time.monotonic()
                published = self.decide_mid_iteration(self.released, progress, read_at)
                if asked:
                    self.checked_at = read_at
                    self.status("running", checked_at=read_at)
                    append_event(self.paths, "boundary", {"iteration": self.released, "boundary_at": boundary,
                                                          "checked_at": read_at, "answered_at": time.time(),
                                                          "published": published is not None})
                if published is not None:
                    continue
            if time.monotonic() - last_track > TRACK_EVERY_S:  # runtime.logger: each new metrics row, live
                self.trackers.poll()
                last_track = time.monotonic()
            if time.monotonic() - last_liveness > self.runtime.heartbeat_interval_s:
                self.check_alive()
                last_liveness = time.monotonic()
            if not limit_stop and time.time() > limit.deadline:  # stop at the next gate, with a checkpoint
                limit_stop = True
                request_stop(self.paths.run_dir, f"run time limit reached: {limit.describe()}")
                self.log(f"run time limit reached ({limit.describe()}): stopping at the next gate with a checkpoint")
            if time.time() > limit.deadline + self.runtime.checkpoint_margin_s:
                raise WaitTimeout(f"run did not stop within runtime.checkpoint_margin_s={self.runtime.checkpoint_margin_s}s "
                                  f"of its time limit ({limit.describe()})")
            time.sleep(self.runtime.poll_interval_s)
        self.status("finished")
        self.trackers.drain(num_iterations - 1, timeout_s=TRACK_DRAIN_S)

    # -- checkpoints and stop requests ----------------------------------------------------------
    def at_gate_checkpoint(self, gate: int, progress: Mapping[int, RankProgress]) -> bool:
        """Every rank waits at ``gate``: take the checkpoint that is due (every
        ``runtime.checkpoint_every`` gates, or asked for by a stop request), then stop if asked.
        Returns True when the run stopped."""
        stop = read_stop(self.paths.run_dir)
        if stop is not None and int(stop.get("at_iteration") or 0) > gate:
            stop = None  # asked to stop at a later gate
        num_iterations = self.cfg.train.num_iterations
        if gate >= num_iterations:
            return False  # the run is complete: a late stop request changes nothing
        every = self.runtime.checkpoint_every
        due = (every > 0 and gate % every == 0) or (stop is not None and stop.get("checkpoint", True))
        taken = None
        if due and gate > self.first_iteration:  # the first gate of an incarnation is its checkpoint
            taken = self.take_checkpoint(gate)
        if stop is None:
            return False
        self.status("stopped", stopped_at_iteration=gate, stop=stop, requeue=True,
                    checkpoint=None if taken is None else str(taken))
        append_event(self.paths, "stopped", {"iteration": gate, "reason": stop.get("reason"),
                                             "checkpoint": None if taken is None else taken.name})
        self.log(f"run stopped at the gate of iteration {gate} ({stop.get('reason')}); "
                 f"resume with: slurm-rl run --resume {self.paths.run_dir}")
        return True

    def take_checkpoint(self, gate: int) -> Path:
        """Checkpoint at ``gate``: every rank writes its part into the staging directory (the
        actor by its DP rank 0), then the manifest seals it. Returns the checkpoint directory."""
        existing = checkpoints.checkpoints_dir(self.paths.run_dir) / checkpoints.checkpoint_name(gate)
        if existing.is_dir():
            try:
                checkpoints.verify(existing)
                return existing  # taken by a predecessor killed before it released the gate
            except checkpoints.CheckpointError as exc:
                self.log(f"replacing {exc}")
        started = time.time()
        staging = checkpoints.staging_dir(self.paths.run_dir, gate, self.generation)
        staging.mkdir(parents=True, exist_ok=True)
        self.status("checkpointing", checkpoint={"iteration": gate, "dir": str(staging)})
        deadline = time.monotonic() + self.runtime.wait_timeout_s
        while True:
            progress = self.progress.read()
            missing = [r for r in self.world if r not in progress or progress[r].checkpointed != str(staging)]
            if not missing:
                break
            failed = {r: d.error for r, d in progress.items() if d.state == "failed"}
            if failed:
                raise CheckpointFailed(f"checkpoint of iteration {gate}: ranks failed while writing it: {failed}")
            self.check_alive()
            if time.monotonic() > deadline:
                hosts = self._hosts()
                raise WaitTimeout(f"checkpoint of iteration {gate} (epoch {self.current.epoch if self.current else None}): "
                                  f"ranks {[(r, hosts.get(r, '?')) for r in missing]} did not write their part into "
                                  f"{staging} within runtime.wait_timeout_s={self.runtime.wait_timeout_s}s")
            time.sleep(self.runtime.poll_interval_s)
        assert self.current is not None
        actor = sorted(self.current.ranks_of("actor"))
        path = checkpoints.finalize(staging, iteration=gate, epoch=self.current.epoch, generation=self.generation,
                                    metrics_rows=len(read_metrics(self.paths.run_dir)),
                                    extra={"policy": self.cfg.scheduler.policy, "world_size": len(self.world),
                                           "actor_ranks": actor, "released_epoch": self.released_epoch})
        removed = checkpoints.prune(self.paths.run_dir, self.runtime.keep_checkpoints)
        nbytes = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        append_event(self.paths, "checkpoint", {"iteration": gate, "path": path.name, "bytes": nbytes,
                                                "seconds": time.time() - started, "pruned": [p.name for p in removed]})
        self.log(f"checkpoint {path} ({nbytes} bytes, {time.time() - started:.2f}s)")
        self.status("running")
        return path


def _progress_summary(state: SchedState) -> dict[str, Any]:
    return {"running": state.rollout.running, "pending": state.rollout.pending,
            "finished": state.rollout.finished, "inference_done": state.inference.done,
            "minibatches_done": state.actor.minibatches_done, "actor_busy": state.actor.busy}


def _all_at_gate(progress: Mapping[int, RankProgress], world: list[int]) -> int | None:
    """The gate every rank waits at, or None while some rank is elsewhere."""
    gates = set()
    for rank in world:
        doc = progress.get(rank)
        if doc is None or doc.state != "at_gate" or doc.gate is None:
            return None
        gates.add(doc.gate)
    return gates.pop() if len(gates) == 1 else None


def run_coordinator(run_dir: Path) -> int:
    """Entry point: take the lease and drive the run; returns a process exit code.

    A failure is recorded in the status (workers read it at their next wait). With
    ``runtime.on_rank_failure: checkpoint_and_requeue`` a dead or stuck rank marks the status
    ``requeue`` (with the hosts to exclude): ``sbatch/train.sh`` requeues the job, which resumes
    from the last checkpoint."""
    paths = RunPaths(run_dir)
    # USR1/USR2 reach the whole step (the coordinator shares rank 0's process group): a stop
    # request, like on the ranks. SIGTERM ends the coordinator; rank 0 starts the next generation.
    install_stop_handlers(run_dir, "coordinator", lambda m: print(m, flush=True), (signal.SIGUSR1, signal.SIGUSR2))
    with CoordinatorLease(paths) as lease:
        assert lease.generation is not None
        generation = lease.generation
        loop: CoordinatorLoop | None = None
        try:
            cfg = load_config(run_dir / "config.yaml")
            loop = CoordinatorLoop(cfg, paths, generation, build_policy(cfg))
            loop.run()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            rank_failure = isinstance(exc, (DeadRankError, WaitTimeout))
            requeue = bool(rank_failure and loop is not None and loop.runtime.on_rank_failure == "checkpoint_and_requeue")
            # the log first: the failed status stops the ranks, and the launcher may then kill this
            # process before it writes another line (an empty coordinator.log was seen under load)
            traceback.print_exc()
            print(f"coordinator failed: {error}", file=sys.stderr, flush=True)
            if loop is not None:
                try:  # what the run measured so far stays in the trackers
                    loop.trackers.close()
                except Exception as close_exc:  # noqa: BLE001  (a tracker's own failure must not hide the run's)
                    print(f"trackers: closing failed: {close_exc}", file=sys.stderr, flush=True)
            write_coordinator_status(paths, {"generation": generation, "state": "failed", "error": error,
                                             "rank_failure": rank_failure, "requeue": requeue,
                                             "exclude": loop.dead_hosts if loop is not None else [],
                                             "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_rl.scheduler.coordinator")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    return run_coordinator(args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
