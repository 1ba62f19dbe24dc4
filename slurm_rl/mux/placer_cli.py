"""``slurm-rl mux place CONFIG --cluster DIR [...]``: the placer's command line (see :mod:`slurm_rl.mux.placer`).

Exit codes: 0 placed (or, with ``--dry-run``, decided); 2 refused (the reason on stderr) or bad
input (the key, the value and what is allowed); 1 a failure after the decision (sbatch, add_job).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def add_place_parser(subparsers: Any, name: str = "mux-place",
                     formatter: type[argparse.HelpFormatter] | None = None) -> argparse.ArgumentParser:
    """Add the ``mux place`` command to ``subparsers`` (``slurm-rl mux place`` maps to ``mux-place``);
    ``formatter``: the command line's help formatter."""
    p = subparsers.add_parser(name, prog="slurm-rl mux place", formatter_class=formatter or argparse.HelpFormatter,
                              help="place a job into the co-execution groups of a cluster dir (join a group, "
                                   "sbatch a new one, co-locate, or refuse: exit 2)",
                              description="Place a job: into a running group that admits it (mux add), a new "
                                          "group of its own (sbatch sbatch/mux.sh) where GPUs are free, "
                                          "co-located (sbatch sbatch/train.sh), or refuse it with the reason.")
    p.add_argument("config", help="the job's run config (YAML)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the job's config")
    p.add_argument("--cluster", type=Path, required=True, metavar="DIR",
                   help="cluster dir: its group dirs, groups/*.yaml and placements.jsonl (required)")
    p.add_argument("--name", default=None, help="the job's name (default: from the config's file name)")
    p.add_argument("--slo", type=float, default=2.0, help="tolerated slowdown versus running alone")
    p.add_argument("--max-response-length", type=int, default=None, metavar="N",
                   help="the conservative profile's response length (default: emulated.response_len_max)")
    p.add_argument("--max-gpus", type=int, default=None, metavar="N",
                   help="GPUs the placer may use in all (default: the partition's, from sinfo)")
    p.add_argument("--host-memory-gb", type=float, default=None, metavar="GB",
                   help="host memory per node of a new group (residency check; default: unchecked)")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="an sbatch option for a new group or co-located run, repeatable: --sbatch=--partition=gpu")
    p.add_argument("--lock-timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for another placer's lock on the cluster dir")
    p.add_argument("--no-colocated", action="store_true",
                   help="never co-locate: join a group, open a new one, or refuse")
    p.add_argument("--dry-run", action="store_true", help="decide and print the figures; change nothing")
    p.add_argument("--json", action="store_true", help="print the decision as JSON")
    return p


def _bad(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def format_placement(p: Any) -> str:
    """The decision and its figures as text."""
    f = p.figures
    head = f"{'would place' if p.dry_run else 'placed'} job {p.job}: {p.kind}"
    if p.kind == "refused":
        head = f"refused job {p.job}"
    elif p.group:
        head += f" {'into' if p.kind == 'direct' else 'as'} {p.group}"
    lines = [head, f"  reason: {p.reason}"]
    if p.predicted and p.predicted.split()[0] != p.kind:
        lines.append(f"  model's first choice: {p.predicted}")
    for fb in p.fallbacks:
        lines.append(f"  not carried out: {fb}")
    if f.get("slowdowns"):
        lines.append("  predicted slowdowns (max-length times): "
                     + ", ".join(f"{j} {v:.2f}x" for j, v in f["slowdowns"].items()))
    if p.kind != "refused":
        lines.append(f"  added cost: {f.get('delta_cost_per_h', 0.0):.1f}/h (relative GPU price), "
                     f"{f.get('delta_cost', 0.0):.1f} over the expected life")
    free = f.get("free_gpus")
    lines.append(f"  capacity: {f.get('capacity_gpus')} GPUs ({f.get('capacity_source')}), {f.get('held_gpus')} held, "
                 f"{free if free is not None else '?'} free"
                 + (f"; this placement takes {f['gpus_needed']} more" if f.get("gpus_needed") else ""))
    for g, times in (f.get("member_times") or {}).items():
        lines.append(f"  group {g} phase times: " + ", ".join(f"{m} {t}" for m, t in times.items()))
    for note in f.get("notes", []):
        lines.append(f"  note: {note}")
    lines.append(f"  decision: {p.decision_ms:.1f} ms")
    act = p.action
    if act.get("joined"):
        lines.append(f"  joined {act['group_dir']} (membership record {act.get('record')}); it enters the rotation "
                     "at the next meta-iteration")
    if act.get("submitted"):
        lines.append(f"  submitted Slurm job {act['sbatch_job']}: {act.get('group_file') or act.get('run_dir')}")
    if p.dry_run:
        lines.append("  dry run: nothing changed")
    return "\n".join(lines)


def cmd_mux_place(args: argparse.Namespace) -> int:
    """Run the placer; 0 placed, 2 refused or bad input, 1 a failure after the decision."""
    from slurm_rl.config import ConfigError
    from slurm_rl.errors import InputError
    from slurm_rl.mux.placer import place
    from slurm_rl.mux.slurm_capacity import SbatchError

    if args.max_gpus is not None and args.max_gpus < 1:
        return _bad(f"--max-gpus: got {args.max_gpus}; allowed: a positive number of GPUs")
    if args.lock_timeout <= 0:
        return _bad(f"--lock-timeout: got {args.lock_timeout}; allowed: > 0 seconds")
    try:
        p = place(args.config, args.cluster, name=args.name, slo=args.slo, dry_run=args.dry_run,
                  sbatch_args=args.sbatch, overrides=args.overrides, max_gpus=args.max_gpus,
                  max_response_length=args.max_response_length, host_memory_gb=args.host_memory_gb,
                  lock_timeout_s=args.lock_timeout, colocated=not args.no_colocated)
    except ConfigError as exc:
        print(f"invalid input:\n{exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except InputError as exc:
        return _bad(str(exc))
    except SbatchError as exc:
        print(f"error: {exc} (recorded in {args.cluster}/placements.jsonl)", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(p.to_json(), indent=1, default=str))
    else:
        print(format_placement(p))
    if p.refused:
        print(f"refused: {p.reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slurm_rl.mux.placer_cli CONFIG --cluster DIR ...`` (the same as ``slurm-rl mux place``)."""
    parser = argparse.ArgumentParser(prog="slurm-rl")
    add_place_parser(parser.add_subparsers(dest="command", required=True))
    return cmd_mux_place(parser.parse_args(["mux-place", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
