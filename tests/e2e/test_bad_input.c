/* SPDX-License-Identifier: MIT */
/* Bad input that used to crash or lie. Each test
 * is named after what broke:
 *   - NULL futures crashed every sr_future_* call;
 *   - sr_strerror(INT_MIN) negated INT_MIN;
 *   - reshape/view/expand accepted shapes whose element count wraps around
 *     to the tensor's (a 6-element tensor viewed as [8589934595,
 *     6148914685509894146]), and a remote reshape sent such a view back;
 *   - the segment's memfd was mode 0777 without an exec seal;
 *   - a huge timeout wrapped around and expired at once; a tiny default
 *     timeout became "none"; NaN, infinities and negatives were ignored or
 *     converted with undefined behaviour;
 *   - a worker name of 128 characters or more was truncated, not refused;
 *   - a response from any rank completed a call sent to another one.
 * Suite bad_input runs in one process (unit); bad_input_mp runs jobs
 * (integration). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "heap.h"
#include "agent.h"
#include "payload.h"
#include "rpc_harness.h"
#include "segment.h"
#include "shmrpc/data.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/future.h"
#include "shmrpc/nn.h"
#include "shmrpc/optim.h"
#include "shmrpc/rref.h"
#include "shmrpc/tensor.h"
#include "tensor_impl.h"
#include "waiter.h"

LEAK_CHECKED_SUITE(bad_input);
LEAK_CHECKED_SUITE(bad_input_mp);

#define SHAPE(...) (const int64_t[]){__VA_ARGS__}

static void assert_msg(const char *want)
{
    cr_assert(strstr(sr_last_error(), want), "sr_last_error() is '%s'; it should name '%s'", sr_last_error(), want);
}

/* ---- futures -------------------------------------------------------------------- */

Test(bad_input, null_future_is_einval_not_a_crash)
{
    sr_value *v = sr_int(1), *out = NULL;
    cr_assert_eq(sr_future_value(NULL, &out), -EINVAL);
    assert_msg("sr_future_value: future is NULL");
    cr_assert_null(out);
    cr_assert_not(sr_future_done(NULL));
    assert_msg("sr_future_done: future is NULL");
    cr_assert_eq(sr_future_set_result(NULL, v), -EINVAL);
    assert_msg("sr_future_set_result: future is NULL");
    cr_assert_eq(sr_future_set_error(NULL, -EIO, "x %d", 1), -EINVAL);
    assert_msg("sr_future_set_error: future is NULL");
    cr_assert_null(sr_future_ref(NULL));
    assert_msg("sr_future_ref: future is NULL");
    sr_future_unref(NULL); /* a no-op, as free(NULL) */
    cr_assert_eq(sr_future_wait(NULL, &out), -EINVAL);
    sr_future *child = NULL;
    cr_assert_eq(sr_future_then(NULL, NULL, NULL, &child), -EINVAL);
    cr_assert_eq(sr_future_add_done_callback(NULL, NULL, NULL), -EINVAL);
    sr_value_unref(v);
}

/* A NULL format is an empty message (UBSan: a NULL format reached vsnprintf). */
Test(bad_input, future_set_error_with_a_null_format)
{
    sr_future *f = sr_future_new();
    cr_assert_eq(sr_future_set_error(f, -EIO, NULL), 0, "%s", sr_last_error());
    cr_assert_eq(sr_future_wait(f, NULL), -EIO);
    cr_assert_str_eq(sr_last_error(), "");
    sr_future_unref(f);
}

/* ---- other NULL handles ---------------------------------------------------------- */

/* The accessors a probe of every public function with NULL pointers found
 * crashing (or, for shape/strides/options, making a pointer from NULL). */
