#!/bin/bash
# Run a co-execution group (several RL jobs sharing a rollout pool and a training pool) inside
# one Slurm allocation: the group scheduler on the batch node, one `srun --overlap` step per job
# (every step spans the group's slots; the grants decide which job computes on a slot when).
#
#   sbatch sbatch/mux.sh GROUP.yaml [key=value ...]
#   sbatch --nodes=1 --ntasks-per-node=8 --gres=gpu:8 sbatch/mux.sh configs/examples/mux/group_2x8.yaml
#
# Two pools as a heterogeneous job (component 0: the training pool's nodes, component 1: the
# rollout pool's, e.g. cheaper GPUs); each job's ranks 0.. then land on component 0 first, so a
# job lists its actor/inference ranks before its rollout ranks:
#   sbatch --nodes=1 --ntasks-per-node=4 --gres=gpu:4 : --nodes=1 --ntasks-per-node=4 --gres=gpu:4 \
#     sbatch/mux.sh configs/examples/mux/group_2x8.yaml
#
# A job that fails is stopped alone; the others go on. Exit code: 0 when every job finished.
#SBATCH --job-name=slurm-rl-mux
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=1
#SBATCH --time=04:00:00
#SBATCH --output=slurm-rl-mux-%j.out
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: sbatch sbatch/mux.sh GROUP.yaml [key=value ...]" >&2
  exit 2
fi
cd "${SLURM_SUBMIT_DIR:-.}"
if [ -n "${SLURM_RL_PYTHON:-}" ]; then PY="$SLURM_RL_PYTHON"
elif [ -x .venv/bin/python ]; then PY="$PWD/.venv/bin/python"
else PY=python3; fi

# Validate the group file and every job config, create the group dir; exit 2 launches nothing.
set +e
GROUP_DIR=$("$PY" -m slurm_rl.cli mux --prepare-only "$@")
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "slurm_rl: group rejected (exit $rc); nothing launched" >&2
  exit $rc
fi
echo "slurm_rl group dir: $GROUP_DIR"

"$PY" -m slurm_rl.scheduler.group_coordinator "$GROUP_DIR" >"$GROUP_DIR/logs/group-scheduler.log" 2>&1 &
scheduler_pid=$!

declare -A step_pid
if [ "${SLURM_HET_SIZE:-1}" -gt 1 ]; then
  # one step over every component; its tasks are the allocation's (component 0 first)
  tasks=0
  for ((c = 0; c < SLURM_HET_SIZE; c++)); do v="SLURM_NTASKS_HET_GROUP_$c"; tasks=$((tasks + ${!v})); done
  echo "slurm_rl: heterogeneous allocation, $SLURM_HET_SIZE components, $tasks tasks"
fi
while read -r name run_dir world port; do
  if [ "${SLURM_HET_SIZE:-1}" -gt 1 ]; then
    if [ "$world" -ne "$tasks" ]; then
      echo "slurm_rl: job $name has $world ranks but the heterogeneous allocation has $tasks tasks" >&2
      kill "$scheduler_pid" 2>/dev/null || true
      exit 2
    fi
    placement=(--het-group="$(seq -s, 0 $((SLURM_HET_SIZE - 1)))")
  else
    placement=(--ntasks="$world" --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}")
  fi
  SLURM_RL_MASTER_PORT=$port srun --overlap --kill-on-bad-exit=1 "${placement[@]}" \
    "$PY" -m slurm_rl.worker "$run_dir" >"$run_dir/logs/srun.log" 2>&1 &
  step_pid[$name]=$!
  echo "slurm_rl: job $name: $world ranks (srun step, port $port), run dir $run_dir"
done < <("$PY" -m slurm_rl.launch.mux steps "$GROUP_DIR")

failed=0
set +e
for name in "${!step_pid[@]}"; do
  wait "${step_pid[$name]}"
  rc=$?
  if [ $rc -eq 0 ]; then echo "slurm_rl: job $name finished"
  else echo "slurm_rl: job $name failed with exit code $rc (the other jobs went on)"; failed=1; fi
done
wait "$scheduler_pid"
src=$?
set -e
echo "slurm_rl: group scheduler exit code $src; inspect with: slurm-rl inspect $GROUP_DIR"
[ $failed -eq 0 ] && [ $src -eq 0 ]
