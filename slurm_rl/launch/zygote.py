"""Warm start across local runs: a process that imported once forks each run's helper processes.

Every local run starts a fork server (:mod:`slurm_rl.launch.forkserver`) that imports what its
ranks need (about 5 s of CPU for a ``cpu`` run: torch, megatron-core, transformers) and a
coordinator (about 0.6 s). Someone who starts many local runs in a row (a test suite, a sweep on a
laptop) pays that for every run. A *zygote* pays it once:

    python -m slurm_rl.launch.zygote DIR --device cpu &      # listens on DIR/cpu.sock
    python -m slurm_rl.launch.zygote DIR --device emulated & # DIR/emulated.sock
    export SLURM_RL_ZYGOTE=DIR
    slurm-rl run run1.yaml; slurm-rl run run2.yaml           # their servers are forked, not started

With ``SLURM_RL_ZYGOTE`` set, the local launcher asks the zygote of its run's ``runtime.device``
to fork ``python -m slurm_rl.launch.forkserver RUN_DIR`` (and the local mux launcher asks the
``emulated`` one for its group scheduler). The forked process is what ``python -m MODULE ARGS``
would have been: the caller's stdin, stdout and stderr (passed over the socket), environment and
working directory, a session of its own, default signal dispositions (the caller's ignored signals
stay ignored), reseeded ``random`` and numpy, the module run as ``__main__``. Its parent is the
zygote, which reports its exit code back to the caller. Only a process that leads its own session is forked so (one that shares its
caller's process group, as rank 0's coordinator does, could not join it from the zygote's session:
rank 0 starts it through ``exec`` below, whose small process stays in rank 0's group).

A zygote serves only a caller that would have started the same interpreter: the same
``sys.executable``, the same ``slurm_rl`` package and the same import-relevant environment
(``PYTHON*``, thread counts, ``LD_*``, ``SLURM_RL_*``); anything else, a missing socket, a zygote that does not
answer within :data:`CONNECT_TIMEOUT_S`, or a process inside a Slurm job (Slurm starts the
processes of a job itself: its cgroup, its signals) starts a fresh interpreter as before. A
zygote keeps the code it imported: restart it after changing ``slurm_rl``.

``python -m slurm_rl.launch.zygote exec [--device D] MODULE ARGS...`` (:func:`exec_module`) is
``python -m MODULE ARGS`` through a zygote for a caller that only runs commands (a test suite
running ``slurm-rl``): it relays the signals it gets, its SIGKILL kills the module (the zygote sees
its end of the connection close), and it exits as the module did. A MODULE ending in ``.py`` is a
script: ``python SCRIPT.py ARGS`` (``sys.path[0]`` the script's directory), e.g. one of ``tools/``.

Each zygote appends a JSON line per child it reaped to ``DIR/<device>.usage.jsonl`` (module, exit
code, CPU seconds with what the child reaped, wall seconds, and the caller's
``SLURM_RL_ZYGOTE_LABEL``), so whoever labels its calls can account for their CPU.

Protocol (``AF_UNIX`` ``SOCK_SEQPACKET``, one JSON message each): the caller sends
``{"module", "argv", "env", "cwd", "key", "tie"}`` with three file descriptors
(stdin, stdout, stderr); the zygote replies ``{"pid": N}`` or ``{"refused": "why"}`` and, once the
child is reaped, ``{"code": C}`` (as ``subprocess.Popen.returncode``). ``tie``: kill the child
when the caller's end closes first.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

ENV = "SLURM_RL_ZYGOTE"
LABEL_ENV = "SLURM_RL_ZYGOTE_LABEL"  # a caller's label for its children in the usage log (not part of the key)
CONNECT_TIMEOUT_S = 120.0  # a zygote still importing answers once it has: wait that long, then start fresh
# Set per rank by the launchers and read when the rank runs, never at import: not part of the key.
RUNTIME_VARS = ("SLURM_RL_RANK", "SLURM_RL_WORLD_SIZE", "SLURM_RL_LOCAL_RANK", "SLURM_RL_NODE_RANK",
                "SLURM_RL_NUM_NODES", "SLURM_RL_JOB_ID", "SLURM_RL_MASTER_ADDR", "SLURM_RL_MASTER_PORT",
                "SLURM_RL_HOST", "SLURM_RL_SLOTS")
KEY_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH")
LOST_CODE = 255  # the exit code of a child whose zygote died before reporting it (as the fork server's)
MAX_MESSAGE = 1 << 20


def socket_path(directory: str | Path, device: str) -> Path:
    """The socket of the zygote of ``device`` in ``directory``."""
    return Path(directory) / f"{device}.sock"


def usage_path(directory: str | Path, device: str) -> Path:
    """The usage log of the zygote of ``device``: a JSON line per child it reaped (``pid``, ``module``,
    ``label``: the caller's ``SLURM_RL_ZYGOTE_LABEL``, ``code``, ``cpu_s`` with what the child reaped, ``wall_s``)."""
    return Path(directory) / f"{device}.usage.jsonl"


def interpreter_key(env: dict[str, str]) -> dict[str, Any]:
    """What a process started with ``env`` would import differently (``PYTHON*``, thread counts,
    ``LD_*`` and our own ``SLURM_RL_*``, e.g. the file-system faults that ``slurm_rl.fsio`` reads at
    import): a zygote serves only its own key."""
    import slurm_rl

    return {"executable": sys.executable, "package": slurm_rl.__file__,
            "env": {k: v for k, v in sorted(env.items())
                    if k.startswith(("PYTHON", "SLURM_RL_")) and k not in (ENV, LABEL_ENV, *RUNTIME_VARS)
                    or k in KEY_VARS}}


def command(module: str, args: list[str], device: str, env: dict[str, str]) -> list[str]:
    """The argv of ``python -m MODULE ARGS`` for a process of ``env`` that stays in its caller's process
    group: through :func:`exec_module` where a zygote may serve it (``SLURM_RL_ZYGOTE`` set, not in a
    Slurm job; the exec falls back to a fresh interpreter by itself), else the plain command."""
    plain = [sys.executable, "-m", module, *args]
    if not env.get(ENV, "").strip() or "SLURM_JOB_ID" in env:
        return plain
    return [sys.executable, "-m", "slurm_rl.launch.zygote", "exec", "--device", device, module, *args]


# ----------------------------------------------------------------------------------------------
# caller side


class ZygoteProcess:
    """A process forked by a zygote, with what ``subprocess.Popen`` offers that our launchers use:
    ``pid``, ``stdin``, ``stdout``, ``returncode``, ``poll()``, ``wait()``, ``send_signal()``,
    ``terminate()``, ``kill()``."""

    def __init__(self, conn: socket.socket, pid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None) -> None:
        self._conn: socket.socket | None = conn
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        if self._conn is None:  # the zygote died first: the process is no child of ours, watch its pid
            deadline = None if timeout is None else time.monotonic() + timeout
            while running(self.pid):
                if deadline is not None and time.monotonic() >= deadline:
                    return
                time.sleep(0.05)
            self.returncode = LOST_CODE
            return
        if not select.select([self._conn], [], [], timeout)[0]:
            return
        data = self._conn.recv(MAX_MESSAGE)
        self._conn.close()
        self._conn = None
        if data:
            self.returncode = int(json.loads(data)["code"])
        else:
            self._read(timeout)

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid} (forked by a zygote)", timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (neither gone nor a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _fd(stream: int | IO[Any] | None, default: int) -> int:
    if stream is None:
        return default
    return stream if isinstance(stream, int) else stream.fileno()


