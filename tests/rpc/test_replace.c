/* SPDX-License-Identifier: MIT */
/* Replacement in place (sr_spawn's SR_RESTART_RANK; segment.h, "Replacement
 * in place"): a rank killed while the others run gets a new process, a new
 * generation, and the others keep their state and call it again.
 *
 * Three workers: rank 0 drives, rank 1 is the victim, rank 2 a bystander
 * that waits in sr_shutdown (a worker waiting there does not stop its peers
 * from being replaced). Every step waits for an event: the victim's
 * replacement announces itself with a call ("hello") that rank 0's function
 * turns into a futex wake; each wait has a bound and a message.
 *
 * Workers are forked copies of this test process: no Criterion call in them.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "common.h"
#include "error.h"
#include "helpers/replace_events.h"
#include "helpers/shared_word.h"
#include "segment.h"
#include "reorder.h"
#include "rpc_harness.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "shmrpc/tensor.h"
#include "transport.h" /* sr__transport_segment */

LEAK_CHECKED_SUITE(replace);

#define WAIT_S 20
#define WORLD 3

/* Shared by the job's processes (created before sr_spawn). */
struct shared {
    struct replace_freeze fz;  /* rank 1 generation 0, when it stops itself */
    _Atomic int refused_seen;  /* rank 1 generation 1: refused what was sent to generation 0 */
    char log[256];             /* where rank 1 generation 1 writes its stderr */
    bool hold;                 /* scenario 4: rank 2 holds what it sends (the reordering mode) */
    _Atomic uint32_t held;     /* rank 2 holds its call to rank 1 generation 0 */
    _Atomic uint32_t back;     /* rank 1's replacement said hello */
    _Atomic uint32_t counted;  /* calls of "count" that ran, on any generation of rank 1 */
    _Atomic uint32_t attempts; /* scenario 5: attempts of the job rank 0 started in */
    bool early;                /* scenario 6: rank 1's replacement says hello asynchronously */
    _Atomic uint32_t sent;     /* scenario 6: it has (its hello is in rank 0's inbox) */
};
static struct shared *sh;

/* ---- functions every rank registers ---- */
static int fn_gen(sr_call *c) { return sr_call_return(c, sr_int(replace_my_gen())); }

static int fn_die(sr_call *c)
{
    (void)c;
    raise(SIGKILL);
    return 0;
}

static int fn_count(sr_call *c)
{
    atomic_fetch_add(&sh->counted, 1);
    return sr_call_return(c, NULL);
}

static int fn_freeze(sr_call *c)
{
    replace_freeze_self(&sh->fz);
    return sr_call_return(c, NULL); /* never: rank 0 kills it while stopped */
}

/* rank 2: send rank 1 a call and return without waiting for it. */
static int fn_call_victim(sr_call *c)
{
    sr_future *f = NULL;
    int rc = sr_rpc_async(1, "gen", SR_ARGS(), WAIT_S, &f);
    if (rc)
        return sr_call_fail(c, rc, "rank 2 could not call rank 1: %s", sr_last_error());
    sr_future_unref(f); /* its answer, or its failure, is nobody's business */
    return sr_call_return(c, NULL);
}

/* A tensor of 64 Ki floats (a shared-heap block of the caller's... of the
 * callee's: it is allocated here and travels by reference), filled with
 * the value given. */
