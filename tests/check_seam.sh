#!/bin/sh
# SPDX-License-Identifier: MIT
# The transport seam (lib/transport/transport.h): the RPC layer reaches its
# transports only through instances' ops, and never opens, boots or frees
# one itself, so that another transport is a new file of the transport
# layer, not an edit of the RPC layer.
#   - the agent's files (lib/rpc: life, send, poll, wait, progress, exits)
#     name none of the shared-memory transport's types,
#     fields or functions, nor the shared heap's (comments included: a
#     comment that names them is a dependency waiting to happen);
#   - no file of lib/rpc names the agent's shared-memory transport type
#     (sr_xport) or MPI ("mpi", SR_HAVE_MPI): choosing a transport per peer,
#     booting and finishing a launcher's job are the transport layer's;
#   - no two files of lib/rpc call each other both ways
#     (check_rpc_calls.py: each file has one job, calls run one way).
# Usage: check_seam.sh SOURCE_ROOT
root=${1:?usage: check_seam.sh SOURCE_ROOT}
files=""
for n in life send poll wait progress exits; do
    f="$root/lib/rpc/$n.c"
    [ -f "$f" ] || { echo "check_seam.sh: $f not found"; exit 1; }
    files="$files $f"
done
rc=0
hits=$(grep -nE -- '->x\b|sr__?xport|sr__?ring_|sr__?seg_|sr__?waiter_|sr__?doorbell|SR_DOORBELL_|SR_WAKE_|FUTEX_WAIT_BITSET|struct sr_peer|sr_worker_info|sr__?heap_' $files)
if [ -n "$hits" ]; then
    echo "the agent uses the shared-memory transport or heap directly (go through its sr_tport ops, lib/transport/transport.h):"
    echo "$hits"
    rc=1
fi
hits=$(grep -rnE -- 'sr__?xport|SR_HAVE_MPI|mpi' "$root/lib/rpc")
if [ -n "$hits" ]; then
    echo "lib/rpc names a transport (the choice per peer and the launchers' transports are lib/transport's):"
    echo "$hits"
    rc=1
fi
python3 "$root/tests/check_rpc_calls.py" "$root" || rc=1
exit $rc
