#!/usr/bin/env bash
# Start (or confirm) the local Slurm test cluster: SLURM_TEST_NODES nodes x SLURM_TEST_GPUS
# fake GPUs on this host, all state under SLURM_TEST_DIR. Idempotent: installs missing packages,
# rewrites the config, starts only daemons that are not running, and waits until every node is idle.
# Usage: tools/slurm/start.sh        (then: source tools/slurm/env.sh)
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

export SLURM_CONF="${SLURM_TEST_CONF}"
export DEBIAN_FRONTEND=noninteractive
export PATH="${PATH}:/usr/sbin:/sbin"
t_start=$(date +%s.%N)

log() { echo "[slurm-test] $*" >&2; }

die() {
  # Print an error, the tail of every log that exists, and exit 1.
  local f
  echo "[slurm-test] ERROR: $*" >&2
  for f in "${SLURM_TEST_LOG}"/*.log; do
    [[ -s "${f}" ]] || continue
    echo "----- tail ${f} -----" >&2
    tail -n 25 "${f}" >&2 || true
  done
  exit 1
}

wait_for() {
  # wait_for SECONDS WHAT [--pidfile FILE NAME] CMD...: poll CMD (10 s cap per try) every 0.2 s until it succeeds;
  # die naming WHAT on timeout, or as soon as the daemon behind FILE has exited (after 2 s grace).
  local timeout="$1" what="$2"; shift 2
  local pidfile="" name="" start deadline
  if [[ "$1" == "--pidfile" ]]; then pidfile="$2"; name="$3"; shift 3; fi
  start=$(date +%s)
  deadline=$(( start + timeout ))
  until timeout 10 "$@" >/dev/null 2>&1; do
    if (( $(date +%s) >= deadline )); then
      die "timed out after ${timeout}s waiting for ${what}"
    fi
    if [[ -n "${pidfile}" ]] && (( $(date +%s) - start >= 2 )) \
        && ! slurm_test_pidfile_alive "${pidfile}" "${name}"; then
      die "${name} exited while waiting for ${what} (port in use? see its log below)"
    fi
    sleep 0.2
  done
}

[[ "$(uname -s)" == "Linux" ]] || die "the local test cluster needs Linux"
[[ "$(id -u)" == "0" ]] || die "the local test cluster needs root (daemons, mknod)"

# ---------------------------------------------------------------- packages
ensure_packages() {
  local -a want=() missing=()
  want=(slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge)
  if [[ "${SLURM_TEST_ACCOUNTING}" == "1" ]]; then
    want+=(slurmdbd:slurmdbd mariadbd:mariadb-server mariadb:mariadb-client)
  fi
  local item
  for item in "${want[@]}"; do
    command -v "${item%%:*}" >/dev/null 2>&1 || PATH="${PATH}:/usr/sbin" command -v "${item%%:*}" \
      >/dev/null 2>&1 || missing+=("${item##*:}")
  done
  (( ${#missing[@]} == 0 )) && return 0
  log "installing ${missing[*]} with apt-get"
  local apt_log="${SLURM_TEST_LOG}/apt.log"
  if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"${apt_log}" 2>&1; then
    log "apt-get install failed; running apt-get update once and retrying"
    apt-get update -q >>"${apt_log}" 2>&1 || die "apt-get update failed (see ${apt_log})"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >>"${apt_log}" 2>&1 \
      || die "apt-get install ${missing[*]} failed (see ${apt_log})"
  fi
}

# ---------------------------------------------------------------- config
any_daemon_running() {
  local f
  for f in "${SLURM_TEST_RUN}"/*.pid; do
    [[ -e "${f}" ]] || continue
    slurm_test_pidfile_alive "${f}" "" && return 0
  done
  return 1
}

write_config() {
  # Write config into a temp dir; restart running daemons only if the config changed.
  local tmp changed=0 f
  tmp=$(mktemp -d "${SLURM_TEST_DIR}/.etc.XXXXXX")
  "$(dirname "${BASH_SOURCE[0]}")/write_conf.sh" "${tmp}"
  # plugstack path inside slurm.conf points at the final directory, not the temp one
  sed -i "s#^PlugStackConfig=.*#PlugStackConfig=${SLURM_TEST_ETC}/plugstack.conf#" "${tmp}/slurm.conf"
  for f in slurm.conf gres.conf slurmdbd.conf plugstack.conf; do
    if [[ -e "${tmp}/${f}" || -e "${SLURM_TEST_ETC}/${f}" ]]; then
      cmp -s "${tmp}/${f}" "${SLURM_TEST_ETC}/${f}" || changed=1
    fi
  done
  if (( changed )) && any_daemon_running; then
    log "config changed: restarting the running daemons"
    "$(dirname "${BASH_SOURCE[0]}")/stop.sh"
  fi
  if (( changed )); then
    rm -rf "${SLURM_TEST_ETC}"
    mv "${tmp}" "${SLURM_TEST_ETC}"
    chmod 755 "${SLURM_TEST_ETC}"
  else
    rm -rf "${tmp}"
  fi
}

prepare_dirs() {
  mkdir -p "${SLURM_TEST_DIR}" "${SLURM_TEST_RUN}" "${SLURM_TEST_LOG}" "${SLURM_TEST_STATE}/slurmctld" \
    "${SLURM_TEST_DIR}/dev" "${SLURM_TEST_MUNGE_DIR}"
  chmod 755 "${SLURM_TEST_DIR}"
  chmod 711 "${SLURM_TEST_MUNGE_DIR}"   # munged refuses 700 for clients; 711 works
  local n i
  for n in $(slurm_test_node_names); do mkdir -p "${SLURM_TEST_STATE}/slurmd-${n}"; done
  # Fake GPUs: slurmd accepts GRES files only if they are character devices.
  for (( i = 0; i < SLURM_TEST_GPUS; i++ )); do
    [[ -c "${SLURM_TEST_DIR}/dev/gpu${i}" ]] || { rm -f "${SLURM_TEST_DIR}/dev/gpu${i}"; \
      mknod -m 666 "${SLURM_TEST_DIR}/dev/gpu${i}" c 1 3 || die "mknod ${SLURM_TEST_DIR}/dev/gpu${i} failed"; }
  done
  if [[ ! -s "${SLURM_TEST_MUNGE_DIR}/munge.key" ]]; then
    (umask 077 && dd if=/dev/urandom of="${SLURM_TEST_MUNGE_DIR}/munge.key" bs=1024 count=1 status=none)
  fi
  chmod 400 "${SLURM_TEST_MUNGE_DIR}/munge.key"
}

# ---------------------------------------------------------------- daemons
start_munged() {
  if slurm_test_pidfile_alive "${SLURM_TEST_RUN}/munged.pid" munged; then return 0; fi
  rm -f "${SLURM_TEST_MUNGE_SOCKET}" "${SLURM_TEST_MUNGE_SOCKET}.lock"
  log "starting munged"
  munged --force -S "${SLURM_TEST_MUNGE_SOCKET}" --key-file="${SLURM_TEST_MUNGE_DIR}/munge.key" \
    --pid-file="${SLURM_TEST_RUN}/munged.pid" --log-file="${SLURM_TEST_LOG}/munged.log" \
    --seed-file="${SLURM_TEST_MUNGE_DIR}/munged.seed" </dev/null >>"${SLURM_TEST_LOG}/munged.log" 2>&1 \
    || die "munged failed to start"
  wait_for "${SLURM_TEST_START_TIMEOUT}" "munged socket ${SLURM_TEST_MUNGE_SOCKET}" --pidfile "${SLURM_TEST_RUN}/munged.pid" munged \
    bash -c "munge -S '${SLURM_TEST_MUNGE_SOCKET}' -n | unmunge -S '${SLURM_TEST_MUNGE_SOCKET}'"
}

db_sql() {
  mariadb --no-defaults --protocol=socket -S "${SLURM_TEST_DB_SOCKET}" -u root -e "$1"
}

start_mariadb() {
  if slurm_test_pidfile_alive "${SLURM_TEST_RUN}/mariadb.pid" mariadbd; then return 0; fi
  if [[ ! -d "${SLURM_TEST_DB_DIR}/mysql" ]]; then
    log "initialising MariaDB in ${SLURM_TEST_DB_DIR}"
    rm -rf "${SLURM_TEST_DB_DIR}"
    mkdir -p "${SLURM_TEST_DB_DIR}"
    mariadb-install-db --no-defaults --user=root --datadir="${SLURM_TEST_DB_DIR}" \
      --auth-root-authentication-method=socket --skip-test-db \
      >"${SLURM_TEST_LOG}/mariadb-install.log" 2>&1 || die "mariadb-install-db failed"
  fi
  log "starting mariadbd"
  rm -f "${SLURM_TEST_DB_SOCKET}"
  setsid mariadbd --no-defaults --user=root --datadir="${SLURM_TEST_DB_DIR}" \
    --socket="${SLURM_TEST_DB_SOCKET}" --port="${SLURM_TEST_DB_PORT}" --bind-address=127.0.0.1 \
    --skip-name-resolve --pid-file="${SLURM_TEST_RUN}/mariadb.pid" \
    --log-error="${SLURM_TEST_LOG}/mariadb.log" --innodb-buffer-pool-size=32M \
    --innodb-log-file-size=16M --innodb-flush-log-at-trx-commit=2 --performance-schema=OFF \
    </dev/null >>"${SLURM_TEST_LOG}/mariadb.log" 2>&1 &
  echo "$!" > "${SLURM_TEST_RUN}/mariadb.pid"   # mariadbd rewrites it with the same pid
  wait_for "${SLURM_TEST_START_TIMEOUT}" "MariaDB socket ${SLURM_TEST_DB_SOCKET}" --pidfile "${SLURM_TEST_RUN}/mariadb.pid" mariadbd \
    mariadb --no-defaults --protocol=socket -S "${SLURM_TEST_DB_SOCKET}" -u root -e "SELECT 1"
  db_sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmtest';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmtest';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || die "creating the accounting database failed"
}

start_slurmdbd() {
  if ! slurm_test_pidfile_alive "${SLURM_TEST_RUN}/slurmdbd.pid" slurmdbd; then
    log "starting slurmdbd"
    slurmdbd </dev/null >>"${SLURM_TEST_LOG}/slurmdbd.log" 2>&1 || die "slurmdbd failed to start"
  fi
  wait_for "${SLURM_TEST_START_TIMEOUT}" "slurmdbd on port ${SLURM_TEST_DBD_PORT}" --pidfile "${SLURM_TEST_RUN}/slurmdbd.pid" slurmdbd \
    sacctmgr -n -P show cluster format=cluster
  if ! timeout 30 sacctmgr -n -P show cluster format=cluster | grep -qx "${SLURM_TEST_CLUSTER_NAME}"; then
    timeout 30 sacctmgr -i add cluster "${SLURM_TEST_CLUSTER_NAME}" >/dev/null || die "sacctmgr add cluster failed"
  fi
}

start_slurmctld() {
  if slurm_test_pidfile_alive "${SLURM_TEST_RUN}/slurmctld.pid" slurmctld; then return 0; fi
  log "starting slurmctld"
  slurmctld -f "${SLURM_CONF}" </dev/null >>"${SLURM_TEST_LOG}/slurmctld.log" 2>&1 \
    || die "slurmctld failed to start"
  wait_for "${SLURM_TEST_START_TIMEOUT}" "slurmctld on port ${SLURM_TEST_CTLD_PORT}" --pidfile "${SLURM_TEST_RUN}/slurmctld.pid" slurmctld \
    scontrol ping
}

start_slurmd() {
  local n
  for n in $(slurm_test_node_names); do
    if slurm_test_pidfile_alive "${SLURM_TEST_RUN}/slurmd-${n}.pid" slurmd; then continue; fi
    log "starting slurmd -N ${n}"
    slurmd -f "${SLURM_CONF}" -N "${n}" </dev/null >>"${SLURM_TEST_LOG}/slurmd-${n}.log" 2>&1 \
      || die "slurmd -N ${n} failed to start"
  done
}

nodes_idle() {
  # True when every configured node is idle (or busy with jobs of an earlier run).
  local states bad
  states=$(timeout 10 sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [[ $(wc -l <<<"${states}") -ge ${SLURM_TEST_NODES} ]] || return 1
  bad=$(awk '$2 !~ /^(idle|mixed|allocated|completing)$/' <<<"${states}")
  [[ -z "${bad}" ]]
}

wait_nodes_idle() {
  local deadline=$(( $(date +%s) + SLURM_TEST_START_TIMEOUT )) resumed=0 n
  until nodes_idle; do
    if (( $(date +%s) >= deadline )); then
      die "timed out after ${SLURM_TEST_START_TIMEOUT}s waiting for nodes $(slurm_test_node_names | paste -sd,) to be idle; sinfo: $(sinfo -h -N -o '%N=%T(%E)' 2>&1 | paste -sd' ')"
    fi
    for n in $(slurm_test_node_names); do
      # slurmd writes its pid file once it has daemonised and initialised: on a loaded host that
      # takes seconds (seen: n1 still detecting its hardware when n2 was up); no pid file yet is
      # "still starting" for a while, not "exited"
      if [[ ! -s "${SLURM_TEST_RUN}/slurmd-${n}.pid" ]] && (( $(date +%s) < deadline - SLURM_TEST_START_TIMEOUT / 3 )); then
        continue
      fi
      slurm_test_pidfile_alive "${SLURM_TEST_RUN}/slurmd-${n}.pid" slurmd \
        || die "slurmd -N ${n} exited while waiting for the nodes to be idle (port in use? see its log)"
    done
    # Nodes left drained/down by an earlier run: resume them once they have registered.
    if (( ! resumed )) && sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(drained|down|drain)'; then
      sleep 1
      scontrol update nodename="$(slurm_test_node_names | paste -sd,)" state=resume >/dev/null 2>&1 || true
      resumed=1
    fi
    sleep 0.2
  done
}

choose_ports() {
  # With no daemon of this directory running and no SLURM_TEST_PORT_BASE given: keep the recorded
  # (or derived) block if it is free, else take the next free one; record the choice.
  if (( SLURM_TEST_PORT_FROM_ENV )) || any_daemon_running; then
    echo "${SLURM_TEST_PORT_BASE}" > "${SLURM_TEST_PORTS_FILE}"
    return 0
  fi
  local base="${SLURM_TEST_PORT_BASE}" tries=0
  until slurm_test_block_free "${base}"; do
    (( ++tries < 64 )) || die "no free block of ${SLURM_TEST_PORT_BLOCK} ports found from ${SLURM_TEST_PORT_BASE}"
    base=$(( base + SLURM_TEST_PORT_BLOCK ))
    (( base + SLURM_TEST_PORT_BLOCK <= SLURM_TEST_PORT_FIRST + SLURM_TEST_PORT_BLOCKS * SLURM_TEST_PORT_BLOCK )) \
      || base=${SLURM_TEST_PORT_FIRST}
  done
  if (( base != SLURM_TEST_PORT_BASE )); then
    log "ports ${SLURM_TEST_PORT_BASE}.. are taken: using ${base}.."
  fi
  SLURM_TEST_PORT_BASE=${base}
  slurm_test_set_ports
  echo "${SLURM_TEST_PORT_BASE}" > "${SLURM_TEST_PORTS_FILE}"
}

mkdir -p "${SLURM_TEST_LOG}"
ensure_packages
prepare_dirs
choose_ports
write_config
start_munged
if [[ "${SLURM_TEST_ACCOUNTING}" == "1" ]]; then
  start_mariadb
  start_slurmdbd
fi
start_slurmctld
start_slurmd
wait_nodes_idle
log "cluster up in $(awk -v a="${t_start}" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s: $(sinfo -h -N -o '%N:%T:%G' | paste -sd' ') (SLURM_CONF=${SLURM_CONF})"
