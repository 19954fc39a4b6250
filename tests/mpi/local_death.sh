#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# local_death.sh PROGRAM: a peer on the same pretend host ends its process
# in a call (tests/mpi/local_death.c); the caller's wait must fail with
# -EPIPE naming it, before the launcher ends the job; the job must end
# within 60 s and leave no process running.
set -uo pipefail
. "$(dirname "$0")/mpirun_env.sh"
prog=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout 60 "${MPIRUN[@]}" -n 4 -x SHMRPC_HOSTS=2 "$prog" > "$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -ne 124 ] || { echo "local_death: the job hung (killed after 60 s)"; exit 1; }
grep -q "returned -32 (EPIPE).*worker1.*ended" "$out" ||
  { echo "local_death: rank 0's call did not fail with -EPIPE naming worker1"; exit 1; }
. "$(dirname "$0")/job_gone.sh"
job_gone "$prog" || { echo "local_death: processes of the job are left:"; echo "$left"; exit 1; }
echo "local_death: -EPIPE at once within the host; the job ended (mpirun exit $rc), no process left"
