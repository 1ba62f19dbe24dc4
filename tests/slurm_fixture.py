"""Session fixture that starts the local Slurm test cluster (tools/slurm/start.sh).

Import it from a conftest or a test module::

    from slurm_fixture import slurm_cluster  # noqa: F401

The fixture yields a :class:`SlurmCluster`; pass ``cluster.env`` as ``env=`` to subprocesses, or
``monkeypatch.setenv`` its items for in-process clients such as submitit.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import filelock
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SLURM_TOOLS = REPO_ROOT / "tools" / "slurm"
# apt-get install of the Slurm + MariaDB packages takes ~40 s cold; leave room for apt-get update.
START_TIMEOUT_S = 600


@dataclass(frozen=True)
class SlurmCluster:
    """A running local test cluster and the environment its clients need."""

    env: Mapping[str, str]
    test_dir: Path
    conf: Path
    nodes: int
    gpus_per_node: int
    accounting: bool

    def run(self, *args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster; on failure the error names the command."""
        try:
            proc = subprocess.run(
                list(args), env=dict(self.env), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"{shlex.join(args)} did not finish within {timeout}s (SLURM_CONF={self.conf})") from exc
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(args)} exited {proc.returncode} (SLURM_CONF={self.conf}):\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def job_gone(self, job_id: str) -> bool:
        """Whether ``job_id`` has left the queue (ended; a requeued job is back in it)."""
        return self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip() == ""

    def sbatch_wait(self, *args: str, cwd: Path | None = None, timeout: float = 600.0) -> tuple[int, str]:
        """``sbatch ARGS`` and wait for the job's end; (the batch script's exit code, job id).

        Like ``sbatch --wait``, but polled every 0.2 s: ``sbatch --wait`` sleeps 2, 8, then 32 s
        between looks, so a job of 11 s returned after 42 s. On a submission error the exit
        code is sbatch's own and the job id is empty."""
        proc = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=dict(self.env), capture_output=True,
                              text=True, timeout=60)
        if proc.returncode != 0:
            return proc.returncode, ""
        job_id = proc.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        while not self.job_gone(job_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} (sbatch {shlex.join(args)}) did not end within {timeout}s")
            time.sleep(0.2)
        # a finished job stays in slurmctld for MinJobAge (300 s): its ExitCode is the script's status
        shown = self.run("scontrol", "show", "job", job_id).stdout
        codes = re.findall(r"\bExitCode=(\d+):(\d+)", shown)
        if not codes:
            raise RuntimeError(f"scontrol show job {job_id} gave no ExitCode:\n{shown}")
        status, signal = (int(x) for x in codes[0])
        return (status if signal == 0 else 128 + signal), job_id

    def wait_sacct_state(self, job_id: str, timeout: float = 30.0) -> str:
        """Return the final accounting State of job_id; sacct lags the job end by up to a few seconds."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = self.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", check=False).stdout
            state = out.strip().splitlines()[0].split()[0] if out.strip() else ""
            if state and state not in {"PENDING", "RUNNING", "COMPLETING", "REQUEUED"}:
                return state
            time.sleep(0.3)
        raise TimeoutError(f"sacct gave no final state for job {job_id} within {timeout}s (last: {state!r})")


def _client_env(test_dir: Path) -> dict[str, str]:
    """Environment for Slurm clients of the cluster in test_dir, as tools/slurm/env.sh exports it."""
    script = f"source {shlex.quote(str(SLURM_TOOLS / 'env.sh'))} && env -0"
    env = dict(os.environ, SLURM_TEST_DIR=str(test_dir))
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, check=True, timeout=30).stdout
    pairs = (item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if not k.startswith("BASH_FUNC_")}


def start_cluster(test_dir: Path | None = None, nodes: int | None = None) -> SlurmCluster:
    """Run tools/slurm/start.sh (idempotent) and describe the cluster; raise with its output on failure.
    ``nodes``: SLURM_TEST_NODES for a cluster of another size (default: the environment's, else 4)."""
    env = dict(os.environ)
    if test_dir is not None:
        env["SLURM_TEST_DIR"] = str(test_dir)
    if nodes is not None:
        env["SLURM_TEST_NODES"] = str(nodes)
    test_dir = Path(env.get("SLURM_TEST_DIR", REPO_ROOT / ".slurm-test"))
    env["SLURM_TEST_DIR"] = str(test_dir)
    try:
        proc = subprocess.run(
            ["bash", str(SLURM_TOOLS / "start.sh")],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"tools/slurm/start.sh did not finish within {START_TIMEOUT_S}s ({test_dir})") from exc
    if proc.returncode != 0:
        raise RuntimeError(
            f"tools/slurm/start.sh failed (rc={proc.returncode}, SLURM_TEST_DIR={test_dir}):\n{proc.stderr}{proc.stdout}"
        )
    client_env = _client_env(test_dir)
    return SlurmCluster(
        env=client_env,
        test_dir=test_dir,
        conf=Path(client_env["SLURM_CONF"]),
        nodes=int(env.get("SLURM_TEST_NODES", "4")),
        gpus_per_node=int(env.get("SLURM_TEST_GPUS", "4")),
        accounting=env.get("SLURM_TEST_ACCOUNTING", "1") == "1",
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the local Slurm cluster once per session (skipped only off Linux or without root).

    The cluster keeps running after the session (start.sh is idempotent and a warm start takes
    ~1 s); stop it with tools/slurm/stop.sh, or set SLURM_TEST_STOP=1 to stop it at session end.
    """
    if platform.system() != "Linux" or os.geteuid() != 0:
        pytest.skip("the local Slurm test cluster needs Linux and root")
    # pytest-xdist workers each ask for the cluster: one start at a time (start.sh is idempotent)
    with filelock.FileLock(str(REPO_ROOT / ".slurm-test.lock"), timeout=START_TIMEOUT_S + 60):
        cluster = start_cluster()
    yield cluster
    if os.environ.get("SLURM_TEST_STOP") == "1" and not os.environ.get("PYTEST_XDIST_WORKER"):
        subprocess.run(
            ["bash", str(SLURM_TOOLS / "stop.sh")],
            env={**os.environ, "SLURM_TEST_DIR": str(cluster.test_dir)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
