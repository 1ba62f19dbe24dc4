"""Bad input everywhere: corrupted, truncated or mistyped control and data files, an unsafe RUN_DIR,
paths escaping RUN_DIR. Each gives an error naming the file (and the field); nothing is unpickled,
nothing is consumed (no epoch applied, no ack counted, no shard yielded, no ticket claimed)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl.config import ConfigError
from slurm_rl.control import (AckWaiter, Epoch, EpochStore, EpochWatcher, HeartbeatWriter, RunPaths, TornFileError,
                              atomic_write_json, lease_generation, read_all_progress, read_heartbeat, read_lease,
                              stale_ranks, write_ack, write_progress)
from slurm_rl.control.grants import Grant, GrantWatcher, GroupPaths, publish_grant, read_members, write_member
from slurm_rl.control.status import read_coordinator_status, write_coordinator_status
from slurm_rl.data import (ROLLOUTS, CorruptShardError, InvalidManifestError, StageReader, StageWriter,
                           claim_pending, list_pending, write_expected, write_pending)
from slurm_rl.data.emulated import make_fake_prompts, make_fake_requests, make_fake_rollouts
from slurm_rl.data.layout import expected_path, manifest_path, stage_dir
from slurm_rl.data.migration import _parse_ticket, pending_dir
from slurm_rl.launch.prepare import prepare_run
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
GEN = 1


class _Marker:
    """Unpickling this creates ``path``: a test that a reader never unpickles."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.path), "w"))


@dataclass
class Kind:
    """One kind of file: how to write a valid one, read it back, and check nothing was consumed."""

    name: str
    write: Callable[[Path], Path]          # writes a valid file under root, returns its path
    read: Callable[[Path], object]         # what a consumer does with it (must raise on bad input)
    unconsumed: Callable[[Path], None]     # after a failed read: nothing was taken
    field: tuple[str, object]              # a field (dotted path into the document) and a bad value for it
    error: type[Exception] = TornFileError
    probe: Callable[[Path], object] | None = None  # a non-consuming read of the valid file (default: read)


def _epoch(n: int) -> Epoch:
    return Epoch(epoch=n, generation=GEN, created_at=time.time(), reason="test", iteration=n, boundary="iteration",
                 placement={"actor": {"ranks": [0, 1], "dp": 2, "tp": 1, "pp": 1}}, previous=n - 1 if n else None)


def _paths(root: Path) -> RunPaths:
    paths = RunPaths(root).ensure()
    if not paths.lease.exists():
        atomic_write_json(paths.lease, {"generation": GEN, "holder": None})
    return paths