static int fn_make(sr_call *c)
{
    int64_t shape[1] = {1 << 16};
    sr_tensor *t = sr_full(SR_F32, 1, shape, (double)sr_value_int(sr_call_arg(c, 0)), 0);
    if (!t)
        return sr_call_fail(c, -ENOMEM, "no tensor: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(t);
    sr_tensor_unref(t);
    return sr_call_return(c, v);
}

/* rank 2: wait for rank 1 to be alive here, then ask its generation */
static int fn_ask_victim(sr_call *c)
{
    int rc = sr_wait_for_worker(1, WAIT_S);
    sr_value *v = NULL;
    if (!rc)
        rc = sr_rpc_sync(1, "gen", SR_ARGS(), WAIT_S, &v);
    if (rc)
        return sr_call_fail(c, rc, "rank 2 asking rank 1: %s", sr_last_error());
    return sr_call_return(c, v);
}

/* rank 2 (scenario 3): threads that call rank 1 without pause while it is
 * killed and replaced, each until generation 1 answered it SENDER_ANSWERS
 * times (or REPLACE_WAIT_S passed): the sends race with this worker's
 * taking of the new generation (its peer's doorbell, sr__xport_rejoin). */
#define SENDERS 3
#define SENDER_ANSWERS 8
static pthread_t senders[SENDERS];

static void *sender(void *arg)
{
    (void)arg;
    int64_t end = replace_now_ns() + (int64_t)REPLACE_WAIT_S * 1000000000;
    intptr_t answers = 0;
    while (answers < SENDER_ANSWERS && replace_now_ns() < end) {
        sr_future *f = NULL;
        sr_value *v = NULL;
        if (sr_rpc_async(1, "gen", SR_ARGS(), WAIT_S, &f)) { /* -EPIPE while rank 1 is gone */
            sched_yield();
            continue;
        }
        if (!sr_future_wait(f, &v) && sr_value_int(v) == 1)
            answers++;
        sr_value_unref(v);
        sr_future_unref(f);
    }
    return (void *)answers;
}

static int fn_senders_start(sr_call *c)
{
    for (int i = 0; i < SENDERS; i++)
        if (pthread_create(&senders[i], NULL, sender, NULL))
            return sr_call_fail(c, -EAGAIN, "rank 2: no thread %d", i);
    return sr_call_return(c, NULL);
}

/* How many senders got their answers from generation 1. */
static int fn_senders_join(sr_call *c)
{
    int64_t done = 0;
    for (int i = 0; i < SENDERS; i++) {
        void *answers = NULL;
        pthread_join(senders[i], &answers);
        done += (intptr_t)answers == SENDER_ANSWERS;
    }
    return sr_call_return(c, sr_int(done));
}

/* rank 2 (scenario 6): answer once rank 1's replacement sent its hello. */
static int fn_after_hello(sr_call *c)
{
    if (shared_word_wait(&sh->sent, 1, WAIT_S) < 1)
        return sr_call_fail(c, -ETIMEDOUT, "rank 1's replacement sent no hello within %d s", WAIT_S);
    return sr_call_return(c, NULL);
}

static void register_fns(void)
{
    sr_register("after_hello", fn_after_hello);
    sr_register("senders_start", fn_senders_start);
    sr_register("senders_join", fn_senders_join);
    sr_register("ask_victim", fn_ask_victim);
    sr_register("make", fn_make);
    sr_register("hello", replace_fn_hello);
    sr_register("gen", fn_gen);
    sr_register("die", fn_die);
    sr_register("freeze", fn_freeze);
    sr_register("call_victim", fn_call_victim);
    sr_register("count", fn_count);
}

static int call_int(int to, const char *fn, int64_t *out)
{
    sr_value *v = NULL;
    int rc = sr_rpc_sync(to, fn, SR_ARGS(), WAIT_S, &v);
    if (!rc)
        *out = sr_value_int(v);
    sr_value_unref(v);
    return rc;
}

/* Rank 1 generation 0 stays out of sr_shutdown (where it could not be
 * replaced) until it is killed; the bound fails the job if it never is. */
static int victim_wait(void)
{
    poll(NULL, 0, 3 * WAIT_S * 1000); /* a bound, not a synchronisation: rank 0's kill ends this process */
    return 99;
}

/* A tensor made by rank 1, filled with `value`; NULL on failure. */
static sr_tensor *make_on_victim(int value)
{
    sr_value *v = NULL, *arg = sr_int(value);
    int rc = sr_rpc_sync(1, "make", SR_ARGS(arg), WAIT_S, &v);
    sr_value_unref(arg);
    if (rc)
        return NULL;
    sr_tensor *t = sr_value_tensor(v);
    if (t)
        sr_tensor_ref(t);
    sr_value_unref(v);
    return t;
}

static bool all_equal(const sr_tensor *t, float want)
{
    const float *p = sr_tensor_data(t);
    for (size_t i = 0; i < sr_tensor_numel(t); i++)
        if (p[i] != want)
            return false;
    return true;
}

/* ---- scenario 1: killed, replaced, called again ---- */
static int driver_kill(void)
{
    int64_t g = -1;
    WCHECK(call_int(1, "gen", &g) == 0 && g == 0, "rank 1 before the kill: %s", sr_last_error());
    /* a block the dead process allocated, held past its death: it stays as
     * it was, however much its successor allocates */
    WCHECK(sr_wait_for_worker(1, WAIT_S) == 0, "a live rank: %s", sr_last_error());
    WCHECK(sr_wait_for_worker(WORLD, WAIT_S) == -EINVAL, "rank %d: %s", WORLD, sr_last_error());
    WCHECK(sr_worker_generation(1) == 0 && sr_worker_generation(-1) == -EINVAL, "generations before: %s",
           sr_last_error());
    sr_tensor *kept = make_on_victim(7);
    WCHECK(kept && all_equal(kept, 7.0f), "the tensor from generation 0: %s", sr_last_error());
    sr_value *v = NULL;
    int rc = sr_rpc_sync(1, "die", SR_ARGS(), WAIT_S, &v);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "(generation 0) was killed by signal SIGKILL"),
           "the call rank 1 died in: %d '%s'", rc, sr_last_error());
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    WCHECK(call_int(1, "gen", &g) == 0 && g == 1, "rank 1 after its replacement: %d: %s", (int)g, sr_last_error());
    WCHECK(call_int(2, "ask_victim", &g) == 0 && g == 1, "rank 2 about rank 1: %d: %s", (int)g, sr_last_error());
    WCHECK(sr_worker_generation(1) == 1, "rank 1's generation here: %" PRId64 ": %s", sr_worker_generation(1),
           sr_last_error());
    for (int i = 0; i < 4; i++) {
        sr_tensor *t = make_on_victim(9);
        WCHECK(t && all_equal(t, 9.0f), "a tensor from generation 1: %s", sr_last_error());
        WCHECK(all_equal(kept, 7.0f), "the tensor generation 0 made changed after generation 1 made %d", i + 1);
        sr_tensor_unref(t);
    }
    sr_tensor_unref(kept); /* the last reference to a block of a dead process's area */
    return 0;
}

