"""The placer across groups (``slurm-rl mux place``): decisions over live groups built as files.

Groups are prepared for real (``prepare_group``: group.json, run dirs, config.yaml) from the emulated
example jobs and marked running with a fresh group scheduler status; Slurm's side (``sbatch``,
``squeue``, ``sinfo``) is faked, and so is ``add_job`` except in the one join that runs it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import write_coordinator_status
from slurm_rl.mux.launcher import prepare_group
from slurm_rl.mux import live, placer
from slurm_rl.mux.cluster_view import cluster_report, cluster_report_json
from slurm_rl.mux.live import read_cluster
from slurm_rl.mux.placer_cli import main as place_main
from slurm_rl.mux.slurm_capacity import Capacity, gres_gpus, parse_job_id, parse_sinfo, resource_args
from slurm_rl.mux.admission import AdmissionDecision

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples" / "mux"
ROLLOUT_HEAVY = EXAMPLES / "job_rollout_heavy.yaml"
BALANCED = EXAMPLES / "job_balanced.yaml"
NO_QUEUE = staticmethod(lambda ids: None)  # squeue unavailable: submitted groups stay pending


def cap(gpus: int | None) -> Capacity:
    return Capacity(gpus, f"test: {gpus} GPUs", gpus_per_node=8, gres=True)


def make_group(cluster: Path, name: str, jobs: dict[str, tuple[Path, float]], state: str = "running",
               status_age_s: float = 0.0) -> Path:
    """A prepared group under ``cluster`` (pools rollout 0-3, train 4-7) whose scheduler says ``state``."""
    spec = {"group": {"dir": str(cluster / name), "pools": {"rollout": "0-3", "train": "4-7"}, "park_s": 0.05},
            "jobs": {j: {"config": str(cfg), "slo": slo} for j, (cfg, slo) in jobs.items()}}
    path = cluster.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    gdir = prepare_group(path).dir
    if state is not None:
        write_coordinator_status(GroupPaths(gdir), {"generation": 1, "state": state, "grant": 0, "out": {},
                                                    "host": "elsewhere", "pid": 1,
                                                    "time": time.time() - status_age_s})
    return gdir


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    d = tmp_path / "cluster"
    d.mkdir()
    return d


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """sbatch records its arguments and answers job ids 1000, 1001, ...; squeue shows those jobs pending."""
    calls: list[list[str]] = []

    def sbatch(args, cwd, env=None, timeout_s=120.0):
        calls.append(list(args))
        time.sleep(0.2)  # a slow submission: a racing placer would overtake here
        return str(1000 + len(calls) - 1)

    def squeue_states(ids):
        submitted = {str(1000 + i) for i in range(len(calls))}
        return {i: "PENDING" for i in ids if i in submitted}

    monkeypatch.setattr(placer, "sbatch", sbatch)
    monkeypatch.setattr(live, "squeue_states", squeue_states)
    return calls


def place(config: Path, cluster: Path, gpus: int | None, **kw):
    return placer.place(config, cluster, capacity=cap(gpus), queued=lambda ids: None, colocated=False, **kw)


def log_lines(cluster: Path) -> list[dict]:
    path = cluster / "placements.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# -- decisions ----------------------------------------------------------------------------------------

def test_direct_into_the_group_that_admits_it(cluster: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 3.0)})
    calls = []
    monkeypatch.setattr(placer, "add_job", lambda gdir, name, config, overrides, slo, max_response_length:
                        calls.append((Path(gdir).name, name, Path(config), slo)) or {"record": 7})
    p = place(ROLLOUT_HEAVY, cluster, 8, name="b", slo=3.0)
    assert (p.kind, p.group) == ("direct", "g1"), p.reason
    assert calls == [("g1", "b", ROLLOUT_HEAVY, 3.0)]
    assert p.figures["delta_cost_per_h"] == 0.0 and set(p.figures["slowdowns"]) == {"a", "b"}
    assert p.figures["member_times"] == {"g1": {"a": "predicted"}}
    (row,) = log_lines(cluster)
    assert row["kind"] == "direct" and row["group"] == "g1" and row["action"]["record"] == 7
    assert row["decision_ms"] > 0 and row["total_ms"] >= row["decision_ms"]


def test_direct_join_runs_add_job(cluster: Path) -> None:
    gdir = make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 10.0)})
    p = place(ROLLOUT_HEAVY, cluster, 8, name="b", slo=10.0)
    assert (p.kind, p.group, p.action["joined"]) == ("direct", "g1", True), p.reason
    group = json.loads((gdir / "group.json").read_text())
    assert group["members"] == ["a", "b"] and (gdir / "jobs" / "b" / "config.yaml").is_file()


def test_new_group_when_none_admits_and_gpus_are_free(cluster: Path, fake_slurm: list[list[str]]) -> None:
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0)})
    p = place(BALANCED, cluster, 16, name="b", slo=1.5, sbatch_args=["--partition=gpu"])
    assert p.kind == "new" and p.group == "group-001", p.reason
    assert p.action["submitted"] and p.action["sbatch_job"] == "1000" and p.action["gpus"] == 8
    (args,) = fake_slurm
    assert args[-2:] == [str(placer.REPO_ROOT / "sbatch" / "mux.sh"), str(cluster / "groups" / "group-001.yaml")]
    assert "--gres=gpu:8" in args and "--partition=gpu" in args
    doc = yaml.safe_load((cluster / "groups" / "group-001.yaml").read_text())
    assert doc["group"]["pools"] == {"rollout": "0-3", "train": "4-7"}
    assert doc["group"]["dir"] == str(cluster / "group-001") and doc["jobs"]["b"]["slo"] == 1.5
    groups = {g.name: g for g in read_cluster(cluster, queued=lambda ids: {"1000": "PENDING"})}
    assert groups["group-001"].state == "pending" and groups["group-001"].gpus == 8
    assert "pending" in groups["group-001"].why


def test_refused_with_reason_when_capacity_is_exhausted(cluster: Path, fake_slurm: list[list[str]]) -> None:
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0)})
    p = place(BALANCED, cluster, 8, name="b", slo=1.5)
    assert p.kind == "refused" and not fake_slurm
    assert "capacity: a new group needs 8 GPUs, 0 of 8 free" in p.reason
    assert "group g1: SLO: b" in p.reason
    assert log_lines(cluster)[-1]["kind"] == "refused"


def test_capacity_unknown_refuses_a_new_group(cluster: Path) -> None:
    p = place(BALANCED, cluster, None, name="b", dry_run=True)
    assert p.kind == "refused" and "capacity unknown" in p.reason


def test_scaled_falls_back_to_an_executable_choice(cluster: Path, monkeypatch: pytest.MonkeyPatch,
                                                   fake_slurm: list[list[str]]) -> None:
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0)})
    real = placer._admit
    seen = []

    def admit(job, specs, adm, hybrid=True):
        seen.append(adm.max_added_rollout_slots)
        if len(seen) == 1:
            return AdmissionDecision("scaled", 0, 2, (4, 5, 6, 7), 2.0, 0.1, {"a": 1.2, job.name: 1.4})
        return real(job, specs, adm, hybrid)

    monkeypatch.setattr(placer, "_admit", admit)
    p = place(BALANCED, cluster, 16, name="b", slo=1.5, dry_run=True)
    assert p.predicted == "scaled into g1" and p.figures["predicted"]["added_rollout_slots"] == 2
    assert p.kind == "new" and seen == [4, 0]
    assert "cannot grow" in p.fallbacks[0] and "scaled into g1, not carried out" in p.reason


def test_a_config_that_cannot_join_a_group_is_refused(cluster: Path) -> None:
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0)})
    p = place(ROLLOUT_HEAVY, cluster, 16, name="b", slo=2.0, dry_run=True,
              overrides=["cluster.component_placement={'actor,inference,rollout': '0-7'}"])
    assert p.kind == "refused" and "serve rollout and actor/inference" in p.reason, p.reason


def test_colocated_falls_back_for_a_job_whose_policy_cannot_share_slots(cluster: Path) -> None:
    """Under auto the job's ranks move between components: it cannot run co-located (static can), nor
    join a group (members are static), and a new group of its own is a group too: refused."""
    p = placer.place(BALANCED, cluster, name="b", slo=2.0, capacity=cap(16), queued=lambda ids: None, dry_run=True,
                     overrides=["cluster.auto_scheduler=true", "scheduler.policy=auto",
                                "cluster.component_placement={actor: 0-1, rollout: 2-5, inference: 6-7}"])
    assert p.predicted == "colocated" and p.kind == "refused", p.reason
    assert "cannot share its slots: cluster.component_placement" in p.reason, p.reason


def test_a_colocated_choice_is_submitted_with_shared_slots(cluster: Path, fake_slurm: list[list[str]]) -> None:
    """A static job time-slices shared slots: the placer submits it co-located."""
    p = placer.place(BALANCED, cluster, name="b", slo=2.0, capacity=cap(16), queued=lambda ids: None)
    assert p.kind == "colocated" and p.group == "b-colocated", p.reason
    (args,) = fake_slurm
    assert str(placer.REPO_ROOT / "sbatch" / "train.sh") in args and "--gres=gpu:4" in args
    assert "cluster.component_placement={'actor,inference,rollout': '0-3'}" in args
    assert p.action["gpus"] == 4
    # its GPUs count for the next placer
    assert {g.name: g.gpus for g in read_cluster(cluster, queued=lambda ids: None)} == {"b-colocated": 4}


# -- the cluster as files --------------------------------------------------------------------------------

def test_read_cluster_states_members_and_measured_times(cluster: Path) -> None:
    g1 = make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0), "b": (BALANCED, 3.0)})
    make_group(cluster, "g2", {"c": (BALANCED, 2.0)}, state="finished")
    make_group(cluster, "g3", {"d": (BALANCED, 2.0)}, status_age_s=3600)  # nothing alive
    make_group(cluster, "g4", {"e": (BALANCED, 2.0)}, state=None)  # prepared, not started
    write_coordinator_status(RunPaths(g1 / "jobs" / "b"), {"generation": 1, "state": "finished"})
    paths = GroupPaths(g1)
    for pool, secs in (("rollout", 4.0), ("train", 1.0)):
        d = paths.releases_dir("a", pool, 0)
        d.mkdir(parents=True)
        for slot in range(2):
            (d / f"slot-{slot:04d}.json").write_text(json.dumps({"started_at": 100.0, "ended_at": 100.0 + secs}))
    groups = {g.name: g for g in read_cluster(cluster, queued=lambda ids: None)}
    assert {n: g.state for n, g in groups.items()} == {"g1": "running", "g2": "finished", "g3": "stale",
                                                        "g4": "pending"}
    g = groups["g1"]
    assert [m.name for m in g.members] == ["a"] and "b" in g.out and g.target
    (a,) = g.members
    assert a.times == "measured (1 rollout, 1 train phases)"
    assert a.profile.expected_rollout_s(4) == pytest.approx(4.0) and a.profile.expected_train_s() == pytest.approx(1.0)
    assert not groups["g3"].target and groups["g3"].holds_gpus and not groups["g2"].holds_gpus


def test_a_submitted_group_that_left_the_queue_is_failed(cluster: Path) -> None:
    rec = {"time": 1.0, "job": "x", "kind": "new", "action": {"group": "group-001", "submitted": True,
                                                             "sbatch_job": "77", "gpus": 8, "pools": {}}}
    (cluster / "placements.jsonl").write_text(json.dumps(rec) + "\n")
    (g,) = read_cluster(cluster, queued=lambda ids: {})
    assert g.state == "failed" and not g.holds_gpus
    (g,) = read_cluster(cluster, queued=lambda ids: {"77": "PENDING"})
    assert g.state == "pending" and g.gpus == 8


# -- two placers, the log, dry runs -----------------------------------------------------------------------

def test_two_placers_never_take_the_same_gpus(cluster: Path, fake_slurm: list[list[str]]) -> None:
    results: dict[str, object] = {}

    def run(name: str) -> None:
        results[name] = place(ROLLOUT_HEAVY, cluster, 8, name=name, slo=2.0)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    kinds = sorted(p.kind for p in results.values())
    assert kinds == ["new", "refused"], [p.reason for p in results.values()]
    assert len(fake_slurm) == 1
    refused = next(p for p in results.values() if p.kind == "refused")
    assert "0 of 8 free (8 held" in refused.reason
    assert sorted(r["kind"] for r in log_lines(cluster)) == ["new", "refused"]


def test_lock_timeout_names_the_lock(cluster: Path) -> None:
    with placer.placer_lock(cluster):
        with pytest.raises(placer.PlacerLockTimeout, match="placer.lock"):
            def other() -> None:
                place(ROLLOUT_HEAVY, cluster, 8, name="z", lock_timeout_s=0.2)
            t = threading.Thread(target=lambda: results.append(_raises(other)))
            results: list = []
            t.start()
            t.join(30)
            raise results[0]


def _raises(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        return exc
    return None


def test_dry_run_writes_nothing(tmp_path: Path, cluster: Path) -> None:
    absent = tmp_path / "absent"
    p = place(ROLLOUT_HEAVY, absent, 8, name="b", dry_run=True)
    assert p.kind == "new" and p.dry_run and not absent.exists()
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0)})
    before = sorted(x.relative_to(cluster) for x in cluster.rglob("*"))
    p = place(BALANCED, cluster, 8, name="c", dry_run=True, slo=1.5)
    assert p.kind == "refused" and sorted(x.relative_to(cluster) for x in cluster.rglob("*")) == before


def test_sbatch_failure_is_logged_and_raised(cluster: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_rl.mux.slurm_capacity import SbatchError

    def broken(args, cwd, env=None, timeout_s=120.0):
        raise SbatchError("sbatch exited 1: invalid partition specified: nope; nothing was submitted")

    monkeypatch.setattr(placer, "sbatch", broken)
    with pytest.raises(SbatchError, match="invalid partition"):
        place(ROLLOUT_HEAVY, cluster, 8, name="b")
    (row,) = log_lines(cluster)
    assert row["kind"] == "new" and row["action"]["submitted"] is False and "invalid partition" in row["action"]["error"]
    assert read_cluster(cluster, queued=lambda ids: None) == []  # not pending: nothing was submitted


# -- command line and inspection ---------------------------------------------------------------------------

def test_cli_refusal_and_bad_input_exit_2(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0)})
    assert place_main([str(BALANCED), "--cluster", str(cluster), "--max-gpus", "8", "--slo", "1.5",
                       "--no-colocated", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["kind"] == "refused" and "refused: capacity" in err
    assert place_main([str(BALANCED), "--cluster", str(cluster), "--max-gpus", "8", "--name", "Bad Name"]) == 2
    assert "--name: got 'Bad Name'; allowed: lower-case" in capsys.readouterr().err
    assert place_main([str(BALANCED), "--cluster", str(cluster), "--max-gpus", "8", "--name", "a"]) == 2
    assert "allowed: a name no group" in capsys.readouterr().err
    assert place_main([str(BALANCED), "train.num_iterations=0", "--cluster", str(cluster), "--max-gpus", "8"]) == 2
    assert "train.num_iterations" in capsys.readouterr().err


def test_cluster_report_lists_the_decisions(cluster: Path, fake_slurm: list[list[str]]) -> None:
    make_group(cluster, "g1", {"a": (ROLLOUT_HEAVY, 2.0)})
    place(BALANCED, cluster, 16, name="b", slo=1.5)
    place(BALANCED, cluster, 16, name="c", slo=1.5)
    text = cluster_report(cluster)
    assert "g1" in text and "group-001" in text and "submitted as Slurm job 1000" in text
    rows = [line for line in text.splitlines() if " new " in line or " refused " in line]
    assert len(rows) == 2 and "refused" in rows[1]
    doc = cluster_report_json(cluster)
    assert doc["held_gpus"] == 16 and [r["job"] for r in doc["placements"]] == ["b", "c"]


# -- Slurm's words ---------------------------------------------------------------------------------------

def test_sinfo_gres_and_job_ids() -> None:
    text = ("n1|gpu*|64|gpu:h100:8(S:0-1)|idle\nn2|gpu*|64|gpu:8|mix\nn3|gpu*|64|gpu:8|drain\n"
            "c1|cpu|32|(null)|idle\nn1|all|64|gpu:h100:8(S:0-1)|idle\n")
    c = parse_sinfo(text, None)
    assert (c.total_gpus, c.gpus_per_node, c.gres) == (16, 8, True) and "partition gpu" in c.source
    c = parse_sinfo(text, "cpu")
    assert (c.total_gpus, c.gres) == (32, False)
    with pytest.raises(Exception, match="partition 'nope' not found"):
        parse_sinfo(text, "nope")
    assert gres_gpus("gpu:a100:4,gpu:v100:2(S:0)") == 6 and gres_gpus("(null)") == 0
    assert parse_job_id("1234\n") == "1234" and parse_job_id("99;cluster1") == "99"
    assert parse_job_id("Submitted batch job 5") == "5"
    assert resource_args(12, cap(16)) == ["--nodes=2", "--ntasks-per-node=6", "--gres=gpu:6"]