def popen(module: str, args: list[str], device: str, env: dict[str, str], *, stdin: int | IO[Any] | None = None,
          stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None,
          start_new_session: bool = False) -> subprocess.Popen | ZygoteProcess:
    """``python -m MODULE ARGS`` with ``env``: forked by the zygote of ``device`` where one serves this
    caller (``SLURM_RL_ZYGOTE``; only with ``start_new_session``), else a fresh ``subprocess.Popen``.
    ``stdin``/``stdout`` may be ``subprocess.PIPE`` or ``DEVNULL``, ``stderr`` ``DEVNULL`` or ``STDOUT``;
    None inherits, as with Popen."""
    proc = _forked(module, args, device, env, stdin, stdout, stderr, start_new_session)
    if proc is not None:
        return proc
    return subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                            start_new_session=start_new_session)


def _forked(module: str, args: list[str], device: str, env: dict[str, str], stdin: Any, stdout: Any, stderr: Any,
            new_session: bool, tie: bool = False, quiet: bool = False) -> ZygoteProcess | None:
    directory = os.environ.get(ENV, "").strip()
    if not directory or not new_session or "SLURM_JOB_ID" in os.environ or "SLURM_JOB_ID" in env:
        return None
    path = socket_path(directory, device)
    if not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine: list[int] = []  # our ends of the pipes, and the child's ends (closed once sent)
    theirs: list[int] = []
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(str(path))
        fds = []
        pipes: dict[str, int] = {}
        for name, stream, default in (("stdin", stdin, 0), ("stdout", stdout, 1)):
            if stream == subprocess.PIPE:
                r, w = os.pipe()
                child, parent = (r, w) if name == "stdin" else (w, r)
                theirs.append(child)
                mine.append(parent)
                pipes[name] = parent
                fds.append(child)
            elif stream == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDWR))
                fds.append(theirs[-1])
            else:
                fds.append(_fd(stream, default))
        if stderr == subprocess.DEVNULL:
            theirs.append(os.open(os.devnull, os.O_RDWR))
            fds.append(theirs[-1])
        else:
            fds.append(fds[1] if stderr == subprocess.STDOUT else _fd(stderr, 2))
        from slurm_rl.launch.forkserver import ignored_signals

        request = {"module": module, "argv": list(args), "env": env, "cwd": os.getcwd(), "key": interpreter_key(env),
                   "tie": tie, "ignored": sorted(ignored_signals())}
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        reply = json.loads(conn.recv(MAX_MESSAGE) or b'{"refused": "the zygote closed the connection"}')
    except (OSError, ValueError) as exc:
        reply = {"refused": f"{type(exc).__name__}: {exc}"}
    finally:
        for fd in theirs:
            os.close(fd)
    if "pid" not in reply:
        conn.close()
        for fd in mine:
            os.close(fd)
        if not quiet:
            print(f"zygote {path}: {reply.get('refused')}; starting a fresh python -m {module}", file=sys.stderr, flush=True)
        return None
    conn.settimeout(None)
    return ZygoteProcess(conn, int(reply["pid"]),
                         os.fdopen(pipes["stdin"], "wb") if "stdin" in pipes else None,
                         os.fdopen(pipes["stdout"], "rb") if "stdout" in pipes else None)