static int held_across(void);

static int worker(int rank, int world, void *arg)
{
    (void)world;
    int (*driver)(void) = arg;
    register_fns();
    if (rank == 1 && replace_my_gen() > 0 && sh->log[0]) { /* the replacement's lines, for the test to read */
        int fd = open(sh->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        WCHECK(fd >= 0 && dup2(fd, 2) == 2, "stderr to %s", sh->log);
        close(fd);
    }
    if (rank == 2 && sh->hold) /* every message it sends waits 600 s, or for held_across's release */
        WCHECK(!setenv("SHMRPC_REORDER_SEED", "1", 1) && !setenv("SHMRPC_REORDER_MIN_US", "600000000", 1) &&
                   !setenv("SHMRPC_REORDER_MAX_US", "600000000", 1),
               "setenv");
    WCHECK(sr_init(NULL) == 0, "rank %d generation %u: sr_init: %s", rank, replace_my_gen(), sr_last_error());
    if (rank == 2 && sh->hold && held_across())
        return 1;
    if (rank == 1) {
        if (replace_my_gen() == 0)
            return victim_wait();
        if (sh->early) {
            sr_future *f = NULL;
            WCHECK(sr_rpc_async(0, "hello", SR_ARGS(), WAIT_S, &f) == 0, "hello: %s", sr_last_error());
            shared_word_bump(&sh->sent);
            int rc = sr_future_wait(f, NULL);
            sr_future_unref(f);
            WCHECK(rc == 0, "hello: %s", sr_last_error());
        } else {
            WCHECK(sr_rpc_sync(0, "hello", SR_ARGS(), WAIT_S, NULL) == 0, "hello: %s", sr_last_error());
        }
        /* relaxed: read by this process only, after the hello's answer,
         * which came after anything older in this inbox */
        atomic_store(&sh->refused_seen, (int)atomic_load_explicit(&sr__agent->refused, memory_order_relaxed));
    }
    if (rank == 0) {
        int rc = driver();
        if (rc)
            return rc;
    }
    int sd = sr_shutdown(true, 3 * WAIT_S);
    WCHECK(sd == 0, "rank %d generation %u: graceful shutdown: %s", rank, replace_my_gen(), sr_last_error());
    return 0;
}

static int spawn(const char *name, int (*driver)(void), int max)
{
    sr_spawn_opts o = {.name_prefix = test_ns(name), .shm_size = WORLD * (64u << 20), .restart = SR_RESTART_RANK,
                       .max_restarts = max};
    return sr_spawn(WORLD, worker, (void *)driver, &o);
}

Test(replace, a_killed_rank_is_replaced_and_called_again, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    int rc = spawn("replace1", driver_kill, 1);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* Without budget the same kill ends the job, as without the policy. */
Test(replace, no_budget_no_replacement, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    int rc = spawn("replace0", driver_kill, 0);
    cr_assert_eq(rc, -SR_EWORKER, "job: %d: %s", rc, sr_last_error());
    cr_assert(strstr(sr_last_error(), "rank 1") && strstr(sr_last_error(), "SIGKILL"), "%s", sr_last_error());
}

static int driver_refuse(void)
{
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(1, "freeze", SR_ARGS(), WAIT_S, &f) == 0, "freeze: %s", sr_last_error());
    WCHECK(replace_wait_stopped(&sh->fz) == 0, "rank 1 did not stop within %d s", WAIT_S);
    /* rank 2's call waits in the stopped rank's inbox, stamped for generation 0 */
    WCHECK(sr_rpc_sync(2, "call_victim", SR_ARGS(), WAIT_S, NULL) == 0, "call_victim: %s", sr_last_error());
    WCHECK(kill(atomic_load(&sh->fz.pid), SIGKILL) == 0, "kill: %s", strerror(errno));
    int rc = sr_future_wait(f, NULL); /* bounded: the call has a timeout of WAIT_S */
    WCHECK(rc == -EPIPE, "the freeze call ended with %d: %s", rc, sr_last_error());
    sr_future_unref(f);
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    int64_t g = -1;
    WCHECK(call_int(1, "gen", &g) == 0 && g == 1, "rank 1 after its replacement: %d: %s", (int)g, sr_last_error());
    return 0;
}

Test(replace, a_message_to_the_dead_generation_is_refused_by_the_next, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    snprintf(sh->log, sizeof(sh->log), "/tmp/%s.log", test_ns("replace2"));
    int rc = spawn("replace2", driver_refuse, 1);
    char text[4096] = "";
    FILE *f = fopen(sh->log, "r");
    size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    text[n] = 0;
    if (f)
        fclose(f);
    unlink(sh->log);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
    cr_assert_geq(atomic_load(&sh->refused_seen), 1, "the replacement refused nothing; its stderr:\n%s", text);
    cr_assert(strstr(text, "refused a message (type 1) from worker2 generation 0 to worker1 generation 0: it was "
                           "sent to an older generation: this is generation 1"),
              "the replacement's stderr:\n%s", text);
}

/* ---- scenario 4: a message held across the replacement of its destination ---- */

/* Rank 2: a call to rank 1 generation 0 that waits in this worker (the
 * reordering mode) until rank 1 has died and its replacement is known
 * here; then it is released. Stamped as it is sent, it would reach
 * generation 1, which would run it, and the quiescence waves of the
 * graceful shutdown would never agree (it was counted for generation 0). */
static int held_across(void)
{
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(1, "count", SR_ARGS(), WAIT_S, &f) == 0, "count: %s", sr_last_error());
    shared_word_bump(&sh->held);
    WCHECK(shared_word_wait(&sh->back, 1, WAIT_S) >= 1, "rank 1's replacement was not back within %d s", WAIT_S);
    WCHECK(sr_wait_for_worker(1, WAIT_S) == 0, "rank 1's replacement, seen from rank 2: %s", sr_last_error());
    int rc = sr_future_wait(f, NULL);
    WCHECK(rc == -EPIPE, "the call held for generation 0 ended with %d: %s", rc, sr_last_error());
    sr_future_unref(f);
    sr__reorder_pump(sr__agent, INT64_MAX, sr__agent_send_now); /* as if its time had come */
    return 0;
}

