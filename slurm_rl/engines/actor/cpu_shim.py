"""Make megatron-core 0.16.1 GPTModel build and train on a CPU-only torch.

megatron-core assumes CUDA in a few places that the local (non-TransformerEngine) layer spec
still reaches on CPU: ``torch.cuda.current_device()`` as a device argument,
``torch.cuda.synchronize()`` before ``dist_checkpointing`` writes, the CUDA RNG state
tracker forked around attention dropout (and saved and restored around each block that activation
recompute re-runs), and the default causal mask created on ``"cuda"``.
This module is the one place that monkeypatches megatron/torch for that; it does nothing when
CUDA is available. Patching is process-wide by nature, so it is idempotent.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_PATCHED_FLAG = "_slurm_rl_cpu_shim"


def _cpu_tracker_class() -> type:
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """The megatron RNG tracker with named states kept as CPU generator states."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise ValueError(f"seed {seed} already exists")
            if name in self.states_:
                raise ValueError(f"rng state {name} already exists")
            self.seeds_.add(seed)
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed)
            self.states_[name] = gen.get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                # Unseeded use (e.g. zero dropout): a fixed state keeps runs deterministic.
                gen = torch.Generator(device="cpu")
                gen.manual_seed(1234)
                self.states_[name] = gen.get_state()
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    return CpuRNGStatesTracker


def _cpu_default_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _cpu_sliding_window_causal_mask(sq: int, skv: int, window_size: tuple[int, int]) -> torch.Tensor:
    m = torch.ones(sq, skv, dtype=torch.bool)
    mu = torch.triu(m, diagonal=skv - sq - window_size[0])
    return ~torch.tril(mu, diagonal=skv - sq + window_size[1])


def _no_op_jit_fuser() -> None:
    """Give megatron-core a no-op ``megatron.core.jit.jit_fuser`` before it is first imported.

    Its fused bias-activation functions are decorated with ``torch.compile`` at import, which
    imports TorchDynamo and Inductor (with sympy and networkx): about a second of each rank's
    start on CPU, for fusions the CPU layer spec never calls. A no-op decorator returns the same
    functions uncompiled. Does nothing once megatron-core is imported (its modules hold the
    decorator already)."""
    import sys
    import types

    if "megatron.core" in sys.modules or "megatron.core.jit" in sys.modules:
        return

    def noop_decorator(func):  # type: ignore[no-untyped-def]
        return func

    jit = types.ModuleType("megatron.core.jit", "megatron-core's jit fuser, a no-op on CPU (slurm_rl.cpu_shim)")
    jit.noop_decorator = noop_decorator  # type: ignore[attr-defined]
    jit.jit_fuser = noop_decorator  # type: ignore[attr-defined]
    jit.enable_jit_fuser = lambda: None  # type: ignore[attr-defined]
    jit.disable_jit_fuser = lambda: None  # type: ignore[attr-defined]
    sys.modules["megatron.core.jit"] = jit


def apply_cpu_shim() -> bool:
    """Patch megatron-core/torch for CPU execution when CUDA is absent.

    Returns True when this call (or an earlier one) patched the process, False when CUDA is
    available and nothing was changed.
    """
    if torch.cuda.is_available():
        return False
    if getattr(torch.cuda, _PATCHED_FLAG, False):
        return True
    _no_op_jit_fuser()
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer import utils as mutils

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    # dist_checkpointing synchronises the device before writing; nothing to wait for on CPU.
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    # activation recompute saves and restores the CUDA RNG state around each recomputed block
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    tracker = _cpu_tracker_class()()
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    for module in (mutils, fused_softmax):
        module.get_default_causal_mask = _cpu_default_causal_mask  # type: ignore[attr-defined]
        module.get_sliding_window_causal_mask = (  # type: ignore[attr-defined]
            _cpu_sliding_window_causal_mask)
    setattr(torch.cuda, _PATCHED_FLAG, True)
    return True
