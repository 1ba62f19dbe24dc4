"""xdist's ``loadgroup`` scheduling, with each serial test handed only to a worker holding at most one test.

xdist keeps two tests queued behind each worker's running one. At the end of the session, where the
serial tests are (tests/conftest.py orders them last, the longest first), a worker that finished a run
of short tests took three serial tests into its queue and ran them one after the other (68 s) while the
other workers had none left. Here a serial test (an xdist group of its own, named ``serial-N``) goes only
to a worker that holds at most one test: a worker starts its last test only once it has the next one (or
is told to stop), so one test behind the running one is the least a worker can hold. Each worker then
holds at most two serial tests, and :class:`~machine_lock.MachineLock` runs two at a time. Everything
else is xdist's.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadGroupScheduling

SERIAL_GROUP = "serial-"
"""Prefix of the xdist group of each serial test (one test per group)."""


class SerialLastScheduling(LoadGroupScheduling):
    """``loadgroup`` that hands a serial test only to a worker holding at most one test."""

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down or not self.workqueue:
            super()._reschedule(node)  # xdist shuts the node down when nothing is left
            return
        if next(iter(self.workqueue)).startswith(SERIAL_GROUP):
            if self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)
            return
        super()._reschedule(node)