def _kinds() -> list[Kind]:
    watchers: dict[Path, EpochWatcher] = {}
    waiters: dict[Path, AckWaiter] = {}
    readers: dict[Path, list] = {}
    grant_watchers: dict[Path, GrantWatcher] = {}

    def epoch_write(root: Path) -> Path:
        EpochStore(_paths(root)).publish(_epoch(0), GEN)
        return _paths(root).epoch(0)

    def epoch_read(root: Path) -> object:
        watchers[root] = EpochWatcher(_paths(root))
        return watchers[root].poll()

    def ack_write(root: Path) -> Path:
        write_ack(_paths(root), 0, 1, "n1", 1.0, 2.0)
        return _paths(root).ack(0, 1)

    def ack_read(root: Path) -> object:
        waiters[root] = AckWaiter(_paths(root), 0, [1], heartbeat_timeout_s=None)
        return waiters[root].wait(0.05)

    def grant_write(root: Path) -> Path:
        paths = GroupPaths(root).ensure()
        atomic_write_json(paths.lease, {"generation": GEN, "holder": None})
        publish_grant(paths, Grant(0, GEN, 1.0, {"rollout": {"slots": {"0": None}}}, {}), GEN)
        return paths.grant(0)

    def grant_read(root: Path) -> object:
        grant_watchers[root] = GrantWatcher(GroupPaths(root), 0.0, "rank 0")
        return grant_watchers[root].poll(force=True)

    def manifest_write(root: Path) -> Path:
        with StageWriter(root, 1, "rollouts", 0, ROLLOUTS) as w:
            w.write(make_fake_rollouts(make_fake_prompts(1, 2, 8, seed=0), 2, 8))
        return manifest_path(root, 1, "rollouts", 0)

    def manifest_read(root: Path) -> object:
        readers[root] = []
        for table in StageReader(root, 1, "rollouts", [0], timeout_s=0.2, poll_interval_s=0.01).iter_shards():
            readers[root].append(table)
        return readers[root]

    def expected_write(root: Path) -> Path:
        manifest_write(root)
        return write_expected(root, 1, "rollouts", [0])

    def expected_read(root: Path) -> object:
        readers[root] = []
        for table in StageReader(root, 1, "rollouts", None, timeout_s=0.2, poll_interval_s=0.01).iter_shards():
            readers[root].append(table)
        return readers[root]

    def ticket_write(root: Path) -> Path:
        write_pending(root, 2, 3, make_fake_requests(make_fake_prompts(2, 2, 8, seed=0), 2))
        return pending_dir(root, 2) / "pending-0003-000000-000.json"

    def nothing_read(root: Path) -> None:
        assert readers[root] == []

    return [
        Kind("epoch", epoch_write, epoch_read,
             lambda root: (watchers[root].current == -1) or pytest.fail("epoch applied"), ("iteration", "x")),
        Kind("ack", ack_write, ack_read, lambda root: (waiters[root].acks == {}) or pytest.fail("ack counted"),
             ("seen_at", "soon")),
        Kind("progress", lambda root: write_progress(_paths(root), 2, {"state": "working", "iteration": 0})
             or _paths(root).progress(2), lambda root: read_all_progress(_paths(root), [2]), lambda root: None,
             ("iteration", "one")),
        Kind("status", lambda root: write_coordinator_status(_paths(root), {"generation": GEN, "state": "running",
                                                                            "released_iteration": 0})
             or _paths(root).control / "coordinator.json", lambda root: read_coordinator_status(_paths(root)),
             lambda root: None, ("released_iteration", "0")),
        Kind("heartbeat", lambda root: HeartbeatWriter(_paths(root), 3, "n1").beat() or _paths(root).heartbeat(3),
             lambda root: stale_ranks(_paths(root), [3], 30.0), lambda root: None, ("time", "now")),
        Kind("lease", lambda root: _paths(root).lease, lambda root: lease_generation(_paths(root)), lambda root: None,
             ("generation", -4)),
        Kind("grant", grant_write, grant_read,
             lambda root: (grant_watchers[root].latest is None) or pytest.fail("grant taken"), ("created_at", "x")),
        Kind("member", lambda root: write_member(GroupPaths(root).ensure(), "a", 0, {"state": "parked"})
             or GroupPaths(root).member("a", 0), lambda root: read_members(GroupPaths(root), "a"), lambda root: None,
             ("rank", 7)),
        Kind("manifest", manifest_write, manifest_read, nothing_read, ("shards.0.rows", -1), InvalidManifestError),
        Kind("expected", expected_write, expected_read, nothing_read, ("producer_ranks", [0, "1"]),
             InvalidManifestError),
        Kind("ticket", ticket_write, lambda root: claim_pending(root, 2, 0),
             lambda root: (list_pending(root, 2) == ["pending-0003-000000-000.json"]) or pytest.fail("claimed"),
             ("rows", "7"), InvalidManifestError,
             probe=lambda root: _parse_ticket(pending_dir(root, 2) / "pending-0003-000000-000.json", "t")),
    ]


KINDS = {k.name: k for k in _kinds()}


