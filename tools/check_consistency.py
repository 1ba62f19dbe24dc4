"""Does dynamic scheduling change training? Run one config under ``static`` and under ``auto``
(real engines, ``train.minibatch_order: index``) and print, as JSON, how far the per-step losses
and the final actor parameters of the two runs are apart, and how the actor's DP changed.

    .venv/bin/python tools/check_consistency.py [CONFIG] [--iterations N] [--out DIR]

Default CONFIG: configs/quickstart.yaml (with ``train.minibatch_order=index``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(config: Path, run_dir: Path, policy: str, iterations: int) -> float:
    overrides = [f"runtime.run_dir={run_dir}", f"scheduler.policy={policy}", f"cluster.auto_scheduler={policy == 'auto'}",
                 "train.minibatch_order=index", f"train.num_iterations={iterations}"]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "slurm_rl.cli", "run", str(config), *overrides, "--no-inspect"],
                          cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{policy} run failed:\n{proc.stdout}\n{proc.stderr}")
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, default=REPO / "configs/quickstart.yaml")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="keep the two run dirs here")
    args = parser.parse_args()
    from safetensors.torch import load_file

    from slurm_rl.metrics import read_metrics

    out = args.out or Path(tempfile.mkdtemp(prefix="consistency-"))
    seconds = {p: run(args.config, out / p, p, args.iterations) for p in ("static", "auto")}
    losses = {p: [x for m in read_metrics(out / p) for x in m["losses"]] for p in seconds}
    pairs = list(zip(losses["static"], losses["auto"]))
    params = {p: load_file(str(out / p / "checkpoints" / "final" / "model.safetensors")) for p in seconds}
    rel = [float((params["auto"][n] - t).abs().max()) / max(float(t.abs().max()), 1e-30)
           for n, t in params["static"].items()]
    print(json.dumps({
        "config": str(args.config), "iterations": args.iterations, "steps": len(pairs),
        "loss_max_abs_diff": max(abs(a - b) for a, b in pairs),
        "loss_max_rel_diff": max((abs(a - b) / max(abs(a), abs(b)) for a, b in pairs if max(abs(a), abs(b)) > 0),
                                 default=0.0),
        "param_max_rel_diff": max(rel),
        "auto_dp_per_minibatch": [[p["dp"] for p in m["plan"]] for m in read_metrics(out / "auto")],
        "run_seconds": seconds, "run_dirs": str(out),
    }, indent=1))


if __name__ == "__main__":
    main()