static int driver_held(void)
{
    WCHECK(shared_word_wait(&sh->held, 1, WAIT_S) >= 1, "rank 2 did not hold its call within %d s", WAIT_S);
    int rc = sr_rpc_sync(1, "die", SR_ARGS(), WAIT_S, NULL);
    WCHECK(rc == -EPIPE, "the call rank 1 died in: %d '%s'", rc, sr_last_error());
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    shared_word_bump(&sh->back);
    return 0;
}

Test(replace, a_message_held_for_a_dead_generation_is_dropped, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    sh->hold = true;
    int rc = spawn("replace4", driver_held, 1);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
    cr_assert_eq(atomic_load(&sh->counted), 0, "rank 1's replacement ran a call meant for generation 0");
}

/* ---- scenario 6: the replacement's first message comes before its return is taken ---- */

/* What the callback of the call rank 1 died in saw (rank 0's process). */
static int early_rc = 1;
static uint64_t early_held, early_refused;

/* Runs on the thread that handles rank 1's death, inside that handling
 * (the call's failure is part of it): its nested call polls on, and the
 * replacement's hello, which rank 2 answers after, arrives meanwhile. */
static void early_cb(sr_future *f, void *arg)
{
    (void)f, (void)arg;
    early_rc = sr_rpc_sync(2, "after_hello", SR_ARGS(), WAIT_S, NULL);
    /* relaxed: statistics, read by the thread that counts them (the token holder's) or after it */
    early_held = atomic_load_explicit(&sr__agent->held_early, memory_order_relaxed);
    early_refused = atomic_load_explicit(&sr__agent->refused, memory_order_relaxed);
}