def _corrupt(path: Path, how: str, marker: Path) -> None:
    data = path.read_bytes()
    path.unlink()  # the valid file may be write-once (hard-linked); replace it
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "binary":
        path.write_bytes(bytes(range(256)))
    elif how == "pickle":
        path.write_bytes(pickle.dumps(_Marker(marker)))
    elif how == "not-an-object":
        path.write_bytes(b"[1, 2, 3]\n")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated", "empty", "binary", "pickle", "not-an-object"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_corrupt_file_is_refused_naming_it_and_nothing_is_consumed(tmp_path: Path, kind: str, how: str) -> None:
    spec = KINDS[kind]
    root = tmp_path / "run"
    path = spec.write(root)
    (spec.probe or spec.read)(root)  # the valid file reads fine (so the failure below is the corruption's)
    marker = tmp_path / "unpickled"
    _corrupt(path, how, marker)
    with pytest.raises(spec.error) as info:
        spec.read(root)
    assert str(path) in str(info.value), str(info.value)
    assert not marker.exists(), "a reader unpickled a file from shared storage"
    spec.unconsumed(root)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_mistyped_field_is_refused_naming_file_and_field(tmp_path: Path, kind: str) -> None:
    spec = KINDS[kind]
    root = tmp_path / "run"
    path = spec.write(root)
    doc = json.loads(path.read_bytes())
    field, value = spec.field
    *parents, last = field.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    path.unlink()
    path.write_text(json.dumps(doc))
    with pytest.raises(spec.error) as info:
        spec.read(root)
    message = str(info.value)
    assert str(path) in message and last in message and repr(value) in message, message
    spec.unconsumed(root)


def test_missing_field_is_named(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    write_ack(paths, 0, 1, "n1", 1.0, 2.0)
    doc = json.loads(paths.ack(0, 1).read_bytes())
    del doc["applied_at"]
    paths.ack(0, 1).write_text(json.dumps(doc))
    with pytest.raises(TornFileError, match=r"rank-0001.json: field 'applied_at' is missing"):
        AckWaiter(paths, 0, [1], heartbeat_timeout_s=None).wait(0.05)


def test_heartbeat_of_another_rank_is_refused(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    HeartbeatWriter(paths, 3, "n1").beat()
    os.replace(paths.heartbeat(3), paths.heartbeat(4))
    with pytest.raises(TornFileError, match=r"rank-0004.json: field 'rank' is 3, expected 4"):
        read_heartbeat(paths, 4)
    assert read_lease(paths)["generation"] == GEN


# -- paths escaping RUN_DIR ---------------------------------------------------------------------------
def _stage(root: Path) -> Path:
    with StageWriter(root, 1, "rollouts", 0, ROLLOUTS) as w:
        w.write(make_fake_rollouts(make_fake_prompts(1, 2, 8, seed=0), 2, 8))
    return manifest_path(root, 1, "rollouts", 0)


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "shard-0000-000000.arrow/../../x.arrow",
                                  "sub/shard-0000-000000.arrow", "..\\shard-0000-000000.arrow",
                                  ".shard-0000-000000.arrow", "shard-0001-000000.arrow", 7])
def test_manifest_shard_reference_outside_its_stage_is_refused(tmp_path: Path, name: object) -> None:
    mpath = _stage(tmp_path)
    doc = json.loads(mpath.read_bytes())
    doc["shards"][0]["name"] = name
    mpath.write_text(json.dumps(doc))
    got = []
    with pytest.raises(InvalidManifestError) as info:
        for t in StageReader(tmp_path, 1, "rollouts", [0], timeout_s=1).iter_shards():
            got.append(t)
    assert str(mpath) in str(info.value) and "shards[0].name" in str(info.value) and repr(name) in str(info.value)
    assert got == []


def test_shard_symlinked_outside_run_dir_is_refused_even_with_a_matching_checksum(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _stage(run)
    shard = stage_dir(run, 1, "rollouts") / "shard-0000-000000.arrow"
    outside = tmp_path / "elsewhere.arrow"
    outside.write_bytes(shard.read_bytes())  # identical bytes: size and xxh3 match the manifest
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(CorruptShardError, match="symbolic link") as info:
        StageReader(run, 1, "rollouts", [0], timeout_s=1).read_all()
    assert info.value.path == str(shard)


def test_pending_ticket_pointing_outside_is_refused_and_stays_unclaimed(tmp_path: Path) -> None:
    write_pending(tmp_path, 2, 3, make_fake_requests(make_fake_prompts(2, 2, 8, seed=0), 2))
    ticket = pending_dir(tmp_path, 2) / "pending-0003-000000-000.json"
    doc = json.loads(ticket.read_bytes())
    doc["arrow"] = "../../iter-000001/rollouts/shard-0000-000000.arrow"
    ticket.unlink()
    ticket.write_text(json.dumps(doc))
    with pytest.raises(InvalidManifestError, match=r"pending-0003-000000-000.json: field 'arrow'"):
        claim_pending(tmp_path, 2, 0)
    assert list_pending(tmp_path, 2) == [ticket.name]


def test_expected_file_of_another_stage_is_refused(tmp_path: Path) -> None:
    _stage(tmp_path)
    write_expected(tmp_path, 1, "rollouts", [0])
    path = expected_path(tmp_path, 1, "rollouts")
    doc = json.loads(path.read_bytes()) | {"stage": "inference"}
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidManifestError, match=r"expected.json: field 'stage' is 'inference', expected 'rollouts'"):
        StageReader(tmp_path, 1, "rollouts", None, timeout_s=1).read_all()