Test(bad_input, null_handles_to_accessors_are_einval_not_crashes)
{
    cr_assert_eq(sr_tensor_ndim(NULL), -EINVAL);
    assert_msg("sr_tensor_ndim: tensor is NULL");
    cr_assert_eq((int)sr_tensor_dtype(NULL), -1);
    cr_assert_null(sr_tensor_shape(NULL));
    cr_assert_null(sr_tensor_strides(NULL));
    cr_assert_eq(sr_tensor_size(NULL, 0), -1);
    cr_assert_eq(sr_tensor_numel(NULL), 0);
    cr_assert_not(sr_tensor_is_contiguous(NULL));
    cr_assert_null(sr_tensor_data(NULL));
    assert_msg("sr_tensor_data: tensor is NULL");

    cr_assert_eq(sr_dataset_size(NULL), -EINVAL);
    cr_assert_eq(sr_dataset_features(NULL), -EINVAL);
    cr_assert_null(sr_dataset_pixels(NULL, 0));
    cr_assert_eq(sr_dataset_label(NULL, 0), -1);
    assert_msg("sr_dataset_label: data set is NULL");

    sr_generator_init(NULL, 1);
    assert_msg("sr_generator_init: generator is NULL");
    cr_assert_eq(sr_generator_next(NULL), 0);
    cr_assert(isnan(sr_generator_uniform(NULL)));
    cr_assert_eq(sr_generator_below(NULL, 10), 0);
    cr_assert_eq(sr_module_numel(NULL), 0);
    sr_module_zero_grad(NULL);
    assert_msg("sr_module_zero_grad: module is NULL");
    cr_assert_eq((int)sr_optim_kind_of(NULL), -EINVAL);
    cr_assert_null(sr_optim_options(NULL));

    cr_assert_eq(sr_call_nargs(NULL), 0);
    cr_assert_null(sr_call_arg(NULL, 0));
    cr_assert_eq(sr_call_caller(NULL), -EINVAL);
    sr_value *v = sr_int(1);
    cr_assert_eq(sr_call_return(NULL, v), -EINVAL); /* and v, given away, is dropped: no leak */
    cr_assert_eq(sr_call_fail(NULL, -EIO, "x"), -EINVAL);
    assert_msg("sr_call_fail: call is NULL");
    cr_assert_str_eq(sr_rref_str(NULL, NULL, 16), "");
}

/* ---- sr_strerror ---------------------------------------------------------------- */

Test(bad_input, strerror_of_int_min_does_not_negate_it)
{
    const char *s = sr_strerror(INT_MIN);
    cr_assert(s && *s, "sr_strerror(INT_MIN) gave no text");
    cr_assert_str_eq(sr_strerror(-EINVAL), sr_strerror(EINVAL));
    cr_assert_str_eq(sr_strerror(-SR_EREMOTE), "the remote function failed");
}

/* ---- tensor shapes -------------------------------------------------------------- */

/* 8589934595 * 6148914685509894146 is 6 modulo 2^64. */
#define WRAPS_TO_6 SHAPE(8589934595LL, 6148914685509894146LL)

Test(bad_input, reshape_and_view_refuse_a_shape_whose_count_wraps)
{
    sr_tensor *t = sr_zeros(SR_F32, 1, SHAPE(6), 0);
    cr_assert(t, "%s", sr_last_error());
    sr_tensor *r = sr_reshape(t, 2, WRAPS_TO_6);
    cr_assert_null(r, "sr_reshape accepted a shape of 2^64 + 6 elements for a 6-element tensor");
    assert_msg("sr_reshape");
    assert_msg("is invalid for input of size 6");
    sr_tensor *v = sr_view(t, 2, WRAPS_TO_6);
    cr_assert_null(v, "sr_view accepted a shape of 2^64 + 6 elements");
    assert_msg("sr_view");
    /* with an inferred dimension too: the known part wraps to 6, so -1 would be 1 */
    cr_assert_null(sr_reshape(t, 3, SHAPE(8589934595LL, 6148914685509894146LL, -1)));
    assert_msg("is invalid for input of size 6");
    /* the same shape for a new tensor was refused already */
    cr_assert_null(sr_zeros(SR_F32, 2, WRAPS_TO_6, 0));
    assert_msg("too many elements");
    /* a valid reshape still works */
    r = sr_reshape(t, 2, SHAPE(3, -1));
    cr_assert(r && sr_tensor_shape(r)[1] == 2, "%s", sr_last_error());
    sr_tensor_unref(r);
    sr_tensor_unref(t);
}

