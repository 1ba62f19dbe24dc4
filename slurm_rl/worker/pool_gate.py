"""A rank's turn on its group pool (multiplexing): wait for the grant, resume, work, park, release.

Only ranks of a job inside a co-execution group (``mux.group_dir``) have a gate. The rank sits on
one slot of one pool (``group.json``: ``jobs.<job>.rank_slots``). Outside its job's turn the
rank's engines are parked in host memory; :meth:`PoolGate.acquire` waits until the latest grant
gives its slot to its job's phase of the iteration, then resumes the engines in place (warm
switch). :meth:`PoolGate.release` parks them and writes the release file that frees the slot.
A grant that revokes the slot (long-tail migration) is seen by :meth:`PoolGate.revoked`.

The iteration protocol talks to a :class:`PhaseGate`: hooks around an iteration's phases that
pass straight through for a run outside a group; :class:`PoolGate` is the group's gate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Protocol

from slurm_rl.config import Config
from slurm_rl.control.grants import GrantWatcher, GroupPaths, write_member, write_release
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.errors import WaitTimeout, WorkerError
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.mux.group_state import read_group_json


class GroupFailed(WorkerError, RuntimeError):
    """The group scheduler failed or stopped; the job's ranks stop too."""


class GatedRollout(Protocol):
    """What a gate sees of this rank's rollout in an iteration."""

    done: bool
    finished: int

    def hand_back(self, grant: int) -> int:
        """Leave the rollout as grant ``grant`` revoked the slot: unfinished requests go back to
        the job; the rows handed back."""
        ...


class PhaseGate:
    """The hooks the iteration protocol calls around an iteration; all pass straight through (a
    run outside a co-execution group). :class:`PoolGate` gives them the group's turns."""

    def before_iteration(self) -> None:
        """At the start of an iteration, before the weight sync."""

    def enter(self, k: int, check: Callable[[], None], rollout_done: Callable[[], bool]) -> bool:
        """Before this rank works on iteration ``k``: True when it may; False when its work is
        already done elsewhere (``rollout_done()``: the iteration's rollout is complete)."""
        return True

    def rollout_turn(self, rollout: GatedRollout | None) -> bool:
        """At every step of the iteration; True when the rank's rollout was just handed back."""
        return False

    def after_iteration(self) -> None:
        """Once the iteration is trained."""


