"""The live group scheduler of a co-execution group: observe the jobs, rotate the pools, publish grants.

One process per group holds the group's lease (``GROUP_DIR/control/lease``, generations: a second
scheduler refuses to start, a stale one is fenced). Every ``group.poll_interval_s`` it builds a
:class:`~slurm_rl.mux.rotation.GroupView` from files only (level-triggered): which
ranks wait for a grant (``control/members``), which slots were released (``control/releases``),
each job's rollout progress and health (its own RUN_DIR: coordinator status, progress,
heartbeats). It calls the same :func:`rotation.decide` the simulator calls and publishes each
change as the next immutable grant. A job that fails leaves the rotation (``job_failed`` event),
its slots are freed and the others continue. Events go to ``control/events/decisions.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from slurm_rl.control.atomic import JsonCache
from slurm_rl.control.events import append_event
from slurm_rl.control.grants import (Grant, GroupPaths, grant_numbers, publish_grant, read_grant, read_members,
                                     read_releases)
from slurm_rl.control.heartbeats import read_heartbeat
from slurm_rl.control.lease import CoordinatorLease
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import ProgressReader, RankProgress
from slurm_rl.control.status import read_coordinator_status, write_coordinator_status
from slurm_rl.scheduler.errors import GroupTimeout
from slurm_rl.fsio import stat_key
from slurm_rl.mux.group_state import group_json_path, read_group_json
from slurm_rl.mux.membership import membership_lock
from slurm_rl.mux.group_sim import with_member
from slurm_rl.mux.rotation import (POOLS, GroupGrant, GroupView, JobView, decide, grant_from_json,
                                             grant_to_json, initial_grant)

HEARTBEAT_TIMEOUT_S = 30.0  # when a job's config does not say otherwise
# How often a job's heartbeats are checked (every poll would read each rank's file 50 times a
# second to find an age measured against a timeout of tens of seconds).
HEARTBEAT_CHECK_S = 1.0


@dataclass
class GroupLoop:
    """One group scheduler generation."""

    paths: GroupPaths
    group: dict[str, Any]
    generation: int
    log: Callable[[str], None] = lambda msg: print(msg, flush=True)
    out: dict[str, str] = field(default_factory=dict)  # job -> why it left the rotation
    _progress: dict[str, ProgressReader] = field(default_factory=dict, repr=False)  # by job
    _beats_checked: dict[str, float] = field(default_factory=dict, repr=False)  # job -> monotonic time
    _members: JsonCache = field(default_factory=JsonCache, repr=False)  # the member files as last read

    def __post_init__(self) -> None:
        self.members = tuple(self.group.get("members") or self.group["jobs"])
        self.pools = {p: tuple(self.group["pools"][p]) for p in POOLS}
        self.slots: dict[str, dict[str, tuple[int, ...]]] = {}
        self._add_slots(self.group)
        self.poll_s = float(self.group["poll_interval_s"])
        self.seen_releases: set[tuple[str, str, int, int]] = set()
        self.group_key: Any = None  # group.json as last read (None: read it on the first look)
        self.pending: list[str] = []  # joined group.json, ranks not all up yet
        numbers = grant_numbers(self.paths)
        if numbers:  # a restarted scheduler carries on from the last grant (level-triggered)
            last = read_grant(self.paths, numbers[-1])
            self.number, self.grant = last.grant, grant_from_json(last.pools, last.done)
            # the rotation's order (joins insert where the cursor points) and its members are the grant's
            order = last.pools["train"].get("order")
            if order:
                self.members = tuple(order)
        else:
            self.number, self.grant = -1, initial_grant(self.pools, self.members)

    def _add_slots(self, group: dict[str, Any]) -> None:
        for j, spec in group["jobs"].items():
            self.slots[j] = {p: tuple(sorted(s for q, s in spec["rank_slots"].values() if q == p)) for p in POOLS}

    # -- joins ----------------------------------------------------------------------------------
    def joins(self) -> list[str]:
        """Jobs that ``slurm-rl mux add`` put into ``group.json`` and whose ranks are all up now
        enter the rotation (inserted where the train pool's cursor points: one cyclic order on both
        pools). Until every rank of a joining job waits for its first grant, the job is pending
        and holds nobody up: a job whose ranks are still starting gets no turn to keep a pool idle."""
        key = stat_key(group_json_path(self.paths.run_dir))
        if key != self.group_key:
            self.group_key = key
            self.group = read_group_json(self.paths.run_dir)
            self._add_slots(self.group)
            self.pending += [j for j in self.group["members"] if j not in self.members and j not in self.pending]
        joined = []
        for job in list(self.pending):
            why = self._job_health(job)
            if why is not None:  # failed (or stopped) before it ever ran
                self.pending.remove(job)
                append_event(self.paths, "job_failed", {"job": job, "why": f"before joining: {why}"})
                self.log(f"group: job {job} left before joining: {why}")
            elif len(read_members(self.paths, job, self._members)) >= int(self.group["jobs"][job]["world_size"]):
                self.pending.remove(job)
                self.grant, self.members = with_member(self.grant, self.members, job)
                append_event(self.paths, "job_joined", {"job": job, "order": list(self.members)})
                self.log(f"group: job {job} joined; rotation order {list(self.members)}")
                joined.append(job)
        return joined

    # -- observing ------------------------------------------------------------------------------
    def _job_health(self, job: str) -> str | None:
        """Why ``job`` is out of the rotation (finished / failed: ...), or None while it runs."""
        jpaths = RunPaths(self.paths.job_dir(job))
        status = read_coordinator_status(jpaths)
        if status is not None and status.state == "finished":
            return "finished"
        if status is not None and status.state == "stopped":
            return f"stopped: {(status.stop or {}).get('reason', 'stop requested')}"
        if status is not None and status.failed:
            return f"failed: {status.error}"
        for rank, doc in self._job_progress(job).items():
            if doc.state == "failed":
                return f"failed: rank {rank} (host {doc.host or '?'}): {doc.error}"
        if time.monotonic() - self._beats_checked.get(job, -HEARTBEAT_CHECK_S) < HEARTBEAT_CHECK_S:
            return None
        self._beats_checked[job] = time.monotonic()
        timeout = float(self.group["jobs"][job].get("heartbeat_timeout_s", HEARTBEAT_TIMEOUT_S))
        now = time.time()
        for rank in range(int(self.group["jobs"][job]["world_size"])):
            beat = read_heartbeat(jpaths, rank)
            if beat is not None and now - float(beat.get("time", now)) > timeout:
                return f"failed: rank {rank} (host {beat.get('host', '?')}) has no heartbeat for {now - float(beat['time']):.0f}s"
        return None

    def _job_progress(self, job: str) -> dict[int, RankProgress]:
        """Every rank's progress of ``job`` (one reader per job: unchanged files are not parsed again)."""
        reader = self._progress.get(job)
        if reader is None:
            world = range(int(self.group["jobs"][job]["world_size"]))
            reader = self._progress[job] = ProgressReader(RunPaths(self.paths.job_dir(job)), world)
        return reader.read()

    def _rollout_finished(self, job: str, k: int) -> int:
        counters = [d.counters for d in self._job_progress(job).values() if d.iteration == k]
        finished = sum(c.rollout_finished for c in counters)
        received = max((c.actor_received for c in counters), default=0)
        return max(finished, received)

    def observe(self) -> GroupView:
        jobs: dict[str, JobView] = {}
        for job in self.members:
            if job not in self.out:
                why = self._job_health(job)
                if why is not None:
                    self.out[job] = why
                    kind = {"finished": "job_finished", "stopped": "job_stopped"}.get(why.split(":")[0], "job_failed")
                    append_event(self.paths, kind, {"job": job, "why": why})
                    self.log(f"group: job {job} {why}")
            waiting: dict[str, int] = {}
            for doc in read_members(self.paths, job, self._members).values():
                if doc.get("state") == "waiting" and doc.get("pool") in POOLS:
                    waiting[doc["pool"]] = max(waiting.get(doc["pool"], -1), int(doc["iteration"]))
            keys = {(p, h.iteration) for p, pg in self.grant.pools.items()
                    for h in (*pg.slots.values(), pg.turn) if h is not None and h.job == job}
            # and every phase the job started and did not complete (a skipped slot's release may come last)
            started = self.grant.started.get(job, {})
            keys |= {(p, k) for p, k in started.items() if k > self.grant.done[job][p]}
            released = {}
            for p, k in keys:
                docs = read_releases(self.paths, job, p, k)
                released[(p, k)] = frozenset(docs)
                for slot, doc in docs.items():
                    if (job, p, k, slot) not in self.seen_releases:
                        self.seen_releases.add((job, p, k, slot))
                        append_event(self.paths, "phase", {**doc, "job": job, "pool": p, "iteration": k, "slot": slot})
            turn = self.grant.pools["rollout"].turn
            spec = self.group["jobs"][job]
            samples = int(spec["samples"])
            finished = self._rollout_finished(job, turn.iteration) if turn is not None and turn.job == job else 0
            jobs[job] = JobView(slots=self.slots[job], iterations=int(spec["iterations"]), waiting=waiting,
                                released=released, rollout_fraction=finished / max(1, samples), out=job in self.out,
                                rollout_left=samples - finished, slot_capacity=int(spec.get("slot_capacity", 0)))
        return GroupView(members=self.members, jobs=jobs, tail_fraction=float(self.group["tail_fraction"]),
                         tail_slots=int(self.group["tail_slots"]),
                         schedule=str(self.group.get("schedule", "round_robin")))

    # -- publishing -----------------------------------------------------------------------------
    def publish(self, grant: GroupGrant, events: list[str]) -> None:
        pools, done = grant_to_json(grant)
        for doc in pools.values():
            doc["order"] = list(self.members)
        record = Grant(grant=self.number + 1, generation=self.generation, created_at=time.time(), pools=pools,
                       done=done, events=tuple(events))
        publish_grant(self.paths, record, self.generation)
        self.number, self.grant = record.grant, grant
        append_event(self.paths, "grant", {"grant": record.grant, "generation": self.generation, "events": events,
                                           "pools": pools, "published_at": record.created_at})
        for e in events:
            self.log(f"group grant {record.grant}: {e}")

    def status(self, state: str, **extra: Any) -> None:
        write_coordinator_status(self.paths, {"generation": self.generation, "state": state, "grant": self.number,
                                              "out": dict(self.out), "host": socket.gethostname(),
                                              "pid": os.getpid(), "time": time.time(), **extra})

    def run(self, timeout_s: float) -> None:
        """Rotate until every job finished or failed."""
        if self.number < 0:
            self.publish(self.grant, ["group started"])
        self.status("running")
        deadline = time.monotonic() + timeout_s
        while True:
            joined = self.joins()
            if joined:
                self.publish(self.grant, [f"{j} joined the rotation" for j in joined])
            if not self.pending and all(j in self.out for j in self.members) and self._end():
                break
            view = self.observe()
            change = decide(self.grant, view)
            if change is not None:
                self.publish(*change)
                self.status("running")
                continue
            if time.monotonic() > deadline:
                raise GroupTimeout(f"group did not finish within group.timeout_s={timeout_s:.0f}s; jobs still "
                                   f"running: {[j for j in self.members if j not in self.out]}")
            time.sleep(self.poll_s)

    def _end(self) -> bool:
        """Every member left: end the group unless a job joined meanwhile (under the membership
        lock, which ``slurm-rl mux add`` holds while it admits a job)."""
        with membership_lock(self.paths.run_dir):
            joined = self.joins()
            if joined:
                self.publish(self.grant, [f"{j} joined the rotation" for j in joined])
            if joined or self.pending:
                return False
            stopped = {j: why for j, why in self.out.items() if why.startswith("stopped")}
            failed = {j: why for j, why in self.out.items() if why != "finished" and j not in stopped}
            self.status("finished", failed=failed, stopped=stopped)
        return True


def run_group_scheduler(group_dir: Path) -> int:
    """Entry point: take the group lease and rotate; 0 when every job finished, 1 otherwise."""
    paths = GroupPaths(group_dir)
    with CoordinatorLease(paths) as lease:
        assert lease.generation is not None
        group = read_group_json(group_dir)
        loop = GroupLoop(paths, group, lease.generation)
        try:
            loop.run(float(group["timeout_s"]))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            loop.status("failed", error=error)
            traceback.print_exc()
            return 1
    return 0 if all(why == "finished" or why.startswith("stopped") for why in loop.out.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_rl.mux.group_scheduler")
    parser.add_argument("group_dir", type=Path)
    return run_group_scheduler(parser.parse_args(argv).group_dir)


if __name__ == "__main__":
    sys.exit(main())
