"""Group inspection (slurm_rl.inspect.group_timeline) on hand-built group directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_rl.control.events import append_event
from slurm_rl.control.grants import GroupPaths, write_release
from slurm_rl.control.status import write_coordinator_status
from slurm_rl.inspect.group_timeline import format_group_report, group_report_json, write_group_gantt

T = 1000.0  # grant 0


def _group_json(root: Path, slo_b: float = 1.5) -> None:
    slots = {"0": ["rollout", 0], "1": ["rollout", 1], "2": ["train", 2]}
    doc = {"dir": str(root), "pools": {"rollout": [0, 1], "train": [2]}, "tail_fraction": 0.8, "tail_slots": 1,
           "poll_interval_s": 0.02, "timeout_s": 60.0, "park_s": 0.5,
           "jobs": {"a": {"slo": 2.0, "iterations": 1, "samples": 8, "world_size": 3, "rank_slots": slots},
                    "b": {"slo": slo_b, "iterations": 1, "samples": 8, "world_size": 3, "rank_slots": slots}}}
    root.mkdir(parents=True, exist_ok=True)
    (root / "group.json").write_text(json.dumps(doc))


def _grant(paths: GroupPaths, n: int, at: float, rollout: dict, train: dict) -> None:
    def slots(spec: dict, pool_slots: list[int]) -> dict:
        return {str(s): spec.get(s) for s in pool_slots}

    append_event(paths, "grant", {"grant": n, "generation": 1, "events": [], "published_at": at, "time": at,
                                  "pools": {"rollout": {"slots": slots(rollout, [0, 1])},
                                            "train": {"slots": slots(train, [2])}}})


def _phase(paths: GroupPaths, job: str, pool: str, slot: int, seen: float, work: tuple[float, float],
           released: float, waited: float, **extra) -> None:
    append_event(paths, "phase", {"job": job, "pool": pool, "iteration": 0, "slot": slot, "waited_s": waited,
                                  "granted_seen_at": seen, "resume_s": work[0] - seen, "started_at": work[0],
                                  "ended_at": work[1], "park_s": released - work[1], "released_at": released,
                                  "time": released + 0.01, **extra})


def _h(job: str, revoked: bool = False) -> dict:
    return {"job": job, "iteration": 0, "revoked": revoked}


def _build(root: Path, failed: bool = False) -> GroupPaths:
    """Two jobs, rollout pool {0, 1}, train pool {2}, one iteration each (numbers in the tests)."""
    _group_json(root)
    paths = GroupPaths(root)
    _grant(paths, 0, T, {}, {})
    _grant(paths, 1, T + 2.0, {0: _h("a"), 1: _h("a")}, {})
    _phase(paths, "a", "rollout", 1, T + 2.0, (T + 2.5, T + 4.0), T + 4.5, 1.0, revoked=True, migrated=3)
    _grant(paths, 2, T + 4.5, {0: _h("a"), 1: _h("b")}, {})
    append_event(paths, "phase", {"job": "b", "pool": "rollout", "iteration": 0, "slot": 0, "skipped": True,
                                  "waited_s": 5.0, "released_at": T + 6.0, "time": T + 6.0})  # never granted
    _phase(paths, "a", "rollout", 0, T + 2.0, (T + 2.5, T + 6.0), T + 6.5, 1.0)
    _grant(paths, 3, T + 6.5, {1: _h("b")}, {2: _h("a")})
    _phase(paths, "b", "rollout", 1, T + 4.5, (T + 5.0, T + 8.0), T + 8.5, 3.5)
    _phase(paths, "a", "train", 2, T + 6.5, (T + 7.0, T + 9.0), T + 9.5, 5.5)
    append_event(paths, "job_finished", {"job": "a", "why": "finished", "time": T + 9.6})
    _grant(paths, 4, T + 9.5, {}, {2: _h("b")})
    if failed:
        append_event(paths, "job_failed", {"job": "b", "why": "failed: rank 2 (host n1): boom", "time": T + 10.2})
        return paths
    _phase(paths, "b", "train", 2, T + 9.5, (T + 10.0, T + 11.0), T + 11.5, 8.5)
    append_event(paths, "job_finished", {"job": "b", "why": "finished", "time": T + 11.6})
    write_coordinator_status(paths, {"generation": 1, "state": "finished", "grant": 4, "out": {}, "time": T + 11.7})
    return paths


@pytest.fixture()
def group(tmp_path: Path) -> Path:
    root = tmp_path / "g"
    _build(root)
    return root


def test_intervals_match_phase_records(group: Path) -> None:
    r = group_report_json(group)
    by = {(p["job"], p["pool"], p["slot"]): p for p in r["phases"]}
    assert len(by) == 6 and not r["missing"]
    a0 = by[("a", "rollout", 0)]
    assert (a0["start"], a0["work_start"], a0["work_end"], a0["end"]) == (T + 2.0, T + 2.5, T + 6.0, T + 6.5)
    assert a0["resume_s"] == pytest.approx(0.5) and a0["park_s"] == pytest.approx(0.5) and not a0["revoked"]
    a1 = by[("a", "rollout", 1)]
    assert a1["revoked"] and a1["migrated"] == 3 and a1["end"] == T + 4.5
    b0 = by[("b", "rollout", 0)]
    assert b0["skipped"] and b0["start"] is None and b0["end"] is None
    bt = by[("b", "train", 2)]
    assert (bt["iteration"], bt["start"], bt["end"]) == (0, T + 9.5, T + 11.5)
    assert r["group_start"] == T and r["span"]["start"] == T + 1.0 and r["span"]["end"] == T + 11.5


def test_busy_and_bubble_fractions(group: Path) -> None:
    pools = group_report_json(group)["pools"]
    # span 10.5 s. rollout: 2 slots = 21 slot-s; held 4.5 + 6.5 = 11, working 3.5 + 1.5 + 3 = 8
    assert pools["rollout"]["busy_fraction"] == pytest.approx(8 / 21)
    assert pools["rollout"]["switch_fraction"] == pytest.approx(3 / 21)
    assert pools["rollout"]["bubble_fraction"] == pytest.approx(10 / 21)
    # train: 10.5 slot-s; held 3 + 2 = 5, working 2 + 1 = 3
    assert pools["train"]["busy_fraction"] == pytest.approx(3 / 10.5)
    assert pools["train"]["bubble_fraction"] == pytest.approx(5.5 / 10.5)


def test_slowdown_and_slo(group: Path) -> None:
    jobs = group_report_json(group)["jobs"]
    a, b = jobs["a"], jobs["b"]
    # a: ready at +1 (granted +2 after waiting 1 s), last release +9.5; solo = rollout 2.5..6 + train 7..9
    assert a["makespan_s"] == pytest.approx(8.5) and a["est_solo_s"] == pytest.approx(5.5)
    assert a["slowdown"] == pytest.approx(8.5 / 5.5) and a["within_slo"] is True
    # b: ready at +1, last release +11.5; solo = rollout 5..8 + train 10..11
    assert b["makespan_s"] == pytest.approx(10.5) and b["est_solo_s"] == pytest.approx(4.0)
    assert b["slowdown"] == pytest.approx(2.625) and b["within_slo"] is False
    assert a["status"] == b["status"] == "finished" and a["iterations_done"] == 1
    assert a["busy_s"]["rollout"] == pytest.approx(4.5 + 2.5) and a["phases"] == 2
    assert a["switch_s"]["rollout"]["resume"]["p50"] == pytest.approx(0.5)


def test_text_report_and_timeline(group: Path) -> None:
    text = format_group_report(group, columns=21)  # 0.5 s per column over the 10.5 s span
    for job in ("a", "b"):
        assert f"\n  {job} " in text
    assert "2.62x" in text and "NO" in text
    assert "rollout   0 |..aAAAAAAAa..........|" in text
    assert "rollout   1 |..aAAAabBBBBBBb......|" in text
    assert "train     2 |...........aAAAAabBBb|" in text
    assert "A = a, B = b" in text


def test_gantt_png(group: Path, tmp_path: Path) -> None:
    out = write_group_gantt(group, tmp_path / "x" / "t.png")
    assert out == tmp_path / "x" / "t.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 5000


def test_failed_job_mid_way(tmp_path: Path) -> None:
    root = tmp_path / "g"
    _build(root, failed=True)
    r = group_report_json(root)
    assert r["jobs"]["b"]["status"] == "failed" and r["jobs"]["b"]["why"] == "rank 2 (host n1): boom"
    assert r["jobs"]["b"]["slowdown"] is None and r["jobs"]["a"]["slowdown"] == pytest.approx(8.5 / 5.5)
    open_ = [p for p in r["phases"] if p["open"]]
    assert [(p["job"], p["pool"], p["slot"], p["end"]) for p in open_] == [("b", "train", 2, None)]
    missing = "\n".join(r["missing"])
    assert "b train it 0 slots [2]" in missing and "job b: 0 of 1 iterations" in missing
    text = format_group_report(root)
    assert "failed: rank 2 (host n1): boom" in text
    assert "missing / incomplete" in text
    assert write_group_gantt(root) == root / "timeline.png" and (root / "timeline.png").stat().st_size > 0


def test_release_file_without_log_record(tmp_path: Path) -> None:
    root = tmp_path / "g"
    _group_json(root)
    paths = GroupPaths(root)
    write_release(paths, "a", "rollout", 0, 1, {"granted_seen_at": T + 1, "resume_s": 0.5, "started_at": T + 1.5,
                                                "ended_at": T + 3, "park_s": 0.5, "released_at": T + 3.5,
                                                "waited_s": 0.0})
    r = group_report_json(root)
    assert [(p["job"], p["slot"], p["start"], p["end"]) for p in r["phases"]] == [("a", 1, T + 1, T + 3.5)]
    assert any("no phase record in the log" in m for m in r["missing"])


def test_phase_freed_by_a_grant_without_release(tmp_path: Path) -> None:
    root = tmp_path / "g"
    _group_json(root)
    paths = GroupPaths(root)
    _grant(paths, 0, T, {}, {})
    _grant(paths, 1, T + 1.0, {0: _h("a"), 1: _h("a")}, {})
    _grant(paths, 2, T + 4.0, {0: _h("a", revoked=True)}, {})
    _phase(paths, "a", "rollout", 1, T + 1.0, (T + 1.5, T + 3.0), T + 3.5, 0.0)
    _grant(paths, 3, T + 6.0, {}, {})  # slot 0 freed: its release record is lost
    r = group_report_json(root)
    by = {p["slot"]: p for p in r["phases"]}
    assert by[0]["approx"] and not by[0]["open"] and by[0]["revoked"]
    assert (by[0]["start"], by[0]["end"]) == (T + 1.0, T + 6.0)
    assert not by[1]["approx"] and r["jobs"]["a"]["switch_s"]["rollout"]["resume"]["n"] == 1
    assert any("a rollout it 0 slots [0]" in m and "times from the grants" in m for m in r["missing"])


@pytest.mark.parametrize("with_group_json", [True, False])
def test_half_written_group(tmp_path: Path, with_group_json: bool) -> None:
    root = tmp_path / "g"
    root.mkdir()
    if with_group_json:
        _group_json(root)
    r = group_report_json(root)
    missing = "\n".join(r["missing"])
    assert "no records" in missing and "no grant published" in missing
    assert ("group.json missing" in missing) != with_group_json
    text = format_group_report(root)
    assert "no phase ran" in text and "missing / incomplete" in text
    if with_group_json:
        assert "\n  a " in text and "job a: no phase ran" in text
    # a torn last record and a garbage group.json do not raise either
    (root / "group.json").write_text("{not json")
    GroupPaths(root).events_dir.mkdir(parents=True, exist_ok=True)
    GroupPaths(root).decisions.write_text('{"kind": "phase", "job": "a"}\n{"kind": "gra')
    format_group_report(root)
    if not with_group_json:
        assert write_group_gantt(root).stat().st_size > 0