class PoolGate(PhaseGate):
    """One rank's slot in its group; see the module docstring."""

    def __init__(self, cfg: Config, info: RankInfo, park: Callable[[], dict[str, Any]],
                 unpark: Callable[[], dict[str, Any]]) -> None:
        assert cfg.mux.group_dir is not None and cfg.mux.job is not None
        self.paths = GroupPaths(Path(cfg.mux.group_dir))
        self.job, self.rank, self.host = cfg.mux.job, info.rank, info.host
        group = read_group_json(self.paths.run_dir)
        self.pool, self.slot = group["jobs"][self.job]["rank_slots"][str(info.rank)]
        self.timeout_s = float(group["timeout_s"])
        self.poll_s = max(float(group["poll_interval_s"]), cfg.runtime.poll_interval_s)
        self.watcher = GrantWatcher(self.paths, self.poll_s, f"{self._who()}")
        self._park, self._unpark = park, unpark
        self.parked = False
        self.holding: int | None = None  # iteration whose grant this rank holds (engines resumed)
        self.acquired: dict[str, Any] = {}

    def _who(self) -> str:
        return f"job {self.job} rank {self.rank} (host {self.host}, {self.pool} slot {self.slot})"

    def _holder(self) -> dict[str, Any] | None:
        grant = self.watcher.poll()
        if grant is None:
            return None
        return grant.pools[self.pool]["slots"].get(str(self.slot))

    def granted(self, k: int) -> bool:
        h = self._holder()
        return h is not None and h["job"] == self.job and h["iteration"] == k and not h.get("revoked")

    def revoked(self) -> bool:
        """True when the rank holds its slot but the latest grant takes it away (tail migration)."""
        if self.holding is None:
            return False
        h = self._holder()
        return h is None or h["job"] != self.job or h["iteration"] != self.holding or bool(h.get("revoked"))

    def park(self) -> dict[str, Any]:
        """Park the engines in host memory (no-op when parked)."""
        if self.parked:
            return {}
        figures = self._park()
        self.parked = True
        return figures

    def acquire(self, k: int, check: Callable[[], None], over: Callable[[], bool] = lambda: False) -> bool:
        """Wait until the grant gives this slot to this job's phase ``k``, then resume the engines;
        True when granted. False when ``over()`` says the phase needs this rank no more (e.g. the
        job's rollout finished on other slots): the slot is released without resuming.

        ``check`` raises when something this rank depends on failed (its job's coordinator).
        """
        self.park()
        waiting_since = time.time()
        write_member(self.paths, self.job, self.rank, {"state": "waiting", "pool": self.pool, "slot": self.slot,
                                                       "iteration": k, "since": waiting_since})
        deadline = time.monotonic() + self.timeout_s
        while not self.granted(k):
            check()
            if over():
                write_release(self.paths, self.job, self.pool, k, self.slot,
                              {"skipped": True, "waited_s": time.time() - waiting_since, "released_at": time.time(),
                               "rank": self.rank, "host": self.host})
                write_member(self.paths, self.job, self.rank, {"state": "parked", "pool": self.pool,
                                                               "slot": self.slot, "iteration": k})
                return False
            status = read_coordinator_status(self.paths)
            if status is not None and status.state in ("failed", "finished"):
                raise GroupFailed(f"{self._who()}: the group scheduler is {status.state} "
                                  f"({status.error or 'no error recorded'}) while waiting for {self.pool} "
                                  f"of iteration {k}")
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{self._who()} waited {self.timeout_s:.0f}s (group.timeout_s) for the grant of "
                                  f"{self.pool} for iteration {k} ({self.paths.grants_dir}, last grant "
                                  f"{None if self.watcher.latest is None else self.watcher.latest.grant})")
            time.sleep(self.poll_s)
        granted_seen = time.time()
        figures = self._unpark()
        self.parked = False
        self.holding = k
        self.acquired = {"waited_s": granted_seen - waiting_since, "granted_seen_at": granted_seen,
                         "grant": self.watcher.latest.grant if self.watcher.latest else None,
                         "resume_s": float(figures.get("seconds", 0.0)), "resume_bytes": int(figures.get("bytes", 0)),
                         "started_at": time.time()}
        write_member(self.paths, self.job, self.rank, {"state": "running", "pool": self.pool, "slot": self.slot,
                                                       "iteration": k, **self.acquired})
        return True

    # -- the protocol's hooks ------------------------------------------------------------------
    def before_iteration(self) -> None:
        """Outside its job's turn a rank's engines stay parked (the weight sync runs parked)."""
        self.park()

    def enter(self, k: int, check: Callable[[], None], rollout_done: Callable[[], bool]) -> bool:
        """Wait for this slot's turn in phase ``k`` (:meth:`acquire`); a rollout slot gives up
        once ``rollout_done()``."""
        return self.acquire(k, check, rollout_done if self.pool == "rollout" else (lambda: False))

    def rollout_turn(self, rollout: GatedRollout | None) -> bool:
        """Free the rollout slot once this rank's rollout is done, or hand the unfinished requests
        to the job's tail and free it when the grant revokes it (True then)."""
        if self.holding is None or self.pool != "rollout":
            return False
        if rollout is None or rollout.done:
            self.release(finished=rollout.finished if rollout else 0)
            return False
        if not self.revoked():
            return False
        grant = self.watcher.latest.grant if self.watcher.latest is not None else 0
        migrated = rollout.hand_back(grant)
        self.release(finished=rollout.finished, migrated=migrated, revoked=True)
        return True

    def after_iteration(self) -> None:
        """The training pool is released once the iteration is trained."""
        self.release()

    # -- turns -----------------------------------------------------------------------------------
    def release(self, **extra: Any) -> None:
        """Park and free the slot (no-op unless holding)."""
        if self.holding is None:
            return
        k, self.holding = self.holding, None
        ended = time.time()
        figures = self.park()
        doc = {**self.acquired, **extra, "ended_at": ended, "park_s": float(figures.get("seconds", 0.0)),
               "park_bytes": int(figures.get("bytes", 0)), "released_at": time.time(), "rank": self.rank,
               "host": self.host}
        write_release(self.paths, self.job, self.pool, k, self.slot, doc)
        write_member(self.paths, self.job, self.rank, {"state": "parked", "pool": self.pool, "slot": self.slot,
                                                       "iteration": k})