Test(bad_input, expand_refuses_an_element_count_that_overflows)
{
    sr_tensor *t = sr_zeros(SR_F32, 1, SHAPE(1), 0);
    cr_assert(t, "%s", sr_last_error());
    sr_tensor *e = sr_expand(t, 3, SHAPE(1LL << 40, 1LL << 40, 1LL << 40));
    cr_assert_null(e, "sr_expand made a view of 2^120 elements");
    assert_msg("sr_expand");
    assert_msg("too many elements");
    e = sr_expand(t, 2, SHAPE(3, 4)); /* a valid one still works */
    cr_assert(e && sr_tensor_numel(e) == 12, "%s", sr_last_error());
    sr_tensor_unref(e);
    sr_tensor_unref(t);
}

/* ceil(size / split_size) was computed as (size + split_size - 1) / split_size:
 * a huge split_size overflowed (UBSan) and gave -1 pieces, i.e. -EPERM. */
Test(bad_input, split_with_a_huge_split_size_is_one_piece)
{
    sr_tensor *t = sr_zeros(SR_F32, 1, SHAPE(5), 0), *out[2] = {NULL, NULL};
    cr_assert(t, "%s", sr_last_error());
    cr_assert_eq(sr_split(t, INT64_MAX, 0, NULL), 1, "%s", sr_last_error());
    cr_assert_eq(sr_split(t, INT64_MAX, 0, out), 1, "%s", sr_last_error());
    cr_assert(out[0] && sr_tensor_numel(out[0]) == 5);
    sr_tensor_unref(out[0]);
    cr_assert_eq(sr_split(t, 2, 0, NULL), 3); /* ceil(5 / 2) still */
    sr_tensor_unref(t);
}

/* With no arrays, a count of SIZE_MAX used to walk 2^64 NULL entries: a hang. */
Test(bad_input, freeing_no_arrays_returns_whatever_the_count, .timeout = 10)
{
    sr_dist_autograd_gradients_free(SIZE_MAX, NULL, NULL);
    sr_optim_state_free(SIZE_MAX, NULL, NULL);
}

/* ---- the segment ---------------------------------------------------------------- */

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020
#endif

