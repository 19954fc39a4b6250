/* SPDX-License-Identifier: MIT */
/* Demo: a token travels around a ring of workers, under shmrun.
 *
 *   shmrun -n 4 ./demo_ring [laps]
 *
 * Rank 0 sends a token to rank 1, each worker forwards it to the next, and
 * rank 0 counts laps. A STOP token makes one last lap so that every worker
 * exits cleanly. Every wait is bounded: a lost token is an error, not a hang.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "shm/xport.h"

enum { MSG_TOKEN = 1, MSG_STOP = 2 };
#define WAIT_NS (10ll * 1000000000)

static int next_msg(sr_xport *x, sr_msg *m)
{
    int64_t deadline = sr__now_ns() + WAIT_NS;
    while (!sr__xport_recv_burst(x, m, 1)) {
        int ev = sr__xport_wait(x, deadline);
        if (ev < 0)
            return ev;
        if ((ev & SR_WAKE_PEER) && !sr__ring_ready(x->inbox) && (ev = sr__xport_check_peers(x)))
            return ev;
        if ((ev & SR_WAKE_TIMEOUT) && !sr__ring_ready(x->inbox))
            return sr__fail(-ETIMEDOUT, "demo_ring", "no token for 10 s");
    }
    return 0;
}

static int forward(sr_xport *x, sr_msg *m)
{
    uint64_t lap;
    memcpy(&lap, m->data, sizeof(lap));
    lap += x->rank == 0;
    memcpy(m->data, &lap, sizeof(lap));
    return sr__xport_send_wait(x, (x->rank + 1) % x->world, m, sr__now_ns() + WAIT_NS);
}

int main(int argc, char **argv)
{
    long laps = 20000;
    char *end = NULL;
    if (argc == 2)
        laps = strtol(argv[1], &end, 10);
    if (argc > 2 || (argc == 2 && (end == argv[1] || *end || laps <= 0))) {
        fprintf(stderr, "demo_ring: usage: demo_ring [LAPS], LAPS a positive whole number (got '%s')\n", argv[argc - 1]);
        return 2;
    }
    sr_xport *x;
    int rc = sr__xport_attach(NULL, &x);
    if (rc) {
        fprintf(stderr, "demo_ring: %s\n", sr_last_error());
        return 1;
    }
    sr_msg m = {.type = MSG_TOKEN};
    int64_t t0 = sr__now_ns();
    if (x->rank == 0)
        rc = sr_xport_send(x, 1 % x->world, &m);
    while (!rc && !(rc = next_msg(x, &m))) {
        uint64_t lap;
        memcpy(&lap, m.data, sizeof(lap));
        if (x->rank == 0 && m.type == MSG_STOP)
            break;
        if (x->rank == 0 && lap + 1 >= (uint64_t)laps)
            m.type = MSG_STOP;
        rc = forward(x, &m);
        if (m.type == MSG_STOP && x->rank != 0)
            break;
    }
    if (!rc && x->rank == 0) {
        double us = (double)(sr__now_ns() - t0) / 1e3 / (double)laps;
        printf("demo_ring: %d workers, %ld laps, %.2f us per lap, %.2f us per hop (wakes %llu, sleeps %llu)\n",
               x->world, laps, us, us / x->world, (unsigned long long)x->st.wakes,
               (unsigned long long)x->st.sleeps);
    }
    if (rc)
        fprintf(stderr, "demo_ring: rank %d: %s\n", x->rank, sr_last_error());
    sr__xport_detach(x);
    return rc ? 1 : 0;
}
