"""Actor engine: megatron-core GPT training with in-place elastic data-parallel resharding."""
