"""PPO's critic (``algorithm.adv_estimator: gae``): the actor's megatron-core model with a scalar
value head in place of the LM output layer, trained by the actor's machinery.

:class:`CriticTrainer` is an :class:`~slurm_rl.engines.actor.trainer.ActorTrainer` over the same
ranks, DP group and TP layout as the actor (or over ranks of its own): its own parameters and AdamW
state, resharded in place (TP changes included: the head is replicated over TP), checkpointed and
parked like the actor's. The body starts from the actor's initial weights (the
HF checkpoint, or the same seeded init), the head from a seeded normal init, as verl's critic
(``AutoModelForTokenClassification`` of the actor's checkpoint, one label). Its forward gives the
value of each next-token position (the state before the response token it predicts), the layout
of the actor's log-probs.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .layout import ParamSpec
from .trainer import ActorTrainer

HEAD_STD = 0.02  # transformers' initializer_range: the score layer's init
HEAD_PARAMS = ("output_layer.weight", "output_layer.bias")


class ValueHead(torch.nn.Module):
    """``hidden -> 1`` (weight and bias: transformers' ``score`` layer of one label), called as
    megatron-core calls its output layer."""

    def __init__(self, hidden: int, seed: int, dtype: torch.dtype) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed + 7919)
        self.weight = torch.nn.Parameter((torch.randn(1, hidden, generator=g) * HEAD_STD).to(dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(self, hidden_states: torch.Tensor, weight: torch.Tensor | None = None,
                runtime_gather_output: Any = None) -> tuple[torch.Tensor, None]:
        return F.linear(hidden_states, self.weight, self.bias), None


def token_values(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], device: torch.device | str
                 ) -> torch.Tensor:
    """The critic's value at every position but the last of a micro-batch: float32 ``[B, T-1]`` (right
    padding), or ``[1, N-1]`` for a packed row."""
    from .logprobs import model_forward

    return model_forward(model, batch, device)[:, :-1, 0].float()


class CriticTrainer(ActorTrainer):
    """The critic on the actor's ranks (see the module docstring); ``train_step``'s loss function
    gets the values ``[B, T-1]`` in place of log-probs."""

    not_in_checkpoint = HEAD_PARAMS

    @staticmethod
    def _specs_of(model: torch.nn.Module, tp: int) -> list[ParamSpec]:
        """The actor's split rules, but the value head is replicated over TP (``hidden -> 1`` has no
        vocabulary to split: every TP rank holds it whole and computes the same values and gradients,
        as megatron's norms)."""
        return [ParamSpec(s.name, tuple(p.shape), None) if s.name in HEAD_PARAMS else s
                for s, (_, p) in zip(ActorTrainer._specs_of(model, tp),
                                     ((n, p) for n, p in model.named_parameters() if p.requires_grad))]

    def _build_model(self, tp_group: dist.ProcessGroup | None, initialize: bool, load: bool) -> torch.nn.Module:
        model = super()._build_model(tp_group, initialize, load)
        dtype = next(model.parameters()).dtype
        model.output_layer = ValueHead(self.model_cfg.hidden_size, self.seed, dtype).to(self.device)
        model.share_embeddings_and_output_weights = False  # the head reads no embedding weight
        return model

    def _forward(self, batch: Mapping[str, torch.Tensor], entropy: bool) -> tuple[torch.Tensor, None]:
        return token_values(self.model, batch, self.device), None
