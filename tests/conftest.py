"""Shared fixtures: the local Slurm test cluster (started once per session, on demand) and the
uninterrupted reference run of the checkpoint/resume tests."""

from slurm_fixture import slurm_cluster  # noqa: F401
from resume_helpers import reference  # noqa: F401
