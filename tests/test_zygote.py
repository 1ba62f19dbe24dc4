"""A zygote (slurm_rl.launch.zygote) forks ``python -m MODULE`` as a fresh interpreter would have
started it: the caller's fds, environment and working directory, a session of its own, default
signals, the module as ``__main__``, the exit code (or the killing signal) reported back; a caller
it cannot serve as that interpreter gets a fresh process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_rl.launch import zygote
from slurm_rl.launch.forkserver import ignored_signals
from zygotes import REPO, caller_ignoring, start_zygotes, stop_zygotes

PROBE = '''
import json, os, signal, sys
print(json.dumps({"pid": os.getpid(), "name": __name__, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
                  "leader": os.getsid(0) == os.getpid(), "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                  "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                  "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                  "ignored": [l for l in open("/proc/self/status") if l.startswith("SigIgn")][0].split()[1]}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
line = sys.stdin.readline()
sys.exit(int(line or 0))
'''


@contextlib.contextmanager
def probe_zygote_in(directory: Path) -> Iterator[tuple[Path, dict[str, str], list[subprocess.Popen]]]:
    """An emulated zygote that can import the probe module (its PYTHONPATH), and the environment
    a caller it serves has."""
    (directory / "zprobe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != zygote.ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(directory), str(REPO)])
    env["OMP_NUM_THREADS"] = "1"
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the zygote starts with the callers' import-relevant environment
    try:
        procs = start_zygotes(directory, ["emulated"])
    finally:
        os.environ.clear()
        os.environ.update(old)
    try:
        yield directory, env, procs
    finally:
        stop_zygotes(procs)


@pytest.fixture(scope="module")
def probe_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    with probe_zygote_in(tmp_path_factory.mktemp("zygote")) as (directory, env, _):
        yield directory, env


def probe(directory: Path, env: dict[str, str], code: str, monkeypatch: pytest.MonkeyPatch, cwd: Path,
          use_zygote: bool) -> tuple[object, dict, str, int]:
    if use_zygote:
        monkeypatch.setenv(zygote.ENV, str(directory))
    else:
        monkeypatch.delenv(zygote.ENV, raising=False)
    monkeypatch.chdir(cwd)
    err = cwd / f"stderr-{use_zygote}"
    with open(err, "wb") as stderr:
        proc = zygote.popen("zprobe", ["a", "b c"], "emulated", dict(env, PROBE_VAR="x"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
    seen = json.loads(proc.stdout.readline())
    proc.stdin.write(f"{code}\n".encode())
    proc.stdin.close()
    rc = proc.wait(timeout=60)
    proc.stdout.close()
    return proc, seen, err.read_text(), rc


@pytest.mark.parametrize("caller_ignores", [(), (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)],
                         ids=["caller-default", "caller-ignores-int-quit-hup"])
def test_a_forked_module_sees_what_a_fresh_interpreter_sees(probe_zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caller_ignores: tuple[int, ...]) -> None:
    """Signal dispositions included: what the caller ignores, a fresh interpreter inherits ignored (and Python
    then installs no SIGINT handler); the rest are at their defaults."""
    directory, env = probe_zygote
    with caller_ignoring(caller_ignores):
        forked, seen, err, rc = probe(directory, env, "7", monkeypatch, tmp_path, True)
        fresh, seen_fresh, err_fresh, rc_fresh = probe(directory, env, "7", monkeypatch, tmp_path, False)
        caller = ignored_signals()  # ours and what we inherited (a background job of a shell: SIGINT, SIGQUIT)
    assert set(caller_ignores) <= caller
    assert isinstance(forked, zygote.ZygoteProcess) and isinstance(fresh, subprocess.Popen)
    assert rc == rc_fresh == 7
    assert err == err_fresh == "to stderr\n"
    assert seen["env"]["PROBE_VAR"] == "x"
    for key in ("name", "argv", "cwd", "leader", "sigterm_default", "sigint", "mask", "ignored"):
        assert seen[key] == seen_fresh[key], key
    ignored = int(seen["ignored"], 16)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        assert bool(ignored & (1 << (sig - 1))) == (sig in caller), sig
    assert seen["sigint"] == (signal.SIGINT not in caller)
    assert seen["name"] == "__main__" and seen["argv"] == ["a", "b c"] and seen["leader"] and seen["cwd"] == str(tmp_path)
    assert {k: v for k, v in seen["env"].items() if k != zygote.ENV} == \
           {k: v for k, v in seen_fresh["env"].items() if k != zygote.ENV}


def test_a_killed_child_reads_as_popen(probe_zygote, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, env = probe_zygote
    monkeypatch.setenv(zygote.ENV, str(directory))
    proc = zygote.popen("zprobe", [], "emulated", env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, start_new_session=True)
    assert isinstance(proc, zygote.ZygoteProcess)
    proc.stdout.readline()
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdin.close()
    proc.stdout.close()


def test_a_caller_the_zygote_cannot_serve_gets_a_fresh_process(probe_zygote, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    directory, env = probe_zygote
    monkeypatch.setenv(zygote.ENV, str(directory))
    cases = {"another thread count": dict(env, OMP_NUM_THREADS="2"),
             "file-system faults (read at import)": dict(env, SLURM_RL_FS_FAULTS="delay_ms=1"),
             "inside a Slurm job": dict(env, SLURM_JOB_ID="12")}
    for why, caller_env in cases.items():
        proc = zygote.popen("zprobe", [], "emulated", caller_env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
        proc.communicate(b"0\n", timeout=60)
        assert isinstance(proc, subprocess.Popen) and proc.returncode == 0, why
    assert "the caller's interpreter or environment differs" in capfd.readouterr().err
    # no zygote for that device, or not a session leader: a fresh process without asking
    for kwargs in ({"device": "cpu", "start_new_session": True}, {"device": "emulated", "start_new_session": False}):
        proc = zygote.popen("zprobe", [], env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **kwargs)
        proc.communicate(b"0\n", timeout=60)
        assert isinstance(proc, subprocess.Popen), kwargs


def test_a_child_outlives_its_zygote_and_only_its_code_is_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with probe_zygote_in(tmp_path) as (directory, env, procs):
        monkeypatch.setenv(zygote.ENV, str(directory))
        proc = zygote.popen("zprobe", [], "emulated", env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
        assert isinstance(proc, zygote.ZygoteProcess)
        proc.stdout.readline()
        procs[0].kill()
        procs[0].wait()
        assert proc.poll() is None and zygote.running(proc.pid)  # it carries on, reparented
        proc.stdin.write(b"3\n")
        proc.stdin.close()
        assert proc.wait(timeout=30) == zygote.LOST_CODE
        assert not zygote.running(proc.pid)
        proc.stdout.close()


def exec_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "slurm_rl.launch.zygote", "exec", "--device", "emulated", "zprobe", *args]


def test_exec_runs_a_module_through_the_zygote_as_the_process_itself(probe_zygote, tmp_path: Path) -> None:
    """``python -m slurm_rl.launch.zygote exec MODULE``: the exit code, the output and the signals are
    the module's; SIGKILL of the caller kills the module, as it would a fresh interpreter."""
    directory, env = probe_zygote
    env = dict(env, **{zygote.ENV: str(directory)})
    done = subprocess.run(exec_argv("x"), input="5\n", capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    seen = json.loads(done.stdout.splitlines()[0])
    assert done.returncode == 5 and seen["argv"] == ["x"] and seen["name"] == "__main__" and seen["cwd"] == str(tmp_path)
    assert done.stderr == "to stderr\n"

    def started() -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen(exec_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=env, text=True)
        child = json.loads(proc.stdout.readline())["pid"]
        assert child != proc.pid and zygote.running(child)  # forked by the zygote, not exec'd
        return proc, child

    relayed, child = started()
    relayed.terminate()  # relayed: the module dies of it, and so does the caller
    assert relayed.wait(timeout=30) == -signal.SIGTERM and not zygote.running(child)
    killed, child = started()
    killed.kill()
    killed.wait()
    deadline = time.monotonic() + 30
    while zygote.running(child):  # the zygote saw its caller go
        assert time.monotonic() < deadline, "the module outlived its SIGKILLed caller"
        time.sleep(0.05)
    for proc in (relayed, killed):
        proc.stdin.close()
        proc.stdout.close()
    fresh = subprocess.run(exec_argv(), input="4\n", capture_output=True, text=True, cwd=tmp_path, timeout=60,
                           env={k: v for k, v in env.items() if k != zygote.ENV})
    assert fresh.returncode == 4 and json.loads(fresh.stdout.splitlines()[0])["name"] == "__main__"
