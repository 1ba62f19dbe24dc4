"""Scoring rollouts with a reward function in a pool of worker processes.

:class:`RewardRunner` keeps a pebble ``ProcessPool`` alive across :meth:`RewardRunner.score`
calls (one per RL iteration). Each sample is one task with its own timeout: a worker that hangs is
killed by pebble and replaced, and the pool keeps working. The workers are started with the
``spawn`` method (never ``fork``: the trainer has threads and torch.distributed state; not
``forkserver``: a forkserver dies of the SIGTERM a preemption sends to every process), start
in the background when the runner is built, and import the reward once. With ``workers=0`` the
samples are scored in the calling process instead (verl's naive reward manager): no process to
start and no task to send, but a sample that runs past its timeout is only found out when it
returns, and a reward that never returns or crashes the interpreter takes the rank with it.

A sample whose reward raises, times out, kills its worker or returns no finite real number is an
error: with ``on_error="raise"`` :meth:`~RewardRunner.score` raises :class:`RewardError`
(:class:`RewardTimeout` for a timeout) naming the reward, the sample id and the cause; with
``on_error="zero"`` its value is 0.0 and it is counted in :attr:`RewardResult.errors` or
:attr:`RewardResult.timeouts`.
"""

from __future__ import annotations

import math
import multiprocessing
import numbers
import os
import signal
import pickle
import reprlib
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError, as_completed
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from slurm_rl.engines.errors import EngineStateError
from slurm_rl.errors import EngineError
from slurm_rl.placement import ConfigError, ConfigIssue
from slurm_rl.rewards.builtin import BUILTIN, RewardFn
from slurm_rl.rewards.errors import RewardError, RewardTimeout
from slurm_rl.rewards.loader import import_reward, resolve_reward, reward_label

if TYPE_CHECKING:  # pebble is imported where it is used: resolving a reward needs no pool
    from pebble import ProcessFuture, ProcessPool

__all__ = ["ON_ERROR", "START_METHOD", "RewardResult", "RewardRunner", "RewardSample"]

START_METHOD = "spawn"
"""How the reward workers are started: a fresh server process forks them, so they inherit neither
the trainer's threads nor its CUDA / torch.distributed state (``fork`` would)."""

ON_ERROR: tuple[str, ...] = ("raise", "zero")
"""What a failed sample does: raise :class:`RewardError`, or score 0.0 and be counted."""

_RESTART_S = 30.0
# the signals that ask a rank to checkpoint and stop (worker.main): never delivered to reward workers
STOP_SIGNALS = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM}
"""Slack per round of samples for a worker restart when bounding a whole :meth:`RewardRunner.score`."""



def _short_repr(value: Any) -> str:
    """``repr(value)``, cut to about 80 characters."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 80
    return short.repr(value)


@dataclass(frozen=True)
class RewardSample:
    """One response to score: ``answer`` is the dataset's ground truth, ``extra`` anything else the
    reward needs (both must pickle)."""

    sample_id: int
    prompt: str
    response: str
    answer: Any
    extra: dict = field(default_factory=dict)


@dataclass
class RewardResult:
    """The rewards of a batch, in the order of the samples; failed samples score 0.0 and are
    counted in ``errors`` (raised, bad value, worker died) or ``timeouts``."""

    values: list[float]
    errors: int = 0
    timeouts: int = 0


def _load(name: str | None, fn: str | None) -> RewardFn:
    """The reward in a worker: a built-in, or ``reward.fn`` imported with the worker's sys.path."""
    return BUILTIN[name] if name is not None else import_reward(str(fn))


def _worker_init(paths: tuple[str, ...], cwd: str, name: str | None, fn: str | None) -> None:
    """Worker start: the parent's working directory and sys.path, then import (and for ``math``
    exercise) the reward once so the first sample does not pay for it. Never raises: a problem
    shows on each sample instead (pebble gives up on a pool whose initializer fails). The rank's
    stop signals are ignored (pebble's own SIGTERM handler included: it stops a worker with SIGKILL
    3 s later)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    sys.path[:] = list(paths) + [p for p in sys.path if p not in paths]
    try:
        reward = _load(name, fn)
        if name == "math":
            reward("", "1", "1", {})
    except Exception:  # noqa: BLE001 - reported per sample by _score_one
        pass


def _score_one(name: str | None, fn: str | None, sample: RewardSample, passes: tuple[type[BaseException], ...] = (),
               where: str = "worker") -> tuple[float, None, None] | tuple[None, str, str]:
    """Run the reward on one sample: (value, None, None) or (None, kind, message); an exception of
    ``passes`` (the caller's own interrupts, where it runs in the caller's process) is raised; ``where``
    names the process in the traceback's heading."""
    try:
        reward = _load(name, fn)
        value = reward(sample.prompt, sample.response, sample.answer, sample.extra)
    except passes:
        raise
    except BaseException as exc:  # noqa: BLE001 - math-verify's TimeoutException, SystemExit... too
        lines = traceback.format_exception(exc)
        return None, "error", f"{type(exc).__name__}: {exc}\n{where} traceback:\n{''.join(lines).rstrip()}"
    try:
        number = float(value) if isinstance(value, numbers.Real) else math.nan
    except (OverflowError, ValueError, TypeError):  # an int too big for a float, an odd Real
        number = math.nan
    if not math.isfinite(number):
        return None, "value", (f"returned {_short_repr(value)} ({type(value).__name__}), "
                               "not a finite real number")
    return number, None, None