static int driver_early(void)
{
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(1, "freeze", SR_ARGS(), WAIT_S, &f) == 0, "freeze: %s", sr_last_error());
    WCHECK(replace_wait_stopped(&sh->fz) == 0, "rank 1 did not stop within %d s", WAIT_S);
    WCHECK(sr_future_add_done_callback(f, early_cb, NULL) == 0, "callback: %s", sr_last_error());
    WCHECK(kill(atomic_load(&sh->fz.pid), SIGKILL) == 0, "kill: %s", strerror(errno));
    int rc = sr_future_wait(f, NULL); /* bounded: the call has a timeout of WAIT_S */
    WCHECK(rc == -EPIPE, "the freeze call ended with %d: %s", rc, sr_last_error());
    sr_future_unref(f);
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement's hello was not served within %d s", WAIT_S);
    WCHECK(early_rc == 0, "the callback's call to rank 2: %d", early_rc);
    WCHECK(early_held == 1 && early_refused == 0,
           "the hello that came while rank 1's death was handled: %" PRIu64 " held, %" PRIu64 " refused (want 1, 0)",
           early_held, early_refused);
    int64_t g = -1;
    WCHECK(call_int(1, "gen", &g) == 0 && g == 1, "rank 1 after its replacement: %d: %s", (int)g, sr_last_error());
    return 0;
}

