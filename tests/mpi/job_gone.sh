# SPDX-License-Identifier: MIT
# Sourced by tests/mpi/*.sh: job_gone PROGRAM waits, at most 20 s, for the
# job's processes (by command name) to end after mpirun returned. mpirun
# signals its ranks as it ends the job; a rank may still be running its exit
# (under the sanitizers, the leak check) for a moment after. Each one is
# waited for by its pid (tail --pid), not on a timer; a zombie not yet reaped
# by this machine's init is not running and not counted. Sets `left` to the
# processes still running, and fails if there are any.
job_gone() {
  local name pid
  name=$(basename "$1" | cut -c1-15)
  for pid in $(ps -eo pid=,stat=,comm= | awk -v n="$name" '$2 !~ /^Z/ && $3 == n { print $1 }'); do
    timeout 20 tail --pid="$pid" -f /dev/null
  done
  left=$(ps -eo pid=,stat=,comm= | awk -v n="$name" '$2 !~ /^Z/ && $3 == n')
  [ -z "$left" ]
}
