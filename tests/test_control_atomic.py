"""Atomic control files under SIGKILL: readers never see a torn document; exclusive publish has one winner."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import pytest
import xxhash

from slurm_rl.control import (ControlError, CoordinatorLease, Epoch, EpochOrderError, EpochStore, EpochWatcher,
                              RunPaths, TornFileError, atomic_write_json, create_run_dir, read_json,
                              remove_stale_temp_files, write_json_exclusive)
from slurm_rl.control.atomic import TEMP_SUFFIX

GENERATION = 1
# Between two reads of a reader: spinning, the two readers took two cores from the writer they watch (and
# from the rest of the suite): 45k reads each, 22 s of CPU for 11 s alone, 34 s of CPU in the whole suite.
READ_PAUSE_S = 0.0005


def _payload_doc(seq: int, rng: random.Random) -> dict:
    payload = f"{seq:08d}" * rng.randint(1, 8192)  # up to 64 KiB: spans many pages
    return {"seq": seq, "len": len(payload), "digest": xxhash.xxh64_hexdigest(payload.encode()), "payload": payload}


def _check_payload(doc: dict) -> str | None:
    payload = doc.get("payload", "")
    if len(payload) != doc.get("len") or xxhash.xxh64_hexdigest(payload.encode()) != doc.get("digest"):
        return f"inconsistent document seq={doc.get('seq')} len={len(payload)}"
    return None


def _make_epoch(n: int, seq: int, rng: random.Random) -> Epoch:
    return Epoch(epoch=n, generation=GENERATION, created_at=time.time(), reason="test", iteration=n, boundary="iter",
                 placement={"actor": {"ranks": [0, 1], "dp": 2, "tp": 1, "pp": 1}},
                 previous=n - 1 if n else None, extra=_payload_doc(seq, rng))


def _writer(run_dir: str, seed: int) -> None:
    """Rewrite the heartbeat and publish epochs as fast as possible until killed."""
    paths = RunPaths(run_dir)
    store = EpochStore(paths)
    rng = random.Random(seed)
    latest = store.latest()
    n = 0 if latest is None else latest.epoch + 1
    seq = seed * 1_000_000
    while True:
        seq += 1
        if seq % 2:
            atomic_write_json(paths.heartbeat(0), _payload_doc(seq, rng))
        else:
            store.publish(_make_epoch(n, seq, rng), GENERATION)
            n += 1


def _reader(run_dir: str, stop: mp.synchronize.Event, out: mp.Queue) -> None:
    """Read the heartbeat and follow the epoch log every ``READ_PAUSE_S``; report counts and violations."""
    paths = RunPaths(run_dir)
    watcher = EpochWatcher(paths, start_after=-1, rank=0)
    reads = epochs = 0
    errors: list[str] = []
    while not stop.is_set():
        try:
            doc = read_json(paths.heartbeat(0))
            reads += 1
            if (problem := _check_payload(doc)) is not None:
                errors.append(problem)
        except FileNotFoundError:
            pass
        except ControlError as exc:
            errors.append(f"heartbeat: {exc}")
        try:
            while (epoch := watcher.poll()) is not None:
                epochs += 1
                if (problem := _check_payload(epoch.extra)) is not None:
                    errors.append(f"epoch {epoch.epoch}: {problem}")
        except ControlError as exc:
            errors.append(f"epoch: {exc}")
        time.sleep(READ_PAUSE_S)
    out.put({"reads": reads, "epochs": epochs, "last": watcher.current, "errors": errors[:20]})


def _wait_for_first_write(paths: RunPaths, seed: int, writer: mp.process.BaseProcess, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if read_json(paths.heartbeat(0))["seq"] // 1_000_000 == seed:
                return
        except FileNotFoundError:
            pass
        assert writer.is_alive(), f"writer {seed} died with {writer.exitcode} before its first write"
        assert time.monotonic() < deadline, f"writer {seed} wrote no heartbeat to {paths.heartbeat(0)} in {timeout_s}s"
        time.sleep(0.001)


@pytest.mark.slow
def test_readers_never_see_torn_files_while_writer_is_killed(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run").ensure()
    kills = 200
    spawn = mp.get_context("spawn")
    fork = mp.get_context("fork")  # the killed writer is restarted 200 times: fork keeps that cheap
    stop, out = spawn.Event(), spawn.Queue()
    readers = [spawn.Process(target=_reader, args=(str(paths.run_dir), stop, out), daemon=True) for _ in range(2)]
    rng = random.Random(1234)
    with CoordinatorLease(paths) as lease:
        assert lease.generation == GENERATION
        for proc in readers:
            proc.start()
        store = EpochStore(paths)
        try:
            for i in range(kills):
                writer = fork.Process(target=_writer, args=(str(paths.run_dir), i + 1), daemon=True)
                writer.start()
                _wait_for_first_write(paths, i + 1, writer)  # so every life gets to write, even on a busy host
                time.sleep(rng.uniform(0.0, 0.03))
                os.kill(writer.pid, signal.SIGKILL)
                writer.join(10)
                assert writer.exitcode == -signal.SIGKILL, f"writer {i} ended with {writer.exitcode}"
                latest = store.latest()  # the last published epoch is always complete and valid
                assert latest is None or _check_payload(latest.extra) is None
                if paths.heartbeat(0).exists():
                    assert _check_payload(read_json(paths.heartbeat(0))) is None
        finally:
            stop.set()
        results = [out.get(timeout=60) for _ in readers]
        for proc in readers:
            proc.join(30)
    for epoch in store.all():  # dense, every file complete and valid
        assert _check_payload(epoch.extra) is None
    published = len(store.numbers())
    dirs = (paths.epochs_dir, paths.heartbeats_dir)
    leftovers = [name for d in dirs for name in os.listdir(d) if name.endswith(TEMP_SUFFIX)]
    print(json.dumps({"kills": kills, "epochs_published": published, "temp_files_left": len(leftovers),
                      "reader_reads": [r["reads"] for r in results], "reader_epochs": [r["epochs"] for r in results]}))
    assert published >= 20, f"only {published} epochs published in {kills} writer lives"
    for result in results:
        assert result["errors"] == [], result["errors"]
        assert result["reads"] > 100
        assert result["epochs"] > 0
    # killed writers leave temp names behind; listing and reading ignored them above, cleanup removes them
    assert sum(remove_stale_temp_files(d, older_than_s=0, now=time.time() + 1) for d in dirs) == len(leftovers)
    assert all(not name.endswith(TEMP_SUFFIX) for d in dirs for name in os.listdir(d))
    assert len(store.all()) == published


def _racer(run_dir: str, wid: int, rounds: int, barrier: mp.synchronize.Barrier, out: mp.Queue) -> None:
    paths = RunPaths(run_dir)
    store = EpochStore(paths)
    won = []
    for n in range(rounds):
        epoch = Epoch(epoch=n, generation=GENERATION, created_at=time.time(), reason=f"writer-{wid}", iteration=n,
                      boundary="iter", placement={}, previous=n - 1 if n else None)
        barrier.wait(timeout=60)
        try:
            store.publish(epoch, GENERATION)
            won.append(n)
        except EpochOrderError:
            pass
        barrier.wait(timeout=60)  # everyone tried epoch n before anyone goes on to n+1
    out.put((wid, won))


def test_exclusive_publish_race_has_exactly_one_winner(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run").ensure()
    atomic_write_json(paths.lease, {"generation": GENERATION, "holder": None})
    rounds, writers = 40, 3
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(paths.run_dir), w, rounds, barrier, out)) for w in range(writers)]
    for proc in procs:
        proc.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(30)
    for n in range(rounds):
        winners = [w for w, won in results.items() if n in won]
        assert len(winners) == 1, f"epoch {n}: winners {winners}"
        assert EpochStore(paths).read(n).reason == f"writer-{winners[0]}"
    assert [e.epoch for e in EpochStore(paths).all()] == list(range(rounds))


def test_write_json_exclusive_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "000000.json"
    write_json_exclusive(target, {"a": 1})
    with pytest.raises(FileExistsError, match="000000.json"):
        write_json_exclusive(target, {"a": 2})
    assert read_json(target) == {"a": 1}
    assert os.listdir(tmp_path) == ["000000.json"]  # the loser's temp file is gone


def test_read_json_names_the_path_of_a_bad_file(tmp_path: Path) -> None:
    torn = tmp_path / "torn.json"
    torn.write_bytes(b'{"epoch": 3, "gen')
    with pytest.raises(TornFileError, match="torn.json"):
        read_json(torn)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(TornFileError, match="list.json.*expected a JSON object"):
        read_json(tmp_path / "list.json")
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "absent.json")


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    atomic_write_json(target, {"v": 1})
    atomic_write_json(target, {"v": 2}, durable=False)
    assert json.loads(target.read_text()) == {"v": 2}
    assert os.listdir(tmp_path) == ["x.json"]


def test_create_run_dir_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        root = create_run_dir(tmp_path / "a" / "run")
    finally:
        os.umask(old)
    assert (root.stat().st_mode & 0o777) == 0o700
    paths = RunPaths(root).ensure()
    assert paths.epochs_dir.is_dir() and paths.heartbeats_dir.is_dir()


def test_remove_stale_temp_files_only_touches_temp_names(tmp_path: Path) -> None:
    (tmp_path / "000001.json").write_text("{}")
    (tmp_path / f".000002.json.123.abcd{TEMP_SUFFIX}").write_text("{")
    assert remove_stale_temp_files(tmp_path, older_than_s=3600) == 0
    assert remove_stale_temp_files(tmp_path, older_than_s=0, now=time.time() + 1) == 1
    assert os.listdir(tmp_path) == ["000001.json"]


def test_remove_temp_files_of_killed_writers_walks_the_tree_and_keeps_other_writers(tmp_path: Path) -> None:
    from slurm_rl.fsio import remove_temp_files_of

    (tmp_path / "control" / "progress").mkdir(parents=True)
    killed = tmp_path / "control" / "progress" / f".rank-0007.json.4242.2fdf32b4{TEMP_SUFFIX}"
    other = tmp_path / "control" / f".status.json.99.abcd{TEMP_SUFFIX}"
    kept = [tmp_path / "control" / "progress" / "rank-0007.json", tmp_path / f".notes{TEMP_SUFFIX}"]
    for path in (killed, other, *kept):
        path.write_text("{")
    assert remove_temp_files_of(tmp_path, {4242}) == 1 and not killed.exists() and other.exists()
    assert remove_temp_files_of(tmp_path) == 1 and not other.exists()
    assert all(path.exists() for path in kept)  # a final name, and a dot file that is not a writer's temp


def test_replace_symlink_swaps_atomically_and_its_temp_is_a_temp_name(tmp_path: Path) -> None:
    from slurm_rl.fsio import replace_symlink, temp_path

    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-b").mkdir()
    replace_symlink(tmp_path / "latest", "run-a")
    replace_symlink(tmp_path / "latest", "run-b")
    assert os.readlink(tmp_path / "latest") == "run-b"
    assert sorted(os.listdir(tmp_path)) == ["latest", "run-a", "run-b"]
    os.symlink("run-a", temp_path(tmp_path / "latest"))  # what a writer killed mid-swap leaves
    assert remove_stale_temp_files(tmp_path, older_than_s=0, now=time.time() + 1) == 1
    assert sorted(os.listdir(tmp_path)) == ["latest", "run-a", "run-b"]