# ----------------------------------------------------------------------------------------------
# zygote side


@dataclass
class Child:
    """A child the zygote forked: the caller's connection, for the usage log its module, label and start."""

    conn: socket.socket
    module: str
    label: str | None
    started: float


def _log(msg: str) -> None:
    print(f"[zygote {os.getpid()}] {msg}", file=sys.stderr, flush=True)


COMMAND_MODULES = ("slurm_rl.cli", "slurm_rl.scheduler.coordinator", "slurm_rl.inspect.commands",
                   "slurm_rl.inspect.run_gantt", "matplotlib.pyplot", "matplotlib.patches", "matplotlib.lines")


def preload_commands() -> None:
    """What the commands run through a zygote import beyond a rank's: the CLI, the coordinator, and
    matplotlib for ``inspect``'s PNGs (with the Agg backend, which they select anyway); and the config
    loader's caches (:func:`slurm_rl.config.warm_caches`)."""
    import importlib

    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        pass
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            _log(f"preload: import {name} failed ({exc}); the commands import it themselves")
    from slurm_rl.config import warm_caches

    warm_caches()  # most commands load a config: built once here, not once per child


def serve(directory: Path, device: str) -> int:
    """Listen on ``directory/<device>.sock``, preload, then fork a child per request (until SIGTERM)."""
    from slurm_rl.launch import forkserver

    directory.mkdir(parents=True, exist_ok=True)
    path = socket_path(directory, device)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # bound under a temporary name and renamed once listening: a caller that sees the socket can connect
    # (bound at its final name, a connect between bind and listen was refused, and the caller ran unforked)
    staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staged.unlink(missing_ok=True)
    listener.bind(str(staged))
    os.chmod(staged, 0o600)
    listener.listen(128)  # callers wait in the backlog while we import
    os.replace(staged, path)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what the launchers give their servers (OpenBLAS: no threads)
    cpu0, wall0 = time.process_time(), time.monotonic()
    forkserver.preload(device)
    preload_commands()
    gc.collect()
    gc.freeze()
    key = interpreter_key(dict(os.environ))
    unusable = forkserver.cuda_touched()
    _log(f"device {device}: preloaded {len(sys.modules)} modules in {time.process_time() - cpu0:.2f}s CPU "
         f"({time.monotonic() - wall0:.2f}s wall); serving {path}"
         + ("; an import loaded the CUDA driver: refusing every request" if unusable else ""))
    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    wake_r, wake_w = forkserver.wake_on_sigchld()
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    children: dict[int, Child] = {}
    usage = usage_path(directory, device)
    tied: dict[int, int] = {}  # connection fd -> pid: the child dies with its caller (exec_module)
    sel = selectors.DefaultSelector()  # not select.select: a zygote may hold more than 1024 connections
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    try:
        while not stop:
            ready = {key.fd for key, _ in sel.select(1.0)}
            if wake_r in ready:
                forkserver.drain(wake_r)
            for fd in ready & tied.keys():  # a tied caller's end closed: it is gone, kill what it ran
                pid = tied.pop(fd)
                sel.unregister(fd)
                if pid in children:
                    _kill(pid)
            _reap(children, tied, sel, usage)
            if listener.fileno() in ready and not stop:
                conn, _ = listener.accept()
                pid, tie = _answer(conn, key, unusable, children, (listener.fileno(), wake_r, wake_w))
                if pid is not None and tie:
                    tied[conn.fileno()] = pid
                    sel.register(conn, selectors.EVENT_READ)
    finally:
        listener.close()
        path.unlink(missing_ok=True)
    _log(f"stopping; {len(children)} children carry on")
    return 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(children: dict[int, Child], tied: dict[int, int], sel: selectors.BaseSelector, usage: Path) -> None:
    """Reap the children that ended: their line in the usage log, then their exit code to the caller."""
    while children:
        try:
            pid, status, rusage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        if child is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        line = {"pid": pid, "module": child.module, "label": child.label, "code": code,
                "cpu_s": round(rusage.ru_utime + rusage.ru_stime, 3), "wall_s": round(time.monotonic() - child.started, 3)}
        with open(usage, "a") as f:
            f.write(json.dumps(line) + "\n")
        if tied.pop(child.conn.fileno(), None) is not None:
            sel.unregister(child.conn)
        try:
            child.conn.send(json.dumps({"code": code}).encode())
        except OSError:
            pass  # the caller is gone
        child.conn.close()


