"""Multiplexing several RL jobs on shared pools (co-execution groups): pure policies.

- :mod:`.rotation` — inside a group: which job holds which slot of each pool (round-robin by
  phase, long-tail migration); used by the live group scheduler and by the simulator alike.
"""
