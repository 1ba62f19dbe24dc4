"""Epoch documents, dense numbering, path validation, and the watcher's one-lookup-per-poll contract."""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_profiles import examples

from slurm_rl.control import (Epoch, EpochOrderError, EpochStore, EpochWatcher, FencedEpochError, RunPaths,
                              TornFileError, UnsafePathError, WaitTimeout, atomic_write_json, safe_join)

GEN = 1


def _epoch(n: int, generation: int = GEN, **overrides: object) -> Epoch:
    fields = dict(epoch=n, generation=generation, created_at=1000.0 + n, reason="scale", iteration=n,
                  boundary="iteration", previous=n - 1 if n else None, extra={"note": "x"},
                  placement={"actor": {"ranks": [0, 1], "dp": 2, "tp": 1, "pp": 1},
                             "rollout": {"ranks": [2, 3, 4, 5], "dp": 2, "tp": 2, "pp": 1, "engine": "vllm"}})
    fields.update(overrides)
    return Epoch(**fields)  # type: ignore[arg-type]


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    paths = RunPaths(tmp_path / "run").ensure()
    atomic_write_json(paths.lease, {"generation": GEN, "holder": None})
    return paths


def test_epoch_json_round_trip_and_helpers() -> None:
    epoch = _epoch(3)
    doc = epoch.to_json()
    assert doc["schema"] == 1
    assert Epoch.from_json(doc) == epoch
    assert epoch.role_of(3) == ["rollout"] and epoch.ranks_of("actor") == [0, 1] and epoch.role_of(9) == []


@pytest.mark.parametrize("change, message", [
    ({"schema": 2}, "unsupported epoch schema 2"),
    ({"generation": "1"}, "'generation' must be a non-negative int"),
    ({"epoch": True}, "'epoch' must be a non-negative int"),
    ({"surprise": 1}, r"unknown keys \['surprise'\]"),
    ({"placement": {"actor": {"ranks": [0, 0], "dp": 1, "tp": 1, "pp": 1}}}, r"placement.actor.ranks has duplicates"),
    ({"placement": {"actor": {"ranks": [0], "dp": 0, "tp": 1, "pp": 1}}}, r"placement.actor.dp must be an int >= 1"),
    ({"previous": 3}, "'previous' must be null or an int below 3"),
])
def test_epoch_validation_names_file_and_field(change: dict, message: str) -> None:
    doc = {**_epoch(3).to_json(), **change}
    with pytest.raises(TornFileError, match=f"000003.json: {message}"):
        Epoch.from_json(doc, "epochs/000003.json")


def test_publish_enforces_dense_numbering(paths: RunPaths) -> None:
    store = EpochStore(paths)
    with pytest.raises(EpochOrderError, match="epoch 1 is not published; numbering must be dense"):
        store.publish(_epoch(2), GEN)
    store.publish(_epoch(0), GEN)
    with pytest.raises(EpochOrderError, match="epoch 0 is already published at .*000000.json"):
        store.publish(_epoch(0), GEN)
    with pytest.raises(EpochOrderError, match="'previous' is 0, expected 1"):
        store.publish(_epoch(2, previous=0), GEN)
    store.publish(_epoch(1), GEN)
    assert paths.acks_dir(1).is_dir()
    assert [e.epoch for e in store.all()] == [0, 1] and store.latest() == _epoch(1)
    os.unlink(paths.epoch(0))
    with pytest.raises(EpochOrderError, match=r"not dense, missing \[0\]"):
        store.all()


def test_publish_requires_the_lease_generation(paths: RunPaths) -> None:
    with pytest.raises(FencedEpochError, match="carries generation 2 but the publisher holds lease generation 1"):
        EpochStore(paths).publish(_epoch(0, generation=2), GEN)


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../b", "a/..", "", "C:/x", "\\\\server\\x", "a\x00b"])
def test_safe_join_rejects_paths_leaving_the_root(tmp_path: Path, rel: str) -> None:
    with pytest.raises(UnsafePathError):
        safe_join(tmp_path, rel)


def test_safe_join_accepts_relative_paths_and_rejects_symlink_escape(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    assert safe_join(root, "data/iter-000001/rollout/shard-0000.arrow") == root / "data/iter-000001/rollout/shard-0000.arrow"
    assert safe_join(root, "./a//b") == root / "a" / "b"
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError, match="outside"):
        safe_join(root, "out/secret")


