"""RL pieces that know nothing about placement: tokenizer, toy task, GRPO math."""
