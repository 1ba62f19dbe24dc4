"""Admission of a group's members: every member keeps its SLO, parked state fits.

``slurm-rl mux`` refuses a group (exit 2, the key path of the job named) when a member's predicted
slowdown versus running alone exceeds its SLO, or when the working sets parked on a node exceed
``group.host_memory_gb``. Phase times come from the jobs' cost model (``emulated``): the group is
simulated twice with the same rotation the live scheduler runs — once with the jobs' response
length distributions, once conservatively with every response at its maximum length
(``jobs.<name>.max_response_length``, else ``emulated.response_len_max``) — and the larger
slowdown counts. Jobs on real engines (``cpu``/``cuda``) have no calibrated phase times here: their
SLO is not checked (reported as such), residency is. A job joining a running group
(``slurm-rl mux add``) is admitted the same way against the members still in the rotation, and
:func:`measured_check` reports the prediction again with the members' measured phase times.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from slurm_rl.config import ConfigIssue, load_config
from slurm_rl.mux.admission import check_slo
from slurm_rl.mux.group_file import GroupJob, GroupSpec
from slurm_rl.mux.live import profile_of, read_group
from slurm_rl.mux.predict import predict_group

BYTES_TRAIN_RANK = 16  # per parameter: fp32 params, grads, two Adam moments
BYTES_ROLLOUT_RANK = 2  # per parameter: bf16 weights


def model_params(job: GroupJob) -> int:
    """Parameters of the job's model: ``emulated.model_params``, or a GPT estimate from ``model``."""
    cfg = job.cfg
    if cfg.runtime.device == "emulated":
        return int(cfg.emulated.model_params)
    from slurm_rl.config import model_sizes
    from slurm_rl.rl.tokenizer import CharTokenizer

    if cfg.model.path is not None:
        from slurm_rl.engines.hf_checkpoint import model_config_from_dir

        return model_config_from_dir(cfg.model.path).num_parameters()
    m = model_sizes(cfg.model)
    h, layers, vocab = m["hidden_size"], m["num_layers"], m["vocab_size"] or CharTokenizer().vocab_size
    return 12 * layers * h * h + 2 * vocab * h


def parked_bytes_per_node(spec: GroupSpec, gpus_per_node: int) -> dict[int, int]:
    """Host bytes the members park on each node (a slot's node: slot // gpus_per_node)."""
    out: dict[int, int] = {}
    for job in spec.jobs:
        params = model_params(job)
        for pool, slot in job.rank_slots.values():
            per = BYTES_TRAIN_RANK if pool == "train" else BYTES_ROLLOUT_RANK
            out[slot // gpus_per_node] = out.get(slot // gpus_per_node, 0) + params * per
    return out


def _conservative(job: GroupJob) -> Any:
    max_len = job.max_response_length or int(job.cfg.emulated.response_len_max)
    return load_config(job.config_path, [*job.overrides, "emulated.response_len_dist=fixed",
                                         f"emulated.response_len_mean={max_len}", f"emulated.response_len_max={max_len}"])


def admit(spec: GroupSpec, host_memory_gb: float | None, gpus_per_node: int) -> tuple[list[ConfigIssue], dict]:
    """Problems (empty: admitted) and the figures behind the decision."""
    issues: list[ConfigIssue] = []
    figures: dict[str, Any] = {"slo_checked": spec.jobs[0].cfg.runtime.device == "emulated"}
    if host_memory_gb is not None:
        per_node = parked_bytes_per_node(spec, gpus_per_node)
        figures["parked_gb_per_node"] = {n: round(b / 1e9, 3) for n, b in sorted(per_node.items())}
        for node, nbytes in sorted(per_node.items()):
            if nbytes > host_memory_gb * 1e9:
                issues.append(ConfigIssue("group.host_memory_gb", host_memory_gb, (
                    f"at least {nbytes / 1e9:.1f} GB: the jobs park {nbytes / 1e9:.1f} GB on node {node} "
                    f"({', '.join(j.name for j in spec.jobs)}); fewer jobs in this group or more host memory")))
    if not figures["slo_checked"]:
        return issues, figures
    switch = {"rollout": 2 * spec.park_s, "train": 2 * spec.park_s}
    names = [j.name for j in spec.jobs]
    args = (spec.pools["rollout"], spec.pools["train"], spec.tail_fraction, spec.tail_slots, switch)
    expected = predict_group([j.cfg for j in spec.jobs], names, *args, schedule=spec.schedule)
    maxlen = predict_group([_conservative(j) for j in spec.jobs], names, *args, schedule=spec.schedule)
    figures["predicted_slowdown"] = {"expected_lengths": expected["slowdown"], "max_lengths": maxlen["slowdown"]}
    figures["predicted_makespan_s"] = round(expected["makespan_s"], 2)
    for job in spec.jobs:
        worst = max(expected["slowdown"][job.name], maxlen["slowdown"][job.name])
        if worst > job.slo:
            issues.append(ConfigIssue(f"jobs.{job.name}.slo", job.slo, (
                f"at least {worst:.2f}: in this group the job is predicted {expected['slowdown'][job.name]:.2f}x "
                f"slower than alone ({maxlen['slowdown'][job.name]:.2f}x with every response at its maximum "
                f"length); round-robin gives each member one iteration per group cycle — refused rather than "
                f"slowed silently")))
    return issues, figures


def measured_check(group_dir: Path, job: GroupJob) -> dict[str, Any]:
    """The SLO prediction again with the members' measured phase times where the group recorded
    some (:mod:`slurm_rl.mux.live`: each member's profile scaled to its measured rollout and
    training means; the placer decides on these), the newcomer at its own profile.

    Reported, not a refusal: measured in-group phases include the warm switches and the polls
    around them, which the newcomer's profile does not, so on short phases this view is far more
    pessimistic than the group turns out (seen: 5.8x predicted where the cost model said 1.8x and
    the group ran the job at 1.45x)."""
    group = read_group(Path(group_dir), time.time())
    figures: dict[str, Any] = {"member_times": {m.name: m.times for m in group.members}}
    if group.problems or not any(m.times.startswith("measured") for m in group.members):
        return figures
    newcomer = profile_of(job.cfg, job.name, job.slo, group.park_s, group.tail_fraction, job.max_response_length)
    spec = group.model(0)
    slow, bad = check_slo(spec.with_member(newcomer), newcomer, "conservative")
    figures["slowdown_max_lengths"] = {n: round(v, 3) for n, v in slow.items()}
    figures["beyond_slo"] = bad
    return figures
