"""Smoke tests of the local Slurm test cluster: multi-node srun steps, fake GPUs, accounting, submitit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_fixture import SlurmCluster, slurm_cluster  # noqa: F401  (session fixture)

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

# Each task of a step writes one JSON line with its Slurm view into DIR/STEP-PROCID.json.
_RECORD_TASK = r"""
printf '{"procid":%s,"localid":%s,"nodeid":%s,"node":"%s","nodelist":"%s","cvd":"%s","step_gpus":"%s"}\n' \
  "$SLURM_PROCID" "$SLURM_LOCALID" "$SLURM_NODEID" "$SLURMD_NODENAME" "$SLURM_JOB_NODELIST" \
  "${CUDA_VISIBLE_DEVICES-unset}" "${SLURM_STEP_GPUS-unset}" > "$OUT_DIR/$STEP-$SLURM_PROCID.json"
"""


def _records_nodelist(hosts: list[str]) -> str:
    """Slurm's compressed form of node names n<i> (n[1-2], n[2,4], n3)."""
    ids = sorted(int(h[1:]) for h in hosts)
    if len(ids) == 1:
        return f"n{ids[0]}"
    runs: list[str] = []
    start = prev = ids[0]
    for i in ids[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(f"{start}-{prev}" if prev > start else str(start))
        if i is not None:
            start = prev = i
    return f"n[{','.join(runs)}]"


def _read_step(out_dir: Path, step: str, ntasks: int) -> list[dict[str, object]]:
    records = [json.loads(p.read_text()) for p in sorted(out_dir.glob(f"{step}-*.json"))]
    assert len(records) == ntasks, f"step {step}: expected {ntasks} task records in {out_dir}, got {len(records)}"
    return sorted(records, key=lambda r: int(r["procid"]))  # type: ignore[arg-type]


def test_nodes_idle_with_gpus(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %T %G %c").stdout.split("\n")
    rows = sorted(line.split() for line in out if line.strip())
    assert [r[0] for r in rows] == [f"n{i}" for i in range(1, slurm_cluster.nodes + 1)]
    for name, state, gres, cpus in rows:
        assert state in {"idle", "mixed", "allocated"}, f"{name} is {state}"
        assert gres == f"gpu:{slurm_cluster.gpus_per_node}", f"{name} gres {gres}"
        assert int(cpus) >= slurm_cluster.gpus_per_node + 2


def test_multinode_srun_ranks_and_gpus(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    nodes, gpus = min(slurm_cluster.nodes, 2), slurm_cluster.gpus_per_node  # a 2-node job, on the nodes Slurm picks
    if nodes < 2 or gpus < 1:
        pytest.skip("needs at least 2 nodes with GPUs")
    ntasks = nodes * gpus
    task = tmp_path / "task.sh"
    task.write_text("#!/bin/bash\n" + _RECORD_TASK)
    task.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"export OUT_DIR={tmp_path}\n"
        'printf \'{"job_gpus":"%s","cvd":"%s","hosts":"%s"}\\n\' "$SLURM_JOB_GPUS" "$CUDA_VISIBLE_DEVICES" '
        '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd,)" > "$OUT_DIR/batch.json"\n'
        f"STEP=all srun {task}\n"
        f"STEP=pertask srun --gpus-per-task=1 {task}\n"
    )
    rc, job_id = slurm_cluster.sbatch_wait(
        f"--nodes={nodes}", f"--ntasks-per-node={gpus}", f"--gres=gpu:{gpus}", "--signal=B:USR1@60", "--time=5",
        f"--output={tmp_path}/slurm-%j.out", str(script), timeout=120,
    )  # fmt: skip
    assert rc == 0, "\n".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    log = "\n".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))

    batch = json.loads((tmp_path / "batch.json").read_text())
    all_gpus = ",".join(str(i) for i in range(gpus))
    hosts = batch["hosts"].split(",")
    assert len(set(hosts)) == nodes and set(hosts) <= {f"n{i}" for i in range(1, slurm_cluster.nodes + 1)}, log
    assert batch == {"job_gpus": all_gpus, "cvd": all_gpus, "hosts": ",".join(hosts)}, log

    for rec in _read_step(tmp_path, "all", ntasks):
        procid = int(rec["procid"])  # type: ignore[arg-type]
        assert rec["nodeid"] == procid // gpus and rec["localid"] == procid % gpus, rec
        assert rec["node"] == hosts[procid // gpus], rec
        assert rec["nodelist"] == _records_nodelist(hosts), rec
        assert rec["cvd"] == all_gpus, rec

    per_node: dict[int, set[str]] = {}
    for rec in _read_step(tmp_path, "pertask", ntasks):
        assert rec["cvd"] == rec["step_gpus"] and str(rec["cvd"]).isdigit(), rec
        per_node.setdefault(int(rec["nodeid"]), set()).add(str(rec["cvd"]))  # type: ignore[arg-type]
    assert per_node == {n: {str(i) for i in range(gpus)} for n in range(nodes)}, per_node

    if slurm_cluster.accounting:
        assert slurm_cluster.wait_sacct_state(job_id) == "COMPLETED"


def test_submitit_ranks_result_and_state(slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    submitit = pytest.importorskip("submitit")
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    nodes, gpus = min(slurm_cluster.nodes, 2), max(slurm_cluster.gpus_per_node, 1)

    def task_view() -> tuple[int, int, int, str]:
        import os

        import submitit as sm

        env = sm.JobEnvironment()
        return env.global_rank, env.local_rank, env.node, os.environ.get("SLURMD_NODENAME", "")

    executor = submitit.SlurmExecutor(folder=tmp_path / "submitit")
    params: dict[str, object] = {"nodes": nodes, "ntasks_per_node": gpus, "time": 5}
    if slurm_cluster.gpus_per_node:
        params["gres"] = f"gpu:{gpus}"
    executor.update_parameters(**params)
    job = executor.submit(task_view)
    results = job.results()
    results = sorted(results)
    hosts = [results[n * gpus][3] for n in range(nodes)]  # the nodes Slurm picked, in node order
    assert len(set(hosts)) == nodes, results
    assert results == [(r, r % gpus, r // gpus, hosts[r // gpus]) for r in range(nodes * gpus)]
    if slurm_cluster.accounting:
        # sacct lags the end of the job by a moment; submitit reads job.state from sacct.
        state = slurm_cluster.wait_sacct_state(job.job_id)
        assert state == "COMPLETED"
        job.get_info(mode="force")
        assert job.state == "COMPLETED"


def test_start_is_idempotent(slurm_cluster: SlurmCluster) -> None:
    from slurm_fixture import start_cluster

    pids_before = sorted(p.read_text().strip() for p in (slurm_cluster.test_dir / "run").glob("*.pid"))
    again = start_cluster(slurm_cluster.test_dir)
    pids_after = sorted(p.read_text().strip() for p in (slurm_cluster.test_dir / "run").glob("*.pid"))
    assert again.conf == slurm_cluster.conf
    assert pids_after == pids_before, "a second start.sh must not restart running daemons"


def test_two_clusters_side_by_side(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A second checkout's cluster (another SLURM_TEST_DIR) starts while this one runs, gets ports
    of its own, runs a job, and stopping it leaves this one running."""
    import os
    import subprocess

    from slurm_fixture import SLURM_TOOLS, start_cluster

    def ports(cluster: SlurmCluster) -> set[int]:
        conf = cluster.conf.read_text()
        keys = ("SlurmctldPort=", "AccountingStoragePort=")
        return {int(line.split("=", 1)[1]) for line in conf.splitlines() if line.startswith(keys)}

    other_dir = tmp_path / "c2"
    try:  # stopped in `finally` even when its start fails (its daemons would outlive the test)
        other = start_cluster(other_dir, nodes=1)
        assert ports(other).isdisjoint(ports(slurm_cluster)), (ports(other), ports(slurm_cluster))
        assert (other_dir / "state" / "ports").read_text().strip().isdigit()
        for cluster in (slurm_cluster, other):
            out = cluster.run("srun", "-N1", "-n1", "--gres=gpu:1", "bash", "-c", "echo $SLURM_JOB_ID $SLURM_CLUSTER_NAME",
                              timeout=60).stdout.split()
            assert out and out[0].isdigit()
    finally:
        subprocess.run(["bash", str(SLURM_TOOLS / "stop.sh"), "--purge"], env={**os.environ, "SLURM_TEST_DIR": str(other_dir)},
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert not other_dir.exists()
    rows = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
    # untouched: every node still up and schedulable ("planned": the backfill scheduler reserved it for a job
    # of another test that is waiting for nodes; "completing": another test's job is ending on it)
    assert rows and all(state in {"idle", "mixed", "allocated", "planned", "completing"} for state in rows), rows