Test(replace, a_message_from_a_return_not_taken_yet_waits_for_it, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    sh->early = true;
    int rc = spawn("replace6", driver_early, 1);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* ---- scenario 3: replaced while a peer's threads call it ---- */
static int driver_senders(void)
{
    WCHECK(sr_rpc_sync(2, "senders_start", SR_ARGS(), WAIT_S, NULL) == 0, "senders_start: %s", sr_last_error());
    int rc = sr_rpc_sync(1, "die", SR_ARGS(), WAIT_S, NULL);
    WCHECK(rc == -EPIPE, "the call rank 1 died in: %d '%s'", rc, sr_last_error());
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    sr_value *v = NULL; /* the senders' own bound is REPLACE_WAIT_S: the join's is above it */
    rc = sr_rpc_sync(2, "senders_join", SR_ARGS(), 2 * WAIT_S, &v);
    int64_t n = rc ? -1 : sr_value_int(v);
    sr_value_unref(v);
    WCHECK(n == SENDERS, "rank 2's senders answered by generation 1: %d of %d: %s", (int)n, SENDERS,
           rc ? sr_last_error() : "");
    return 0;
}

Test(replace, a_rank_is_replaced_while_a_peers_threads_call_it, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    int rc = spawn("replace3", driver_senders, 1);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* ---- scenario 5: a death inside sr_shutdown restarts the whole job ---- */

/* This attempt's number (SHMRPC_RESTART_COUNT; 0: the first). */
static unsigned my_attempt(void)
{
    const char *a = getenv("SHMRPC_RESTART_COUNT");
    return a ? (unsigned)atoi(a) : 0;
}

/* Until rank's line says CLOSING (it entered sr_shutdown), bounded. A
 * worker's state has no futex wake: yield between looks. */
static int closing_wait(int rank)
{
    struct sr_worker_info *w = sr__seg_worker(sr__transport_segment(sr__agent->tports), rank);
    int64_t end = replace_now_ns() + (int64_t)WAIT_S * 1000000000;
    /* acquire: pairs with the worker's release store of CLOSING */
    while (atomic_load_explicit(&w->state, memory_order_acquire) != SR_WORKER_CLOSING) {
        if (replace_now_ns() > end)
            return -ETIMEDOUT;
        sched_yield();
    }
    return 0;
}

/* Rank 0 of the first attempt: (spend: rank 1 killed and replaced first,
 * spending the budget), then rank 2, waiting in sr_shutdown, dies serving
 * "die" there. The supervisor stops this attempt: wait for it, bounded. */
static int driver_closing_death(bool spend)
{
    if (spend) {
        WCHECK(sr_rpc_sync(1, "die", SR_ARGS(), WAIT_S, NULL) == -EPIPE, "the call rank 1 died in: %s",
               sr_last_error());
        WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    }
    WCHECK(closing_wait(2) == 0, "rank 2 did not enter sr_shutdown within %d s", WAIT_S);
    int rc = sr_rpc_sync(2, "die", SR_ARGS(), WAIT_S, NULL);
    WCHECK(rc == -EPIPE, "the call rank 2 died in: %d '%s'", rc, sr_last_error());
    return victim_wait();
}

/* arg: non-NULL to spend the budget on a replacement first. Every later
 * attempt only shuts down. */
static int worker_closing(int rank, int world, void *arg)
{
    (void)world;
    register_fns();
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0)
        atomic_fetch_add(&sh->attempts, 1);
    if (my_attempt() == 0 && rank == 1 && arg)
        if (replace_my_gen() == 0)
            return victim_wait();
    if (my_attempt() == 0 && rank == 1 && replace_my_gen() > 0)
        WCHECK(sr_rpc_sync(0, "hello", SR_ARGS(), WAIT_S, NULL) == 0, "hello: %s", sr_last_error());
    if (my_attempt() == 0 && rank == 0)
        return driver_closing_death(arg != NULL);
    int sd = sr_shutdown(true, 3 * WAIT_S);
    WCHECK(sd == 0, "rank %d attempt %u: graceful shutdown: %s", rank, my_attempt(), sr_last_error());
    return 0;
}

/* sr_spawn of fn(arg) replacing ranks, its stderr (the supervisor's lines) in report. */
static int spawn_stderr(const char *name, int max, int (*fn)(int, int, void *), void *arg, char *report, size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "/tmp/%s.err", test_ns(name));
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600), saved = dup(2);
    cr_assert(fd >= 0 && saved >= 0 && dup2(fd, 2) == 2, "stderr to %s: %s", path, strerror(errno));
    sr_spawn_opts o = {.name_prefix = test_ns(name), .shm_size = WORLD * (64u << 20), .restart = SR_RESTART_RANK,
                       .max_restarts = max};
    int rc = sr_spawn(WORLD, fn, arg, &o);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, report, len - 1, 0);
    report[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    return rc;
}

