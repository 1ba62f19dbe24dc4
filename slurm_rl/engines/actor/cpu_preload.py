"""Importing this module imports megatron-core with the CPU shim applied (:func:`~slurm_rl.engines.actor.model.
preload_megatron`), on a torch built without CUDA only: a fork server lists it among the modules it imports
before forking ranks (:data:`slurm_rl.engines.actor.local_dist.PRELOAD`), so that each rank does not import
megatron-core again (~1.5 s of CPU per rank). With a CUDA build it imports nothing more: the server must not
touch the driver before it forks."""

from __future__ import annotations

import torch

if torch.version.cuda is None:
    from slurm_rl.engines.actor.model import preload_megatron

    preload_megatron("cpu")
