"""Typed records of the files between ranks and coordinator: a rank's progress and the coordinator
status are validated when read and when written; a torn or mistyped file is refused naming the file
and the field; the field names in the files stay those older run dirs have."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurm_rl.control import RunPaths, TornFileError
from slurm_rl.control.progress import (IterationCounters, LastMinibatch, RankProgress, read_all_progress,
                                      write_progress)
from slurm_rl.control.status import CheckpointRequest, CoordinatorStatus, read_coordinator_status, status_path, write_coordinator_status
from slurm_rl.worker.errors import CoordinatorFailed

AT_GATE = {"rank": 3, "host": "n1", "state": "at_gate", "iteration": 4, "epoch": 7, "roles": ["rollout"], "gate": 5,
           "checkpointed": None, "time": 1.5e9, "rollout_finished": 12, "boundary_at": None}
STOPPED = {"generation": 2, "state": "stopped", "released_iteration": 4, "released_epoch": 7, "checked_at": 1.5e9,
           "host": "n0", "pid": 77, "time": 1.5e9, "stopped_at_iteration": 5, "stop": {"reason": "USR1"},
           "requeue": True, "checkpoint": "checkpoints/iter-000005"}


@pytest.fixture()
def paths(tmp_path: Path) -> RunPaths:
    return RunPaths(tmp_path / "run").ensure()


WORKING = {"rank": 1, "host": "n0", "state": "working", "iteration": 2, "epoch": 3, "roles": ["rollout", "actor"],
           "rollout_finished": 40, "rollout_running": 8, "migrated_out": 2, "inference_done": 30,
           "actor_minibatches_done": 1, "actor_busy": True, "boundary_at": 1.5e9, "actor_received": 32,
           "actor_ready": 16,
           "rollout_len_hist": {"0": 3, "7": 5}, "rollout_longest": 900, "rollout_step_s": 0.02,
           "rollout_decoding": 6, "inference_busy_s": 4.5,
           "actor_last_minibatch": {"index": 0, "dp": 2, "seconds": 1.25, "tokens": 4096, "resharded": False},
           "time": 1.5e9}


def test_progress_record_types_its_fields(paths: RunPaths) -> None:
    paths.progress(3).write_text(json.dumps(AT_GATE))
    record = read_all_progress(paths, [3])[3]
    assert isinstance(record, RankProgress)
    assert (record.rank, record.host, record.state, record.gate, record.roles) == (3, "n1", "at_gate", 5, ("rollout",))
    assert record.checkpointed is None and record.error is None and record.boundary_at is None
    assert record.counters == IterationCounters(rollout_finished=12)
    assert record.to_json() == AT_GATE and list(record.to_json()) == list(AT_GATE)  # the file's field names, unchanged


def test_progress_counters_are_typed(paths: RunPaths) -> None:
    paths.progress(1).write_text(json.dumps(WORKING))
    c = read_all_progress(paths, [1])[1].counters
    assert (c.rollout_finished, c.rollout_running, c.migrated_out, c.inference_done) == (40, 8, 2, 30)
    assert (c.actor_received, c.actor_ready, c.actor_minibatches_done, c.actor_busy) == (32, 16, 1, True)
    assert dict(c.rollout_len_hist) == {0: 3, 7: 5} and c.rollout_longest == 900
    assert (c.rollout_step_s, c.rollout_decoding, c.inference_busy_s) == (0.02, 6, 4.5)
    assert c.actor_last_minibatch == LastMinibatch(index=0, dp=2, seconds=1.25, tokens=4096, resharded=False)


def test_absent_counters_read_as_their_defaults(paths: RunPaths) -> None:
    paths.progress(0).write_text(json.dumps({"rank": 0, "time": 1.5e9, "state": "starting", "phase": "loading"}))
    record = read_all_progress(paths, [0])[0]
    c = record.counters
    assert c == IterationCounters()
    assert (c.rollout_finished, c.rollout_running, c.migrated_out, c.inference_done, c.actor_received,
            c.actor_ready, c.actor_minibatches_done, c.rollout_longest, c.rollout_decoding) == (0,) * 9
    assert c.actor_busy is False and c.inference_busy_s == 0.0 and dict(c.rollout_len_hist) == {}
    assert c.rollout_step_s is None and c.actor_last_minibatch is None
    assert record.roles == () and record.iteration is None
    assert record.to_json() == {"rank": 0, "time": 1.5e9, "state": "starting", "phase": "loading"}  # no defaults added


def test_progress_round_trip_keeps_the_file_field_names(paths: RunPaths) -> None:
    doc = {k: v for k, v in WORKING.items() if k not in ("rank", "time")}
    write_progress(paths, 1, doc)
    written = json.loads(paths.progress(1).read_text())
    assert sorted(written) == sorted(WORKING) and {k: v for k, v in written.items() if k != "time"} == {
        k: v for k, v in WORKING.items() if k != "time"}
    assert read_all_progress(paths, [1])[1].to_json() == written


def test_a_record_built_directly_writes_its_fields_that_are_not_defaults() -> None:
    record = RankProgress(rank=2, time=1.5e9, state="working", iteration=0,
                          counters=IterationCounters(rollout_finished=5, rollout_len_hist={3: 5}))
    doc = record.to_json()
    assert doc == {"rank": 2, "time": 1.5e9, "state": "working", "iteration": 0, "rollout_finished": 5,
                   "rollout_len_hist": {"3": 5}}
    assert RankProgress.from_json(doc, "rank-0002.json") == record


def test_unknown_progress_fields_are_refused_on_write_and_ignored_on_read(paths: RunPaths) -> None:
    with pytest.raises(TornFileError, match=r"rank-0001\.json: field 'rollout_finshed' is not a known field"):
        write_progress(paths, 1, {"state": "working", "rollout_finshed": 3})
    assert not paths.progress(1).exists()
    paths.progress(3).write_text(json.dumps({**AT_GATE, "samples_done": 7}))  # written by another version
    record = read_all_progress(paths, [3])[3]
    assert record.counters.rollout_finished == 12 and record.to_json() == AT_GATE


def test_progress_written_through_the_record(paths: RunPaths) -> None:
    write_progress(paths, 2, {"host": "n2", "state": "failed", "iteration": 1, "error": "KeyError: 'x'"})
    doc = json.loads(paths.progress(2).read_text())
    assert doc["rank"] == 2 and isinstance(doc["time"], float) and doc["error"] == "KeyError: 'x'"
    assert read_all_progress(paths, [2])[2].error == "KeyError: 'x'"


@pytest.mark.parametrize("name, value, message", [
    ("boundary_at", "soon", "field 'boundary_at' must be a number or null, got 'soon'"),
    ("gate", 5.5, "field 'gate' must be an int or null, got 5.5"),
    ("actor_busy", 1, "field 'actor_busy' must be a boolean, got 1"),
    ("rollout_finished", "12", "field 'rollout_finished' must be a non-negative int, got '12'"),
    ("rollout_running", -1, "field 'rollout_running' must be a non-negative int, got -1"),
    ("inference_busy_s", None, "field 'inference_busy_s' must be a number, got None"),
    ("rollout_step_s", "fast", "field 'rollout_step_s' must be a number or null, got 'fast'"),
    ("rollout_len_hist", {"a": 1}, "field 'rollout_len_hist' must be an object of bucket numbers to non-negative ints"),
    ("rollout_len_hist", {"\u00b2": 1}, "field 'rollout_len_hist' must be an object of bucket numbers"),
    ("rollout_len_hist", {"3": 1.5}, "field 'rollout_len_hist' must be an object of bucket numbers"),
    ("actor_last_minibatch", [0], "field 'actor_last_minibatch' must be an object or null, got [0]"),
    ("actor_last_minibatch", {"index": 0, "dp": "2"}, "field 'actor_last_minibatch.dp' must be a non-negative int"),
    ("actor_last_minibatch", {"dp": 2}, "field 'actor_last_minibatch.index' is missing"),
    ("time", None, "field 'time' must be a number, got None"),
    ("rank", 4, "field 'rank' is 4, expected 3"),
])
def test_invalid_progress_is_refused_naming_file_and_field(paths: RunPaths, name: str, value: object,
                                                           message: str) -> None:
    paths.progress(3).write_text(json.dumps({**AT_GATE, name: value}))
    with pytest.raises(TornFileError, match=r"rank-0003\.json: " + re.escape(message)):
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
    assert status.checkpoint == "checkpoints/iter-000005" and status.checkpoint_request is None
    assert json.loads(status_path(paths).read_text()) == STOPPED == status.to_json()


def test_status_checkpoint_request_is_typed(paths: RunPaths) -> None:
    """While checkpointing, ``checkpoint`` is a request (iteration, staging dir); a bad one is refused."""
    write_coordinator_status(paths, {"generation": 1, "state": "checkpointing",
                                     "checkpoint": {"iteration": 3, "dir": "checkpoints/.iter-000003.tmp-1"}})
    status = read_coordinator_status(paths)
    assert status is not None and status.checkpoint is None
    assert status.checkpoint_request == CheckpointRequest(3, "checkpoints/.iter-000003.tmp-1")
    with pytest.raises(TornFileError, match=r"field 'checkpoint\.iteration' must be a non-negative int"):
        write_coordinator_status(paths, {"generation": 1, "state": "checkpointing",
                                         "checkpoint": {"iteration": -1, "dir": "x"}})
    with pytest.raises(TornFileError, match=r"field 'checkpoint' must be a string or null"):
        write_coordinator_status(paths, {"generation": 1, "state": "stopped", "checkpoint": 7})


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
