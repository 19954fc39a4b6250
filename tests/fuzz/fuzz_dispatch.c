/* SPDX-License-Identifier: MIT */
/* libFuzzer harness for the agent's handling of incoming RPC messages
 * (lib/rpc/poll.c, serve.c, calls.c: requests, module requests, keep calls, responses,
 * errors, control and module messages), end to end: a one-worker job runs
 * its agent in this process (fz_env_init_agent), and each input is one
 * message that this worker sends to itself through its inbox, so the
 * progress thread takes it as it would a peer's: payload, extension block,
 * function lookup, arguments, the function run (built-ins only), the modules'
 * hooks, and the answer (which comes back to this worker and is dropped as
 * unknown or taken by a pending call).
 *
 * Input: u8 message type, the 56 slot bytes (struct sr_wire), then the
 * payload block's bytes (for a block payload, the slot names the payload
 * fixture by a marker; fuzz_env.h). After sending it, the harness makes a
 * no-op call to itself: the inbox is FIFO, so when that returns the message
 * has been taken (its work may go on, on an executor).
 *
 * The contract checked: no message crashes the worker or trips a sanitizer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fuzz_env.h"
#include "agent.h"
#include "shm/xport.h" /* sr__transport_xport: the shared-memory transport under the agent */
#include "wire.h"
#include "shmrpc/rpc.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_env_init_agent();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 + FZ_SLOT_BYTES)
        return 0;
    uint8_t *buf = malloc(size);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    fz_unmark(buf, size);
    fz_objects_in_flight();
    sr_msg m = {.type = buf[0]};
    memcpy(m.data, buf + 1, FZ_SLOT_BYTES);
    size_t tail = size - 1 - FZ_SLOT_BYTES;
    memcpy(fz_payload(), buf + 1 + FZ_SLOT_BYTES, tail < FZ_PAYLOAD_BYTES ? tail : FZ_PAYLOAD_BYTES);
    free(buf);
    if (sr_xport_send(sr__transport_xport(sr__agent->tports), 0, &m) == 0) {
        sr_value *out = NULL;
        sr_rpc_sync(0, "noop", SR_NOARGS, 10.0, &out); /* an error is the input's doing */
        sr_value_unref(out);
    }
    fz_top_up();
    return 0;
}