/* Does this kernel know MFD_NOEXEC_SEAL (Linux 6.3)? */
static bool kernel_has_noexec_seal(void)
{
    int fd = memfd_create("probe", MFD_CLOEXEC | MFD_NOEXEC_SEAL);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

Test(bad_input, segment_is_mode_0600_and_exec_sealed)
{
    sr_segment seg;
    sr_segment_opts o = {.world_size = 1, .ring_slots = 64, .name = test_ns("mode")};
    o.size = sr__segment_fixed_size(1, 64) + SR_HEAP_MIN;
    cr_assert_eq(sr__segment_create(&o, &seg), 0, "sr__segment_create: %s", sr_last_error());
    struct stat st;
    cr_assert_eq(fstat(seg.fd, &st), 0);
    unsigned mode = st.st_mode & 07777;
    int seals = fcntl(seg.fd, F_GET_SEALS);
    sr__segment_detach(&seg, true);
    cr_assert_eq(mode, 0600, "the segment's memfd has mode %04o, want 0600", mode);
    if (kernel_has_noexec_seal())
        cr_assert(seals >= 0 && (seals & F_SEAL_EXEC), "the segment has seals %#x, without F_SEAL_EXEC", seals);
    else
        cr_log_warn("this kernel has no MFD_NOEXEC_SEAL: only the mode is checked");
}

/* ---- jobs: shared flags ---------------------------------------------------------- */

/* Words shared by a job's processes (mapped before sr_spawn). */
struct shared {
    _Atomic uint32_t release;  /* rank 1's parked function returns once set */
    _Atomic uint32_t ready;    /* first step of a scenario done (see each) */
    _Atomic uint32_t done;     /* second step done */
    _Atomic uint64_t call_id;  /* stray response: rank 0's call to rank 1 */
};
static struct shared *sh;

static void flag_set(_Atomic uint32_t *w)
{
    atomic_store_explicit(w, 1, memory_order_release); /* pairs with the acquire load in flag_wait */
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wait until *w is set, at most limit_s seconds; false on timeout. */
static bool flag_wait(_Atomic uint32_t *w, int limit_s)
{
    struct timespec end, now;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += limit_s;
    while (!atomic_load_explicit(w, memory_order_acquire)) { /* pairs with flag_set's release store */
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
            return false;
        struct timespec slice = {.tv_sec = 1};
        syscall(SYS_futex, w, FUTEX_WAIT, 0, &slice, NULL, 0);
    }
    return true;
}

/* Returns 7 once the test releases it. */
static int fn_park(sr_call *c)
{
    if (!flag_wait(&sh->release, 120))
        return sr_call_fail(c, -ETIMEDOUT, "park: never released");
    return sr_call_return(c, sr_int(7));
}

static void register_park(void) { sr_register("park", fn_park); }

static void new_shared(void)
{
    sh = shared_page(sizeof(*sh));
    memset(sh, 0, sizeof(*sh));
}

/* ---- timeouts ------------------------------------------------------------------- */

/* 18446744073.710 s is 18446744073710 ms, whose nanoseconds wrap to 448384:
 * the deadline used to be "now + 0.45 ms". */
#define WRAPPING_TIMEOUT_S 18446744073.710

static int sc_huge_timeout(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_future *huge = NULL, *small = NULL;
    WCHECK(sr_rpc_async(1, "park", SR_ARGS(), WRAPPING_TIMEOUT_S, &huge) == 0, "huge: %s", sr_last_error());
    /* Its deadline is later than huge's wrapped one: once it has expired,
     * the expiry scan has seen huge's deadline too. */
    WCHECK(sr_rpc_async(1, "park", SR_ARGS(), 0.05, &small) == 0, "small: %s", sr_last_error());
    WEXPECT_ERR(sr_future_wait(small, NULL), -ETIMEDOUT, "RPC ran for more than set timeout (50 ms)");
    bool early = sr_future_done(huge);
    int hrc = early ? sr_future_value(huge, NULL) : 0;
    flag_set(&sh->release);
    WCHECK(!early, "a call with a timeout of %.3f s expired at once (%d: %s)", WRAPPING_TIMEOUT_S, hrc,
           sr_last_error());
    sr_value *v = NULL;
    WCHECK(sr_future_wait(huge, &v) == 0 && sr_value_int(v) == 7, "huge: %s", sr_last_error());
    sr_value_unref(v);
    sr_future_unref(huge);
    sr_future_unref(small);
    return 0;
}

Test(bad_input_mp, a_timeout_past_int64_nanoseconds_does_not_expire_at_once, .timeout = 120)
{
    new_shared();
    RUN_JOB("hugeto", 2, .scenario = sc_huge_timeout, .register_fns = register_park);
}

static int sc_timeout_values(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    double before = sr_get_rpc_timeout();
    /* Refused, and the default stays. */
    double bad[] = {NAN, -INFINITY, -1, -1e-9};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        WEXPECT_ERR(sr_set_rpc_timeout(bad[i]), -EINVAL, "sr_set_rpc_timeout: timeout");
        WCHECK(sr_get_rpc_timeout() == before, "sr_set_rpc_timeout(%g) changed the default to %g", bad[i],
               sr_get_rpc_timeout());
    }
    sr_value *v = NULL;
    WEXPECT_ERR(sr_rpc_sync(1, "park", SR_ARGS(), NAN, &v), -EINVAL, "timeout nan");
    WEXPECT_ERR(sr_rpc_sync(1, "park", SR_ARGS(), -INFINITY, &v), -EINVAL, "timeout -inf");
    WEXPECT_ERR(sr_shutdown(true, NAN), -EINVAL, "sr_shutdown: timeout nan");
    WEXPECT_ERR(sr_shutdown(true, -1), -EINVAL, "sr_shutdown: timeout -1");
    WCHECK(sr_rank() == 0, "a refused sr_shutdown tore the worker down");
    /* Clamped to the documented maximum, never converted with overflow. */
    WCHECK(sr_set_rpc_timeout(1e300) == 0, "1e300: %s", sr_last_error());
    WCHECK(sr_get_rpc_timeout() == SR_MAX_RPC_TIMEOUT, "1e300 gave a default of %g s, want %g", sr_get_rpc_timeout(),
           (double)SR_MAX_RPC_TIMEOUT);
    /* A tiny default is the smallest timeout, not "none". */
    WCHECK(sr_set_rpc_timeout(1e-9) == 0, "1e-9: %s", sr_last_error());
    WCHECK(sr_get_rpc_timeout() == 0.001, "a default of 1e-9 s became %g s, not none", sr_get_rpc_timeout());
    WEXPECT_ERR(sr_rpc_sync(1, "park", SR_ARGS(), 0, &v), -ETIMEDOUT, "RPC ran for more than set timeout (1 ms)");
    flag_set(&sh->release);
    WCHECK(sr_set_rpc_timeout(SR_TIMEOUT_NONE) == 0 && isinf(sr_get_rpc_timeout()), "none: %s", sr_last_error());
    return 0;
}

Test(bad_input_mp, timeout_values_are_refused_clamped_or_rounded_up, .timeout = 120)
{
    new_shared();
    RUN_JOB("tovals", 2, .scenario = sc_timeout_values, .register_fns = register_park);
}

/* ---- worker names ---------------------------------------------------------------- */

static int long_name_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    char name[201];
    memset(name, 'a', 200);
    name[200] = '\0';
    sr_init_opts o = {.name = name};
    WEXPECT_ERR(sr_init(&o), -EINVAL, "Worker name must be shorter than 128 characters, got 200");
    name[128] = '\0'; /* exactly 128: still too long */
    WEXPECT_ERR(sr_init(&o), -EINVAL, "got 128");
    name[127] = '\0';
    name[0] = (char)('a' + rank); /* 127: the longest valid name, unique per rank */
    WCHECK(sr_init(&o) == 0, "a 127-character name: %s", sr_last_error());
    WCHECK(strlen(sr_worker_name(rank)) == 127, "the name is %zu characters", strlen(sr_worker_name(rank)));
    WCHECK(sr_shutdown(true, 60) == 0, "shutdown: %s", sr_last_error());
    return 0;
}