/* A job of worker_closing: its status and attempts as wanted; its
 * stderr in report. */
static void run_closing(const char *name, int max, bool spend, int want_rc, unsigned want_attempts, char *report,
                        size_t len)
{
    sh = shared_page(sizeof(*sh));
    int rc = spawn_stderr(name, max, worker_closing, spend ? (void *)1 : NULL, report, len);
    cr_assert_eq(rc, want_rc, "job: %d: %s\nstderr:\n%s", rc, sr_last_error(), report);
    cr_assert_eq(atomic_load(&sh->attempts), want_attempts, "attempts: %u; stderr:\n%s", atomic_load(&sh->attempts),
                 report);
}

/* A rank that dies inside sr_shutdown cannot be replaced in place (its
 * successor would arrive at the shutdown again): the whole job restarts,
 * from the same budget, and says why. */
Test(replace, a_death_inside_sr_shutdown_restarts_the_job, .timeout = 120)
{
    char report[8192];
    run_closing("replace5", 1, false, 0, 2, report, sizeof(report));
    cr_assert(strstr(report, "rank 2 (pid ") &&
                  strstr(report, "was killed by signal SIGKILL; not replaced in place (it died inside sr_shutdown): "
                                 "restarting the job (restart 1; 1 of 1 replacements and restarts spent)"),
              "stderr:\n%s", report);
}

/* The same death once a replacement spent the budget ends the job. */
Test(replace, a_death_inside_sr_shutdown_without_budget_ends_the_job, .timeout = 120)
{
    char report[8192];
    run_closing("replace6", 1, true, -SR_EWORKER, 1, report, sizeof(report));
    cr_assert(strstr(report, "replacement 1 of 1)") && strstr(report, "rank 2 (pid ") &&
                  strstr(report, "was killed by signal SIGKILL; stopped the other 2 workers"),
              "stderr:\n%s", report);
}

/* Budget for both: rank 1 replaced, then the restart, the last of two. */
Test(replace, replacements_and_restarts_share_one_budget, .timeout = 120)
{
    char report[8192];
    run_closing("replace7", 2, true, 0, 2, report, sizeof(report));
    cr_assert(strstr(report, "replacement 1 of 2)") &&
                  strstr(report, "restarting the job (restart 1; 2 of 2 replacements and restarts spent)"),
              "stderr:\n%s", report);
}

/* A death before every worker attached, in a job that replaces ranks:
 * not in place either (the others wait in sr_init's start barrier for
 * it); the job restarts and says why. Rank 0 records the attempt it runs
 * in (1 + SHMRPC_RESTART_COUNT), not a count of its starts: the restart
 * may stop the first attempt's rank 0 before it has run a line. */
static int worker_early(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    if (rank == 0)
        atomic_store(&sh->attempts, my_attempt() + 1);
    if (rank == 1 && my_attempt() == 0)
        raise(SIGKILL);
    register_fns();
    WCHECK(sr_init(NULL) == 0, "rank %d attempt %u: sr_init: %s", rank, my_attempt(), sr_last_error());
    int sd = sr_shutdown(true, 3 * WAIT_S);
    WCHECK(sd == 0, "rank %d attempt %u: graceful shutdown: %s", rank, my_attempt(), sr_last_error());
    return 0;
}

Test(replace, a_death_before_every_worker_attached_restarts_the_job, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    char report[8192];
    int rc = spawn_stderr("replace8", 1, worker_early, NULL, report, sizeof(report));
    cr_assert_eq(rc, 0, "job: %d: %s\nstderr:\n%s", rc, sr_last_error(), report);
    cr_assert_eq(atomic_load(&sh->attempts), 2, "attempts: %u; stderr:\n%s", atomic_load(&sh->attempts), report);
    cr_assert(strstr(report, "rank 1 (pid ") &&
                  strstr(report, "not replaced in place (it died before every worker had attached): restarting "
                                 "the job (restart 1; 1 of 1 replacements and restarts spent)"),
              "stderr:\n%s", report);
}
