#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# peer_death.sh PROGRAM: a rank of another (pretend) host dies in a call
# (tests/mpi/peer_death.c). mpirun must end the job, non-zero, within 60 s,
# naming the rank that died, and leave none of the job's processes behind.
set -uo pipefail
. "$(dirname "$0")/mpirun_env.sh"
prog=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout 60 "${MPIRUN[@]}" -n 4 -x SHMRPC_HOSTS=2 "$prog" > "$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$out"
if [ "$rc" -eq 124 ]; then echo "peer_death: the job hung (killed after 60 s)"; exit 1; fi
if [ "$rc" -eq 0 ]; then echo "peer_death: mpirun exited 0 although rank 3 was killed"; exit 1; fi
grep -q "rank 3" "$out" || { echo "peer_death: mpirun's report does not name rank 3"; exit 1; }
. "$(dirname "$0")/job_gone.sh"
job_gone "$prog" || { echo "peer_death: processes of the job are left:"; echo "$left"; exit 1; }
echo "peer_death: the job ended in ${took} s (mpirun exit $rc), naming rank 3; no process left"