Test(bad_input_mp, a_worker_name_of_128_characters_is_refused_not_truncated, .timeout = 120)
{
    sr_spawn_opts o = {.name_prefix = test_ns("names"), .shm_size = 2 * (64u << 20)};
    cr_assert_eq(sr_spawn(2, long_name_worker, NULL, &o), 0, "%s", sr_last_error());
}

/* ---- a remote reshape ------------------------------------------------------------ */

/* This worker's shared blocks alive now. */
static uint64_t live_blocks(void)
{
    sr_heap_counters c;
    sr__heap_counters_get(&c);
    return c.allocs - c.local_frees - c.drained;
}

/* Rank 1: every block it allocated for the call comes back once rank 0 is
 * done with the answer (through the remote-free list: drained here). */
static int callee_leaks_nothing(void)
{
    uint64_t base = live_blocks();
    flag_set(&sh->ready);
    WCHECK(flag_wait(&sh->done, 60), "rank 0 never finished");
    int64_t end = sr__now_ns() + 30 * INT64_C(1000000000);
    while (live_blocks() > base && sr__now_ns() < end) {
        sr__heap_drain();
        sched_yield();
    }
    WCHECK(live_blocks() == base, "the failed remote reshape leaked %llu of worker1's heap blocks",
           (unsigned long long)(live_blocks() - base));
    return 0;
}

