"""The phase-gate hooks of the iteration protocol: a pass-through outside a group, the group's
turns (wait for the grant, resume, release, hand back a revoked rollout) inside one."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurm_rl.control.grants import Grant, GroupPaths, publish_grant, read_members, read_releases
from slurm_rl.control.lease import CoordinatorLease
from slurm_rl.worker.pool_gate import PhaseGate, PoolGate


def test_outside_a_group_every_hook_passes_through() -> None:
    gate = PhaseGate()
    gate.before_iteration()
    assert gate.enter(3, check=lambda: None, rollout_done=lambda: pytest.fail("not asked"))
    assert gate.rollout_turn(None) is False
    gate.after_iteration()


class FakeRollout:
    def __init__(self) -> None:
        self.done, self.finished = False, 5
        self.handed: list[int] = []

    def hand_back(self, grant: int) -> int:
        self.handed.append(grant)
        self.done, self.finished = True, 6
        return 3


class Engines:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def park(self) -> dict[str, Any]:
        self.calls.append("park")
        return {"seconds": 0.5, "bytes": 10}

    def unpark(self) -> dict[str, Any]:
        self.calls.append("unpark")
        return {"seconds": 0.25, "bytes": 10}


def make_gate(tmp_path: Path, pool: str, slot: int) -> tuple[PoolGate, Engines]:
    paths = GroupPaths(tmp_path / "group").ensure()
    (paths.run_dir / "group.json").write_text(json.dumps({
        "timeout_s": 5, "poll_interval_s": 0.01,
        "jobs": {"a": {"rank_slots": {"0": [pool, slot]}}}}))
    cfg = SimpleNamespace(mux=SimpleNamespace(group_dir=str(paths.run_dir), job="a"),
                          runtime=SimpleNamespace(poll_interval_s=0.01))
    engines = Engines()
    gate = PoolGate(cfg, SimpleNamespace(rank=0, host="n0"), engines.park, engines.unpark)  # type: ignore[arg-type]
    return gate, engines


def grant(n: int, generation: int, pool: str, holder: dict[str, Any] | None) -> Grant:
    return Grant(grant=n, generation=generation, created_at=0.0, done={},
                 pools={pool: {"slots": {"0": holder}, "turn": None, "cursor": 0}})


def test_a_rollout_slot_whose_rollout_ended_elsewhere_is_released_unused(tmp_path: Path) -> None:
    gate, engines = make_gate(tmp_path, "rollout", 0)
    gate.before_iteration()
    assert not gate.enter(0, check=lambda: None, rollout_done=lambda: True)
    assert engines.calls == ["park"] and gate.holding is None
    assert read_releases(gate.paths, "a", "rollout", 0)[0]["skipped"] is True
    gate.after_iteration()  # holds nothing: nothing to release
    assert engines.calls == ["park"]


def test_a_granted_rollout_slot_is_handed_back_when_revoked(tmp_path: Path) -> None:
    gate, engines = make_gate(tmp_path, "rollout", 0)
    with CoordinatorLease(gate.paths) as lease:
        g = lease.generation
        publish_grant(gate.paths, grant(0, g, "rollout", {"job": "a", "iteration": 0, "revoked": False}), g)
        gate.before_iteration()
        assert gate.enter(0, check=lambda: None, rollout_done=lambda: False)
        assert engines.calls == ["park", "unpark"] and gate.holding == 0
        assert read_members(gate.paths, "a")[0]["state"] == "running"
        rollout = FakeRollout()
        assert gate.rollout_turn(rollout) is False and rollout.handed == []  # still its turn
        publish_grant(gate.paths, grant(1, g, "rollout", {"job": "a", "iteration": 0, "revoked": True}), g)
        gate.watcher.poll_interval_s = 0.0
        assert gate.rollout_turn(rollout) is True and rollout.handed == [1]
    release = read_releases(gate.paths, "a", "rollout", 0)[0]
    assert (release["revoked"], release["migrated"], release["finished"]) == (True, 3, 6)
    assert engines.calls == ["park", "unpark", "park"] and gate.holding is None
    assert read_members(gate.paths, "a")[0]["state"] == "parked"


def test_a_training_slot_is_held_until_the_iteration_is_trained(tmp_path: Path) -> None:
    gate, engines = make_gate(tmp_path, "train", 0)
    with CoordinatorLease(gate.paths) as lease:
        g = lease.generation
        publish_grant(gate.paths, grant(0, g, "train", {"job": "a", "iteration": 2, "revoked": False}), g)
        # a training slot never gives up on its own: the rollout being done does not matter
        assert gate.enter(2, check=lambda: None, rollout_done=lambda: True)
        assert gate.rollout_turn(FakeRollout()) is False and gate.holding == 2
        gate.after_iteration()
    assert engines.calls == ["park", "unpark", "park"] and gate.holding is None
    assert read_releases(gate.paths, "a", "train", 2)[0]["park_s"] == 0.5