class _BrokenPool(EngineError):
    """The pool broke under a batch (``cause``: pebble's error); caught by :meth:`RewardRunner.score`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class RewardRunner:
    """Scores batches of :class:`RewardSample` with one reward in ``workers`` processes.

    ``name`` is a built-in reward (``gsm8k``, ``math``, ``exact``), ``fn`` a
    ``package.module:function`` importable from the working directory or sys.path (exactly one).
    ``timeout_s`` bounds each sample; ``on_error`` is ``"raise"`` or ``"zero"``; ``workers=0``
    scores in this process (see the module docstring). Resolves the reward at once (raises
    :class:`~slurm_rl.placement.ConfigError` for a bad one) and starts the workers in the
    background. Use as a context manager or call :meth:`close`.
    """

    def __init__(self, name: str | None = None, fn: str | None = None, timeout_s: float = 10.0,
                 on_error: Literal["raise", "zero"] = "raise", workers: int = 2) -> None:
        issues = []
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
            issues.append(ConfigIssue("reward.timeout_s", timeout_s, "a positive, finite number of seconds"))
        if on_error not in ON_ERROR:
            issues.append(ConfigIssue("reward.on_error", on_error, " or ".join(map(repr, ON_ERROR))))
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            issues.append(ConfigIssue("reward.workers", workers,
                                      "a whole number of worker processes, or 0 to score in the rank's process"))
        if issues:
            raise ConfigError(issues)
        resolve_reward(name, fn)  # a bad reward fails here, in the caller's process
        self.name = name
        self.fn = fn
        self.label = reward_label(name, fn)
        self.timeout_s = float(timeout_s)
        self.on_error = on_error
        self.workers = workers
        self._cwd = os.getcwd()
        self._paths = tuple(dict.fromkeys(os.path.abspath(p) if p else self._cwd for p in sys.path))
        self._closed = False
        self._pool: ProcessPool | None = self._new_pool() if workers else None

    def _new_pool(self) -> ProcessPool:
        """A started pool whose processes never see the signals that ask the rank to stop.

        Slurm delivers ``--signal`` (USR1), submitit's USR2 and preemption's TERM to every process
        of the job step: unhandled, they would kill the workers in the middle of a batch, and the
        rank would fail instead of checkpointing at its gate. They are blocked while the pool's
        manager thread and the workers are made (a blocked mask is
        inherited by threads, forks and exec), and unblocked again here, so a signal that arrives
        meanwhile still reaches the rank. pebble stops a hung worker with SIGTERM, then SIGKILL
        after 3 s: a timed-out sample's worker dies 3 s late."""
        from pebble import ProcessPool

        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pool = ProcessPool(max_workers=self.workers, initializer=_worker_init,
                               initargs=(self._paths, self._cwd, self.name, self.fn),
                               context=multiprocessing.get_context(START_METHOD))
            started = pool.active  # reading `active` starts the workers now (pebble waits for a task)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if not started:
            raise self._pool_error(RuntimeError("the worker pool did not start"))
        return pool

    def _live_pool(self) -> ProcessPool:
        self._check_open()
        if self._pool is None or not self._pool.active:
            self._discard_pool()
            self._pool = self._new_pool()
        return self._pool

    def _discard_pool(self) -> None:
        """Stop the pool, killing its workers and dropping its queued tasks."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join()

    def score(self, samples: Sequence[RewardSample]) -> RewardResult:
        """The rewards of ``samples``, in their order. With ``on_error="raise"`` the first failed
        sample raises :class:`RewardError` (:class:`RewardTimeout`), and the pool is restarted
        on the next call; with ``"zero"`` it scores 0.0 and is counted. A pool that breaks under
        the batch (pebble's ``BrokenProcessPool``: a worker it started could not run) is started
        again once and the samples not scored yet are scored there; a second break raises."""
        samples = list(samples)
        result = RewardResult(values=[0.0] * len(samples))
        if not self.workers:
            self._check_open()
            for i, sample in enumerate(samples):
                self._record(result, i, sample, *self._score_here(sample))
            return result
        done: set[int] = set()
        restarted = False
        try:
            while len(done) < len(samples):
                try:
                    self._score_some(samples, [i for i in range(len(samples)) if i not in done], result, done)
                except _BrokenPool as broken:
                    if restarted:
                        raise self._pool_error(broken.cause) from broken.cause
                    restarted = True
                    self._discard_pool()  # the next _live_pool() starts a fresh one
        except BaseException:
            self._discard_pool()  # queued tasks of this batch must not run into the next one
            raise
        return result

    def _score_some(self, samples: list[RewardSample], indices: list[int], result: RewardResult,
                    done: set[int]) -> None:
        """Score ``samples[i]`` for ``i`` in ``indices`` into ``result``, adding each to ``done`` once its
        outcome is in; raises :class:`_BrokenPool` when the pool breaks."""
        pool = self._live_pool()
        futures: dict[ProcessFuture, int] = {}
        try:
            for i in indices:
                futures[pool.schedule(_score_one, args=(self.name, self.fn, samples[i]), timeout=self.timeout_s)] = i
        except RuntimeError as exc:  # pebble: the pool is no longer running
            raise _BrokenPool(exc) from exc
        for future in self._completed(futures):
            i = futures[future]
            value, kind, message = self._outcome(future)
            done.add(i)
            self._record(result, i, samples[i], value, kind, message)

    def _record(self, result: RewardResult, i: int, sample: RewardSample, value: float | None, kind: str | None,
                message: str) -> None:
        """Put the outcome of ``sample`` (the ``i``-th) into ``result``, or raise it (``on_error="raise"``)."""
        if kind is None:
            result.values[i] = value  # type: ignore[assignment]
        elif self.on_error == "raise":
            raise self._error(sample.sample_id, kind, message)
        elif kind == "timeout":
            result.timeouts += 1
        else:
            result.errors += 1

    def _score_here(self, sample: RewardSample) -> tuple[float | None, str | None, str]:
        """One sample scored in this process (``workers=0``); a sample that returned after
        ``timeout_s`` is a timeout."""
        start = time.monotonic()
        value, kind, message = _score_one(self.name, self.fn, sample, passes=(KeyboardInterrupt,), where="rank")
        took = time.monotonic() - start
        if kind is None and took > self.timeout_s:
            return None, "timeout", f"it returned after {took:.1f} s, in the rank's process (reward.workers 0)"
        return value, kind, message or ""

    def _check_open(self) -> None:
        if self._closed:
            raise EngineStateError(f"reward {self.label!r}: score() after close()")

    def _completed(self, futures: dict[ProcessFuture, int]) -> Iterator[ProcessFuture]:
        """The futures as they finish; a pool that stops finishing them (its threads died) is
        an error after a generous bound: every sample timing out, and a worker restart each."""
        rounds = -(-len(futures) // self.workers)
        try:
            yield from as_completed(futures, timeout=rounds * (self.timeout_s + _RESTART_S) + _RESTART_S)
        except FutureTimeout as exc:
            raise self._pool_error(exc) from exc

    def _pool_error(self, exc: BaseException) -> RewardError:
        return RewardError(f"reward {self.label!r}: the worker pool failed: {type(exc).__name__}: {exc}",
                           reward=self.label, kind="pool")

    def _outcome(self, future: ProcessFuture) -> tuple[float | None, str | None, str]:
        """(value, kind of failure or None, message) of a finished task."""
        from concurrent.futures.process import BrokenProcessPool

        from pebble import ProcessExpired

        try:
            value, kind, message = future.result()
        except FutureTimeout:
            return None, "timeout", ""
        except ProcessExpired as exc:
            return None, "worker", f"its worker process died (exit code {exc.exitcode})"
        except CancelledError:
            return None, "worker", "its task was cancelled"
        except BrokenProcessPool as exc:
            raise _BrokenPool(exc) from exc
        except (AttributeError, TypeError, pickle.PicklingError) as exc:  # pebble could not pickle the task
            return None, "error", f"the sample cannot be sent to a worker: {type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - _score_one catches the reward's own; anything else
            return None, "error", f"{type(exc).__name__}: {exc}"
        return value, kind, message or ""

    def _error(self, sample_id: int, kind: str, message: str) -> RewardError:
        if kind == "timeout":
            how = message or "no result, and its worker was killed"
            return RewardTimeout(f"reward {self.label!r} timed out on sample {sample_id} (reward.timeout_s="
                                 f"{self.timeout_s:g} s): {how}", reward=self.label, sample_id=sample_id, kind=kind)
        if kind == "value":
            return RewardError(f"reward {self.label!r} {message} on sample {sample_id}",
                               reward=self.label, sample_id=sample_id, kind=kind)
        return RewardError(f"reward {self.label!r} failed on sample {sample_id}: {message}",
                           reward=self.label, sample_id=sample_id, kind=kind)

    def close(self) -> None:
        """Stop the workers; the runner cannot score afterwards. Idempotent."""
        self._closed = True
        self._discard_pool()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
