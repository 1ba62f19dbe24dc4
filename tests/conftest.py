"""Shared fixtures: the local Slurm test cluster (started once per session, on demand)."""

from slurm_fixture import slurm_cluster  # noqa: F401
