"""Every default of the scheduler, documented in one place (the values are the config's own,
``slurm_rl.config``, the bottom layer; this module re-exports them).

RLinf's own code disagrees with itself about some of these (``use_wait_before_last_iter_policy``
defaults to ``True`` in its managers but ``False`` in its documented example); ours are set here
once, and ``PolicyConfig`` / the simulator read them from here.

Policy
    POLICIES                        names of the scheduling policies (``scheduler.policy``).
    POLICY                          ``static``: the disaggregated baseline; nothing moves unless asked.
    MAX_RUNNING_REQUESTS            concurrent requests one rollout instance decodes (RLinf
                                    ``rollout.max_running_requests``); the auto policy keeps
                                    ``ceil(outstanding / MAX_RUNNING_REQUESTS)`` instances.
    PRE_PROCESS_THRESHOLD           pre-process ends when the outstanding rollout requests fall to
                                    this fraction of the iteration's samples (RLinf: 0.5).
    PRE_PROCESS_MIN_FINISHED        ... and at least this fraction of samples has finished (RLinf: 0.1).
    USE_PRE_PROCESS_POLICY          off: rollout does not borrow the actor's GPUs at iteration start.
    USE_WAIT_BEFORE_LAST_ITER_POLICY off: the actor's last mini-batch does not wait for every GPU.
    RANKS_PER_INSTANCE              GPUs per rollout instance / per actor model replica (TP x PP).

Live coordinator
    LIVE_TICK_S                     seconds between mid-iteration policy calls (each reads every
                                    rank's progress file once).

Simulator
    SWITCH_LATENCY_S                publish-to-applied latency of one placement epoch.
    TICK_S                          simulated seconds between policy calls when nothing happens.
    SEED                            seed of the response-length sampler.
    RESPONSE_LEN_DIST               ``lognormal`` (``pareto`` and ``fixed`` also accepted).
    RESPONSE_LEN_SIGMA              lognormal shape; the mean is ``emulated.response_len_mean``.
    PARETO_ALPHA                    Pareto shape when ``RESPONSE_LEN_DIST == "pareto"``.
    DECODE_FIXED_FRACTION           part of a decode step that does not shrink with the batch
                                    (1: per-request speed independent of the batch).
"""

from __future__ import annotations

from slurm_rl.config import (  # noqa: F401  (re-exported)
    DECODE_FIXED_FRACTION,
    LIVE_TICK_S,
    MAX_RUNNING_REQUESTS,
    PARETO_ALPHA,
    POLICIES,
    POLICY,
    PRE_PROCESS_MIN_FINISHED,
    PRE_PROCESS_THRESHOLD,
    RANKS_PER_INSTANCE,
    RESPONSE_LEN_DIST,
    RESPONSE_LEN_SIGMA,
    SEED,
    SWITCH_LATENCY_S,
    TICK_S,
    USE_PRE_PROCESS_POLICY,
    USE_WAIT_BEFORE_LAST_ITER_POLICY,
)

__all__ = ["DECODE_FIXED_FRACTION", "LIVE_TICK_S", "MAX_RUNNING_REQUESTS", "PARETO_ALPHA", "POLICIES", "POLICY",
           "PRE_PROCESS_MIN_FINISHED", "PRE_PROCESS_THRESHOLD", "RANKS_PER_INSTANCE", "RESPONSE_LEN_DIST",
           "RESPONSE_LEN_SIGMA", "SEED", "SWITCH_LATENCY_S", "TICK_S", "USE_PRE_PROCESS_POLICY",
           "USE_WAIT_BEFORE_LAST_ITER_POLICY"]

#: plan: iterations after which the slower of its two modes (collocated, disaggregated) is tried again
TIME_SLICING_RETRY = 16
#: plan: each mode is judged by the mean of its latest this many measured iterations
TIME_SLICING_WINDOW = 4
#: plan: collocated is chosen over disaggregated only when its last iteration was this fraction faster
TIME_SLICING_MARGIN = 0.02
#: plan: co-location is not tried where its forecast exceeds the disaggregated iterations measured by this fraction
TIME_SLICING_FORECAST_MARGIN = 0.10
