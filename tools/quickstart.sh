#!/usr/bin/env bash
# Set up .venv (pinned deps) and run the quickstart locally (no Slurm), then print its inspection.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup_env.sh core
exec .venv/bin/slurm-rl run configs/quickstart.yaml "$@"
