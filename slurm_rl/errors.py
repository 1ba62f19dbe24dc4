"""The exception hierarchy of slurm_rl: every error the package raises is a :class:`SlurmRLError`.

Families (each module subclasses one of them and keeps the builtin base its callers catch)::

    SlurmRLError
    ├── InputError (ValueError)      bad input: config, arguments, a run dir or file the user named
    │                                 (placement.ConfigError, launch.submit.SubmitError, ...); exit 2
    ├── ControlError                  control plane: epochs, acks, leases, control files (control/errors.py)
    ├── DataPlaneError (RuntimeError) shards, manifests, migration (data/errors.py)
    ├── EngineError                   rollout/actor/inference engines, weight sync, parking (engines/errors.py)
    ├── WorkerError                   the rank-side protocol: collectives, coordinator failure, stops
    ├── SchedulerError                coordinator, group scheduler, simulator (scheduler/errors.py)
    ├── LaunchError (RuntimeError)    starting, watching and submitting ranks (launch/)
    ├── StorageError (OSError)        a file operation on shared storage failed (fsio.py)
    └── WaitTimeout (TimeoutError)    a bounded wait ran out of time; the one timeout family

A timeout of a family is a subclass of both, e.g. ``ManifestTimeout(DataPlaneError, WaitTimeout)``,
so ``except TimeoutError`` and ``except WaitTimeout`` catch every one of them.
"""

from __future__ import annotations


class SlurmRLError(Exception):
    """Base class of every error raised by slurm_rl."""


class InputError(SlurmRLError, ValueError):
    """Bad input: a config value, a command-line argument, or a file or directory the user named.

    Nothing was launched or changed; the command line exits with code 2."""


class ControlError(SlurmRLError):
    """Base class of all control-plane errors."""


class DataPlaneError(SlurmRLError, RuntimeError):
    """Base class for every data-plane failure (bad manifest, bad name, schema mismatch...)."""


class EngineError(SlurmRLError):
    """Base class of the engines' errors (rollout, actor, inference, weight sync, parking)."""


class WorkerError(SlurmRLError):
    """Base class of a rank's errors in the worker protocol (collectives, coordinator failure, stops)."""


class SchedulerError(SlurmRLError):
    """Base class of the coordinator's, the group scheduler's and the simulator's errors."""


class LaunchError(SlurmRLError, RuntimeError):
    """A rank failed or the run did not finish in time (names the ranks and their exit codes)."""


class WaitTimeout(SlurmRLError, TimeoutError):
    """A bounded wait ran out of time (names what was awaited, by whom, and the limit)."""
