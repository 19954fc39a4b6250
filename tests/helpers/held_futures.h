/* SPDX-License-Identifier: MIT */
/* Futures that a test's async function hands out and answers later, all at
 * once (release_holds): the "hold" functions of test_idle_wake.c and
 * test_quiet_waits.c, which keep a call in flight while the test measures.
 * HELD_MAX bounds them; each user passes its own, smaller limit. */
#ifndef SR_TESTS_HELD_FUTURES_H
#define SR_TESTS_HELD_FUTURES_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

#include "shmrpc/shmrpc.h"

#define HELD_MAX 32

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static sr_future *held[HELD_MAX];
static int nheld;

/* A new pending future in *out, also kept for release_holds: 0, -ENOMEM, or
 * -ENOSPC when `max` (at most HELD_MAX) are held already. */
static inline int hold_new(int max, sr_future **out)
{
    sr_future *f = sr_future_new();
    if (!f)
        return -ENOMEM;
    pthread_mutex_lock(&held_lock);
    bool room = nheld < max && nheld < HELD_MAX;
    if (room)
        held[nheld++] = sr_future_ref(f);
    pthread_mutex_unlock(&held_lock);
    if (!room) {
        sr_future_unref(f);
        return -ENOSPC;
    }
    *out = f;
    return 0;
}

/* Answer every held future (None) and forget them. */
static inline void release_holds(void)
{
    pthread_mutex_lock(&held_lock);
    for (int i = 0; i < nheld; i++) {
        sr_future_set_result(held[i], NULL);
        sr_future_unref(held[i]);
    }
    nheld = 0;
    pthread_mutex_unlock(&held_lock);
}

#endif
