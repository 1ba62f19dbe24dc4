#!/usr/bin/env bash
# Set up .venv (pinned deps) and run the quickstart locally (no Slurm): live progress while it
# trains, then the run's summary, its placement timeline (PNG) and where everything is.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup_env.sh core
# the model, tokenizer and dataset as files, made once (a random-init Llama checkpoint, a character
# tokenizer trained with `tokenizers`, single-digit additions in GSM8K's "#### 7" answer format)
.venv/bin/python tools/make_toy_files.py runs/toy --max-operand 4 > /dev/null
echo "quickstart: training configs/quickstart.yaml on CPU (4 ranks; a few minutes)"
exec .venv/bin/slurm-rl run configs/quickstart.yaml "$@"
