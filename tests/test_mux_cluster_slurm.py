"""The placer across groups on the local Slurm cluster, for real: two groups run (``sbatch
sbatch/mux.sh``); ``slurm-rl mux place`` puts a third job directly into one of them, runs a fourth
(an SLO no group keeps) co-located on 2 GPUs of its own, its components sharing them, through
``sbatch sbatch/train.sh``, and refuses a fifth with its reason (exit 2); every placed job runs to its
end, producing and training each sample once, and ``slurm-rl inspect DIR`` shows the decisions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emulated_configs import write_config
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.paths import RunPaths
from slurm_rl.metrics import read_metrics
from slurm_rl.mux.group_state import group_state
from resume_helpers import wait_until
from test_mux_live import job_config
from test_scheduling_backends import check_every_sample_once
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600.0
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def small_job(run_dir: Path, iterations: int, seed: int) -> dict:
    """3 ranks (actor 0, inference 1, rollout 2): a group of one such job takes 3 GPUs."""
    cfg = job_config("emulated", run_dir, iterations=iterations, seed=seed)
    cfg["cluster"] = {"num_nodes": 1, "gpus_per_node": 3,
                      "component_placement": {"actor": "0", "inference": "1", "rollout": "2"}}
    cfg["runtime"]["keep_iterations"] = iterations  # every iteration's data stays for the check
    return cfg


def test_place_direct_new_and_refused_on_slurm(slurm_cluster, tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    env = dict(os.environ, **slurm_cluster.env)
    jobs = {name: small_job(tmp_path / name, iterations, seed)
            for name, iterations, seed in [("a", 30, 1), ("b", 30, 2), ("c", 3, 3), ("d", 3, 4), ("e", 3, 5)]}
    for name, cfg in jobs.items():
        write_config(tmp_path / f"{name}.yaml", cfg)
    slurm_ids = []
    for g, name in (("g1", "a"), ("g2", "b")):  # two live groups of one job each, 3 GPUs each
        doc = {"group": {"dir": str(cluster / g), "pools": {"rollout": "0", "train": "1-2"}, "tail_fraction": 1.0,
                         "poll_interval_s": 0.02, "timeout_s": 600, "park_s": 0.02, "gpus_per_node": 4},
               "jobs": {name: {"config": str(tmp_path / f"{name}.yaml"), "slo": 4.0}}}
        (tmp_path / f"{g}.yaml").write_text(yaml.safe_dump(doc))
        proc = slurm_cluster.run("sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=3", "--gres=gpu:3",
                                 f"--output={tmp_path / g}.out", str(REPO / "sbatch" / "mux.sh"), str(tmp_path / f"{g}.yaml"))
        slurm_ids.append(proc.stdout.strip().split(";")[0])
    wait_until("both groups to run", lambda: all(group_state(cluster / g)[0] == "running" for g in ("g1", "g2")), TIMEOUT_S)

    def place(name: str, slo: float) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "mux", "place", str(tmp_path / f"{name}.yaml"),
                               "--cluster", str(cluster), "--name", name, "--slo", str(slo), "--max-gpus", "9",
                               "--json"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)

    third = place("c", 4.0)  # a loose SLO: a running group admits it
    assert third.returncode == 0, third.stderr
    c = json.loads(third.stdout)
    assert c["kind"] == "direct" and c["group"] in (str(cluster / "g1"), str(cluster / "g2"), "g1", "g2"), c
    # a tight SLO: no group admits it, 3 of 9 GPUs are free: a new group (the test cluster has 8: it
    # waits in Slurm's queue until a group ends)
    fourth = place("d", 1.1)
    assert fourth.returncode == 0, fourth.stderr
    d = json.loads(fourth.stdout)
    # ... and its components time-slice 2 GPUs of its own (its policy is static) for less than a new group's 3
    assert d["kind"] == "colocated" and d["action"]["submitted"] and d["action"]["sbatch_job"], d
    assert d["action"]["gpus"] == 2 and "cluster.component_placement={'actor,inference,rollout': '0-1'}" \
        in d["action"]["sbatch_args"], d["action"]
    fifth = place("e", 1.1)  # likewise, and too few GPUs are left: refused with the reason
    assert fifth.returncode == 2, (fifth.stdout, fifth.stderr)
    assert "capacity" in fifth.stdout + fifth.stderr and "1 of 9" in fifth.stdout + fifth.stderr, fifth.stdout

    slurm_ids.append(str(d["action"]["sbatch_job"]))
    for job_id in slurm_ids:
        wait_until(f"Slurm job {job_id} to end", lambda: slurm_cluster.job_gone(job_id), TIMEOUT_S)
    log = [json.loads(line) for line in (cluster / "placements.jsonl").read_text().splitlines()]
    assert [(r["job"], r["kind"]) for r in log] == [("c", "direct"), ("d", "colocated"), ("e", "refused")], log
    assert all(r.get("reason") for r in log)
    c_group = cluster / Path(c["group"]).name
    for group_dir, name in ((c_group, "c"), (cluster / "g1", "a"), (cluster / "g2", "b")):
        assert group_state(group_dir)[0] == "finished", (group_dir, name)
        check_every_sample_once(GroupPaths(group_dir).job_dir(name), jobs[name])
    d_run = Path(d["action"]["run_dir"])  # the co-located run, through sbatch/train.sh
    assert len(read_metrics(d_run)) == jobs["d"]["train"]["num_iterations"]
    check_every_sample_once(d_run, jobs["d"])
    assert all(e.ranks_of("actor") == e.ranks_of("rollout") == e.ranks_of("inference") == [0, 1]
               for e in EpochStore(RunPaths(d_run)).all())
    shown = subprocess.run([*CLI, "inspect", str(cluster)], capture_output=True,
                           text=True, cwd=REPO, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for word in ("direct", "colocated", "refused", f"submitted as Slurm job {d['action']['sbatch_job']}"):
        assert word in shown.stdout, shown.stdout
    as_json = subprocess.run([*CLI, "inspect", "--json", str(cluster)],
                             capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert "capacity" in as_json.stdout and "1 of 9" in as_json.stdout, as_json.stdout
