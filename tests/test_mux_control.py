"""A group's control files: grants are immutable, dense, validated and fenced like epochs; one
group scheduler at a time; a restarted scheduler carries on from the last grant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_rl.control.atomic import atomic_write_json
from slurm_rl.control.errors import EpochOrderError, FencedEpochError, LeaseHeldError, TornFileError
from slurm_rl.control.grants import (Grant, GrantWatcher, GroupPaths, grant_numbers, publish_grant, read_grant,
                                     read_releases, write_member, write_release)
from slurm_rl.control.lease import CoordinatorLease
from slurm_rl.mux.group_scheduler import GroupLoop
from slurm_rl.mux.rotation import decide, grant_from_json, grant_to_json, initial_grant

POOLS = {"rollout": (0, 1), "train": (2, 3)}


def group_doc() -> dict:
    jobs = {j: {"iterations": 2, "samples": 8, "world_size": 4, "slot_capacity": 8,
                "rank_slots": {"0": ["train", 2], "1": ["train", 3], "2": ["rollout", 0], "3": ["rollout", 1]}}
            for j in ("a", "b")}
    return {"pools": {p: list(s) for p, s in POOLS.items()}, "tail_fraction": 1.0, "tail_slots": 1,
            "poll_interval_s": 0.01, "timeout_s": 5, "jobs": jobs}


def grant(n: int, generation: int) -> Grant:
    pools, done = grant_to_json(initial_grant(POOLS, ("a", "b")))
    return Grant(grant=n, generation=generation, created_at=0.0, pools=pools, done=done)


def test_grants_round_trip_dense_and_immutable(tmp_path: Path) -> None:
    paths = GroupPaths(tmp_path).ensure()
    with CoordinatorLease(paths) as lease:
        g = lease.generation
        publish_grant(paths, grant(0, g), g)
        with pytest.raises(EpochOrderError, match="already published"):
            publish_grant(paths, grant(0, g), g)
        with pytest.raises(EpochOrderError, match="dense"):
            publish_grant(paths, grant(2, g), g)
        publish_grant(paths, grant(1, g), g)
    assert grant_numbers(paths) == [0, 1]
    back = read_grant(paths, 1)
    assert grant_from_json(back.pools, back.done) == initial_grant(POOLS, ("a", "b"))


def test_a_stale_group_scheduler_is_fenced(tmp_path: Path) -> None:
    paths = GroupPaths(tmp_path).ensure()
    with CoordinatorLease(paths) as first:
        old = first.generation
        publish_grant(paths, grant(0, old), old)
        with pytest.raises(LeaseHeldError):  # a second scheduler refuses to start
            CoordinatorLease(paths).acquire()
    with CoordinatorLease(paths) as second:  # the first one died; a new generation takes over
        new = second.generation
        assert new == old + 1
        publish_grant(paths, grant(1, new), new)
        with pytest.raises(FencedEpochError, match="newer group scheduler"):  # the old one wakes up
            publish_grant(paths, grant(2, old), old)
    watcher = GrantWatcher(paths, 0.0, "test rank")
    assert watcher.poll(force=True).grant == 1 and watcher.highest_generation == new
    # a grant of an older generation after a newer one is refused by the ranks
    stale = grant(2, old).to_json()
    atomic_write_json(paths.grant(2), stale)
    with pytest.raises(FencedEpochError, match="older"):
        watcher.poll(force=True)


@pytest.mark.parametrize("doc, field", [
    ({"grant": "1", "generation": 1, "pools": {}, "done": {}}, "grant"),
    ({"grant": 1, "generation": 1, "pools": {"rollout": {"slots": {"x": None}}}, "done": {}}, "slots"),
    ({"grant": 1, "generation": 1, "pools": {"rollout": {"slots": {"0": {"job": 3}}}}, "done": {}}, "pools.rollout.slots.0"),
    ({"grant": 1, "generation": 1, "pools": {}, "done": []}, "done"),
])
def test_a_malformed_grant_is_refused_naming_the_field(tmp_path: Path, doc: dict, field: str) -> None:
    paths = GroupPaths(tmp_path).ensure()
    paths.grants_dir.mkdir(parents=True)
    paths.grant(1).write_text(json.dumps(doc))
    with pytest.raises(TornFileError, match=field):
        read_grant(paths, 1)


def test_a_torn_grant_is_never_taken(tmp_path: Path) -> None:
    paths = GroupPaths(tmp_path).ensure()
    paths.grants_dir.mkdir(parents=True)
    paths.grant(0).write_text('{"grant": 0, "generation": 1, "pools": {')  # cut short
    with pytest.raises(TornFileError):
        GrantWatcher(paths, 0.0, "test rank").poll(force=True)


def test_a_restarted_group_scheduler_carries_on_from_the_last_grant(tmp_path: Path) -> None:
    paths = GroupPaths(tmp_path).ensure()
    atomic_write_json(tmp_path / "group.json", group_doc())
    with CoordinatorLease(paths) as lease:
        loop = GroupLoop(paths, group_doc(), lease.generation, log=lambda m: None)
        loop.publish(loop.grant, ["group started"])
        # both jobs wait for their rollout of iteration 0: a takes the rollout pool
        for job in ("a", "b"):
            for rank, slot in ((2, 0), (3, 1)):
                write_member(paths, job, rank, {"state": "waiting", "pool": "rollout", "slot": slot, "iteration": 0})
        change = loop.observe()
        loop.publish(*decide(loop.grant, change))
        assert loop.grant.pools["rollout"].turn.job == "a"
    # the scheduler dies; a's ranks release their slots meanwhile
    for slot in (0, 1):
        write_release(paths, "a", "rollout", 0, slot, {"started_at": 0.0})
    assert set(read_releases(paths, "a", "rollout", 0)) == {0, 1}
    with CoordinatorLease(paths) as lease:
        loop = GroupLoop(paths, group_doc(), lease.generation, log=lambda m: None)
        assert loop.number == 1 and loop.grant.pools["rollout"].turn.job == "a"  # read back, not restarted
        new, events = decide(loop.grant, loop.observe())
        assert new.done["a"]["rollout"] == 0 and new.pools["rollout"].turn.job == "b", events
        loop.publish(new, events)
        assert read_grant(paths, 2).generation == lease.generation
