"""Prompt files of the toy tasks the cpu tests train on (written by ``slurm_rl.toy.tasks``, see
tests/data/README.md): ``add_4.jsonl`` (``"3+4="`` -> ``"#### 7"``), ``copy_6.jsonl`` and
``copy_12.jsonl`` (six or twelve letters from ``a-f``), 256 rows each; and their reward."""

from pathlib import Path

TOY_DATA = Path(__file__).resolve().parent / "data"
# partial credit (a learning signal in every group from the first iteration): with a binary reward
# most groups of a random model score all 0, their gradients are ~0, and Adam turns the summation-order
# noise of ~0 gradients into parameter differences that identity tests across DP sizes would see
TOY_REWARD = "slurm_rl.toy.rewards:partial_match"
# reward.workers of the cpu test runs whose subject is not the reward pool: 0, scored in the rank's own
# process (two spawned interpreters per rollout rank cost ~0.2 s of CPU each, ~80 s over the suite). The pool
# in a run stays covered where it is the subject: the Slurm runs (stop signals to every process of the job
# step), reward placement, the user-reward runs and the examples; tests/test_rewards.py tests the pool itself.
TOY_REWARD_WORKERS = 0