# -- an unsafe RUN_DIR ----------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def _unsafe(run_dir: Path, how: str) -> str:
    """Make ``run_dir`` unsafe in one way; returns what the error must say."""
    run_dir.mkdir(mode=0o700)
    if how == "other-owner":
        os.chown(run_dir, 65534, 65534)
        return "owned by uid 65534"
    if how == "world-writable":
        os.chmod(run_dir, 0o777)
        return "mode is 0777"
    if how == "control-other-owner":
        (run_dir / "control").mkdir(mode=0o700)
        os.chown(run_dir / "control", 65534, 65534)
        return "owned by uid 65534"
    if how == "control-world-writable":
        (run_dir / "control").mkdir(mode=0o700)
        os.chmod(run_dir / "control", 0o757)
        return "mode is 0757"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["other-owner", "world-writable", "control-other-owner", "control-world-writable"])
def test_unsafe_run_dir_is_refused_at_launch_with_exit_2(tmp_path: Path, how: str) -> None:
    if how.endswith("other-owner") and os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    run_dir = tmp_path / "run"
    needle = _unsafe(run_dir, how)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    proc = _cli("run", str(write_config(tmp_path / "c.yaml", emulated_config(run_dir))))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "runtime.run_dir" in proc.stderr and needle in proc.stderr, proc.stderr
    assert "starting" not in proc.stdout  # no rank launched
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # nothing written into it
    with pytest.raises(ConfigError, match="runtime.run_dir"):
        prepare_run(tmp_path / "c.yaml")


def test_run_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.write_text("not a directory")
    with pytest.raises(ConfigError, match="runtime.run_dir: got .*run'; allowed: a directory"):
        prepare_run(write_config(tmp_path / "c.yaml", emulated_config(run_dir)))


def test_own_private_run_dir_is_accepted_and_tightened(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o750)
    _, prepared = prepare_run(write_config(tmp_path / "c.yaml", emulated_config(run_dir)))
    assert prepared == run_dir and (run_dir / "config.yaml").exists()
    assert os.stat(run_dir).st_mode & 0o777 == 0o700
    assert not list(run_dir.glob(".*.tmp"))


def test_torn_progress_file_fails_the_reader_not_the_writer(tmp_path: Path) -> None:
    """A rank's next (atomic) progress write replaces a corrupt file: writers never read it."""
    paths = _paths(tmp_path)
    paths.progress(2).write_bytes(b'{"state": "work')
    with pytest.raises(TornFileError, match="rank-0002.json: not a complete JSON document"):
        read_all_progress(paths, [2])
    write_progress(paths, 2, {"state": "working", "iteration": 0})
    assert read_all_progress(paths, [2])[2].state == "working"



