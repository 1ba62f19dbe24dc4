"""``slurm-rl simulate --calibrate RUN_DIR``: fit the simulator's cost model to a live run.

Reads the run's resolved ``config.yaml``, what its coordinator measured (``control/history.json``,
see ``scheduler.history``) and its events (iteration releases, switch latencies), and fits:

* rollout: ``step_s(b) = alpha + beta * b`` per decode step with ``b`` running requests gives
  ``S = alpha + beta * m`` at full load and ``decode_fixed_fraction = alpha / S``, hence
  ``rollout_s_per_token = S * g ** scaling / m`` (``g`` GPUs per instance);
* response lengths: mean, lognormal sigma (from the log-lengths' spread) and the longest seen;
* inference: busy GPU-seconds over the tokens scored (``... / G ** (1 - scaling)``);
* actor: the median over mini-batches of ``seconds * dp ** scaling / tokens`` (resharding ones left
  out; they pay the reshard on top);
* ``scheduler.switch_latency_s``: the median publish-to-acked latency of mid-iteration epochs;
* ``scheduler.iteration_overhead_s``: what the cost model leaves out (gate handshake, weight sync,
  polling and hand-off latencies of the live runtime), fitted last as the median residual per
  iteration between the run and the simulation with the fitted costs (reported separately:
  ``error_costs_only``).

It then simulates the calibrated config under the run's policy and reports the simulated
iteration times next to the live ones (gate to gate). Costs the history cannot fit keep the
configured value (and say so).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from slurm_rl.config import Config, ConfigError, load_config
from slurm_rl.errors import InputError
from slurm_rl.scheduler.forecast import LengthForecast
from slurm_rl.scheduler.history import History, bucket_edges


class CalibrationError(InputError):
    """The run directory lacks what calibration needs."""


def _length_fit(h: History) -> dict[str, float]:
    if sum(h.lengths) <= 0:
        return {}
    total = float(sum(h.lengths))
    logs = []
    for i, c in enumerate(h.lengths):
        if c:
            lo, hi = bucket_edges(i)
            logs.append((c / total, math.log(math.sqrt(lo * hi))))
    mu = sum(w * x for w, x in logs)
    var = sum(w * (x - mu) ** 2 for w, x in logs)
    # a bucket spans 2 ** (1/4): remove its own spread (uniform in log) from the variance
    width = math.log(2) / 4
    sigma = math.sqrt(max(1e-6, var - width ** 2 / 12))
    return {"response_len_mean": LengthForecast.from_hist(h.lengths).mean,
            "response_len_sigma": sigma, "response_len_max": float(h.longest or 0)}


def fit_costs(cfg: Config, h: History, switch_latencies: list[float]) -> tuple[dict[str, Any], list[str]]:
    """Calibrated ``emulated`` / ``scheduler`` values, and the names of those kept as configured."""
    emu = cfg.emulated
    scaling = emu.scaling
    m = cfg.scheduler.max_running_requests
    g = cfg.scheduler.rollout_ranks_per_instance
    out: dict[str, Any] = {}
    kept: list[str] = []
    line = h.decode.line()
    if line is not None and line[1] > 0:
        full = line[0] + line[1] * m
        out["rollout_s_per_token"] = full * g ** scaling / m
        out["decode_fixed_fraction"] = min(1.0, line[0] / full)
    elif line is not None:
        out["rollout_s_per_token"] = line[0] * g ** scaling / m
        kept.append("decode_fixed_fraction")
    else:
        kept += ["rollout_s_per_token", "decode_fixed_fraction"]
    lengths = _length_fit(h)
    if lengths:
        out.update(lengths)
        if not lengths["response_len_max"]:
            out.pop("response_len_max")
            kept.append("response_len_max")
    else:
        kept += ["response_len_mean", "response_len_sigma", "response_len_max"]
    mean_len = float(out.get("response_len_mean", emu.response_len_mean))
    per_sample = mean_len + emu.prompt_len
    inference = cfg.placement.components.get("inference")
    inf_ranks = len(inference.ranks) if inference is not None else 0
    if h.inference[0] > 0 and inf_ranks:
        out["inference_s_per_token"] = (h.inference[1] / (h.inference[0] * per_sample)
                                        / inf_ranks ** (1.0 - scaling))
    else:
        kept.append("inference_s_per_token")
    per_token = [sec * dp ** scaling / tok for dp, sec, tok in h.minibatches if tok > 0 and sec > 0]
    if per_token:
        out["actor_s_per_token"] = statistics.median(per_token)
    else:
        kept.append("actor_s_per_token")
    if switch_latencies:
        out["switch_latency_s"] = statistics.median(switch_latencies)
    else:
        kept.append("switch_latency_s")
    return out, kept


def calibrate(run_dir: Path) -> dict[str, Any]:
    """Fit, simulate and compare (see the module docstring); a JSON-able report."""
    from slurm_rl.control.atomic import read_json
    from slurm_rl.control.events import read_events
    from slurm_rl.control.paths import RunPaths
    from slurm_rl.scheduler.simulate import simulate

    paths = RunPaths(run_dir)
    config_path = Path(run_dir) / "config.yaml"
    if not config_path.is_file():
        raise CalibrationError(f"calibrate: {config_path} does not exist (not a run directory)")
    if not paths.history.is_file():
        raise CalibrationError(f"calibrate: {paths.history} does not exist (the run finished no "
                               "iteration, or predates the coordinator's history)")
    cfg = _load(config_path)
    history = History.from_json(read_json(paths.history))
    decisions = [e for e in read_events(paths, "decision") if e.get("mid_iteration")]
    released = [float(e["released_at"]) for e in read_events(paths, "release")]
    live = [b - a for a, b in zip(released, released[1:])]
    if not live:
        raise CalibrationError("calibrate: the run released fewer than two iterations")
    fitted, kept = fit_costs(cfg, history, [float(e["switch_latency_s"]) for e in decisions])
    # an int-typed key (response_len_max, response_len_mean) takes the fit rounded
    changes = {(f"scheduler.{k}" if k == "switch_latency_s" else f"emulated.{k}"):
               int(round(v)) if isinstance(getattr(cfg.emulated, k, None), int) else v for k, v in fitted.items()}
    changes["train.num_iterations"] = len(live)
    policy = _policy_name(cfg)
    configured = simulate(_load(config_path, {"train.num_iterations": len(live)}), policy=policy)
    costs_only = simulate(_load(config_path, changes), policy=policy)
    # what the cost model leaves out (gate handshake, weight sync, polling and hand-off latencies)
    # is the residual: one number per iteration, the median over the run's iterations
    overhead = max(0.0, statistics.median(a - b.time_s for a, b in zip(live, costs_only.iterations)))
    changes["scheduler.iteration_overhead_s"] = overhead
    fitted["iteration_overhead_s"] = overhead
    sim = simulate(_load(config_path, changes), policy=policy)
    sim_s = [it.time_s for it in sim.iterations]
    return {
        "run_dir": str(run_dir), "policy": policy,
        "fitted": {k: round(v, 9) for k, v in fitted.items()}, "kept_as_configured": kept,
        "configured": {k: getattr(cfg.emulated, k, None) for k in fitted
                       if k not in ("switch_latency_s", "iteration_overhead_s")},
        "live_iteration_s": [round(t, 3) for t in live],
        "simulated_iteration_s": [round(t, 3) for t in sim_s],
        "simulated_uncalibrated_iteration_s": [round(it.time_s, 3) for it in configured.iterations],
        "simulated_costs_only_iteration_s": [round(it.time_s, 3) for it in costs_only.iterations],
        "error_costs_only": round(costs_only.total_time_s / sum(live) - 1, 4),
        "error": round(sum(sim_s) / sum(live) - 1, 4),
        "error_uncalibrated": round(configured.total_time_s / sum(live) - 1, 4),
        "within_10pct": abs(sum(sim_s) / sum(live) - 1) <= 0.10,
    }


def _load(config_path: Path, changes: dict[str, Any] | None = None) -> Config:
    """The run's validated config with ``changes`` (full key -> value) applied as overrides."""
    overrides = [f"{key}={value!r}" for key, value in (changes or {}).items()]
    try:
        return load_config(config_path, overrides, env={})
    except ConfigError as exc:
        raise CalibrationError(f"calibrate: {config_path} with {overrides}: {exc}") from None


def _policy_name(cfg: Config) -> str:
    base = cfg.scheduler.policy
    opts = [name for name, key in (("pre_process", "use_pre_process_policy"),
                                   ("wait_before_last_iter", "use_wait_before_last_iter_policy"))
            if base == "auto" and getattr(cfg.cluster, key)]
    return "+".join([base, *opts])