static int sc_remote_reshape(int rank, int world)
{
    (void)world;
    if (rank == 1)
        return callee_leaks_nothing();
    WCHECK(flag_wait(&sh->ready, 60), "rank 1 never took its baseline");
    sr_tensor *t = sr_zeros(SR_F32, 1, SHAPE(6), 0);
    WCHECK(t, "%s", sr_last_error());
    sr_block *b = t->storage->block;
    uint32_t before = sr__block_refcount(b);
    sr_value *x = sr_value_from_tensor(t), *shape[2] = {sr_int(8589934595LL), sr_int(6148914685509894146LL)};
    sr_value *list = sr_list(2, shape), *v = NULL;
    int rc = sr_rpc_sync(1, "reshape", SR_ARGS(x, list), SR_TIMEOUT_NONE, &v);
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", sr_last_error());
    /* The callee drops its reference to our block after it answers: wait
     * for that (bounded), then only ours must be left. */
    int64_t end = sr__now_ns() + 30 * INT64_C(1000000000);
    while (sr__block_refcount(b) > before && sr__now_ns() < end)
        sched_yield();
    uint32_t left = sr__block_refcount(b);
    sr_value_unref(x);
    sr_tensor_unref(t);
    sr_value_unref(list);
    sr_value_unref(shape[0]);
    sr_value_unref(shape[1]);
    flag_set(&sh->done); /* on every path: rank 1 waits for it */
    sr_value_unref(v);
    WCHECK(rc == -SR_EREMOTE && strstr(msg, "is invalid for input of size 6"),
           "remote reshape to 2^64 + 6 elements: %d '%s'", rc, msg);
    WCHECK(left == before, "the failed remote reshape left %u extra references to the tensor's block",
           left - before);
    return 0;
}

Test(bad_input_mp, a_remote_reshape_that_overflows_fails_and_leaks_no_block, .timeout = 120)
{
    new_shared();
    RUN_JOB("rreshape", 2, .scenario = sc_remote_reshape);
}

/* ---- responses from the wrong rank ---------------------------------------------- */

/* The id of this worker's one call in flight to `to`, read from the call table. */
static uint64_t call_in_flight_to(int to)
{
    sr_agent *a = sr__agent;
    for (int32_t i = 0; i < a->nslots; i++) {
        uint32_t gen = atomic_load(&a->slots[i].gen);
        if ((gen & 1) && a->slots[i].to == to)
            return (uint64_t)gen << 32 | (uint32_t)i;
    }
    return 0;
}

/* An error response to call id, sent to `to` as the callee would. */
static int forge_response(int to, uint64_t id)
{
    sr_msg m = {.type = SR_MSG_ERR};
    struct sr_wire w = {.call_id = id, .code = -EPERM};
    static const char text[] = "forged";
    uint8_t *p = sr__payload_reserve(&m, &w, sizeof(text) - 1);
    WCHECK(p, "no room for the forged text");
    memcpy(p, text, sizeof(text) - 1);
    sr__wire_put(&m, &w, false);
    sr__quiesce_sent(sr__agent, to); /* as dispatch counts a sent answer */
    WCHECK(sr__agent_send(sr__agent, to, &m) == 0, "forged send: %s", sr_last_error());
    return 0;
}

static int sc_stray_response(int rank, int world)
{
    (void)world;
    if (rank == 2) { /* forges an answer to rank 0's call to rank 1 */
        WCHECK(flag_wait(&sh->ready, 60), "rank 0 never published its call id");
        WCHECK(forge_response(0, atomic_load(&sh->call_id)) == 0, "forge");
        flag_set(&sh->done);
        return 0;
    }
    if (rank == 1) { /* answers only after the forgery is in rank 0's inbox */
        WCHECK(flag_wait(&sh->done, 60), "rank 2 never forged");
        flag_set(&sh->release);
        return 0;
    }
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(1, "park", SR_ARGS(), SR_TIMEOUT_NONE, &f) == 0, "%s", sr_last_error());
    uint64_t id = call_in_flight_to(1);
    WCHECK(id, "no call to rank 1 in the table");
    atomic_store(&sh->call_id, id);
    flag_set(&sh->ready);
    sr_value *v = NULL;
    int rc = sr_future_wait(f, &v);
    sr_future_unref(f);
    WCHECK(rc == 0 && sr_value_int(v) == 7, "rank 2's forged response completed the call to rank 1: %d '%s'", rc,
           sr_last_error());
    sr_value_unref(v);
    uint64_t strays = atomic_load(&sr__agent->stray_responses);
    WCHECK(strays == 1, "%llu stray responses counted, want 1", (unsigned long long)strays);
    return 0;
}

Test(bad_input_mp, a_response_from_another_rank_does_not_complete_the_call, .timeout = 120)
{
    new_shared();
    RUN_JOB("stray", 3, .scenario = sc_stray_response, .register_fns = register_park);
}
