"""The local launcher's fork server (slurm_rl.launch.forkserver): a rank forked from the run's warm
interpreter is a worker of its own (own session, own environment, default signal dispositions, no
torch in an emulated rank); exit codes, failures and kills read as with a fresh process per rank;
the server goes away with its run, and with its launcher. The server's life is checked both as a
fresh process and forked from a zygote (slurm_rl.launch.zygote)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from resume_helpers import INTERRUPTIBLE, REPO, cli, run_config, wait_until
from slurm_rl.control.heartbeats import read_heartbeat
from slurm_rl.control.lease import read_lease
from slurm_rl.control.paths import RunPaths
from slurm_rl.errors import LaunchError
from slurm_rl.launch.forkserver import ForkedRank, ForkServer, _gpu_visible, ignored_signals
from slurm_rl.launch.local import LocalJob, worker_env
from slurm_rl.launch.zygote import ENV as ZYGOTE_ENV
from slurm_rl.launch.zygote import ZygoteProcess
from zygotes import caller_ignoring, start_zygotes, stop_zygotes

WORLD = 4


@pytest.fixture(params=["fresh", "zygote"])
def server_start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """How the run's fork server starts: a fresh interpreter, or forked from a zygote (the session's,
    or one of this test's own when the session runs without)."""
    if request.param == "fresh":
        monkeypatch.delenv(ZYGOTE_ENV, raising=False)
        yield request.param
        return
    own: list[subprocess.Popen] = []
    if not os.environ.get(ZYGOTE_ENV):
        directory = tmp_path_factory.mktemp("zygotes")
        own = start_zygotes(directory, ["emulated"])
        monkeypatch.setenv(ZYGOTE_ENV, str(directory))
    try:
        yield request.param
    finally:
        stop_zygotes(own)


def started_as(job: LocalJob, how: str) -> bool:
    return isinstance(job._server.proc, ZygoteProcess if how == "zygote" else subprocess.Popen)