def _answer(conn: socket.socket, key: dict[str, Any], unusable: bool, children: dict[int, Child],
            own_fds: tuple[int, ...]) -> tuple[int | None, bool]:
    """Fork the child a request asks for; returns its pid (None: refused) and whether it is tied to its caller."""
    fds: list[int] = []
    try:
        conn.settimeout(10.0)
        data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
        request = json.loads(data)
        why = ("an import loaded the CUDA driver" if unusable else
               None if request.get("key") == key else "the caller's interpreter or environment differs from the zygote's"
               if len(fds) == 3 else "three file descriptors expected")
        if why is not None:
            conn.send(json.dumps({"refused": why}).encode())
            conn.close()
            return None, False
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(request, fds, [*own_fds, *(c.conn.fileno() for c in children.values())])
        children[pid] = Child(conn, str(request["module"]), request["env"].get(LABEL_ENV), time.monotonic())
        conn.send(json.dumps({"pid": pid}).encode())
        return pid, bool(request.get("tie"))
    except (OSError, ValueError) as exc:
        _log(f"a request failed: {type(exc).__name__}: {exc}")
        conn.close()
        return None, False
    finally:
        for fd in fds:
            os.close(fd)


def _child(request: dict[str, Any], fds: list[int], own_fds: list[int]) -> NoReturn:
    """The forked child: become ``python -m MODULE ARGV`` and run it."""
    from slurm_rl.launch.forkserver import become_fresh, exit_like_an_interpreter

    def run() -> int | None:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for fd in own_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        become_fresh(request["env"], frozenset(request.get("ignored", ())))
        target = request["module"]
        sys.argv = [target, *request["argv"]]
        if is_script(target):  # as `python SCRIPT.py`: the script's directory first on the path
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
            return 0
        warnings.filterwarnings("ignore", message=r".*found in sys\.modules after import of package", category=RuntimeWarning)
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return 0

    exit_like_an_interpreter(run)


