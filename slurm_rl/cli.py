"""The ``slurm-rl`` command line: run, stop, mux, submit, prepare, validate, inspect, export, simulate.

Exit codes: 0 done; 2 bad config or arguments (a message naming the key, the value and what is
allowed; nothing launched); 1 any other failure (its message, no traceback); 3 a run stopped at a
gate with a checkpoint. ``--debug`` (or ``SLURM_RL_DEBUG=1``) prints the traceback of a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_STOPPED = 3  # the run stopped at a gate with a checkpoint (preemption, time limit, slurm-rl stop): resumable
DEBUG_ENV = "SLURM_RL_DEBUG"  # =1: like --debug
DISTRIBUTION = "slurm_rl"  # pyproject.toml's [project] name

DESCRIPTION = ("slurm-rl: RL post-training of LLMs inside one Slurm allocation\n"
               "(placement epochs on shared storage, Arrow handoff between components, in-place resharding).")
EPILOG = f"""\
exit codes: 0 done; 2 bad config or arguments (nothing launched); 1 any other failure; 141 stdout closed early;
3 a run stopped at a gate with a checkpoint (resume it with: slurm-rl run --resume RUN_DIR).
--debug (or {DEBUG_ENV}=1) prints the traceback of a failure.
'slurm-rl COMMAND --help' shows a command's arguments and their defaults."""


