"""Checkpoint, stop and resume a whole run (preemption, time limits, requeue, dead ranks).

- :mod:`.checkpoints`: run checkpoints under ``RUN_DIR/checkpoints/iter-NNNNNN`` (atomic, with a
  manifest of checksums; the last ``runtime.keep_checkpoints`` are kept);
- :mod:`.stop`: the stop request a signal (USR1, USR2, SIGTERM) or ``slurm-rl stop`` leaves for the
  coordinator, which checkpoints at the next iteration gate and stops the run;
- :mod:`.restart`: turn a stopped or failed RUN_DIR into one a new incarnation resumes.
"""