def test_unknown_engine_key_is_refused_at_launch_with_exit_2(tmp_path: Path) -> None:
    """``algorithm.*`` typos were once ignored until a rank built its engines: now refused up front."""
    run_dir = tmp_path / "run"
    doc = emulated_config(run_dir) | {"algorithm": {"kl_coeff": 0.1}, "actor": {"lr": -1}}
    proc = _cli("run", str(write_config(tmp_path / "c.yaml", doc)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("algorithm.kl_coeff: got 0.1; allowed: one of the keys adv_estimator, norm_adv_by_std_in_grpo, gamma, "
            "clip_eps, clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode, kl_coef, kl_loss_type, entropy_coeff, "
            "use_kl_in_reward, kl_penalty, kl_ctrl, temperature" in proc.stderr)
    assert "actor.lr: got -1" in proc.stderr, proc.stderr
    assert "starting" not in proc.stdout and not run_dir.exists()  # nothing launched, nothing written


def test_shared_ranks_a_dynamic_policy_cannot_move_are_refused_before_a_launch(tmp_path: Path) -> None:
    """``auto`` runs a hybrid placement with its shared ranks pinned; what it cannot do there is refused by
    validate (exit 2, naming the key), not by the coordinator once the ranks have started: a pre-process
    that would lend the actor's shared rank to the rollout, and a placement where the actor holds every rank
    (nothing left to move). ``plan`` refuses shared ranks: it chooses co-location by itself."""
    import yaml

    from emulated_configs import emulated_config

    def validate(placement: dict, policy: str = "auto", **cluster) -> subprocess.CompletedProcess:
        cfg = emulated_config(tmp_path / "run", gpus_per_node=2, iterations=1)
        cfg["cluster"].update(auto_scheduler=True, component_placement=placement, **cluster)
        cfg["scheduler"] = {"policy": policy}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
        return subprocess.run([*CLI, "validate", str(tmp_path / "c.yaml")], capture_output=True, text=True,
                              timeout=120)

    hybrid = {"actor,inference": "0", "rollout": "1"}
    proc = validate(hybrid)
    assert proc.returncode == 0 and "mode: hybrid" in proc.stdout, proc.stdout + proc.stderr
    proc = validate(hybrid, use_pre_process_policy=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cluster.use_pre_process_policy: got True; allowed: false where the actor's ranks are shared (ranks " \
           "0): pre-process lends the actor's ranks to the rollout" in proc.stderr
    proc = validate({"actor,rollout,inference": "all"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cluster.component_placement: got {'actor,rollout,inference': 'all'}; allowed: a placement where " \
           "scheduler.policy auto can move a rank" in proc.stderr and "the actor holds every rank already (ranks " \
           "0-1 shared): scheduler.policy static" in proc.stderr
    proc = validate(hybrid, policy="plan")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "allowed: components on separate ranks under scheduler.policy plan (ranks 0 are shared; plan chooses " \
           "co-location by itself, per iteration)" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_bad_algorithm_options_exit_2_naming_each_key(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    doc = emulated_config(run_dir) | {"algorithm": {"adv_estimator": "gae", "clip_ratio_low": 1.5,
                                                    "loss_agg_mode": "mean", "kl_loss_type": "k4",
                                                    "use_kl_in_reward": True, "kl_ctrl": {"type": "pid", "horizon": 0},
                                                    "old_logprobs": "rollout", "rollout_is": "truncated",
                                                    "rollout_is_cap": 0},
                                      "actor": {"ppo_epochs": 0}}
    proc = _cli("run", str(write_config(tmp_path / "c.yaml", doc)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "algorithm.adv_estimator: got 'gae'" in proc.stderr and "a critic in cluster.component_placement" in proc.stderr
    assert "algorithm.clip_ratio_low: got 1.5; allowed: null (clip_eps) or a number in [0, 1)" in proc.stderr
    assert "algorithm.loss_agg_mode: got 'mean'; allowed: one of token-mean, seq-mean-token-sum" in proc.stderr
    assert "algorithm.kl_loss_type: got 'k4'" in proc.stderr
    assert "algorithm.kl_ctrl.type: got 'pid'; allowed: one of fixed, adaptive" in proc.stderr
    assert "algorithm.kl_ctrl.horizon: got 0" in proc.stderr
    assert "algorithm.rollout_is: got 'truncated'; allowed: none while algorithm.old_logprobs is rollout" in proc.stderr
    assert "algorithm.rollout_is_cap: got 0.0; allowed: a number > 0" in proc.stderr
    assert "actor.ppo_epochs: got 0; allowed: a positive" in proc.stderr
    assert "starting" not in proc.stdout and not run_dir.exists()  # nothing launched, nothing written