def version() -> str:
    """The installed distribution's version (``unknown`` when slurm_rl is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every optional option's help ends with its default: '(default: X)', 'off' for a flag; help
    that already says its default, and a required option's, is left as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.default is argparse.SUPPRESS or "default" in text or action.required
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        if action.nargs == 0:  # store_true / store_false
            return f"{text} (default: {'on' if action.default else 'off'})"
        return f"{text} (default: %(default)s)"


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config file (ours, verl's or RLinf's; 'verl': verl's default config)")
    p.add_argument("overrides", nargs="*", help="key=value overrides (ours, or Hydra-style in the config's dialect: "
                   "+key=value, ++key=value), e.g. train.num_iterations=2")


def _slurm_args(p: argparse.ArgumentParser) -> None:
    """submit's Slurm options (see slurm_rl.launch.submit.SlurmOptions)."""
    g = p.add_argument_group("Slurm options (--executor slurm; written as #SBATCH lines by submitit)")
    g.add_argument("--partition", default=None, metavar="NAME",
                   help="Slurm partition, e.g. gpu (default: the cluster's default partition)")
    g.add_argument("--account", default=None, metavar="NAME",
                   help="account to charge (default: your default account)")
    g.add_argument("--qos", default=None, metavar="NAME", help="quality of service (default: the cluster's default)")
    g.add_argument("--time", default=None, metavar="LIMIT",
                   help="time limit: minutes (90) or Slurm's forms (1:30:00, 2-12, 2-12:30:00); also the "
                        "local executor's timeout (default: runtime.run_timeout_s, null: 4 h, + runtime.checkpoint_margin_s "
                        "+ 1 minute; with --group "
                        "group.timeout_s + 1 minute)")
    g.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="nodes; must equal the config's cluster.num_nodes, 1 with --group "
                        "(default: cluster.num_nodes)")
    g.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                   help="accelerator slots per node; fills in cluster.gpus_per_node where the config leaves it "
                        "to the allocation, must equal it otherwise; asks for G GPUs per node (gres gpu:G) "
                        "unless runtime.device is cpu or emulated (default: cluster.gpus_per_node; GPUs "
                        "requested only for runtime.device cuda)")
    g.add_argument("--constraint", default=None, metavar="FEATURES",
                   help="node features, e.g. 'a100|h100' (default: none)")
    g.add_argument("--exclusive", action="store_true", help="whole nodes, shared with no other job")
    g.add_argument("--slurm", action="append", default=None, metavar="KEY=VALUE",
                   help="any other sbatch option, repeatable: --slurm mem=200G --slurm reservation=rl "
                        "(KEY= with no value: a bare flag) (default: none)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurm-rl", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"slurm-rl {version()}")
    parser.add_argument("--debug", action="store_true",
                        help=f"print the traceback of a failure (or {DEBUG_ENV}=1) (default: off)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")

    def command(name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, formatter_class=_Formatter, **kwargs)

    p = command("run", "train locally: one process per rank on this machine (no Slurm)")
    p.add_argument("config", nargs="?", help="YAML config file (ours, verl's or RLinf's; 'verl': verl's default "
                   "config) (with --resume: none, only overrides)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.num_iterations=2")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", default=None,
                   help="go on with the run in RUN_DIR from its newest checkpoint (overrides may change the "
                        "placement) (default: a new run)")
    p.add_argument("--no-inspect", action="store_true", help="do not print the epoch log at the end")

    p = command("stop", "ask a running run to checkpoint at its next iteration gate and stop")
    p.add_argument("run_dir", type=Path, help="RUN_DIR of the running run")
    p.add_argument("--no-checkpoint", action="store_true", help="stop at the next gate without a checkpoint")
    p.add_argument("--at-iteration", type=int, default=None, metavar="N",
                   help="stop at the gate of iteration N (or the first gate after it) (default: the next gate)")

    p = command("mux", "run a co-execution group (several jobs sharing GPU pools) on this machine; "
                "`mux add|remove|place` change running groups (`slurm-rl mux add --help`)")
    p.add_argument("group", help="group YAML file (group: + jobs:)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the group file, e.g. group.tail_fraction=1")
    p.add_argument("--prepare-only", action="store_true",
                   help="validate and create the group dir, print it, launch nothing (sbatch/mux.sh)")

    p = command("submit", "submit a run (or, with --group, a co-execution group) with submitit")
    _config_args(p)
    p.add_argument("--executor", default="slurm", choices=["slurm", "local"],
                   help="slurm: an sbatch job; local: submitit's local executor on this machine")
    p.add_argument("--wait", action="store_true", help="wait for the job and print the epoch log")
    p.add_argument("--group", action="store_true", help="CONFIG is a group file: submit a co-execution group")
    _slurm_args(p)

    p = command("prepare", "validate, create the run dir, write config.yaml; print the run dir")
    _config_args(p)

    p = command("validate", "check a config (or a group file) and print the resolved placement")
    p.add_argument("config", help="YAML config file (ours, verl's or RLinf's; 'verl': verl's default config), or a "
                   "group file (a file with group: and jobs:)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.num_iterations=2")
    p.add_argument("--json", action="store_true", help="print the resolved placement (or group) as JSON")

    p = command("inspect", "a run on one screen, its placement timeline; --follow, --compare")
    p.add_argument("run_dir", type=Path, nargs="+", help="RUN_DIR (or GROUP_DIR); with --compare: RUN_A RUN_B")
    p.add_argument("--json", action="store_true", help="print the full data as JSON")
    p.add_argument("--all", action="store_true", help="every epoch row instead of collapsing repeated iterations")
    p.add_argument("--follow", action="store_true", help="refresh the view from the files until the run ends")
    p.add_argument("--interval", type=float, default=2.0, help="--follow: seconds between refreshes")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="--follow: give up after this many seconds")
    p.add_argument("--compare", action="store_true", help="two runs side by side (e.g. static vs auto)")
    p.add_argument("--png", type=Path, default=None,
                   help="--compare: where to write the plot (default: RUN_B/compare-<RUN_A name>.png)")
    p.add_argument("--iterations", default=None, metavar="A:B",
                   help="only iterations A to B-1 (like a Python slice: A:, :B; --iterations=-20: the last 20): "
                        "the summary, the epochs, the reward curve and the PNGs (default: all)")

    p = command("export", "write a run's trained actor as a Hugging Face directory")
    p.add_argument("run_dir", type=Path, help="RUN_DIR of a run")
    p.add_argument("--checkpoint", default="final", help="final or iter-N (a run checkpoint)")
    p.add_argument("--to", type=Path, required=True, metavar="DIR", help="new directory to write (required)")

    p = command("simulate", "run the scheduling policies on a discrete-event model of the cluster")
    p.add_argument("config", nargs="?", help="YAML config file (not with --calibrate)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.num_iterations=2")
    p.add_argument("--gpus", type=int, default=None,
                   help="simulate this many GPUs instead of the config's (default: the config's)")
    p.add_argument("--policy", default=None,
                   help="static | auto | plan, options joined by '+'; collocated[+offload]: every GPU time-slices "
                        "rollout, inference and training (default: from the config)")
    p.add_argument("--compare-modes", action="store_true",
                   help="the config against the disaggregated policies and co-location on the same GPUs, and the "
                        "fastest (default: off)")
    p.add_argument("--calibrate", type=Path, default=None, metavar="RUN_DIR",
                   help="fit the cost model to a live run's files and compare the simulation with it (default: off)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    for p in sub.choices.values():  # --debug after the command too (SUPPRESS: keeps a --debug given before it)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _translated(args: argparse.Namespace) -> Any:
    """A verl or RLinf CONFIG (and overrides in its dialect) translated into ours: ``args.config`` and
    ``args.overrides`` replaced by what ``load_config`` reads; the translation (None for one of ours)."""
    from slurm_rl.dialects.core import resolve_config

    args.source_config = args.config
    args.config, args.overrides, translation = resolve_config(args.config, args.overrides)
    return translation


def _warn(cfg: Any, translation: Any) -> list[str]:
    """The warnings of a config (keys with no effect here) and of its translation, printed to stderr."""
    from slurm_rl.config_warnings import config_warnings

    warnings = [*(translation.warnings if translation is not None else []), *config_warnings(cfg)]
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    return warnings


def _bad(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def is_group_file(path: str | Path) -> bool:
    """Whether ``path`` is a group file: a YAML mapping with a ``group`` section (run configs have
    none; ``load_group`` then names a missing ``jobs``). An unreadable or broken file is not one
    (loading it as a config names the problem)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "group" in doc


def cmd_validate_group(args: argparse.Namespace) -> int:
    """Validate a group file as ``slurm-rl mux`` would (every job config, pools, admission:
    SLO and residency); create nothing."""
    from slurm_rl.config import ConfigError
    from slurm_rl.mux.group_file import load_group
    from slurm_rl.inspect.epoch_log import compress_ranks
    from slurm_rl.mux.group_admission import admit

    spec = load_group(args.config, args.overrides)
    issues, figures = admit(spec, spec.host_memory_gb, spec.gpus_per_node)
    if issues:
        raise ConfigError(issues)
    doc = {**spec.to_json(), "admission": figures}
    if args.json:
        print(json.dumps(doc))
        return EXIT_OK
    pools = ", ".join(f"{p} pool slots {compress_ranks(list(s))}" for p, s in spec.pools.items())
    print(f"group {args.config}: valid; {len(spec.jobs)} jobs on {len(spec.slots)} slots ({pools}); "
          f"group dir {spec.dir}")
    slowdown = figures.get("predicted_slowdown", {})
    for job in spec.jobs:
        cfg = job.cfg
        predicted = ""
        if slowdown:
            predicted = (f", predicted {slowdown['expected_lengths'][job.name]:.2f}x "
                         f"({slowdown['max_lengths'][job.name]:.2f}x at max lengths)")
        print(f"  job {job.name:<12} ({Path(job.config_path).name}) {cfg.placement.world_size} ranks (rollout slots "
              f"{compress_ranks(list(job.slots('rollout')))}, train slots {compress_ranks(list(job.slots('train')))}), "
              f"{cfg.train.num_iterations} iterations, device {cfg.runtime.device}, SLO {job.slo:g}x{predicted}")
    if not figures.get("slo_checked"):
        print("  SLO: not checked (jobs on real engines have no calibrated phase times)")
    if spec.host_memory_gb is None:
        print("  residency: not checked (group.host_memory_gb is not set)")
    else:
        parked = ", ".join(f"node {n} {gb:g} GB" for n, gb in figures.get("parked_gb_per_node", {}).items())
        print(f"  residency: parked state per node {parked} (limit group.host_memory_gb={spec.host_memory_gb:g})")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from slurm_rl.config import actor_precision, actor_tp_choices, critic_tp, load_config
    from slurm_rl.inputs import check_inputs, model_summary

    if is_group_file(args.config):
        return cmd_validate_group(args)
    from omegaconf import OmegaConf

    from slurm_rl.config_warnings import config_warnings
    from slurm_rl.rl.advantages import needs_critic

    translation = _translated(args)
    cfg = load_config(args.config, args.overrides)
    check_inputs(cfg)
    warnings = [*(translation.warnings if translation is not None else []), *config_warnings(cfg)]
    doc = cfg.placement.to_json()
    actor = {"tensor_parallel": cfg.actor.tensor_parallel, "tensor_parallel_choices": list(actor_tp_choices(cfg)),
             "precision": actor_precision(cfg), "recompute": cfg.actor.recompute}
    written = cfg.raw["runtime"]["device"]
    run = {"device": cfg.runtime.device, "device_setting": written, "policy": cfg.scheduler.policy,
           "auto_scheduler": cfg.cluster.auto_scheduler, "model": model_summary(cfg), "mode": cfg.placement.mode,
           "critic": needs_critic(cfg.algorithm)}
    from slurm_rl.job_limits import run_limit

    limit = run_limit(cfg.runtime.run_timeout_s, cfg.runtime.checkpoint_margin_s)
    run["run_timeout"] = {"seconds": round(limit.timeout_s, 1), "deadline": limit.deadline, "source": limit.source}
    run["rollout"] = _rollout_summary(cfg)
    if cfg.scheduler.policy == "plan":  # may plan run an iteration collocated?
        from slurm_rl.inputs import time_slicing_off_because

        off = time_slicing_off_because(cfg)
        run["time_slicing"] = {"on": not off, "off_because": off}
    if args.json:
        print(json.dumps({**doc, **run, "actor": actor, "warnings": warnings,
                          "translation": translation.to_json() if translation is not None else None,
                          "config": OmegaConf.to_container(cfg.raw, resolve=True)}, default=str))
        return EXIT_OK
    model = run["model"]
    if translation is not None:
        print(f"{translation.dialect} config {args.source_config}, translated (foreign key = value -> our key = value):")
        for row in translation.rows:
            print(f"  {row.text()}")
    for line in warnings:
        print(f"warning: {line}")
    print(f"config {args.source_config}: valid; world size {doc['world_size']} on {cfg.placement.num_slots} slots")
    print(f"  device {run['device']}" + (f" (runtime.device {written}: resolved on this host; each rank resolves it)"
                                         if written == "auto" else "")
          + f"; scheduling {run['policy']} (cluster.auto_scheduler {str(run['auto_scheduler']).lower()})")
    print(f"  model: {model['architecture']}, {model['parameters'] / 1e6:.2f}M parameters ({model['source']})")
    from slurm_rl.inspect.epoch_log import compress_ranks

    for name, comp in doc["components"].items():
        print(f"  {name:<10} ranks {compress_ranks(comp['ranks']):<12} slots {compress_ranks(comp['slots'])}")
    own_critic = list(cfg.placement.critic_ranks)
    if run["critic"] and own_critic:
        print(f"  {'critic':<10} ranks {compress_ranks(own_critic):<12} of its own, TP {critic_tp(cfg)} "
              "(PPO: algorithm.adv_estimator gae; idle in every epoch, they train the critic on the actor's mini-batches)")
    elif run["critic"]:
        print(f"  {'critic':<10} on the actor's ranks (PPO: algorithm.adv_estimator gae; it moves with the actor)")
    if cfg.placement.reward_ranks:
        print(f"  {'reward':<10} ranks {compress_ranks(list(cfg.placement.reward_ranks)):<12} apart from the rollout "
              "(their worker processes score every response, between the rollout and the inference)")
    print(f"  mode: {run['mode']}" + ("" if run["mode"] == "disaggregated" else
                                      " (shared ranks time-slice their components: rollout, inference, then training)"))
    if "time_slicing" in run:
        ts = run["time_slicing"]
        print("  time slicing: " + ("plan may run an iteration collocated (every component on every rank) where its "
                                    "measured iterations say it is faster; the first one runs so (epoch 0)"
                                    if ts["on"] else
                                    "off (" + "; ".join(ts["off_because"]) + "): every iteration disaggregated"))
    for roles, ranks in cfg.placement.ranks_by_roles().items():
        critic = [r for r in ranks if r in own_critic]
        if critic:
            print(f"    ranks {compress_ranks(critic):<12} critic")
        if len(critic) < len(ranks):
            print(f"    ranks {compress_ranks([r for r in ranks if r not in own_critic]):<12} {', '.join(roles) or 'idle'}")
    if run["device"] == "cuda" and run["mode"] != "disaggregated":
        from slurm_rl.memory_fit import phase_memory

        fits = phase_memory(cfg, model["parameters"])
        for pm in fits:
            print(f"    ranks {compress_ranks(list(pm.ranks)):<12} memory at least: {pm.describe()}")
        if not fits:
            print("    memory per GPU: not checked (no GPU visible here: set runtime.gpu_memory_gb)")
    ro = run["rollout"]
    print(f"  rollout: {ro['backend']}, {ro['engines']} engine(s) of TP {ro['tensor_model_parallel_size']} "
          f"({ro['ranks_per_engine']} rank(s) each)" + "".join(f", {k} {v}" for k, v in ro.get("vllm", {}).items()))
    print(f"  run time limit: {limit.describe()}")
    choices = actor["tensor_parallel_choices"]
    also = f" (choices {', '.join(map(str, choices))})" if len(choices) > 1 else ""
    print(f"  actor: tensor_parallel {actor['tensor_parallel']}{also}, precision {actor['precision']}"
          f"{' (auto)' if cfg.actor.precision == 'auto' else ''}, recompute {actor['recompute']}")
    return EXIT_OK


def _rollout_summary(cfg: Any) -> dict[str, Any]:
    """The rollout engines as the run builds them: TP size, ranks per engine and, for vLLM, its options
    on the resolved device."""
    from slurm_rl.config import actor_precision
    from slurm_rl.rollout_config import engine_tp, processes_per_engine, resolve_engine_options

    placement = cfg.placement
    ranks = len(placement.components["rollout"].ranks) if "rollout" in placement.components else 0
    per = processes_per_engine(cfg.rollout, placement, cfg.scheduler.rollout_ranks_per_instance)
    out: dict[str, Any] = {"backend": cfg.rollout.backend, "tensor_model_parallel_size": engine_tp(
        cfg.rollout, placement, cfg.scheduler.rollout_ranks_per_instance), "ranks_per_engine": per,
        "engines": ranks // per}
    if cfg.rollout.backend == "vllm" and cfg.runtime.device in ("cpu", "cuda"):
        from slurm_rl.inputs import model_context

        out["vllm"] = resolve_engine_options(cfg.rollout, cfg.runtime.device, actor_precision(cfg),
                                             cfg.data.max_prompt_length, model_context(cfg))
    return out


def cmd_export(args: argparse.Namespace) -> int:
    """Write a run's actor checkpoint as a Hugging Face directory."""
    from slurm_rl.export import export_run

    figures = export_run(args.run_dir, args.to, args.checkpoint)
    print(f"exported {figures['checkpoint']} ({figures['architecture']}, {figures['bytes'] / 1e6:.1f} MB) "
          f"to {figures['to']} in {figures['seconds']:.1f}s")
    return EXIT_OK


def cmd_prepare(args: argparse.Namespace) -> int:
    """Create the run dir (sbatch/train.sh); a requeued job gets its previous incarnation's,
    made ready to resume."""
    import os

    from slurm_rl.launch.prepare import prepare_run
    from slurm_rl.resume.restart import prepare_resume, previous_incarnation, record_job

    env = dict(os.environ)
    translation = _translated(args)
    previous = previous_incarnation(args.config, args.overrides, env)
    if previous is not None:
        _, run_dir, _ = prepare_resume(previous, log=lambda m: print(m, file=sys.stderr, flush=True))
    else:
        cfg, run_dir = prepare_run(args.config, args.overrides, check_allocation=True)
        _warn(cfg, translation)
    if env.get("SLURM_JOB_ID"):
        record_job(run_dir, env["SLURM_JOB_ID"])
    print(run_dir)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from slurm_rl.launch.local import LaunchError, run_local
    from slurm_rl.job_limits import run_limit
    from slurm_rl.launch.prepare import prepare_run

    if args.resume is not None:
        from slurm_rl.resume.restart import prepare_resume

        overrides = [*([args.config] if args.config else []), *args.overrides]
        cfg, run_dir, point = prepare_resume(args.resume, overrides, log=lambda m: print(m, flush=True))
    elif args.config is None:
        return _bad("config: got nothing; allowed: a YAML config file, or --resume RUN_DIR")
    else:
        translation = _translated(args)
        cfg, run_dir = prepare_run(args.config, args.overrides)
        _warn(cfg, translation)
    print(f"run dir: {run_dir}", flush=True)
    print(f"starting {cfg.placement.world_size} ranks locally (device {cfg.runtime.device})", flush=True)
    from slurm_rl.inspect.commands import next_steps
    from slurm_rl.inspect.live import ProgressPrinter

    try:
        with ProgressPrinter(run_dir, cfg.placement.world_size, cfg.train.num_iterations):
            result = run_local(run_dir, cfg.placement.world_size, timeout_s=run_limit(
                cfg.runtime.run_timeout_s, cfg.runtime.checkpoint_margin_s).timeout_s + 2 * cfg.runtime.checkpoint_margin_s)
    except LaunchError as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        print(next_steps(run_dir, ok=False), flush=True)
        print(f"resume from the last checkpoint with: slurm-rl run --resume {run_dir}", file=sys.stderr)
        return EXIT_FAILED
    from slurm_rl.control.paths import RunPaths
    from slurm_rl.control.status import read_coordinator_status

    status = read_coordinator_status(RunPaths(run_dir))
    if status is not None and status.state == "stopped":
        print(f"run stopped at the gate of iteration {status.stopped_at_iteration} after {result.seconds:.1f}s "
              f"({(status.stop or {}).get('reason')}); checkpoint {status.checkpoint}\n"
              f"resume with: slurm-rl run --resume {run_dir}", flush=True)
        return EXIT_STOPPED
    print(f"run finished in {result.seconds:.1f}s", flush=True)
    if not args.no_inspect:
        cmd_inspect(argparse.Namespace(run_dir=run_dir, json=False))
        print("")
    print(next_steps(run_dir, ok=True), flush=True)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from slurm_rl.resume.stop import read_stop, request_stop

    if not (args.run_dir / "control").is_dir():
        return _bad(f"run_dir: got {str(args.run_dir)!r}; allowed: a run directory holding control/")
    if args.at_iteration is not None and args.at_iteration < 0:
        return _bad(f"--at-iteration: got {args.at_iteration}; allowed: an iteration number >= 0")
    if request_stop(args.run_dir, "slurm-rl stop", checkpoint=not args.no_checkpoint, at_iteration=args.at_iteration):
        where = "its next iteration gate" if args.at_iteration is None else f"the gate of iteration {args.at_iteration}"
        print(f"stop requested: {args.run_dir} stops at {where}"
              + (" after a checkpoint" if not args.no_checkpoint else ""))
    else:
        print(f"a stop was already requested: {read_stop(args.run_dir)}")
    return EXIT_OK


def cmd_mux(args: argparse.Namespace) -> int:
    from slurm_rl.launch.local import LaunchError
    from slurm_rl.mux.launcher import prepare_group, run_group_local

    if args.prepare_only:  # sbatch/mux.sh: a requeued job resumes its previous incarnation's group
        from slurm_rl.mux.group_file import load_group
        from slurm_rl.mux.group_requeue import previous_group, resume_group
        from slurm_rl.resume.restart import record_job

        previous = previous_group(load_group(args.group, args.overrides).dir, dict(os.environ))
        if previous is not None:
            resumed = resume_group(previous, log=lambda m: print(m, file=sys.stderr, flush=True))
            print(f"slurm_rl: resuming group {previous}: members {resumed}", file=sys.stderr, flush=True)
            group_dir = previous
        else:
            group_dir = prepare_group(args.group, args.overrides).dir
        if os.environ.get("SLURM_JOB_ID"):
            record_job(group_dir, os.environ["SLURM_JOB_ID"])
        print(group_dir)
        return EXIT_OK
    spec = prepare_group(args.group, args.overrides)
    print(f"group dir: {spec.dir}", flush=True)
    for job in spec.jobs:
        print(f"  job {job.name}: {job.cfg.placement.world_size} ranks (rollout slots {list(job.slots('rollout'))}, "
              f"train slots {list(job.slots('train'))}), SLO {job.slo:g}x", flush=True)
    try:
        result = run_group_local(spec.dir, log=lambda m: print(m, flush=True))
    except LaunchError as exc:
        print(f"group failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"group finished in {result.seconds:.1f}s: " + ", ".join(f"{j} {v.split(':')[0]}" for j, v in result.jobs.items()))
    print(f"inspect: slurm-rl inspect {spec.dir}")
    return EXIT_OK if result.ok else EXIT_FAILED


def _mux_verbs() -> dict[str, tuple[argparse.ArgumentParser, Any]]:
    """``slurm-rl mux add|remove|place``: each verb's parser and command (parsed apart from the
    ``mux GROUP.yaml`` command, whose first argument is a file)."""
    from slurm_rl.mux.placer_cli import add_place_parser

    verbs = argparse.ArgumentParser(prog="slurm-rl mux").add_subparsers(dest="command")

    def command(name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser:
        return verbs.add_parser(name, prog=f"slurm-rl mux {name}", help=text, description=text,
                                formatter_class=_Formatter, **kwargs)

    p = command("add", "ask a running group to take a job (admission as for a declared "
                "group; refused: exit 2 with the reason)")
    p.add_argument("group_dir", type=Path, help="GROUP_DIR of the running group")
    p.add_argument("name", help="the job's name in the group (lower-case letters, digits, '_', '-')")
    p.add_argument("config", help="the job's run config (YAML)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the job's config")
    p.add_argument("--slo", type=float, default=None, help="tolerated slowdown versus running alone (default: 2.0)")
    p.add_argument("--max-response-length", type=int, default=None, metavar="N",
                   help="the conservative profile's response length (default: emulated.response_len_max)")
    p.add_argument("--dry-run", action="store_true", help="admit or refuse, print the figures, change nothing")
    p.add_argument("--json", action="store_true", help="print the admission figures as JSON")

    p = command("remove", "a job leaves a running group (it checkpoints at its next "
                "gate and its ranks exit, freeing what they parked)")
    p.add_argument("group_dir", type=Path, help="GROUP_DIR of the running group")
    p.add_argument("name", help="the member to remove")
    p.add_argument("--reason", default="removed from the group", help="recorded with the leave")

    add_place_parser(verbs, name="place", formatter=_Formatter)
    return {name: (parser, {"add": cmd_mux_add, "remove": cmd_mux_remove, "place": cmd_mux_place}[name])
            for name, parser in verbs.choices.items()}


def cmd_mux_add(args: argparse.Namespace) -> int:
    from slurm_rl.mux.membership import add_job

    figures = add_job(args.group_dir, args.name, args.config, args.overrides, slo=args.slo,
                      max_response_length=args.max_response_length, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(figures, indent=1, default=str))
    else:
        verb = "would admit" if args.dry_run else "admitted"
        slow = figures.get("predicted_slowdown", {})
        print(f"{verb} job {args.name} into {args.group_dir}: members {figures['members']}")
        for kind, per in slow.items():
            print(f"  predicted slowdown ({kind}): " + ", ".join(f"{j} {v:.2f}x" for j, v in per.items()))
        if not figures.get("slo_checked"):
            print("  SLO not checked: real engines have no calibrated phase times (residency checked)")
        if not args.dry_run:
            print(f"  it enters the rotation at the next meta-iteration (membership record {figures['record']})")
    return EXIT_OK


def cmd_mux_remove(args: argparse.Namespace) -> int:
    from slurm_rl.mux.membership import remove_job

    number = remove_job(args.group_dir, args.name, args.reason)
    print(f"job {args.name} leaves {args.group_dir} at its next gate (membership record {number})")
    return EXIT_OK


def cmd_mux_place(args: argparse.Namespace) -> int:
    from slurm_rl.mux.placer_cli import cmd_mux_place as place

    return place(args)


def cmd_submit(args: argparse.Namespace) -> int:
    from slurm_rl.launch.submit import SlurmOptions, submit

    options = SlurmOptions.from_cli(partition=args.partition, account=args.account, qos=args.qos, time=args.time,
                                    nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                    constraint=args.constraint, exclusive=args.exclusive, slurm=args.slurm)
    if args.group:
        from slurm_rl.mux.launcher import submit_group

        job = submit_group(args.config, args.overrides, executor=args.executor, options=options)
        if args.wait:
            print(job.results()[0] if isinstance(job.results(), list) else job.results())
        return EXIT_OK

    translation = _translated(args)
    if translation is not None:
        for line in translation.warnings:
            print(f"warning: {line}", file=sys.stderr, flush=True)
    job = submit(args.config, args.overrides, executor=args.executor, options=options)
    if args.wait:
        job.results()
        run_dir = Path(job.submission().args[0])
        return cmd_inspect(argparse.Namespace(run_dir=run_dir, json=False))
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from slurm_rl.inspect import commands

    dirs = args.run_dir if isinstance(args.run_dir, list) else [args.run_dir]
    if getattr(args, "compare", False):
        if len(dirs) != 2:
            return _bad(f"inspect --compare: got {len(dirs)} run dirs; allowed: exactly two (RUN_A RUN_B)")
        for d in dirs:
            if not (d / "control").is_dir():
                return _bad(f"run_dir: got {str(d)!r}; allowed: a run directory holding control/epochs")
        return commands.compare_runs(dirs[0], dirs[1], as_json=args.json, png=args.png)
    if len(dirs) != 1:
        return _bad(f"inspect: got {len(dirs)} run dirs; allowed: one (two with --compare)")
    args.run_dir = dirs[0]
    from slurm_rl.mux.cluster_view import cluster_report, cluster_report_json, is_cluster_dir

    if is_cluster_dir(args.run_dir):  # groups placed by `slurm-rl mux place`: the groups and every decision
        print(json.dumps(cluster_report_json(args.run_dir), indent=1) if args.json else cluster_report(args.run_dir))
        return EXIT_OK
    from slurm_rl.mux.group_state import group_json_path

    if group_json_path(args.run_dir).is_file():  # a co-execution group: its timeline
        from slurm_rl.inspect.group_timeline import format_group_report, group_report_json, write_group_gantt

        if args.json:
            print(json.dumps(group_report_json(args.run_dir), indent=1))
            return EXIT_OK
        print(format_group_report(args.run_dir))
        print(f"timeline: {write_group_gantt(args.run_dir)}; each job: slurm-rl inspect {args.run_dir}/jobs/<name>")
        return EXIT_OK
    if not (args.run_dir / "control").is_dir():
        return _bad(f"run_dir: got {str(args.run_dir)!r}; allowed: a run directory holding control/epochs")
    if getattr(args, "follow", False):
        if args.interval <= 0 or args.timeout <= 0:
            return _bad(f"inspect --follow: got --interval {args.interval} --timeout {args.timeout}; allowed: > 0")
        return commands.follow(args.run_dir, interval_s=args.interval, timeout_s=args.timeout)
    return commands.inspect_run(args.run_dir, as_json=args.json, all_epochs=getattr(args, "all", False),
                                iterations=getattr(args, "iterations", None))


def cmd_simulate(args: argparse.Namespace) -> int:
    from slurm_rl.config import load_config
    from slurm_rl.scheduler.cli_bridge import run_simulation

    if args.calibrate is not None:
        from slurm_rl.scheduler.calibrate import CalibrationError, calibrate

        if args.config is not None:
            return _bad("simulate --calibrate RUN_DIR takes no config (the run's own config.yaml is used)")
        try:
            print(json.dumps(calibrate(args.calibrate), indent=1))
        except CalibrationError as exc:
            return _bad(str(exc))
        return EXIT_OK
    if args.config is None:
        return _bad("simulate: a config file, or --calibrate RUN_DIR")
    # the simulator is the cost model: the config is read as the emulated device's (no model, data or reward needed)
    cfg = load_config(args.config, [*args.overrides, "runtime.device=emulated"])
    if args.compare_modes and args.policy is not None:
        return _bad("simulate: --compare-modes runs every policy; leave out --policy")
    return run_simulation(cfg, gpus=args.gpus, policy=args.policy, as_json=args.json, compare=args.compare_modes)


COMMANDS = {
    "run": cmd_run,
    "stop": cmd_stop,
    "mux": cmd_mux,
    "submit": cmd_submit,
    "prepare": cmd_prepare,
    "export": cmd_export,
    "validate": cmd_validate,
    "inspect": cmd_inspect,
    "simulate": cmd_simulate,
}


def _debug(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") == "1"


MUX_VERBS = ("add", "remove", "place")


EXIT_BROKEN_PIPE = 128 + 13  # a shell's code for a command ended by SIGPIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush at exit raises nothing more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code (see the module docstring)."""
    from slurm_rl.config import ConfigError
    from slurm_rl.errors import InputError, SlurmRLError

    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if (first is not None and set(argv[:first]) <= {"--debug"} and argv[first] == "mux"
            and argv[first + 1:first + 2] and argv[first + 1] in MUX_VERBS):
        verb_parser, run = _mux_verbs()[argv[first + 1]]
        args = verb_parser.parse_args(argv[first + 2:])
        args.debug = "--debug" in argv[:first]
    else:
        args = _parser().parse_args(argv)
        run = COMMANDS[args.command]
    try:
        code = run(args)
        sys.stdout.flush()  # inside the try: a reader gone before the last flush is a broken pipe too
        return code
    except BrokenPipeError:  # stdout's reader left (`slurm-rl validate ... | head`): end quietly, as `cat` does
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if _debug(args):
            traceback.print_exc()
        if isinstance(exc, ConfigError):
            print(f"invalid config:\n{exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if isinstance(exc, (InputError, FileNotFoundError, FileExistsError)):
            return _bad(str(exc))
        if isinstance(exc, SlurmRLError):
            print(f"error: {exc}", file=sys.stderr)
        else:  # not one of ours: name its type, which says more than the message alone
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            if not _debug(args):
                print(f"(slurm-rl --debug or {DEBUG_ENV}=1 prints the traceback)", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
