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
#
# Preemption and time limits: with `sbatch --requeue --signal=B:USR1@120 sbatch/mux.sh GROUP.yaml`
# (or `scancel --signal=USR1 --batch JOBID`) every member checkpoints at its gate, the job is
# requeued, and the requeued job resumes each member from its checkpoint.
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

# The group scheduler and one `srun --overlap` step per job: a task per node that forks the job's ranks
# there where they fill the allocation's tasks (SLURM_RL_FORKSERVER=0: a task per rank) (jobs that `slurm-rl mux add` admits
# later get theirs as they join); a job that fails is stopped alone.
launcher_pid=""
on_usr1() {
  echo "slurm_rl: USR1 (preemption/time limit) received at $(date +%s); every member checkpoints at its gate"
  "$PY" -m slurm_rl.mux.group_requeue stop "$GROUP_DIR" || true
}
trap on_usr1 USR1
set +e
"$PY" -m slurm_rl.mux.launcher srun "$GROUP_DIR" &
launcher_pid=$!
while true; do
  wait "$launcher_pid"
  rc=$?
  # wait returns >128 when interrupted by the trapped signal; keep waiting for the launcher itself.
  if [ $rc -gt 128 ] && kill -0 "$launcher_pid" 2>/dev/null; then continue; fi
  break
done
# Requeue the group when it was stopped at the members' gates (sbatch --requeue; the requeued job
# resumes every stopped member from its checkpoint).
"$PY" -m slurm_rl.mux.group_requeue requeue "$GROUP_DIR"
case $? in
  0) sleep 60 & wait $! ;;  # requeued: Slurm ends this script
  3) rc=0 ;;  # every member finished
esac
set -e
exit $rc
