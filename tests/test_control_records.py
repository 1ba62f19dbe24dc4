"""Typed records of the files between ranks and coordinator: a rank's progress and the coordinator
status are validated when read and when written; a torn or mistyped file is refused naming the file
and the field; the field names in the files stay those older run dirs have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_rl.control import RunPaths, TornFileError
from slurm_rl.control.progress import RankProgress, read_all_progress, write_progress
from slurm_rl.control.status import CoordinatorStatus, read_coordinator_status, status_path, write_coordinator_status
from slurm_rl.worker.errors import CoordinatorFailed

AT_GATE = {"rank": 3, "host": "n1", "state": "at_gate", "iteration": 4, "epoch": 7, "roles": ["rollout"], "gate": 5,
           "checkpointed": None, "time": 1.5e9, "rollout_finished": 12, "boundary_at": None}
STOPPED = {"generation": 2, "state": "stopped", "released_iteration": 4, "released_epoch": 7, "checked_at": 1.5e9,
           "host": "n0", "pid": 77, "time": 1.5e9, "stopped_at_iteration": 5, "stop": {"reason": "USR1"},
           "requeue": True, "checkpoint": "checkpoints/iter-000005"}


@pytest.fixture()
def paths(tmp_path: Path) -> RunPaths:
    return RunPaths(tmp_path / "run").ensure()


def test_progress_record_types_its_fields_and_reads_as_the_document(paths: RunPaths) -> None:
    paths.progress(3).write_text(json.dumps(AT_GATE))
    record = read_all_progress(paths, [3])[3]
    assert isinstance(record, RankProgress)
    assert (record.rank, record.host, record.state, record.gate, record.roles) == (3, "n1", "at_gate", 5, ("rollout",))
    assert record.checkpointed is None and record.error is None and record.boundary_at is None
    assert record["rollout_finished"] == 12 and record.get("rollout_running", 0) == 0  # counters by name
    assert record.to_json() == AT_GATE and list(record) == list(AT_GATE)  # the file's field names, unchanged


def test_progress_written_through_the_record(paths: RunPaths) -> None:
    write_progress(paths, 2, {"host": "n2", "state": "failed", "iteration": 1, "error": "KeyError: 'x'"})
    doc = json.loads(paths.progress(2).read_text())
    assert doc["rank"] == 2 and isinstance(doc["time"], float) and doc["error"] == "KeyError: 'x'"
    assert read_all_progress(paths, [2])[2].error == "KeyError: 'x'"


@pytest.mark.parametrize("name, value, message", [
    ("boundary_at", "soon", "field 'boundary_at' must be a number or null, got 'soon'"),
    ("gate", 5.5, "field 'gate' must be an int or null, got 5.5"),
    ("actor_busy", 1, "field 'actor_busy' must be a boolean, got 1"),
    ("time", None, "field 'time' must be a number, got None"),
    ("rank", 4, "field 'rank' is 4, expected 3"),
])
def test_invalid_progress_is_refused_naming_file_and_field(paths: RunPaths, name: str, value: object,
                                                           message: str) -> None:
    paths.progress(3).write_text(json.dumps({**AT_GATE, name: value}))
    with pytest.raises(TornFileError, match=r"rank-0003\.json: " + message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        read_all_progress(paths, [3])


def test_torn_or_missing_field_progress_is_refused(paths: RunPaths) -> None:
    paths.progress(3).write_text(json.dumps(AT_GATE)[:40])
    with pytest.raises(TornFileError, match=r"rank-0003\.json: not a complete JSON document"):
        read_all_progress(paths, [3])
    paths.progress(3).write_text(json.dumps({k: v for k, v in AT_GATE.items() if k != "time"}))
    with pytest.raises(TornFileError, match=r"rank-0003\.json: field 'time' is missing"):
        read_all_progress(paths, [3])


def test_a_writer_cannot_write_an_invalid_progress_document(paths: RunPaths) -> None:
    with pytest.raises(TornFileError, match=r"rank-0001\.json: field 'gate' must be an int or null"):
        write_progress(paths, 1, {"state": "at_gate", "gate": "5"})
    assert not paths.progress(1).exists()


def test_status_record_types_its_fields_and_keeps_the_document(paths: RunPaths) -> None:
    write_coordinator_status(paths, STOPPED)
    status = read_coordinator_status(paths)
    assert isinstance(status, CoordinatorStatus) and not status.failed
    assert (status.generation, status.state, status.released_iteration, status.stopped_at_iteration) == (2, "stopped", 4, 5)
    assert status.stop == {"reason": "USR1"} and status.requeue is True and status.exclude == ()
    assert status["checkpoint"] == "checkpoints/iter-000005"
    assert json.loads(status_path(paths).read_text()) == STOPPED == status.to_json()


@pytest.mark.parametrize("name, value, message", [
    ("state", None, "field 'state' must be a string, got None"),
    ("released_iteration", "4", "field 'released_iteration' must be an int, got '4'"),
    ("requeue", "yes", "field 'requeue' must be a boolean, got 'yes'"),
    ("exclude", "n2", "field 'exclude' must be a list, got 'n2'"),
    ("generation", -1, "field 'generation' must be a non-negative int, got -1"),
])
def test_invalid_status_is_refused_naming_file_and_field(paths: RunPaths, name: str, value: object,
                                                         message: str) -> None:
    status_path(paths).write_text(json.dumps({**STOPPED, name: value}))
    with pytest.raises(TornFileError, match=r"coordinator\.json: " + message):
        read_coordinator_status(paths)
    with pytest.raises(TornFileError, match=r"coordinator\.json: " + message):
        write_coordinator_status(paths, {**STOPPED, name: value})


def test_torn_status_is_refused_and_a_missing_one_is_none(paths: RunPaths) -> None:
    assert read_coordinator_status(paths) is None
    status_path(paths).write_text('{"generation": 2, "sta')
    with pytest.raises(TornFileError, match=r"coordinator\.json: not a complete JSON document"):
        read_coordinator_status(paths)
    status_path(paths).write_text(json.dumps({"generation": 2}))
    with pytest.raises(TornFileError, match=r"coordinator\.json: field 'state' is missing"):
        read_coordinator_status(paths)


def test_a_failed_status_stops_the_ranks_through_one_class(paths: RunPaths) -> None:
    write_coordinator_status(paths, {"generation": 1, "state": "failed", "error": "DeadRankError: rank 5"})
    status = read_coordinator_status(paths)
    assert status is not None and status.failed
    with pytest.raises(CoordinatorFailed, match=r"^coordinator failed: DeadRankError: rank 5; rank 1 \(host h\) stops$"):
        CoordinatorFailed.check(status, "rank 1 (host h)")
