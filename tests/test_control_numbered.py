"""``control.numbered``: numbered documents published once, densely, by the current lease holder."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.errors import EpochOrderError, FencedEpochError, TornFileError
from slurm_rl.control.numbered import NumberedFiles, lease_generation
from slurm_rl.control.paths import RunPaths


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    paths = RunPaths(tmp_path / "group").ensure()
    set_lease(paths, 1)
    return paths


def set_lease(paths: RunPaths, generation: int) -> None:
    atomic_write_json(paths.lease, {"generation": generation, "holder": None})


def log(paths: RunPaths, **kw: object) -> NumberedFiles[dict]:
    return NumberedFiles(paths, paths.control / "members-log", kind="change", number_key="change",
                         holder="tester", **kw)  # type: ignore[arg-type]


def doc(n: int, generation: int = 1, **extra: object) -> dict:
    return {"change": n, "generation": generation, **extra}


def test_paths_follow_prefix_and_width(paths: RunPaths) -> None:
    files = log(paths, prefix="m-", width=4)
    assert files.path(7) == paths.control / "members-log" / "m-0007.json"
    assert log(paths).path(7).name == "000007.json"
    with pytest.raises(ValueError, match="width"):
        log(paths, width=0)


def test_racing_publishers_exactly_one_wins(paths: RunPaths) -> None:
    files, racers = log(paths), 8
    for n in range(4):
        barrier = threading.Barrier(racers)
        won: list[int] = []
        lost: list[Exception] = []

        def publish(i: int) -> None:
            barrier.wait()
            try:
                files.publish(n, doc(n, who=i), 1)
                won.append(i)
            except EpochOrderError as exc:
                lost.append(exc)

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(won) == 1 and len(lost) == racers - 1, (won, lost)
        assert all(f"change {n} is already published at" in str(exc) for exc in lost)
        assert files.read(n) == doc(n, who=won[0])  # the winner's document, untouched
    assert files.numbers() == [0, 1, 2, 3]


def test_a_published_number_is_never_overwritten(paths: RunPaths) -> None:
    files = log(paths)
    files.publish(0, doc(0, note="first"), 1)
    with pytest.raises(EpochOrderError, match=r"change 0 is already published at .*000000.json"):
        files.publish(0, doc(0, note="second"), 1)
    assert read_json(files.path(0))["note"] == "first"


def test_numbering_is_dense(paths: RunPaths) -> None:
    files = log(paths)
    with pytest.raises(EpochOrderError, match="change 0 is not published; numbering must be dense"):
        files.publish(1, doc(1), 1)
    assert files.numbers() == [] and files.latest() is None


def test_stale_generations_are_refused(paths: RunPaths) -> None:
    files = log(paths)
    set_lease(paths, 3)
    assert lease_generation(paths) == 3
    with pytest.raises(FencedEpochError, match=r"as generation 2: .*lease is at generation 3 \(a newer tester took over\)"):
        files.publish(0, doc(0, 2), 2)
    with pytest.raises(FencedEpochError, match="carries generation 2 but the publisher holds lease generation 3"):
        files.publish(0, doc(0, 2), 3)
    files.publish(0, doc(0, 3), 3)
    set_lease(paths, 2)  # a lease file behind the log: the log's own generations still fence
    with pytest.raises(FencedEpochError, match="change 0 already has generation 3"):
        files.publish(1, doc(1, 2), 2)
    files.publish(1, doc(1, 4), 4)  # a newer generation carries on
    assert files.numbers() == [0, 1]


def test_numbers_in_order_ignoring_other_files(paths: RunPaths) -> None:
    files = log(paths, prefix="m-", width=3)
    for n in range(12):
        files.publish(n, doc(n), 1)
    for stray in ("m-0005.json", "m-01.json", "x-005.json", "m-abc.json", "m-005.json.tmp", ".m-013.json.tmp-1"):
        (files.directory / stray).write_text("{}")
    assert files.numbers() == list(range(12))
    assert files.latest() == doc(11)
    assert files.read_doc(4) == (doc(4), doc(4))


def test_reads_check_the_number_and_decode(paths: RunPaths) -> None:
    files = log(paths)
    files.publish(0, doc(0), 1)
    files.directory.joinpath("000001.json").write_text('{"change": 0, "generation": 1}')
    with pytest.raises(TornFileError, match="000001.json: file holds change 0, expected 1"):
        files.read(1)
    files.directory.joinpath("000002.json").write_text('{"change": 2}')
    with pytest.raises(TornFileError, match="000002.json: 'generation' must be a non-negative int"):
        files.read(2)
    with pytest.raises(FileNotFoundError):
        files.read(3)
    with pytest.raises(ValueError, match="document holds change 5"):
        files.publish(1, doc(5), 1)

    typed = NumberedFiles(paths, files.directory, kind="change", number_key="change",
                          decode=lambda d, where: (d["change"], where))
    assert typed.read(0) == (0, str(files.path(0)))


def test_before_write_runs_only_after_the_checks(paths: RunPaths) -> None:
    files, calls = log(paths), []
    with pytest.raises(EpochOrderError):
        files.publish(1, doc(1), 1, before_write=lambda: calls.append(1))
    assert calls == []
    files.publish(0, doc(0), 1, before_write=lambda: calls.append(0))
    assert calls == [0]


def test_readers_refuse_an_older_generation(paths: RunPaths) -> None:
    files = log(paths)
    files.check_order(3, 2, 2, "rank 1")
    with pytest.raises(FencedEpochError, match=r"rank 1: change 3 \(.*000003.json\) has generation 1, older than generation 2"):
        files.check_order(3, 1, 2, "rank 1")


def test_an_unfenced_log_keeps_exclusive_dense_numbering(paths: RunPaths) -> None:
    records = NumberedFiles(paths, paths.control / "records", kind="record", number_key="record", fenced=False)
    records.publish(0, {"record": 0, "job": "a"}, None)
    with pytest.raises(EpochOrderError, match="record 0 is already published"):
        records.publish(0, {"record": 0, "job": "b"}, None)
    with pytest.raises(EpochOrderError, match="record 1 is not published; numbering must be dense"):
        records.publish(2, {"record": 2}, None)
    with pytest.raises(ValueError, match="unfenced log takes generation=None"):
        records.publish(1, {"record": 1}, 1)
    with pytest.raises(ValueError, match="fenced log takes a generation"):
        log(paths).publish(0, doc(0), None)
    records.publish(1, {"record": 1, "job": "b"}, None)
    assert records.numbers() == [0, 1] and records.latest() == {"record": 1, "job": "b"}
