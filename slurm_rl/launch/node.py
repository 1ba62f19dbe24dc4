"""``python -m slurm_rl.launch.node RUN_DIR``: the ranks of one node under ``srun``, forked from one
interpreter that imported what they need once (as torchrun's per-node agent starts a node's ranks).

``sbatch/train.sh`` starts one ``srun`` task per node that holds ranks (``SLURM_HOSTFILE`` names those
nodes in the order of their first rank, ``--distribution=arbitrary``); task ``k`` serves the ``k``-th
of them. It reads the placement from ``RUN_DIR/config.yaml``, imports for ``runtime.device`` as the
local launcher's fork server does (:func:`slurm_rl.launch.forkserver.preload`: torch, megatron-core,
transformers on ``cpu``; nothing that touches CUDA), then forks each of the node's ranks. A rank sees
the environment ``srun`` would have given it as a task of its own: ``SLURM_PROCID`` its rank,
``SLURM_NTASKS`` the world size, ``SLURM_LOCALID`` its index on the node, ``SLURM_NODEID`` the
placement's node; the rest is the task's (``CUDA_VISIBLE_DEVICES`` of the node, which the rank
narrows to its own as before). A node of 8 ranks imports once instead of 8 times.

``sbatch/mux.sh`` starts a group's job the same way, with ``--ranks-per-node N,N,...``: task ``k``
serves the ranks srun's block distribution would have put on the allocation's ``k``-th node (a job's
placement names the group's slots, not the allocation's nodes). A ``slurm-rl submit`` task calls
:func:`serve_ranks` for its node from inside submitit (:class:`slurm_rl.launch.submit.RankTask`).

The ranks stay in the task's process group and share its stdout and stderr (the job log). Slurm
signals every process of a step (``scancel``, the preemption's SIGTERM, ``srun`` forwarding the
batch script's USR1), so the ranks get them as before; this process ignores the polite ones. It
exits once its ranks did: 0 when all exited 0; as soon as one fails, with that rank's code (128 +
the signal for a rank killed by one), so that ``srun --kill-on-bad-exit=1`` ends the step as it
did when that rank was a task itself. Before it leaves it SIGKILLs what remains below it (the node's other
ranks, rank 0's coordinator, reward workers): it is their subreaper, so a process whose parent ended is
still found, as Slurm would have found it in the step (a process that outlived this one would have
escaped the step: Slurm's ``proctrack/linuxproc`` follows the process tree). Where an import loaded the CUDA driver (a rank forked from
here could not use CUDA), each rank starts as a fresh ``python -m slurm_rl.worker RUN_DIR`` instead
(the ``cuda`` preload has not run on a GPU machine yet: tested here with ``emulated`` and ``cpu`` jobs).
``SLURM_RL_FORKSERVER=0`` makes ``sbatch/train.sh`` start one task per rank, as before.

A forked rank's ``/proc/PID/cmdline`` and ``environ`` are this process's: find a rank by its
heartbeat's ``pid`` (:func:`slurm_rl.control.heartbeats.read_heartbeat`).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from slurm_rl.fsio import remove_temp_files_of
from slurm_rl.launch import forkserver
from slurm_rl.launch.proctable import process_stats

if TYPE_CHECKING:
    from slurm_rl.config import ReusableConfig

USAGE = ("usage: python -m slurm_rl.launch.node RUN_DIR [--ranks-per-node N,N,...]   (one srun task per node "
         "that holds ranks)")


def nodes_in_rank_order(node_of_rank: list[int]) -> list[int]:
    """The placement nodes that hold ranks, in the order of their first rank (the per-node hostfile's)."""
    return list(dict.fromkeys(node_of_rank))


def tasks_per_node(value: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE`` (``4(x2),3``) as a count per node; ``ValueError`` when malformed."""
    counts: list[int] = []
    for item in filter(None, value.split(",")):
        count, _, repeat = item.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts


def block_layout(ranks_per_node: list[int]) -> list[int]:
    """The node of every rank when consecutive ranks fill each node in turn (``srun``'s block distribution)."""
    return [node for node, count in enumerate(ranks_per_node) for _ in range(count)]


def node_ranks(node_of_rank: list[int], task: int) -> tuple[int, list[int]]:
    """The placement node that srun task ``task`` serves and its ranks; ``ValueError`` past the last node."""
    nodes = nodes_in_rank_order(node_of_rank)
    if not 0 <= task < len(nodes):
        raise ValueError(f"srun task {task} but the placement holds ranks on {len(nodes)} nodes: start one task "
                         f"per node (sbatch/train.sh does)")
    node = nodes[task]
    return node, [r for r, n in enumerate(node_of_rank) if n == node]


def rank_env(environ: dict[str, str], rank: int, local_rank: int, world_size: int, node: int) -> dict[str, str]:
    """The environment of one rank: the task's, with the variables srun sets per task made the rank's."""
    return dict(environ, SLURM_PROCID=str(rank), SLURM_NTASKS=str(world_size), SLURM_LOCALID=str(local_rank),
                SLURM_NODEID=str(node))


def _log(msg: str) -> None:
    print(f"slurm_rl node {os.environ.get('SLURMD_NODENAME', '?')} (pid {os.getpid()}): {msg}", file=sys.stderr,
          flush=True)


def _fork_rank(run_dir: str, env: dict[str, str], ignored: frozenset[int], loaded: ReusableConfig | None = None) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid

    def run() -> int:
        forkserver.become_fresh(env, ignored)
        return forkserver.run_as_worker(run_dir, loaded)

    forkserver.exit_like_an_interpreter(run)
    raise AssertionError("unreachable")  # pragma: no cover


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Have the orphans among this process's descendants reparented to it (Linux ``prctl``)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for pid, fields in process_stats():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> set[int]:
    """SIGKILL every process below this one (until none is left, at most a few rounds); their pids."""
    killed: set[int] = set()
    for _ in range(5):
        pids = [p for p in descendants(os.getpid()) if p not in killed]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
    return killed


def _exit_code(code: int) -> int:
    """A rank's ``Popen.returncode`` as a shell reports it (128 + N for death by signal N)."""
    return 128 - code if code < 0 else code


def wait_for_ranks(children: dict[int, int]) -> int:
    """Reap the ranks (pid -> rank); the first failure's exit code at once, else 0 once all ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        rank = children.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            _log(f"rank {rank} (pid {pid}) exited with code {code}; leaving so that srun ends the step "
                 f"({len(children)} ranks of this node still running)")
            return _exit_code(code)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 3) or len(args) == 3 and args[1] != "--ranks-per-node":
        print(USAGE, file=sys.stderr)
        return 2
    run_dir = args[0]
    from slurm_rl.config import ReusableConfig

    loaded = ReusableConfig.load(Path(run_dir) / "config.yaml")
    placement = loaded.config.placement
    node_of_rank = [placement.node_of_rank(r) for r in range(placement.world_size)]
    if len(args) == 3:  # the step's layout, not the placement's nodes (a group's job: its slots span the allocation)
        try:
            node_of_rank = block_layout([int(n) for n in args[2].split(",")])
        except ValueError:
            node_of_rank = []
        if len(node_of_rank) != placement.world_size:
            _log(f"--ranks-per-node {args[2]}: allowed: counts that add up to the run's {placement.world_size} ranks")
            return 2
    try:
        node, ranks = node_ranks(node_of_rank, int(os.environ.get("SLURM_PROCID", "0")))
    except ValueError as exc:
        _log(str(exc))
        return 2
    ignored = forkserver.ignored_signals()  # inherited from srun: a rank started as a fresh process would keep them
    for sig in forkserver.IGNORED_BY_SERVER:
        signal.signal(sig, signal.SIG_IGN)
    become_subreaper()
    environ = dict(os.environ)
    envs = {r: rank_env(environ, r, i, placement.world_size, node) for i, r in enumerate(ranks)}
    return serve_ranks(run_dir, loaded, node, envs, ignored)


def serve_ranks(run_dir: str, loaded: ReusableConfig, node: int, envs: dict[int, dict[str, str]],
                ignored: frozenset[int], started: Callable[[set[int]], None] = lambda pids: None) -> int:
    """Import what a rank of the run's device needs, start each rank of ``envs`` (rank -> its environment)
    forked from here (fresh where an import loaded the CUDA driver), tell ``started`` their pids, reap them
    (:func:`wait_for_ranks`), then SIGKILL what is left below this process. ``ignored``: the signals a rank
    keeps ignored. The first failing rank's exit code, else 0."""
    device = loaded.config.runtime.device
    ranks = list(envs)
    environ = dict(os.environ)
    warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
    cpu0, wall0 = time.process_time(), time.monotonic()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # numpy's OpenBLAS starts no threads here
    forkserver.preload(device)
    gc.collect()
    gc.freeze()
    os.environ.clear()
    os.environ.update(environ)
    _log(f"node {node}, ranks {ranks}, device {device}: preloaded {len(sys.modules)} modules in "
         f"{time.process_time() - cpu0:.2f}s CPU ({time.monotonic() - wall0:.2f}s wall)")
    if forkserver.cuda_touched():
        _log("an import loaded the CUDA driver: starting each rank as a fresh process")
        def as_inherited() -> None:  # in the child before exec: not the signals this task ignores for itself
            for sig in forkserver.IGNORED_BY_SERVER:
                signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)

        fresh = {r: subprocess.Popen([sys.executable, "-m", "slurm_rl.worker", run_dir], env=envs[r],
                                     preexec_fn=as_inherited) for r in ranks}
        procs = {p.pid: r for r, p in fresh.items()}
    else:
        procs = {_fork_rank(run_dir, envs[r], ignored, loaded): r for r in ranks}
    rank_pids = set(procs)
    started(rank_pids)
    code = 1
    try:
        code = wait_for_ranks(procs)
    finally:  # also when a signal handler ends this process (submitit's requeue exits from one)
        left = kill_descendants()
        if left:
            _log(f"killed {len(left)} processes left below this task (as Slurm does at a step's end)")
        if code != 0:  # what a killed rank (or its coordinator) was writing: the temp files named by their pids
            remove_temp_files_of(run_dir, left | rank_pids)
    return code

if __name__ == "__main__":
    sys.exit(main())
