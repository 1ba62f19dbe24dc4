"""What "the same computation" means for two real runs (multiplexed vs alone, scaled vs static,
resumed vs uninterrupted): same per-step losses and final parameters, within float noise on the
scale of each quantity's terms.

Why they are not bit-equal: the hf rollout generates the requests a rank claimed in one padded
batch, and which requests share a batch differs from run to run (two rollout ranks claim from one
table); a sampled logprob then differs in the last bits (up to ~5e-7) with the batch's shape, and so
do the reference logprobs of the inference rank's batches. A changed DP size changes the order of
the gradient reduction the same way.

A GRPO loss is a mean of per-token terms ``-min(r A, clip(r) A) + beta k3`` with ``r`` ~ 1 and a
group-normalised advantage ``|A|`` of order 1: a logprob moved by ``d`` moves the loss by about
``|A| d``. So losses are compared with an absolute tolerance on that O(1) scale (a tolerance
relative to the loss itself, which is a near-zero mean, is meaningless), and parameters with a
tolerance relative to each tensor's largest entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# The same 16 requests with their own seeds, generated in groups of 4 regrouped, or one by one:
# the same tokens, logprobs apart by up to 2.4e-7 and 4.8e-7 (the same grouping twice: bit-equal).
LOGPROB_ATOL = 1e-6
# |A| <= sqrt(G - 1) (1.7 for groups of 4) times that noise: under 1e-6.
LOSS_ATOL = 1e-6


def assert_losses_match(got: Sequence[float], want: Sequence[float], atol: float = LOSS_ATOL) -> None:
    """Same number of optimizer steps, each loss within ``atol`` (terms of order 1)."""
    assert len(got) == len(want), (got, want)
    worst = max((abs(a - b) for a, b in zip(got, want)), default=0.0)
    assert worst <= atol, f"per-step losses differ by up to {worst:.3g} (> {atol:g}): {list(got)} vs {list(want)}"


def assert_params_match(got_dir: Path, want_dir: Path, rtol: float) -> None:
    """``checkpoints/final/model.safetensors`` of two runs (and of their critics, where they trained
    one): same tensors, each within ``rtol`` of its largest entry."""
    from safetensors.torch import load_file

    final = Path("checkpoints") / "final"
    critic = final / "critic" / "model.safetensors"
    assert (got_dir / critic).exists() == (want_dir / critic).exists()
    for path in (final / "model.safetensors", critic):
        if (want_dir / path).exists():
            _same_tensors(load_file(str(got_dir / path)), load_file(str(want_dir / path)), rtol)


def _same_tensors(got: dict, want: dict, rtol: float) -> None:
    assert got.keys() == want.keys()
    for name, ref in want.items():
        scale = float(ref.abs().max()) or 1.0
        diff = float((got[name] - ref).abs().max())
        assert diff <= rtol * scale, (name, diff, scale)
