#!/bin/sh
# The transport seam (lib/transport/transport.h, issue 13): the RPC agent reaches its
# transport only through an instance's ops, so that another transport is a
# new file, not an edit of the agent. lib/rpc/agent.c must name none of the
# shared-memory transport's types, fields or functions (comments included:
# a comment that names them is a dependency waiting to happen).
# Usage: check_seam.sh SOURCE_ROOT
root=${1:?usage: check_seam.sh SOURCE_ROOT}
f="$root/lib/rpc/agent.c"
[ -f "$f" ] || { echo "check_seam.sh: $f not found"; exit 1; }
hits=$(grep -nE -- '->x\b|sr_xport|sr_ring_|sr_seg_|sr_waiter_|sr_doorbell|sr__doorbell|SR_DOORBELL_|SR_WAKE_|FUTEX_WAIT_BITSET|struct sr_peer|sr_worker_info' "$f")
if [ -n "$hits" ]; then
    echo "lib/rpc/agent.c uses the shared-memory transport directly (go through its sr_tport ops, lib/transport/transport.h):"
    echo "$hits"
    exit 1
fi
exit 0