class _FsCounter:
    """Counts path lookups that a poll may do."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        for module, name in [(os, "open"), (os, "stat"), (os, "lstat"), (os, "listdir"), (os, "scandir"),
                             (os, "access"), (builtins, "open")]:
            monkeypatch.setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name: str, func):  # noqa: ANN001, ANN202
        def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self.calls[name] += 1
            return func(*args, **kwargs)
        return counted


def test_poll_does_exactly_one_lookup_per_call(paths: RunPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    store = EpochStore(paths)
    store.publish(_epoch(0), GEN)
    watcher = EpochWatcher(paths, start_after=-1)
    counter = _FsCounter(monkeypatch)
    assert watcher.poll() == _epoch(0)
    assert counter.calls == Counter({"open": 1})
    for _ in range(50):
        assert watcher.poll() is None
    assert counter.calls == Counter({"open": 51}) and watcher.polls == 51
    monkeypatch.undo()
    store.publish(_epoch(1), GEN)
    counter = _FsCounter(monkeypatch)
    assert watcher.poll() == _epoch(1)
    assert counter.calls == Counter({"open": 1})


def test_poll_interval_backs_off_when_idle_and_resets_on_an_epoch(paths: RunPaths) -> None:
    watcher = EpochWatcher(paths, poll_interval_s=0.01, idle_poll_interval_s=0.1, backoff=2.0)
    intervals = []
    for _ in range(6):
        watcher.poll()
        intervals.append(watcher.interval)
    assert intervals == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])
    EpochStore(paths).publish(_epoch(0), GEN)
    assert watcher.poll() is not None and watcher.interval == 0.01
    watcher.poll()
    watcher.activity()
    assert watcher.interval == 0.01


def test_wait_next_times_out_naming_rank_epoch_and_path(paths: RunPaths) -> None:
    watcher = EpochWatcher(paths, start_after=4, rank=9)
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"rank 9: timed out after 0.2s waiting for reshard plan \(epoch 5 at .*000005.json\)"):
        watcher.wait_next(0.2, what="reshard plan")
    assert 0.2 <= time.monotonic() - start < 5
    assert watcher.polls <= 12  # back-off: not 20 polls of 10 ms


def test_wait_next_returns_an_epoch_published_meanwhile(paths: RunPaths) -> None:
    store = EpochStore(paths)
    store.publish(_epoch(0), GEN)
    watcher = EpochWatcher(paths, start_after=0)
    timer = threading.Timer(0.05, store.publish, args=(_epoch(1), GEN))
    timer.start()
    try:
        assert watcher.wait_next(10, "epoch 1").epoch == 1
    finally:
        timer.join()


def test_torn_epoch_file_is_reported_with_its_path(paths: RunPaths) -> None:
    paths.epoch(0).write_bytes(b'{"epoch": 0, "genera')
    with pytest.raises(TornFileError, match="000000.json"):
        EpochWatcher(paths).poll()
    atomic_write_json(paths.epoch(0), _epoch(1).to_json() | {"epoch": 0, "previous": None})
    atomic_write_json(paths.epoch(1), _epoch(0).to_json())
    watcher = EpochWatcher(paths)
    watcher.poll()
    with pytest.raises(TornFileError, match="000001.json: file holds epoch 0, expected 1"):
        watcher.poll()


@settings(max_examples=examples(300), deadline=None)
@given(rel=st.text(alphabet=st.sampled_from(list("ab./\\:~ \x00")), max_size=12))
def test_safe_join_result_always_stays_under_the_root(tmp_path_factory: pytest.TempPathFactory, rel: str) -> None:
    root = tmp_path_factory.getbasetemp() / "safe-join-root"
    root.mkdir(exist_ok=True)
    try:
        joined = safe_join(root, rel)
    except UnsafePathError:
        return
    resolved, base = joined.resolve(), root.resolve()
    assert resolved == base or base in resolved.parents


def test_poll_if_due_rate_limits_frequent_safe_points(paths: RunPaths) -> None:
    watcher = EpochWatcher(paths, poll_interval_s=0.01, idle_poll_interval_s=0.05)
    end = time.monotonic() + 0.3
    calls = 0
    while time.monotonic() < end:
        watcher.poll_if_due()
        calls += 1
    assert calls > 1000
    assert 3 <= watcher.polls <= 30  # not one lookup per safe point
    EpochStore(paths).publish(_epoch(0), GEN)
    time.sleep(0.06)
    assert watcher.poll_if_due() == _epoch(0)
