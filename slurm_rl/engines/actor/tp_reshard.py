"""Tensor-parallel weight resharding with megatron-core's own planner, over gloo on CPU.

``megatron.core.resharding.swap_model_weights`` copies a model's weights into another model
with a different TP (or PP/DP) layout: it gathers parameter metadata from every rank, plans
slice-to-slice transfers on rank 0 and runs them through a ``CopyService``. Two things keep it
from running on a CPU-only torch as shipped, both handled here:

* the Gloo copy service creates a ``torch.cuda.Stream`` in its constructor and makes a world
  group; :class:`CpuGlooCopyService` takes an explicit group and no stream;
* the planner reads the DP and PP groups of each model's ``pg_collection`` through
  ``dist.get_process_group_ranks``, so they must be groups of the world, not the private
  one-rank groups ``build_gpt_model`` uses for TP=1; :func:`swap_weights` sets them.

Weights only: optimizer state is not part of megatron's plan. The planner exchanges metadata
with ``all_gather_object`` (torch.distributed's own object collectives, inside the allocation).
Collective over the world.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def cpu_gloo_copy_service(group: dist.ProcessGroup) -> Any:
    """A megatron ``GlooCopyService`` over ``group`` that needs no CUDA."""
    from megatron.core.resharding.copy_services.gloo_copy_service import GlooCopyService

    class CpuGlooCopyService(GlooCopyService):
        """``GlooCopyService`` without the CUDA stream, over an explicit group."""

        def __init__(self, pg: dist.ProcessGroup) -> None:  # no super(): it needs CUDA
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.gloo_pg = pg
            self.send_ops: list[Any] = []
            self.recv_ops: list[Any] = []
            self._copy_stream = None

    return CpuGlooCopyService(group)


def swap_weights(src_model: torch.nn.Module, dst_model: torch.nn.Module,
                 src_groups: dict[str, dist.ProcessGroup],
                 dst_groups: dict[str, dist.ProcessGroup],
                 transfer_group: dist.ProcessGroup) -> None:
    """Copy ``src_model``'s weights into ``dst_model`` whatever their TP layouts.

    ``src_groups``/``dst_groups`` give each model's ``"dp"`` and ``"pp"`` groups (world
    groups); their TP groups are the ones the models were built with. Every world rank calls
    this with its own shard of both models.
    """
    from megatron.core.resharding.refit import swap_model_weights

    for model, groups in ((src_model, src_groups), (dst_model, dst_groups)):
        pgs = model.pg_collection  # type: ignore[union-attr]
        pgs.dp, pgs.pp = groups["dp"], groups["pp"]
    with torch.no_grad():
        swap_model_weights(src_model, dst_model, cpu_gloo_copy_service(transfer_group))
