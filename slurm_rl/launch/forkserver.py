"""Fork server of the local launcher: a run's ranks pay their imports once.

``slurm-rl run`` (:class:`slurm_rl.launch.local.LocalJob`, also under ``slurm-rl mux``) used to
start every rank as a fresh ``python -m slurm_rl.worker RUN_DIR``, and each rank imported what it
needs on its own: about 0.35 s of CPU for an emulated rank (slurm_rl, pyarrow, numpy, omegaconf),
3 s for a ``cpu``/``cuda`` rank (torch, megatron-core, transformers). Now the launcher starts one
``python -m slurm_rl.launch.forkserver RUN_DIR`` per run, which imports what the run's ranks need
(by ``runtime.device`` of ``RUN_DIR/config.yaml``) and then ``fork()``\\ s every rank from that
warm interpreter:

- ``emulated``: the worker modules, pyarrow, numpy, omegaconf; never torch (an emulated rank
  stays a small process);
- ``cpu``: also torch, megatron-core (:func:`~slurm_rl.engines.actor.model.preload_megatron`,
  with the CPU shim), the engines, transformers' ``AutoTokenizer`` and ``LlamaForCausalLM``;
- ``cuda``: the same less megatron-core. Nothing in the server touches CUDA (a process that
  initialised CUDA cannot hand it to a forked child); each rank initialises its own after fork.

What a forked rank gets, as ``python -m slurm_rl.worker RUN_DIR`` would have: its own session
(``setsid``: ``LocalJob.kill`` SIGKILLs each rank's process group), fds 1 and 2 on its log file
and stdin on ``/dev/null``, ``os.environ`` exactly the rank's environment (``SLURM_RL_RANK``...),
default signal dispositions (the signals the launcher ignores stay ignored, as across ``exec``) and
an empty signal mask, reseeded ``random`` and numpy,
``sys.argv`` of the worker and ``slurm_rl.worker.__main__`` as ``__main__``; its exit runs
``threading``'s shutdown and the ``atexit`` handlers, like an interpreter's. What differs: the
``cmdline`` and ``environ`` of ``/proc/PID`` show the fork server's (find a rank's process by its
heartbeat's ``pid``, :func:`slurm_rl.control.heartbeats.read_heartbeat`), the ranks of one run
share one hash seed, and a rank's RSS counts the pages it shares with the server.

The server starts no thread and runs no torch op before it forks. Two threads are not its own:
pyarrow's bundled jemalloc starts a background thread at import (jemalloc's fork handlers hold its
locks across ``fork``; a forked rank runs without that thread), and numpy's OpenBLAS starts
``OMP_NUM_THREADS - 1`` (the launcher starts the server with the ranks' ``OMP_NUM_THREADS``, 1
unless set; OpenBLAS stops its threads before a ``fork``). ``logs/forkserver.log`` lists the
threads after the imports and at the first fork. The server ignores SIGINT, SIGTERM,
SIGHUP, SIGUSR1 and SIGUSR2 (a preemption signals every process of a step: those are the ranks'
to handle), and exits once its request pipe is closed and every rank is reaped, or as soon as its
parent (the launcher) is gone; the ranks then carry on, as fresh processes would have.

Protocol (one JSON object a line):

- request (the server's stdin): ``{"rank": 3, "env": {...}, "log": "RUN_DIR/logs/rank-0003.log"}``
- reply (the server's stdout): ``{"rank": 3, "pid": 12345}``, or ``{"rank": 3, "error": "..."}``
  when the rank could not be started;
- report (stdout): ``{"pid": 12345, "code": 0}`` once the rank is reaped, ``code`` as
  ``subprocess.Popen.returncode`` (negative: killed by that signal).

With ``SLURM_RL_ZYGOTE`` set (:mod:`slurm_rl.launch.zygote`) the server itself is forked from a
zygote that imported for the run's device once, so its preload finds everything imported; its parent
is then the zygote, and it watches the launcher's pid instead (``python -m slurm_rl.launch.forkserver
RUN_DIR LAUNCHER_PID``).

``SLURM_RL_FORKSERVER=0`` in the launcher's environment (or ``LocalJob(..., forkserver=False)``)
keeps the former path: every rank a fresh ``python -m slurm_rl.worker RUN_DIR`` (subprocess.Popen).
Under ``sbatch/train.sh`` one srun task per node forks that node's ranks after the same preload
(:mod:`slurm_rl.launch.node`); submitit's tasks are one per rank, started by Slurm.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from slurm_rl.errors import LaunchError
from slurm_rl.launch import zygote

if TYPE_CHECKING:
    from slurm_rl.config import ReusableConfig

ENV_SWITCH = "SLURM_RL_FORKSERVER"
LOG_NAME = "forkserver.log"
# How long the launcher waits for the server to import and reply with every rank's pid.
START_TIMEOUT_S = 600.0
# The exit code of a rank whose server died before reporting it (the code itself is lost).
LOST_CODE = 255
# The server's exit code when it must not fork (CUDA got initialised while importing).
UNUSABLE_EXIT = 3

WORKER_MODULES = (
    "numpy", "numpy.ma", "pyarrow", "pyarrow.ipc", "omegaconf", "dateutil.relativedelta",
    "slurm_rl.config", "slurm_rl.worker.main", "slurm_rl.worker.__main__", "slurm_rl.worker.runtime",
    "slurm_rl.worker.protocol", "slurm_rl.worker.compute", "slurm_rl.worker.emulated_compute",
    "slurm_rl.worker.activity",
)
REAL_MODULES = (
    "torch", "torch.distributed", "safetensors.torch", "numpy.ctypeslib", "multiprocessing.popen_spawn_posix",
    "slurm_rl.worker.real_compute", "slurm_rl.engines.actor.trainer", "slurm_rl.engines.actor.checkpoint",
    "slurm_rl.engines.weight_sync", "slurm_rl.rl.losses",
    "slurm_rl.engines.inference", "slurm_rl.engines.rollout", "slurm_rl.engines.rollout.hf",
    "slurm_rl.rl.tokenizer", "slurm_rl.rl.dataset", "slurm_rl.rewards.runner", "pebble",
)
# Signals a fresh interpreter leaves at SIG_DFL (SIGINT: Python's KeyboardInterrupt handler;
# SIGPIPE and SIGXFSZ: ignored, as Python's startup sets them).
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
                   signal.SIGQUIT, signal.SIGALRM)
IGNORED_BY_SERVER = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
RESET_SIGNALS = (signal.SIGINT, *DEFAULT_SIGNALS)


def ignored_signals() -> frozenset[int]:
    """Which of :data:`RESET_SIGNALS` this process ignores now: what a process it started would inherit
    ignored across ``exec`` (a shell's background job ignores SIGINT and SIGQUIT, ``nohup`` SIGHUP)."""
    return frozenset(sig for sig in RESET_SIGNALS if signal.getsignal(sig) == signal.SIG_IGN)


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the local launcher forks ranks from a fork server (``SLURM_RL_FORKSERVER``, default 1)."""
    value = (os.environ if environ is None else environ).get(ENV_SWITCH, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


# ----------------------------------------------------------------------------------------------
# launcher side


class ForkServerUnusable(LaunchError):
    """The server refused to fork (it could not import without touching CUDA): start the ranks
    as fresh processes instead."""


class ForkedRank:
    """One rank forked by a :class:`ForkServer`: ``pid``, ``poll()``, ``wait()`` and
    ``returncode`` as a ``subprocess.Popen`` offers them."""

    def __init__(self, server: "ForkServer", rank: int, pid: int) -> None:
        self.server, self.rank, self.pid = server, rank, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump()
            self.returncode = self.server.code_of(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"rank {self.rank} (pid {self.pid})", timeout or 0.0)
            self.server.pump(0.2 if left is None else min(0.2, left))
        return self.returncode  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"ForkedRank(rank={self.rank}, pid={self.pid}, returncode={self.returncode})"


class ForkServer:
    """The launcher's end of one run's fork server."""

    def __init__(self, run_dir: Path, env: dict[str, str], log_dir: Path) -> None:
        self.run_dir = run_dir
        self.log_path = log_dir / LOG_NAME
        with open(self.log_path, "ab") as log:
            device = run_device(run_dir)
            self.proc = zygote.popen("slurm_rl.launch.forkserver", [str(run_dir), str(os.getpid())], device, env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        self._buf = b""
        self._eof = False
        self.codes: dict[int, int] = {}  # pid -> exit code, as reported
        self._pids: dict[int, int] = {}  # rank -> pid
        self._errors: dict[int, str] = {}  # rank -> why it was not started
        self.started = False  # every rank of start() has its pid

    def start(self, requests: list[tuple[int, dict[str, str], Path]]) -> dict[int, ForkedRank]:
        """Fork one rank per ``(rank, env, log path)``; then close the request pipe (the server
        exits once every rank ended). Raises :class:`LaunchError` when a rank could not be started."""
        assert self.proc.stdin is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        ignored = sorted(ignored_signals())  # what a rank started by us as a fresh process would inherit ignored
        data = b"".join((json.dumps({"rank": rank, "env": env, "log": str(log), "ignored": ignored}) + "\n").encode()
                        for rank, env, log in requests)
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)  # the server reads once it has imported: do not block past the deadline
        writable = select.poll()
        writable.register(fd, select.POLLOUT)
        while data and time.monotonic() < deadline:
            try:
                data = data[os.write(fd, data[:65536]):]
            except BlockingIOError:
                writable.poll(500)
            except BrokenPipeError:
                break  # the server died: told below
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        wanted = {rank for rank, _, _ in requests}
        while not wanted <= (self._pids.keys() | self._errors.keys()):
            if self._eof and self.proc.wait() == UNUSABLE_EXIT:
                raise ForkServerUnusable(f"the fork server of {self.run_dir} cannot fork ranks: "
                                         f"{tail(self.log_path, 1)}")
            if self._eof:
                raise LaunchError(f"the fork server of {self.run_dir} exited with code {self.proc.wait()} before it "
                                  f"started ranks {sorted(wanted - self._pids.keys())}. Last lines of "
                                  f"{self.log_path}:\n{tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise LaunchError(f"the fork server of {self.run_dir} (pid {self.proc.pid}) did not start every rank within "
                                  f"{START_TIMEOUT_S:.0f}s. Last lines of {self.log_path}:\n{tail(self.log_path)}")
            self.pump(0.5)
        if self._errors:
            rank = min(self._errors)
            raise LaunchError(f"the fork server could not start rank {rank}: {self._errors[rank]}")
        self.started = True
        return {rank: ForkedRank(self, rank, self._pids[rank]) for rank, _, _ in requests}

    def abort(self) -> None:
        """A start that failed midway (an error, Ctrl-C): stop the server before it forks more,
        SIGKILL every rank it forked (known to us or not) and the server."""
        if self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGSTOP)  # it ignores the polite signals, not this one
        for pid in self.children():
            for kill in (os.killpg, os.kill):  # os.kill: a child not yet in its own session
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def pump(self, timeout: float = 0.0) -> None:
        """Read what the server has written (waiting at most ``timeout`` for it)."""
        if self._eof:
            return
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()  # not select.select: the launcher may hold more than 1024 fds
        poller.register(fd, select.POLLIN)
        while True:
            if not poller.poll(timeout * 1000):
                return
            data = os.read(fd, 65536)
            if not data:
                self._eof = True
                self.proc.wait()
                return
            self._buf += data
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                self._take(json.loads(line))
            timeout = 0.0

    def _take(self, msg: dict[str, Any]) -> None:
        if "code" in msg:
            self.codes[int(msg["pid"])] = int(msg["code"])
        elif "pid" in msg:
            self._pids[int(msg["rank"])] = int(msg["pid"])
        else:
            self._errors[int(msg["rank"])] = str(msg.get("error"))

    def code_of(self, pid: int) -> int | None:
        """The rank's exit code; :data:`LOST_CODE` once the server is gone without reporting it
        (the server died: nobody can reap the rank and learn its code)."""
        code = self.codes.get(pid)
        if code is None and self._eof:
            code = self.codes[pid] = LOST_CODE
        return code

    def children(self) -> list[int]:
        """The server's children (the ranks it forked and has not reaped)."""
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def close(self, timeout: float = 30.0) -> None:
        """Wait for the server to exit (it does once every rank ended); kill it after ``timeout``."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        deadline = time.monotonic() + timeout
        while not self._eof and time.monotonic() < deadline:
            self.pump(0.2)
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ----------------------------------------------------------------------------------------------
# server side


def _log(msg: str) -> None:
    print(f"[forkserver {os.getpid()}] {msg}", file=sys.stderr, flush=True)


def _gpu_visible() -> bool:
    """Whether this machine has an NVIDIA driver (without touching CUDA)."""
    import glob

    return os.path.exists("/dev/nvidiactl") or bool(glob.glob("/proc/driver/nvidia/gpus/*"))


def _import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception as exc:  # the rank imports it again and reports the error in its own log
        _log(f"preload: import {name} failed ({type(exc).__name__}: {exc}); the ranks import it themselves")


def preload(device: str) -> None:
    """Import what a rank of ``runtime.device`` ``device`` imports (no thread, no torch op, no CUDA)."""
    for name in WORKER_MODULES:
        _import(name)
    if device == "emulated":
        return
    if device == "cpu" and not _gpu_visible():
        # apply_cpu_shim asks torch.cuda.is_available(): on a machine with a driver that
        # initialises CUDA in the server, so there each rank imports megatron-core itself.
        try:
            from slurm_rl.engines.actor.model import preload_megatron

            preload_megatron("cpu")
        except Exception as exc:
            _log(f"preload: megatron-core failed ({type(exc).__name__}: {exc}); the ranks import it themselves")
    for name in REAL_MODULES:
        _import(name)
    try:  # transformers imports its models lazily: ask for the classes the ranks use
        transformers = importlib.import_module("transformers")
        for name in ("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM", "LlamaForCausalLM"):
            getattr(transformers, name)
    except Exception as exc:
        _log(f"preload: transformers failed ({type(exc).__name__}: {exc}); the ranks import it themselves")


def run_device(run_dir: str | Path) -> str:
    """``runtime.device`` of the run (``emulated``, said in the log, when its config cannot be read)."""
    loaded = run_config(run_dir)
    return "emulated" if loaded is None else loaded.config.runtime.device


def run_config(run_dir: str | Path) -> ReusableConfig | None:
    """The run's config, loaded to be handed to the ranks forked from here (None, said in the log, when it
    cannot be read: the ranks load it themselves and report why)."""
    try:
        from slurm_rl.config import ReusableConfig

        return ReusableConfig.load(Path(run_dir) / "config.yaml")
    except Exception as exc:
        _log(f"cannot read runtime.device from {run_dir}/config.yaml ({type(exc).__name__}: {exc}); "
             f"preloading the worker modules only")
        return None


def _threads() -> list[str]:
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:
            continue
    return names


def cuda_touched() -> bool:
    """The CUDA driver library is loaded in this process (it is loaded only once CUDA is used)."""
    try:
        return "libcuda.so" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _write(fd: int, msg: dict[str, Any]) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def wake_on_sigchld() -> tuple[int, int]:
    """A non-blocking pipe that SIGCHLD writes to (Python's wakeup fd): a select on its read end wakes
    when a child ends. Returns (read end, write end)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    return wake_r, wake_w


def drain(fd: int) -> None:
    """Read a non-blocking pipe empty."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def become_fresh(env: dict[str, str], ignored: frozenset[int] = frozenset()) -> None:
    """In a forked child: what a fresh interpreter started by the caller starts with: default signal
    dispositions but for the signals the caller ignored (``ignored``, see :func:`ignored_signals`: an
    ignored signal stays ignored across ``exec``, and Python then leaves SIGINT ignored too), an empty
    signal mask, ``env`` as the environment, reseeded ``random`` and numpy."""
    import random

    for sig in DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN if signal.SIGINT in ignored else signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.environ.clear()
    os.environ.update(env)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def serve(run_dir: str, req: int, rep: int, parent: int, loaded: ReusableConfig | None = None) -> int:
    """Fork a rank per request until ``req`` closes, report each exit on ``rep``; leave once the
    launcher ``parent`` is gone. ``loaded``: the run's config as this server read it (a rank takes it
    where its file and environment read the same)."""
    wake_r, wake_w = wake_on_sigchld()
    own_fds = (req, rep, wake_r, wake_w)
    by_parent = os.getppid() == parent  # else a zygote forked us: watch the launcher's pid
    children: set[int] = set()
    buf = b""
    reading = True
    first = True
    try:
        while reading or children:
            if not (os.getppid() == parent if by_parent else zygote.running(parent)):
                _log(f"the launcher (pid {parent}) is gone; leaving {len(children)} ranks to themselves")
                return 0
            ready, _, _ = select.select([wake_r, req] if reading else [wake_r], [], [], 1.0)
            if wake_r in ready:
                drain(wake_r)
            while children:  # reap before forking more: a report always follows its pid reply
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    children.clear()
                    break
                if pid == 0:
                    break
                children.discard(pid)
                _write(rep, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})
            if reading and req in ready:
                data = os.read(req, 1 << 20)
                if not data:
                    reading = False
                    continue
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    request = json.loads(line)
                    if first:
                        threads = _threads()
                        _log(f"threads at the first fork: {len(threads)} {threads}")
                        first = False
                    _write(rep, _fork_rank(run_dir, request, own_fds, children, loaded))
    except BrokenPipeError:
        _log("the launcher closed its end of the reply pipe; leaving the ranks to themselves")
    return 0


def _fork_rank(run_dir: str, request: dict[str, Any], own_fds: tuple[int, ...], children: set[int],
               loaded: ReusableConfig | None = None) -> dict[str, Any]:
    rank = int(request["rank"])
    try:
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    except OSError as exc:
        return {"rank": rank, "error": f"cannot open its log {request['log']}: {exc}"}
    sync_r, sync_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(log_fd)
        os.close(sync_r)
        os.close(sync_w)
        return {"rank": rank, "error": f"fork failed: {exc}"}
    if pid == 0:
        os.close(sync_r)
        _run_rank(run_dir, request["env"], frozenset(request.get("ignored", ())), log_fd, sync_w, own_fds, loaded)
    os.close(log_fd)
    os.close(sync_w)
    os.read(sync_r, 1)  # EOF once the child has its own session (a kill of its group reaches it)
    os.close(sync_r)
    children.add(pid)
    return {"rank": rank, "pid": pid}


def _run_rank(run_dir: str, env: dict[str, str], ignored: frozenset[int], log_fd: int, sync_w: int,
              own_fds: tuple[int, ...], loaded: ReusableConfig | None = None) -> NoReturn:
    """The forked child: become ``python -m slurm_rl.worker RUN_DIR`` and run the rank."""

    def run() -> int:
        os.setsid()
        os.close(sync_w)
        signal.set_wakeup_fd(-1)
        for fd in own_fds:
            os.close(fd)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        become_fresh(env, ignored)
        return run_as_worker(run_dir, loaded)

    exit_like_an_interpreter(run)


def run_as_worker(run_dir: str, loaded: ReusableConfig | None = None) -> int:
    """In a forked child: run the rank as ``python -m slurm_rl.worker RUN_DIR`` would (its
    ``__main__`` and ``sys.argv``; ``loaded``: the run's config as the parent read it); returns its exit code."""
    main = sys.modules.get("slurm_rl.worker.__main__") or importlib.import_module("slurm_rl.worker.__main__")
    sys.modules["__main__"] = main
    sys.argv = [str(main.__file__), run_dir]
    from slurm_rl.worker.main import run_worker

    return run_worker(Path(run_dir), loaded)


def exit_like_an_interpreter(run: Callable[[], int | None]) -> NoReturn:
    """Run ``run`` in a forked child and leave as an interpreter would: ``SystemExit``'s code (or
    ``run``'s result), a traceback and 1 for an exception; non-daemon threads joined, ``atexit``
    handlers run, stdio flushed; then ``os._exit``."""
    code: object = 1
    try:
        code = run()
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            threading._shutdown()  # type: ignore[attr-defined]
        except BaseException:
            traceback.print_exc()
        try:
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(_exit_code(code) & 0xFF)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_rl.launch.forkserver RUN_DIR [LAUNCHER_PID]``: requests on stdin, replies on
    stdout; LAUNCHER_PID (default: the parent) is the process whose end ends the server."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or not all(a.isdigit() for a in args[1:]):
        print("usage: python -m slurm_rl.launch.forkserver RUN_DIR [LAUNCHER_PID]", file=sys.stderr)
        return 2
    run_dir = args[0]
    parent = int(args[1]) if len(args) == 2 else os.getppid()
    for sig in IGNORED_BY_SERVER:
        signal.signal(sig, signal.SIG_IGN)
    # requests and replies on fds of their own; fd 0 and 1 become /dev/null and this log
    req, rep = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
    cpu0, wall0 = time.process_time(), time.monotonic()
    loaded = run_config(run_dir)
    device = "emulated" if loaded is None else loaded.config.runtime.device
    preload(device)
    gc.collect()
    gc.freeze()  # the imported objects stay shared with every rank (no GC pass writes to them)
    threads = _threads()
    _log(f"run dir {run_dir}, device {device}: preloaded {len(sys.modules)} modules (torch: "
         f"{'yes' if 'torch' in sys.modules else 'no'}, megatron-core: {'yes' if 'megatron.core' in sys.modules else 'no'}) "
         f"in {time.process_time() - cpu0:.2f}s CPU ({time.monotonic() - wall0:.2f}s wall); "
         f"threads: {len(threads)} {threads}")
    if cuda_touched():
        _log("an import loaded the CUDA driver: a rank forked from here could not use CUDA; the launcher "
             "starts each rank as a fresh process instead")
        return UNUSABLE_EXIT
    return serve(run_dir, req, rep, parent, loaded)


if __name__ == "__main__":
    sys.exit(main())
