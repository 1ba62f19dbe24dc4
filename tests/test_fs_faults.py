"""The shared file system misbehaving: a full file system (a real tmpfs mounted with 64 KiB), I/O
errors (injected at the one place files are written, ``slurm_rl.fsio``), and a slow file system.

Every write that fails raises an error naming the final path, leaves the final name as it was
(absent, or the previous complete document) and leaves no temp file behind.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl.control import (CoordinatorLease, Epoch, EpochStore, EpochWatcher, HeartbeatWriter, RunPaths,
                              append_event, read_ack, read_all_progress, read_events, read_heartbeat, read_lease,
                              write_ack, write_progress)
from slurm_rl.control.grants import Grant, GroupPaths, publish_grant, read_grant
from slurm_rl.control.status import read_coordinator_status, write_coordinator_status
from slurm_rl.data import ROLLOUTS, StageReader, StageWriter, write_expected
from slurm_rl.data.emulated import make_fake_prompts, make_fake_rollouts
from slurm_rl.data.layout import manifest_path, stage_dir
from slurm_rl.data.migration import write_pending
from slurm_rl.fsio import FAULTS_ENV, Fault, FileSystem, StorageError, atomic_write_json, read_bytes_once
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
GEN = 1


# -- helpers ------------------------------------------------------------------------------------------
def _epoch(n: int) -> Epoch:
    return Epoch(epoch=n, generation=GEN, created_at=time.time(), reason="test", iteration=n, boundary="iteration",
                 placement={"actor": {"ranks": [0, 1], "dp": 2, "tp": 1, "pp": 1}}, previous=n - 1 if n else None)


def _rollouts(rows: int = 40) -> pa.Table:
    return make_fake_rollouts(make_fake_prompts(1, rows // 4, 8, seed=0), 4, 16, seed=0)


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*.tmp")]


def _fill(mount: Path, mode: str = "wb") -> Path:
    """Fill the file system at ``mount`` completely (a real ENOSPC for every later write); ``mode="ab"``
    tops an earlier fill up with what was freed since."""
    filler = mount / "filler"
    with open(filler, mode, buffering=0) as f:
        chunk = b"\0" * 4096
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs mounted for this test (unmounted afterwards)."""
    mount = tmp_path / "small"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 64 KiB tmpfs here (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# -- ENOSPC on a real full file system ----------------------------------------------------------------
# Each case: (prepare before the disk fills, the write that must fail, what the final path must hold after)
Case = tuple[Callable[[Path], None], Callable[[Path], None], Callable[[Path], None], str]


def _epoch_case() -> Case:
    def before(root: Path) -> None:
        paths = RunPaths(root).ensure()
        atomic_write_json(paths.lease, {"generation": GEN, "holder": None})
        EpochStore(paths).publish(_epoch(0), GEN)
        paths.acks_dir(1).mkdir(parents=True)

    def write(root: Path) -> None:
        EpochStore(RunPaths(root)).publish(_epoch(1), GEN)

    def after(root: Path) -> None:
        paths = RunPaths(root)
        assert not paths.epoch(1).exists()
        watcher = EpochWatcher(paths, start_after=0)
        assert watcher.poll() is None and watcher.current == 0  # a reader sees no epoch 1, nothing torn
        assert EpochStore(paths).read(0).epoch == 0
    return before, write, after, "control/epochs/000001.json"


def _ack_case() -> Case:
    def before(root: Path) -> None:
        RunPaths(root).acks_dir(3).mkdir(parents=True)

    def write(root: Path) -> None:
        write_ack(RunPaths(root), 3, 5, "n1", seen_at=1.0, applied_at=2.0, figures={"bytes": 1})

    def after(root: Path) -> None:
        assert read_ack(RunPaths(root), 3, 5) is None
    return before, write, after, "control/acks/000003/rank-0005.json"


def _progress_case() -> Case:
    def before(root: Path) -> None:
        write_progress(RunPaths(root).ensure(), 2, {"state": "working", "iteration": 1, "rollout_finished": 7})

    def write(root: Path) -> None:
        write_progress(RunPaths(root), 2, {"state": "working", "iteration": 1, "rollout_finished": 8, "host": "x" * 300})

    def after(root: Path) -> None:
        assert read_all_progress(RunPaths(root), [2])[2].counters.rollout_finished == 7  # the previous complete document
    return before, write, after, "control/progress/rank-0002.json"


def _status_case() -> Case:
    def before(root: Path) -> None:
        write_coordinator_status(RunPaths(root).ensure(), {"generation": GEN, "state": "running",
                                                           "released_iteration": 0})

    def write(root: Path) -> None:
        write_coordinator_status(RunPaths(root), {"generation": GEN, "state": "running", "released_iteration": 1,
                                                  "pad": "x" * 300})

    def after(root: Path) -> None:
        assert read_coordinator_status(RunPaths(root)).released_iteration == 0
    return before, write, after, "control/coordinator.json"


def _heartbeat_case() -> Case:
    def before(root: Path) -> None:
        HeartbeatWriter(RunPaths(root).ensure(), 4, "n1").beat()

    def write(root: Path) -> None:
        beat = HeartbeatWriter(RunPaths(root), 4, "n1")
        beat.set_epoch(12345678901234567890)  # longer than the previous beat: needs a new block
        beat.beat()

    def after(root: Path) -> None:
        assert read_heartbeat(RunPaths(root), 4)["epoch"] is None
    return before, write, after, "control/heartbeats/rank-0004.json"


def _lease_case() -> Case:
    def before(root: Path) -> None:
        RunPaths(root).ensure()
        atomic_write_json(RunPaths(root).lease, {"generation": 3, "holder": None})
        RunPaths(root).generations_dir.mkdir()

    def write(root: Path) -> None:
        CoordinatorLease(RunPaths(root)).acquire()

    def after(root: Path) -> None:
        assert read_lease(RunPaths(root)) == {"generation": 3, "holder": None}
        assert not list(RunPaths(root).generations_dir.iterdir())
    return before, write, after, "control/generations/000004.json"


def _grant_case() -> Case:
    def before(root: Path) -> None:
        paths = GroupPaths(root).ensure()
        atomic_write_json(paths.lease, {"generation": GEN, "holder": None})
        paths.grants_dir.mkdir()

    def write(root: Path) -> None:
        publish_grant(GroupPaths(root), Grant(0, GEN, 0.0, {"rollout": {"slots": {"0": None}}}, {}), GEN)

    def after(root: Path) -> None:
        with pytest.raises(FileNotFoundError):
            read_grant(GroupPaths(root), 0)
    return before, write, after, "control/grants/000000.json"


def _shard_case() -> Case:
    writer: list[StageWriter] = []

    def before(root: Path) -> None:
        writer.append(StageWriter(root, 1, "rollouts", 0, ROLLOUTS))
        writer[0].write(_rollouts(8))

    def write(root: Path) -> None:
        writer[0].write(_rollouts(40))

    def after(root: Path) -> None:
        d = stage_dir(root, 1, "rollouts")
        assert sorted(p.name for p in d.iterdir()) == ["manifest-0000.json", "shard-0000-000000.arrow"]
        m = json.loads(manifest_path(root, 1, "rollouts", 0).read_bytes())
        assert [s["name"] for s in m["shards"]] == ["shard-0000-000000.arrow"] and not m["complete"]
    return before, write, after, "data/iter-000001/rollouts/shard-0000-000001.arrow"


def _manifest_case() -> Case:
    def before(root: Path) -> None:
        with StageWriter(root, 1, "rollouts", 0, ROLLOUTS) as w:
            w.write(_rollouts(8))
            w.close(complete=False)

    def write(root: Path) -> None:
        StageWriter(root, 1, "rollouts", 0, ROLLOUTS).close()  # resume (rewrites the manifest), complete

    def after(root: Path) -> None:
        m = json.loads(manifest_path(root, 1, "rollouts", 0).read_bytes())
        assert len(m["shards"]) == 1 and not m["complete"]
        reader = StageReader(root, 1, "rollouts", [0], timeout_s=0.3, poll_interval_s=0.01)
        got = []
        with pytest.raises(TimeoutError):
            for t in reader.iter_shards():
                got.append(t)
        assert [t.num_rows for t in got] == [8]  # the listed shard only; the stage never looks complete
    return before, write, after, "data/iter-000001/rollouts/manifest-0000.json"


def _expected_case() -> Case:
    def before(root: Path) -> None:
        stage_dir(root, 2, "inference").mkdir(parents=True)

    def write(root: Path) -> None:
        write_expected(root, 2, "inference", list(range(2000)))

    def after(root: Path) -> None:
        assert not (stage_dir(root, 2, "inference") / "expected.json").exists()
    return before, write, after, "data/iter-000002/inference/expected.json"


CASES = {"epoch": _epoch_case, "ack": _ack_case, "progress": _progress_case, "status": _status_case,
         "heartbeat": _heartbeat_case, "lease": _lease_case, "grant": _grant_case, "shard": _shard_case,
         "manifest": _manifest_case, "expected": _expected_case}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_enospc_on_a_full_tmpfs_names_the_path_and_leaves_no_torn_file(small_fs: Path, kind: str) -> None:
    before, write, after, rel = CASES[kind]()
    root = small_fs / "run"
    before(root)
    filler = _fill(small_fs)
    with pytest.raises(OSError) as info:
        write(root)
    assert info.value.errno == errno.ENOSPC, info.value
    assert isinstance(info.value, StorageError)
    assert info.value.filename == str(root / rel), str(info.value)
    assert str(root / rel) in str(info.value) and "No space left on device" in str(info.value)
    assert _temp_files(root) == []
    after(root)
    filler.unlink()  # space again: the same write now succeeds
    write(root)
    assert (root / rel).exists()


def test_enospc_shard_writer_carries_on_once_space_is_back(small_fs: Path) -> None:
    root = small_fs / "run"
    w = StageWriter(root, 1, "rollouts", 0, ROLLOUTS)
    w.write(_rollouts(8))
    filler = _fill(small_fs)
    with pytest.raises(StorageError, match="shard-0000-000001.arrow"):
        w.write(_rollouts(40))
    filler.unlink()
    w.write(_rollouts(12))
    w.close()
    out = StageReader(root, 1, "rollouts", [0], timeout_s=5).read_all()
    assert out.num_rows == 20  # 8 + 12: nothing of the failed shard


def test_enospc_on_the_decision_log_names_it_and_earlier_records_stay_readable(small_fs: Path) -> None:
    paths = RunPaths(small_fs / "run").ensure()
    append_event(paths, "decision", {"epoch": 0})
    _fill(small_fs)
    with pytest.raises(StorageError, match="decisions.jsonl") as info:
        append_event(paths, "decision", {"epoch": 1, "pad": "x" * 8000})
    assert info.value.errno == errno.ENOSPC
    assert [e["epoch"] for e in read_events(paths)] == [0]


def test_heartbeat_thread_survives_enospc_and_reports_it(small_fs: Path) -> None:
    paths = RunPaths(small_fs / "run").ensure()
    filler = _fill(small_fs)
    with pytest.raises(StorageError, match="rank-0001.json"):
        HeartbeatWriter(paths, 1, "n1", interval_s=0.05).start()
    filler.unlink()
    with HeartbeatWriter(paths, 1, "n1", interval_s=0.05) as beat:
        filler = _fill(small_fs)
        beat.set_epoch(10**30)  # the next beat needs more room than the last one
        deadline = time.monotonic() + 5
        while beat.last_error is None and time.monotonic() < deadline:
            # a beat in flight while the file system was filled frees the old beat's page when it is renamed
            # over it, and the next beat takes that page: take it first, until a beat finds no room
            _fill(small_fs, "ab")
            time.sleep(0.02)
        assert isinstance(beat.last_error, StorageError) and beat.last_error.errno == errno.ENOSPC
        assert read_heartbeat(paths, 1)["epoch"] is None  # the last complete beat
        filler.unlink()
        deadline = time.monotonic() + 5
        while read_heartbeat(paths, 1)["epoch"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read_heartbeat(paths, 1)["epoch"] == 10**30


# -- EIO (injected at the one place files are written) --------------------------------------------------
def _kind_writers(fs: FileSystem, root: Path) -> dict[str, tuple[Callable[[], None], Path]]:
    paths = RunPaths(root / "run", fs=fs)
    gpaths = GroupPaths(root / "group", fs=fs)
    for p in (paths, gpaths):
        p.ensure()
        atomic_write_json(p.lease, {"generation": GEN, "holder": None})
    paths.acks_dir(0).mkdir()
    gpaths.grants_dir.mkdir()
    return {
        "epoch": (lambda: EpochStore(paths).publish(_epoch(0), GEN), paths.epoch(0)),
        "ack": (lambda: write_ack(paths, 0, 1, "n1", 1.0, 2.0), paths.ack(0, 1)),
        "progress": (lambda: write_progress(paths, 1, {"state": "working"}), paths.progress(1)),
        "status": (lambda: write_coordinator_status(paths, {"generation": GEN, "state": "running"}),
                   paths.control / "coordinator.json"),
        "heartbeat": (lambda: HeartbeatWriter(paths, 1, "n1").beat(), paths.heartbeat(1)),
        "grant": (lambda: publish_grant(gpaths, Grant(0, GEN, 0.0, {}, {}), GEN), gpaths.grant(0)),
        "shard": (lambda: StageWriter(paths.run_dir, 0, "rollouts", 1, ROLLOUTS, fs=fs).write(_rollouts(8)),
                  stage_dir(paths.run_dir, 0, "rollouts") / "shard-0001-000000.arrow"),
        "manifest": (lambda: StageWriter(paths.run_dir, 0, "inference", 2, ROLLOUTS, fs=fs),
                     manifest_path(paths.run_dir, 0, "inference", 2)),
        "pending": (lambda: write_pending(paths.run_dir, 0, 3, _pending(), fs=fs),
                    paths.run_dir / "data/iter-000000/pending/pending-0003-000000-000.json"),
    }


def _pending() -> pa.Table:
    from slurm_rl.data.emulated import make_fake_requests
    return make_fake_requests(make_fake_prompts(0, 2, 8, seed=0), 2)


WRITE_STEPS = {"open": "creating temp file", "write": "writing", "fsync": "fsync", "rename": "renaming into place",
               "link": "linking into place"}


def _steps(kind: str) -> list[str]:
    """The steps a write of ``kind`` goes through: write-once files are linked, others renamed;
    liveness and observation files (acks, progress, heartbeats) are not fsynced."""
    steps = ["open", "write", "link" if kind in ("epoch", "grant", "pending") else "rename"]
    return steps + ([] if kind in ("ack", "progress", "heartbeat") else ["fsync"])


@pytest.mark.parametrize(("kind", "step"), [(k, s) for k in ("ack", "epoch", "grant", "heartbeat", "manifest",
                                                             "pending", "progress", "shard", "status")
                                            for s in _steps(k)])
def test_eio_at_every_write_step_names_the_path_and_publishes_nothing(tmp_path: Path, kind: str, step: str) -> None:
    write, clean_final = _kind_writers(FileSystem(), tmp_path / "clean")[kind]
    # Only operations on this file (its temp name ".NAME.*.tmp" or NAME itself) fail.
    fs = FileSystem(faults=(Fault(step, f"*/{clean_final.name}", errno.EIO), Fault(step, f"*/.{clean_final.name}.*",
                                                                                   errno.EIO)))
    faulty_write, final = _kind_writers(fs, tmp_path / "faulty")[kind]
    with pytest.raises(StorageError) as info:
        faulty_write()
    assert info.value.errno == errno.EIO
    assert info.value.filename == str(final), str(info.value)
    assert WRITE_STEPS[step] in str(info.value) and "Input/output error" in str(info.value)
    assert not final.exists()
    assert _temp_files(tmp_path / "faulty") == []
    write()  # the same write through the real file system works (the test exercises a real path)
    assert clean_final.exists()


def test_eio_on_read_names_the_path_and_is_not_taken_for_a_missing_or_torn_file(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path).ensure()
    atomic_write_json(paths.lease, {"generation": GEN, "holder": None})
    EpochStore(paths).publish(_epoch(0), GEN)
    faulty = RunPaths(tmp_path, fs=FileSystem(faults=(Fault("read", "*/epochs/*", errno.EIO),)))
    watcher = EpochWatcher(faulty)
    with pytest.raises(StorageError, match="000000.json") as info:
        watcher.poll()
    assert info.value.errno == errno.EIO and watcher.current == -1  # nothing applied
    with pytest.raises(StorageError, match="reading failed"):
        read_bytes_once(paths.epoch(0), fs=faulty.fs)
    assert EpochWatcher(paths).poll().epoch == 0


def test_faults_spec_from_the_environment() -> None:
    fs = FileSystem.from_env({FAULTS_ENV: "delay_ms=25; eio=write:*/acks/*;enospc=open:*.arrow*"})
    assert fs.delay_s == 0.025
    assert fs.faults == (Fault("write", "*/acks/*", errno.EIO), Fault("open", "*.arrow*", errno.ENOSPC))
    assert FileSystem.from_env({}) == FileSystem()
    for bad, needle in (("delay_ms=x", "delay_ms='x'"), ("eio", "not key=value"), ("nosuch=write:*", "nosuch"),
                        ("eio=scribble:*", "scribble")):
        with pytest.raises(ValueError, match=needle):
            FileSystem.parse(bad)


def test_a_process_reads_the_faults_at_start(tmp_path: Path) -> None:
    code = ("from slurm_rl.fsio import atomic_write_json\n"
            f"atomic_write_json({str(tmp_path / 'x.json')!r}, {{'a': 1}})\n")
    env = {**os.environ, FAULTS_ENV: "eio=rename:*/x.json"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode != 0 and f"{tmp_path / 'x.json'}" in proc.stderr and "Errno 5" in proc.stderr
    assert not (tmp_path / "x.json").exists() and _temp_files(tmp_path) == []


# -- slow file system -----------------------------------------------------------------------------------
def test_every_operation_of_a_write_pays_the_delay(tmp_path: Path) -> None:
    fs = FileSystem(delay_s=0.02)
    start = time.perf_counter()
    atomic_write_json(tmp_path / "a.json", {"a": 1}, fs=fs)  # open, write, fsync, rename, open dir, fsync dir
    assert time.perf_counter() - start >= 6 * 0.02
    start = time.perf_counter()
    atomic_write_json(tmp_path / "b.json", {"a": 1}, durable=False, fs=fs)  # open, write, rename
    assert 3 * 0.02 <= time.perf_counter() - start


def _cli_run(cfg: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "run", str(cfg), "--no-inspect"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


def _run_result(run_dir: Path) -> dict:
    """What a run computed: its epochs (placement), per-iteration figures and the trained sample ids."""
    epochs = [{k: v for k, v in e.to_json().items() if k != "created_at"} for e in EpochStore(RunPaths(run_dir)).all()]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    figures = [{k: m[k] for k in ("iteration", "samples", "minibatches", "actor_dp")}
               | {"plan": [(p["epoch"], p["dp"], p["resharded"]) for p in m["plan"]]} for m in metrics]
    trained = {}
    for it_dir in sorted((run_dir / "data").glob("iter-*")):
        shards = sorted((it_dir / "actor_batch").glob("shard-*.arrow"))
        trained[it_dir.name] = [pa.ipc.open_file(str(s)).read_all().column("sample_id").to_pylist() for s in shards]
    return {"epochs": epochs, "figures": figures, "trained": trained}


@pytest.mark.slow  # two whole 8-rank runs, one with every file operation delayed (~40 s): the whole suite runs it
def test_emulated_run_on_a_slow_file_system_computes_the_same(tmp_path: Path) -> None:
    """8 ranks, 3 iterations, two placement changes; every file operation of every process delayed
    by 20 ms. The run is slower and otherwise identical: same epochs, same mini-batches, same samples."""
    results, seconds = {}, {}
    for name, spec in (("fast", ""), ("slow", "delay_ms=20")):
        run_dir = tmp_path / name
        cfg = emulated_config(run_dir, keep_iterations=10)
        cfg["train"]["minibatch_order"] = "index"
        env = {**os.environ, FAULTS_ENV: spec}
        start = time.monotonic()
        proc = _cli_run(write_config(tmp_path / f"{name}.yaml", cfg), env)
        seconds[name] = time.monotonic() - start
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        results[name] = _run_result(run_dir)
        assert _temp_files(run_dir) == []
    assert len(results["fast"]["epochs"]) == 3 and len(results["fast"]["trained"]) == 3
    assert results["slow"] == results["fast"]
    assert seconds["slow"] > 1.5 * seconds["fast"], seconds  # the delay really applied (ranks and coordinator)


# -- whole runs: a full disk and an I/O error end the run with the path named, nothing torn ------------------
def _assert_nothing_torn(run_dir: Path) -> int:
    """Every control/data document under ``run_dir`` is complete and every listed shard verifies; no temp
    file is left. Returns how many files were checked."""
    from slurm_rl.data.manifest import ProducerManifest
    from slurm_rl.data.shardio import open_shard

    assert _temp_files(run_dir) == []
    checked = 0
    for path in sorted(run_dir.rglob("*.json")):
        doc = json.loads(read_bytes_once(path))
        checked += 1
        if path.name.startswith("manifest-"):
            stage, it = path.parent.name, int(path.parent.parent.name[5:])
            m = ProducerManifest.load(path, iteration=it, stage=stage, producer_rank=int(path.name[9:13]))
            for shard in m.shards:
                open_shard(path.parent / shard.name, nbytes=shard.bytes, digest=shard.xxh3_64)
                checked += 1
        assert isinstance(doc, dict)
    EpochStore(RunPaths(run_dir)).all()  # dense, each epoch valid
    return checked


def test_emulated_run_on_a_full_file_system_fails_naming_the_path_and_tears_nothing(tmp_path: Path) -> None:
    """The whole run on a real 400 KiB tmpfs: it runs out of space mid-run (a full run needs ~780 KiB)."""
    mount = tmp_path / "small"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 400 KiB tmpfs here (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        run_dir = mount / "run"
        cfg = write_config(tmp_path / "c.yaml", emulated_config(run_dir, keep_iterations=10))
        proc = _cli_run(cfg, {**os.environ, FAULTS_ENV: ""})
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "run failed" in out and "No space left on device" in out and f"'{run_dir}/" in out, out[-3000:]
        assert _assert_nothing_torn(run_dir) > 10
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_emulated_run_with_an_io_error_on_one_ack_fails_naming_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ack = RunPaths(run_dir).ack(1, 3)
    cfg = write_config(tmp_path / "c.yaml", emulated_config(run_dir))
    proc = _cli_run(cfg, {**os.environ, FAULTS_ENV: f"eio=rename:{ack}"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "run failed: rank 3" in out and f"Input/output error (injected by {FAULTS_ENV}): '{ack}'" in out, out[-3000:]
    # only that one file failed: every rank's ack of epoch 0 (written the same way, before training began)
    # is in place; whether another rank acked epoch 1 before the launcher stopped it is timing
    assert not ack.exists() and all(RunPaths(run_dir).ack(0, r).exists() for r in range(8))
    _assert_nothing_torn(run_dir)


def test_a_record_cut_short_does_not_swallow_the_next_one(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path).ensure()
    append_event(paths, "decision", {"epoch": 0})
    with open(paths.decisions, "ab") as f:
        f.write(b'{"epoch": 1, "kind": "deci')  # what a failed (ENOSPC) append can leave
    append_event(paths, "decision", {"epoch": 2})
    assert [e["epoch"] for e in read_events(paths)] == [0, 2]