def prepare(tmp_path: Path, backend: str = "emulated") -> Path:
    """A prepared 4-rank run, slow enough (0.25 s polls) to be looked at while it runs."""
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config(backend, run_dir, **INTERRUPTIBLE)))
    proc = cli("prepare", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def blocked_signals(pid: int, settle_s: float = 2.0) -> int:
    """The process's blocked signals once it is not starting a subprocess: CPython blocks every signal
    in the parent from vfork to the child's exec (rank 0 starts its coordinator so, right when its
    heartbeat appears), a window of milliseconds; a mask that stays set for ``settle_s`` is returned."""
    deadline = time.monotonic() + settle_s
    while (mask := int(status(pid)["SigBlk"], 16)) != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return mask


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        return status(pid)["State"][0] not in "ZX"
    except (OSError, KeyError):
        return False


def gone(pids: list[int], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def heartbeat_pids(job: LocalJob, run_dir: Path) -> dict[int, int]:
    pids: dict[int, int] = {}

    def every_rank_beats() -> bool:
        assert job.poll() is None, "the run ended before every rank was seen"
        for rank in range(WORLD):
            beat = read_heartbeat(RunPaths(run_dir), rank)
            if beat is not None:
                pids[rank] = int(beat["pid"])
        return len(pids) == WORLD

    wait_until("every rank's heartbeat", every_rank_beats, timeout=120)
    return pids


def finish(job: LocalJob, timeout: float = 300.0) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while (codes := job.poll()) is None:
        assert time.monotonic() < deadline, "the run did not finish"
        time.sleep(0.05)
    return codes


def test_forked_ranks_are_workers_of_their_own(tmp_path: Path, server_start: str) -> None:
    """Started by a launcher that ignores SIGHUP (as under ``nohup``), each rank ignores it too, as the
    fresh process it stands for would have; no other signal the server ignores."""
    run_dir = prepare(tmp_path)
    with caller_ignoring((signal.SIGHUP,)):
        job = LocalJob(run_dir, WORLD, forkserver=True)
        launcher_ignores = ignored_signals()
    assert signal.SIGHUP in launcher_ignores
    try:
        assert started_as(job, server_start)
        assert all(isinstance(p, ForkedRank) for p in job.procs.values())
        pids = heartbeat_pids(job, run_dir)
        server = job._server.proc.pid
        for rank, pid in pids.items():
            assert job.procs[rank].pid == pid
            assert os.getsid(pid) == pid and os.getpgid(pid) == pid  # own session, as start_new_session
            st = status(pid)
            assert int(st["PPid"]) == server
            assert blocked_signals(pid) == 0
            ignored = int(st["SigIgn"], 16)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
                # the server ignores them; the rank, as a fresh process of the launcher's, only what the launcher does
                assert bool(ignored & (1 << (sig - 1))) == (sig in launcher_ignores), (rank, sig)
            assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text()  # an emulated rank never loads torch
            assert os.readlink(f"/proc/{pid}/fd/1") == str(run_dir / "logs" / f"rank-{rank:04d}.log")
            assert os.readlink(f"/proc/{pid}/fd/2") == os.readlink(f"/proc/{pid}/fd/1")
        codes = finish(job)
    finally:
        job.kill()
    assert codes == {rank: 0 for rank in range(WORLD)}
    for rank in range(WORLD):  # each rank found its own SLURM_RL_RANK in its environment
        assert f"[rank {rank}/{WORLD} " in (run_dir / "logs" / f"rank-{rank:04d}.log").read_text()
    log = (run_dir / "logs" / "forkserver.log").read_text()
    assert "device emulated" in log and "torch: no" in log, log
    assert job._server.proc.returncode == 0  # it left on its own once every rank was reaped


@pytest.mark.parametrize("path", ["forkserver", "popen"])
def test_a_rank_killed_by_a_signal_fails_the_run_with_its_log(path: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit code reads as Popen's (-9: SIGKILL), the others are stopped, the log tail is told.
    ``SLURM_RL_FORKSERVER=0`` keeps a fresh process per rank."""
    run_dir = prepare(tmp_path)
    monkeypatch.setenv("SLURM_RL_FAULT", "weight_sync@rank=0,iteration=1")
    monkeypatch.setenv("SLURM_RL_FORKSERVER", "1" if path == "forkserver" else "0")
    job = LocalJob(run_dir, WORLD)
    try:
        assert all(isinstance(p, ForkedRank if path == "forkserver" else subprocess.Popen) for p in job.procs.values())
        with pytest.raises(LaunchError) as err:
            finish(job)
    finally:
        job.kill()
    assert "rank 0 exited with code -9" in str(err.value)
    assert "fault drill: SIGKILL at weight_sync" in str(err.value)
    assert gone([p.pid for p in job.procs.values()])
    if path == "forkserver":
        assert job._server.proc.returncode is not None


def test_kill_stops_every_rank_and_the_coordinator(tmp_path: Path, server_start: str) -> None:
    run_dir = prepare(tmp_path)
    job = LocalJob(run_dir, WORLD, forkserver=True)
    try:
        assert started_as(job, server_start)
        pids = heartbeat_pids(job, run_dir)
        wait_until("the coordinator's lease", lambda: (read_lease(RunPaths(run_dir)) or {}).get("holder"))
        coordinator = read_lease(RunPaths(run_dir))["holder"]["pid"]
    finally:
        job.kill()
    assert {r: p.returncode for r, p in job.procs.items()} == {r: -signal.SIGKILL for r in range(WORLD)}
    assert gone([*pids.values(), coordinator])
    assert job._server.proc.returncode is not None


def test_a_dead_server_fails_the_run_and_its_ranks_are_stopped(tmp_path: Path, server_start: str) -> None:
    run_dir = prepare(tmp_path)
    job = LocalJob(run_dir, WORLD, forkserver=True)
    try:
        assert started_as(job, server_start)
        pids = heartbeat_pids(job, run_dir)
        os.kill(job._server.proc.pid, signal.SIGKILL)
        with pytest.raises(LaunchError, match="fork server of this run exited with code -9"):
            finish(job)
    finally:
        job.kill()
    assert gone(list(pids.values()))


def test_a_server_that_loaded_cuda_falls_back_to_fresh_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that loaded the CUDA driver cannot hand CUDA to a forked child: the server then
    forks nothing and the launcher starts each rank as before. (The driver here: some library
    named libcuda.so.1, loaded by a sitecustomize before anything else.)"""
    import _json

    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(_json.__file__, site / "libcuda.so.1")
    (site / "sitecustomize.py").write_text(f"import ctypes\nctypes.CDLL({str(site / 'libcuda.so.1')!r})\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    run_dir = prepare(tmp_path)
    job = LocalJob(run_dir, WORLD, forkserver=True)
    try:
        assert all(isinstance(p, subprocess.Popen) for p in job.procs.values())
        codes = finish(job)
    finally:
        job.kill()
    assert codes == {rank: 0 for rank in range(WORLD)}
    assert "loaded the CUDA driver" in (run_dir / "logs" / "forkserver.log").read_text()


def test_the_server_leaves_with_its_launcher(tmp_path: Path, server_start: str) -> None:
    """The launcher SIGKILLed: the server leaves (the ranks, in sessions of their own, carry on
    as fresh processes would have; this test then stops them)."""
    run_dir = prepare(tmp_path)
    script = ("import sys, time; from pathlib import Path; from slurm_rl.launch.local import LocalJob, worker_env; "
              "job = LocalJob(Path(sys.argv[1]), 4, forkserver=True); "
              "print(type(job._server.proc).__name__, job._server.proc.pid, *(p.pid for p in job.procs.values()), flush=True); "
              "time.sleep(600)")
    launcher = subprocess.Popen([sys.executable, "-c", script, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    ranks: list[int] = []
    try:
        kind, server, *ranks = launcher.stdout.readline().split()
        server, ranks = int(server), [int(r) for r in ranks]
        assert len(ranks) == WORLD and kind == ("ZygoteProcess" if server_start == "zygote" else "Popen")
        launcher.kill()
        launcher.wait()
        assert gone([server], timeout=10)
    finally:
        launcher.kill()
        for pid in ranks:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_rank_the_server_cannot_start_is_a_launch_error(tmp_path: Path) -> None:
    """Rank 2's log cannot be opened: a LaunchError naming it, and the ranks forked before and
    after it are stopped with the server."""
    run_dir = prepare(tmp_path)
    server = ForkServer(run_dir, dict(os.environ), run_dir / "logs")
    logs = {rank: run_dir / "logs" / f"rank-{rank:04d}.log" for rank in range(WORLD)}
    logs[2] = tmp_path / "no-such-dir" / "rank-0002.log"
    try:
        with pytest.raises(LaunchError, match="could not start rank 2: cannot open its log"):
            server.start([(rank, worker_env(rank, WORLD, "t", 29500, dict(os.environ)), logs[rank])
                          for rank in range(WORLD)])
        forked = list(server._pids.values())
        assert len(forked) == WORLD - 1
    finally:
        server.abort()
    assert gone(forked)
    assert server.proc.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_cpu_server_preloads_torch_and_megatron_without_threads(tmp_path: Path) -> None:
    """A cpu run's server imports torch and megatron-core and starts no thread of its own (the
    only other one: pyarrow's jemalloc background thread)."""
    run_dir = prepare(tmp_path, "cpu")
    proc = subprocess.run([sys.executable, "-m", "slurm_rl.launch.forkserver", str(run_dir)], cwd=REPO,
                          input="", capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    megatron = "no" if _gpu_visible() else "yes"  # with a driver, apply_cpu_shim would touch CUDA
    assert "device cpu" in proc.stderr and f"torch: yes, megatron-core: {megatron}" in proc.stderr, proc.stderr
    threads = proc.stderr.split("threads: ", 1)[1].splitlines()[0]
    names = yaml.safe_load(threads.split(" ", 1)[1])
    assert len(names) - names.count("jemalloc_bg_thd") == 1, threads
