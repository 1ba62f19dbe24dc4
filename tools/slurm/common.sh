# Shared settings and helpers for the local test cluster; sourced by start.sh, stop.sh, env.sh.
# Every setting can be overridden from the environment (see docs/testing.md).

_slurm_tools_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_slurm_repo_dir="$(cd "${_slurm_tools_dir}/../.." && pwd)"

SLURM_TEST_DIR="${SLURM_TEST_DIR:-${_slurm_repo_dir}/.slurm-test}"
SLURM_TEST_NODES="${SLURM_TEST_NODES:-4}"
SLURM_TEST_GPUS="${SLURM_TEST_GPUS:-4}"
if [[ -z "${SLURM_TEST_CPUS:-}" ]]; then
  SLURM_TEST_CPUS=$(( SLURM_TEST_GPUS + 2 > 8 ? SLURM_TEST_GPUS + 2 : 8 ))
fi
# Ports: SLURM_TEST_PORT_BASE from the environment, else the block recorded by the start.sh that
# started this directory's cluster (state/ports), else a block derived from SLURM_TEST_DIR (start.sh
# moves on to the next free block when that one is taken and records what it chose). So two
# checkouts on one host get clusters of their own, and a running cluster keeps its ports.
SLURM_TEST_PORTS_FILE="${SLURM_TEST_DIR}/state/ports"
SLURM_TEST_PORT_BLOCK=16    # ports per cluster: ctld, dbd, mariadb, then one per slurmd
# 10000-20000: below the rendezvous ports of jobs (slurm_rl.launch.rank_env: 20000-40000) and the
# kernel's ephemeral range (32768-60999), either of which could take a daemon's port between the
# free-block check and the daemon's bind (seen: a second cluster's slurmd failed to bind mid-suite)
SLURM_TEST_PORT_FIRST=10000
SLURM_TEST_PORT_BLOCKS=625  # blocks between SLURM_TEST_PORT_FIRST and 20000
SLURM_TEST_PORT_FROM_ENV=0
if [[ -n "${SLURM_TEST_PORT_BASE:-}" ]]; then
  SLURM_TEST_PORT_FROM_ENV=1
elif [[ -s "${SLURM_TEST_PORTS_FILE}" ]]; then
  SLURM_TEST_PORT_BASE=$(tr -dc '0-9' < "${SLURM_TEST_PORTS_FILE}")
else
  SLURM_TEST_PORT_BASE=$(( SLURM_TEST_PORT_FIRST
    + ( $(printf '%s' "${SLURM_TEST_DIR}" | cksum | cut -d' ' -f1) % SLURM_TEST_PORT_BLOCKS ) * SLURM_TEST_PORT_BLOCK ))
fi
SLURM_TEST_ACCOUNTING="${SLURM_TEST_ACCOUNTING:-1}"
SLURM_TEST_START_TIMEOUT="${SLURM_TEST_START_TIMEOUT:-90}"
SLURM_TEST_CLUSTER_NAME="${SLURM_TEST_CLUSTER_NAME:-slurmrltest}"

slurm_test_set_ports() {
  # Port layout: ctld=BASE, dbd=BASE+1, mariadb=BASE+2, slurmd n1..nN = BASE+3 ...
  SLURM_TEST_CTLD_PORT=$(( SLURM_TEST_PORT_BASE ))
  SLURM_TEST_DBD_PORT=$(( SLURM_TEST_PORT_BASE + 1 ))
  SLURM_TEST_DB_PORT=$(( SLURM_TEST_PORT_BASE + 2 ))
  SLURM_TEST_SLURMD_PORT0=$(( SLURM_TEST_PORT_BASE + 3 ))
}
slurm_test_set_ports

SLURM_TEST_ETC="${SLURM_TEST_DIR}/etc"
SLURM_TEST_RUN="${SLURM_TEST_DIR}/run"
SLURM_TEST_LOG="${SLURM_TEST_DIR}/log"
SLURM_TEST_STATE="${SLURM_TEST_DIR}/state"
SLURM_TEST_MUNGE_DIR="${SLURM_TEST_DIR}/munge"
SLURM_TEST_MUNGE_SOCKET="${SLURM_TEST_MUNGE_DIR}/munge.socket"
SLURM_TEST_DB_DIR="${SLURM_TEST_STATE}/mariadb"
SLURM_TEST_DB_SOCKET="${SLURM_TEST_RUN}/mariadb.sock"
SLURM_TEST_CONF="${SLURM_TEST_ETC}/slurm.conf"

slurm_test_node_names() {
  # Print the node names n1..nN, one per line.
  local i
  for (( i = 1; i <= SLURM_TEST_NODES; i++ )); do echo "n${i}"; done
}

slurm_test_pid_alive() {
  # True if PID exists, is not a zombie and (if given) its comm starts with NAME.
  local pid="$1" name="${2:-}" state comm
  [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/${pid}/status" ]] || return 1
  state=$(awk '/^State:/ {print $2; exit}' "/proc/${pid}/status" 2>/dev/null) || return 1
  [[ -n "${state}" && "${state}" != "Z" && "${state}" != "X" ]] || return 1
  if [[ -n "${name}" ]]; then
    comm=$(cat "/proc/${pid}/comm" 2>/dev/null) || return 1
    [[ "${comm}" == "${name}"* ]] || return 1
  fi
  return 0
}

slurm_test_pidfile_alive() {
  # True if the pid file PIDFILE names a live (non-zombie) process called NAME.
  local pidfile="$1" name="$2" pid
  [[ -s "${pidfile}" ]] || return 1
  pid=$(tr -dc '0-9' < "${pidfile}")
  slurm_test_pid_alive "${pid}" "${name}"
}

slurm_test_port_in_use() {
  # True if something listens on 127.0.0.1:PORT (or the port is otherwise taken).
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

slurm_test_block_free() {
  # True if every port of the block at BASE is free.
  local base="$1" i
  for (( i = 0; i < 3 + SLURM_TEST_NODES; i++ )); do
    slurm_test_port_in_use $(( base + i )) && return 1
  done
  return 0
}