RELAYED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def is_script(module: str) -> bool:
    """Whether what a caller asks to run is a script's path (``python SCRIPT.py``), not a module's name."""
    return module.endswith(".py")


def exec_module(module: str, args: list[str], device: str = "cpu") -> NoReturn:
    """Become ``python -m MODULE ARGS`` (``python MODULE ARGS`` for a script, :func:`is_script`): forked by
    the zygote of ``device`` where one serves this
    process (with its fds, environment and working directory; tied to it: SIGKILL this process and
    the zygote kills the child; the signals a user or Slurm sends are relayed; this process exits as
    the child did), else ``exec`` of a fresh interpreter (silently: the output is the module's alone)."""
    # A signal that arrives while the child is being forked waits (blocked) until the relay is in
    # place, so it reaches the child too rather than killing this process alone.
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED_SIGNALS)
    proc = _forked(module, args, device, dict(os.environ), None, None, None, new_session=True, tie=True, quiet=True)
    if proc is None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED_SIGNALS)
        os.execv(sys.executable, [sys.executable, *([module] if is_script(module) else ["-m", module]), *args])
    for sig in RELAYED_SIGNALS:
        signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED_SIGNALS)
    code = proc.wait()
    if code < 0:  # killed by a signal: so are we, as the caller of a fresh interpreter would see it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_rl.launch.zygote DIR --device DEVICE`` serves;
    ``python -m slurm_rl.launch.zygote exec [--device DEVICE] MODULE ARGS...`` runs ``python -m MODULE ARGS`` through one."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exec"]:
        rest, device = argv[1:], "cpu"
        if rest[:1] == ["--device"] and len(rest) > 1:
            rest, device = rest[2:], rest[1]
        if not rest:
            print("usage: python -m slurm_rl.launch.zygote exec [--device DEVICE] MODULE|SCRIPT.py ARGS...", file=sys.stderr)
            return 2
        exec_module(rest[0], rest[1:], device)
    parser = argparse.ArgumentParser(prog="python -m slurm_rl.launch.zygote", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="where the socket <device>.sock is made (SLURM_RL_ZYGOTE=DIR)")
    parser.add_argument("--device", choices=("emulated", "cpu", "cuda"), default="cpu",
                        help="what to preload: the imports of a rank of this runtime.device")
    args = parser.parse_args(argv)
    return serve(args.dir, args.device)


if __name__ == "__main__":
    sys.exit(main())
