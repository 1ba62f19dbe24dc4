#!/usr/bin/env bash
# Stop every daemon of the local Slurm test cluster (jobs first, then slurmd, slurmctld, slurmdbd,
# MariaDB, munged). Zombies count as stopped. State under SLURM_TEST_DIR is kept; pass --purge
# to delete it as well.
set -uo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
export SLURM_CONF="${SLURM_TEST_CONF}"

log() { echo "[slurm-test] $*" >&2; }

stop_pidfile() {
  # stop_pidfile PIDFILE NAME: SIGTERM, wait up to 15 s, then SIGKILL; remove the pid file.
  local pidfile="$1" name="$2" pid i
  [[ -s "${pidfile}" ]] || return 0
  pid=$(tr -dc '0-9' < "${pidfile}")
  if slurm_test_pid_alive "${pid}" "${name}"; then
    log "stopping ${name} (pid ${pid})"
    kill -TERM "${pid}" 2>/dev/null || true
    for (( i = 0; i < 75; i++ )); do
      slurm_test_pid_alive "${pid}" "${name}" || break
      sleep 0.2
    done
    if slurm_test_pid_alive "${pid}" "${name}"; then
      log "${name} (pid ${pid}) ignored SIGTERM for 15s; sending SIGKILL"
      kill -KILL "${pid}" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  rm -f "${pidfile}"
}

if [[ -s "${SLURM_TEST_CONF}" ]] && slurm_test_pidfile_alive "${SLURM_TEST_RUN}/slurmctld.pid" slurmctld; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | paste -sd' ')
  if [[ -n "${jobs}" ]]; then
    log "cancelling jobs ${jobs}"
    # shellcheck disable=SC2086
    timeout 10 scancel ${jobs} 2>/dev/null || true
    for (( i = 0; i < 50; i++ )); do
      [[ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
fi

for pidfile in "${SLURM_TEST_RUN}"/slurmd-*.pid; do
  [[ -e "${pidfile}" ]] && stop_pidfile "${pidfile}" slurmd
done
# Job steps that outlived slurmd (e.g. slurmctld was already down, so nothing was cancelled):
# slurmstepd and job processes of this cluster carry SLURM_CONF=<our conf>; jobs also SLURM_JOB_ID.
ancestors=" "
p=$$
while [[ "${p}" =~ ^[0-9]+$ ]] && (( p > 1 )); do
  ancestors+="${p} "
  p=$(awk '/^PPid:/ {print $2; exit}' "/proc/${p}/status" 2>/dev/null)
done
for envfile in $(grep -lzxF "SLURM_CONF=${SLURM_TEST_CONF}" /proc/[0-9]*/environ 2>/dev/null); do
  pid="${envfile#/proc/}"; pid="${pid%/environ}"
  [[ "${ancestors}" == *" ${pid} "* ]] && continue
  comm=$(cat "/proc/${pid}/comm" 2>/dev/null) || continue
  if [[ "${comm}" != "slurmstepd" ]]; then
    grep -qz '^SLURM_JOB_ID=' "${envfile}" 2>/dev/null || continue
  fi
  slurm_test_pid_alive "${pid}" || continue
  log "killing leftover job process ${comm} (pid ${pid})"
  kill -KILL "${pid}" 2>/dev/null || true
done

stop_pidfile "${SLURM_TEST_RUN}/slurmctld.pid" slurmctld
stop_pidfile "${SLURM_TEST_RUN}/slurmdbd.pid" slurmdbd
stop_pidfile "${SLURM_TEST_RUN}/mariadb.pid" mariadbd
stop_pidfile "${SLURM_TEST_RUN}/munged.pid" munged

if [[ "${1:-}" == "--purge" ]]; then
  log "removing ${SLURM_TEST_DIR}"
  rm -rf "${SLURM_TEST_DIR}"
fi
exit 0
