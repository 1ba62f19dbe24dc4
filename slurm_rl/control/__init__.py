"""The file control plane: epochs, acks, heartbeats, progress and the coordinator lease on shared storage.

Knows nothing about RL: JSON documents, ranks, epochs and generations. Never imports torch.

Cost model per rank: ``EpochWatcher`` opens one known path per poll, every 10 ms right after an
epoch, backing off by x1.3 per empty poll to 100 ms when idle (~10 lookups/s); a heartbeat every
second is 4 syscalls (create temp, write, close, rename). A new epoch is seen within the current
poll interval (<= 100 ms after long idle). The coordinator's ``AckWaiter`` opens one path per poll
(the first rank still missing) every 5 ms. No hot loop lists a directory.

Every file goes through :mod:`slurm_rl.fsio` (``RunPaths.fs``): a failed write raises
``StorageError`` naming the path and publishes nothing; every document read is checked field by
field (``TornFileError`` naming the file and the field).
"""

from slurm_rl.control.acks import AckWaiter, read_ack, write_ack
from slurm_rl.control.atomic import (atomic_write_bytes, atomic_write_json, read_json, remove_stale_temp_files,
                                     write_json_exclusive)
from slurm_rl.control.epochs import Epoch, EpochStore, EpochWatcher, lease_generation, read_epoch_file
from slurm_rl.control.errors import (AckTimeout, ControlError, DeadRankError, EpochOrderError, FencedEpochError,
                                     LeaseHeldError, TornFileError, UnsafePathError, WaitTimeout)
from slurm_rl.control.events import append_event, read_events
from slurm_rl.control.heartbeats import HeartbeatWriter, read_heartbeat, stale_ranks
from slurm_rl.control.lease import CoordinatorLease, read_lease
from slurm_rl.control.paths import RunPaths, create_run_dir, safe_join
from slurm_rl.control.progress import read_all_progress, write_progress

__all__ = [
    "AckTimeout", "AckWaiter", "ControlError", "CoordinatorLease", "DeadRankError", "Epoch", "EpochOrderError",
    "EpochStore", "EpochWatcher", "FencedEpochError", "HeartbeatWriter", "LeaseHeldError", "RunPaths",
    "TornFileError", "UnsafePathError", "WaitTimeout", "append_event", "atomic_write_bytes", "atomic_write_json",
    "create_run_dir", "lease_generation", "read_ack", "read_all_progress", "read_epoch_file", "read_events",
    "read_heartbeat", "read_json", "read_lease", "remove_stale_temp_files", "safe_join", "stale_ranks",
    "write_ack", "write_json_exclusive", "write_progress",
]
