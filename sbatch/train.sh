#!/bin/bash
# Train with slurm_rl inside one Slurm allocation: a task per node that forks the node's ranks of the
# placement (a rank may own several GPUs: it narrows CUDA_VISIBLE_DEVICES to its own).
#
#   sbatch sbatch/train.sh CONFIG [key=value ...]
#   sbatch --nodes=2 --ntasks-per-node=4 --gres=gpu:4 sbatch/train.sh configs/examples/slurm_2x4.yaml
#
# Every #SBATCH line below is a default: options given on the sbatch command line win.
# SLURM_RL_PYTHON picks the interpreter (default: .venv/bin/python of the submit dir, else python3).
#SBATCH --job-name=slurm-rl
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=1
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --output=slurm-rl-%j.out
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: sbatch sbatch/train.sh CONFIG [key=value ...]" >&2
  exit 2
fi
cd "${SLURM_SUBMIT_DIR:-.}"
if [ -n "${SLURM_RL_PYTHON:-}" ]; then PY="$SLURM_RL_PYTHON"
elif [ -x .venv/bin/python ]; then PY="$PWD/.venv/bin/python"
else PY=python3; fi

# Validate and create the run dir before any rank starts; a bad config ends here with exit 2.
# A requeued job (SLURM_RESTART_COUNT > 0) gets its previous incarnation's run dir, ready to resume.
set +e
RUN_DIR=$("$PY" -m slurm_rl.cli prepare "$@")
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "slurm_rl: config rejected (exit $rc); nothing launched" >&2
  exit $rc
fi
echo "slurm_rl run dir: $RUN_DIR"
echo "slurm_rl job $SLURM_JOB_ID: ${SLURM_NNODES:-1} nodes, ${SLURM_NTASKS} tasks, nodes ${SLURM_JOB_NODELIST}"

# Preemption / time limit: Slurm sends USR1 to this shell 120 s before the end (give more than
# one iteration's time). The run checkpoints at its next iteration gate and stops; the job is
# then requeued (below) and the next start resumes this RUN_DIR.
srun_pid=""
on_usr1() {
  echo "slurm_rl: USR1 (preemption/time limit) received at $(date +%s); asking the run to checkpoint and stop"
  "$PY" -m slurm_rl.cli stop "$RUN_DIR" || true
  [ -n "$srun_pid" ] && kill -USR1 "$srun_pid" 2>/dev/null || true
}
trap on_usr1 USR1

# Each rank on the node the placement gives it. By default one task per node that holds ranks
# (python -m slurm_rl.launch.node: it imports torch & co. once and forks the node's ranks, with the
# CPUs of all of them); SLURM_RL_FORKSERVER=0: one task per rank. SLURM_HOSTFILE lists the node of
# every task.
RANK_HOSTS="$RUN_DIR/logs/rank-hosts-$SLURM_JOB_ID"
# shellcheck disable=SC2046
"$PY" -m slurm_rl.launch.hostfile "$RUN_DIR" $(scontrol show hostnames "$SLURM_JOB_NODELIST") > "$RANK_HOSTS"
export SLURM_HOSTFILE="$RUN_DIR/logs/hosts-$SLURM_JOB_ID"
CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"
case "${SLURM_RL_FORKSERVER:-1}" in
  0|[Ff][Aa][Ll][Ss][Ee]|[Nn][Oo]|[Oo][Ff][Ff])
    cp "$RANK_HOSTS" "$SLURM_HOSTFILE"
    TASK=(-m slurm_rl.worker "$RUN_DIR") ;;
  *)
    awk '!seen[$0]++' "$RANK_HOSTS" > "$SLURM_HOSTFILE"
    CPUS_PER_TASK=$(( CPUS_PER_TASK * $(sort "$RANK_HOSTS" | uniq -c | awk '$1 > m {m = $1} END {print m}') ))
    TASK=(-m slurm_rl.launch.node "$RUN_DIR") ;;
esac
NTASKS=$(wc -l < "$SLURM_HOSTFILE")

# Live progress in this job log (startup phases, one line per iteration, ETA), read from RUN_DIR's files.
"$PY" -m slurm_rl.inspect.live "$RUN_DIR" --interval 5 &
progress_pid=$!

env -u SLURM_NTASKS_PER_NODE srun --kill-on-bad-exit=1 --distribution=arbitrary --ntasks="$NTASKS" \
  --cpus-per-task="$CPUS_PER_TASK" "$PY" "${TASK[@]}" &
srun_pid=$!
set +e
while true; do
  wait "$srun_pid"
  rc=$?
  # wait returns >128 when interrupted by the trapped signal; keep waiting for srun itself.
  if [ $rc -gt 128 ] && kill -0 "$srun_pid" 2>/dev/null; then continue; fi
  break
done
# the follower ends by itself once the coordinator says finished or failed; give it a moment
for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$progress_pid" 2>/dev/null || break; sleep 1; done
kill "$progress_pid" 2>/dev/null || true
echo "slurm_rl: ranks finished with exit code $rc; run dir $RUN_DIR"
echo "slurm_rl: summary and placement timeline: slurm-rl inspect $RUN_DIR  (writes $RUN_DIR/timeline.png)"
echo "slurm_rl: while a run goes on: slurm-rl inspect --follow $RUN_DIR"
# A run stopped at a gate (or whose ranks failed, with runtime.on_rank_failure:
# checkpoint_and_requeue) goes on in this job, requeued; scontrol requeue ends this script.
"$PY" -m slurm_rl.launch.requeue "$RUN_DIR" --srun-exit "$rc"
case $? in
  0) sleep 60 & wait $! ;;  # requeued: Slurm ends this script; report no exit code of our own first
  3) rc=0 ;;  # the run finished (a rank may have died of a late signal while it shut down)
esac
exit $rc
