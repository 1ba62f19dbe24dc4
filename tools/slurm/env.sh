# Source this file to use the local test cluster from a shell:
#   source tools/slurm/env.sh && sinfo
# Exports SLURM_CONF, SLURM_TEST_DIR and a PATH that holds the Slurm client commands.
# shellcheck shell=bash
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
export SLURM_TEST_DIR
export SLURM_CONF="${SLURM_TEST_CONF}"
case ":${PATH}:" in
  *:/usr/bin:*) ;;
  *) export PATH="/usr/bin:${PATH}" ;;
esac
case ":${PATH}:" in
  *:/usr/sbin:*) ;;
  *) export PATH="${PATH}:/usr/sbin" ;;
esac
