/* SPDX-License-Identifier: MIT */
/* The transport benchmark: inbox rings and doorbells, side by side with the
 * machine's floor measured in the same run (PERFORMANCE.md, "ring alone" and
 * the round-trip targets).
 *
 *   ping-pong round trip, two workers, through sr_xport (send, recv_burst,
 *   wait), exactly as the RPC layer will use it:
 *     spin   fixed spin budget, nobody sleeps        vs the cache-line ping-pong
 *     sleep  spin budget 0: every message rings the
 *            doorbell and wakes a sleeping peer      vs the futex ping-pong
 *            (io_uring FUTEX_WAIT doorbell, and the eventfd fallback)
 *   burst throughput, 1/2/4/8 producers -> one consumer that dequeues in
 *   bursts, adaptive spin policy, per-message cost vs one cache-line
 *   transfer (half the cache-line round trip).
 *
 * Why sr_spawn + sr_xport and not bare rings in a memfd: the targets are
 * about what a caller pays, and a message always costs the enqueue plus the
 * doorbell check (a seq_cst fence), the dequeue plus the back-pressure check.
 * Measuring the bare ring would hide exactly the costs that can be tuned.
 *
 * Noise: the machine is shared, so every configuration runs ROUNDS rounds,
 * each measuring the floor and then ours in the same two processes, and the
 * line reports the medians over rounds and the median of per-round ratios.
 * Every reply and every burst message is checked after timing; a wrong or
 * lost message fails the run (exit 1). A missed target is reported, not
 * failed (set BENCH_STRICT=1 to fail on it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench_util.h"
#include "error.h"
#include "floor.h"
#include "shmrpc/spawn.h"
#include "shm/xport.h"

#define ROUNDS 7
#define N_SPIN 20000      /* timed round trips per round, spin mode */
#define N_SLEEP 4000      /* timed round trips per round, sleep mode */
#define WARMUP_DIV 4      /* warm-up: a quarter of the timed count */
#define SPIN_BUDGET_NS (50ll * 1000000)
#define BURST_MSGS 200000 /* messages per throughput round, all producers together */
#define BURST 32
#define WAIT_NS (20ll * 1000000000)
#define MAX_PRODUCERS 8

enum { MSG_PING = 1, MSG_PONG = 2, MSG_DATA = 3 };
#define PONG_XOR UINT64_C(0x5a5a5a5a5a5a5a5a)

/* The counts above, or --smoke's (main): the figures of a smoke run are not measurements. */
static int rounds = ROUNDS, n_spin = N_SPIN, n_sleep = N_SLEEP;
static uint64_t burst_msgs = BURST_MSGS;
static size_t memcpy_bytes = 256u << 20;
static int64_t spin_budget_ns = SPIN_BUDGET_NS; /* --smoke: 1 ms, so that a peer preempted on a busy
                                                 * machine costs little spinning */

struct rtt_cfg {
    uint32_t doorbell; /* enum sr_doorbell_kind */
    int spin_phase;    /* also measure spin mode */
};

/* Shared with every worker (allocated before sr_spawn forks them); the
 * results are written by rank 0 and read by the parent after sr_spawn
 * returned (the workers' exit orders them). */
struct shared {
    bench_floor_area floor;
    bench_barrier bar;
    bench_rounds spin, sleep, twoline; /* twoline: ours vs the two-line floor, spin mode */
    double sleep_wakes_per_rt, spin_sleeps_per_rt;
    int tput_rounds;
    double tput_ns[BENCH_MAX_ROUNDS], tput_floor_ns[BENCH_MAX_ROUNDS];
    uint64_t tput_sleeps, tput_spins, tput_msgs;
    _Atomic uint64_t tput_full; /* every producer adds its count (relaxed: read after the job) */
};
static struct shared *sh;

/* A counter of this worker's transport. relaxed: written by this thread
 * (the consumer, or the only sender), so the value is exact here. */
static uint64_t stat_of(_Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

static int fail(int rank, const char *what, int rc)
{
    fprintf(stderr, "bench_ring: rank %d: %s: %s (%s)\n", rank, what, strerror(rc < 0 ? -rc : rc),
            sr_last_error());
    return 1;
}

/* Wait for the inbox; every wait is bounded by deadline. */
static int wait_ready(sr_xport *x, int64_t deadline)
{
    int ev = sr__xport_wait(x, deadline);
    if (ev < 0)
        return ev;
    if ((ev & SR_WAKE_PEER) && (ev = sr__xport_check_peers(x)))
        return ev;
    if ((ev & SR_WAKE_TIMEOUT) && !sr__ring_ready(x->inbox))
        return sr__fail(-ETIMEDOUT, "bench_ring", "no message within %lld s", WAIT_NS / 1000000000);
    return 0;
}

static int recv_one(sr_xport *x, sr_msg *m, int64_t deadline)
{
    int rc = 0;
    while (!rc && !sr__xport_recv_burst(x, m, 1))
        rc = wait_ready(x, deadline);
    return rc;
}

static int send_one(sr_xport *x, int to, sr_msg *m, int64_t deadline)
{
    return sr__xport_send_wait(x, to, m, deadline);
}

/* Rank 0 sends n pings and times each round trip into rtt[]; rank 1 echoes.
 * *bad counts wrong replies (checked by the caller after timing). */
static int ring_pingpong(sr_xport *x, uint32_t n, int64_t *rtt, uint64_t *bad)
{
    int64_t deadline = sr__now_ns() + WAIT_NS;
    sr_msg m = {0};
    int rc = 0;
    if (x->rank == 1) {
        for (uint32_t i = 0; i < n && !rc; i++) {
            if (!(rc = recv_one(x, &m, deadline))) {
                uint64_t v;
                memcpy(&v, m.data, sizeof(v));
                v ^= PONG_XOR;
                memcpy(m.data, &v, sizeof(v));
                m.type = MSG_PONG;
                rc = send_one(x, 0, &m, deadline);
            }
        }
        return rc;
    }
    int64_t t = bench_now_ns();
    for (uint64_t i = 0; i < n && !rc; i++) {
        m.type = MSG_PING;
        memcpy(m.data, &i, sizeof(i));
        if (!(rc = send_one(x, 1, &m, deadline)) && !(rc = recv_one(x, &m, deadline))) {
            uint64_t v;
            memcpy(&v, m.data, sizeof(v));
            *bad += m.type != MSG_PONG || m.src != 1 || v != (i ^ PONG_XOR);
            int64_t t2 = bench_now_ns();
            rtt[i] = t2 - t;
            t = t2;
        }
    }
    return rc;
}

/* One measurement: warm-up, then n timed round trips; rank 0 gets p50/p99. */
static int timed_pingpong(sr_xport *x, uint32_t n, int64_t *s, bench_lat *out)
{
    uint64_t bad = 0;
    int rc = ring_pingpong(x, n / WARMUP_DIV, s, &bad);
    if (!rc)
        rc = ring_pingpong(x, n, s, &bad);
    if (!rc && bad)
        rc = sr__fail(-EBADMSG, "bench_ring", "%llu wrong replies", (unsigned long long)bad);
    if (!rc && x->rank == 0)
        *out = bench_lat_of(s, n);
    return rc;
}

enum floor_kind { FLOOR_CACHELINE, FLOOR_TWOLINE, FLOOR_FUTEX };

static int timed_floor(int rank, enum floor_kind kind, uint32_t n, int64_t *s, bench_lat *out)
{
    static const char *const names[] = {"cache-line", "two-line", "futex"};
    int (*const fns[])(bench_floor_area *, enum bench_role, uint32_t, int64_t *) = {
        bench_floor_cacheline, bench_floor_twoline, bench_floor_futex};
    enum bench_role role = rank == 0 ? BENCH_INITIATOR : BENCH_ECHO;
    int rc = fns[kind](&sh->floor, role, n / WARMUP_DIV, s);
    if (!rc)
        rc = fns[kind](&sh->floor, role, n, s);
    if (!rc && rank == 0)
        *out = bench_lat_of(s, n);
    if (rc)
        sr__fail(rc, "bench_ring", "%s floor: the peer stopped answering", names[kind]);
    return rc;
}

static void set_spin(sr_xport *x, int64_t ns)
{
    x->fixed_spin = true;
    x->spin_ns = ns;
}

/* One round of spin mode then one of sleep mode, each after its floor. */
static int rtt_round(sr_xport *x, const struct rtt_cfg *c, int64_t *s)
{
    bench_lat fl = {0}, fl2 = {0}, ours = {0};
    int rc = 0;
    if (c->spin_phase) {
        set_spin(x, spin_budget_ns);
        uint64_t sleeps = stat_of(&x->st.sleeps);
        if (!(rc = timed_floor(x->rank, FLOOR_CACHELINE, n_spin, s, &fl)) &&
            !(rc = timed_floor(x->rank, FLOOR_TWOLINE, n_spin, s, &fl2)) &&
            !(rc = timed_pingpong(x, n_spin, s, &ours)) && x->rank == 0) {
            bench_rounds_add(&sh->spin, ours, fl);
            bench_rounds_add(&sh->twoline, ours, fl2);
            sh->spin_sleeps_per_rt += (double)(stat_of(&x->st.sleeps) - sleeps) / (n_spin + n_spin / WARMUP_DIV);
        }
    }
    set_spin(x, 0);
    uint64_t wakes = stat_of(&x->st.wakes);
    if (!rc && !(rc = timed_floor(x->rank, FLOOR_FUTEX, n_sleep, s, &fl)) && !(rc = timed_pingpong(x, n_sleep, s, &ours)) &&
        x->rank == 0) {
        bench_rounds_add(&sh->sleep, ours, fl);
        sh->sleep_wakes_per_rt += (double)(stat_of(&x->st.wakes) - wakes) / (n_sleep + n_sleep / WARMUP_DIV);
    }
    return rc;
}

static int rtt_worker(int rank, int world, void *arg)
{
    (void)world;
    const struct rtt_cfg *c = arg;
    sr_xport_opts o = {.doorbell = c->doorbell, .fixed_spin = true, .spin_ns = spin_budget_ns};
    sr_xport *x;
    int rc = sr__xport_attach(&o, &x);
    if (rc)
        return fail(rank, "attach", rc);
    if (x->waiter.kind != c->doorbell) {
        sr__xport_detach(x);
        return fail(rank, "doorbell kind", -EOPNOTSUPP);
    }
    int64_t *s = malloc((n_spin > n_sleep ? n_spin : n_sleep) * sizeof(*s));
    for (int r = 0; r < rounds && !rc; r++)
        rc = s ? rtt_round(x, c, s) : -ENOMEM;
    free(s);
    sr__xport_detach(x);
    return rc ? fail(rank, "round trip", rc) : 0;
}

/* ---- burst throughput: ranks 1..N produce, rank 0 consumes ---- */

static int produce(sr_xport *x, uint64_t count)
{
    int64_t deadline = sr__now_ns() + WAIT_NS;
    sr_msg m = {.type = MSG_DATA};
    for (uint64_t i = 0; i < count; i++) {
        memcpy(m.data, &i, sizeof(i));
        int rc = sr_xport_send(x, 0, &m);
        if (rc == -EAGAIN)
            rc = send_one(x, 0, &m, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

/* Receive every message in bursts; each producer's messages must arrive in
 * order, exactly once (next[src] is the sequence number expected next). */
static int consume(sr_xport *x, uint64_t total, uint64_t *next, uint64_t *bad)
{
    int64_t deadline = sr__now_ns() + WAIT_NS;
    sr_msg m[BURST];
    for (uint64_t got = 0; got < total;) {
        unsigned k = sr__xport_recv_burst(x, m, BURST);
        for (unsigned i = 0; i < k; i++) {
            uint64_t v;
            memcpy(&v, m[i].data, sizeof(v));
            unsigned src = m[i].src;
            *bad += src == 0 || src >= (unsigned)x->world || m[i].type != MSG_DATA || v != next[src];
            next[src % x->world]++;
        }
        got += k;
        if (k)
            continue;
        int rc = wait_ready(x, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

/* Rank 0 checks, after timing, that every producer's messages all arrived. */
static int check_burst(sr_xport *x, const uint64_t *next, uint64_t bad, uint64_t per_producer)
{
    for (int p = 1; p < x->world && !bad; p++)
        bad += next[p] != per_producer;
    if (bad)
        return sr__fail(-EBADMSG, "bench_ring", "burst: %llu wrong, lost or reordered messages",
                        (unsigned long long)bad);
    return 0;
}

static int consume_round(sr_xport *x, uint64_t per_producer, const bench_lat *fl)
{
    uint64_t next[MAX_PRODUCERS + 1] = {0}, bad = 0, total = per_producer * (uint64_t)(x->world - 1);
    uint64_t sleeps = stat_of(&x->st.sleeps);
    uint64_t spins = stat_of(&x->st.spin_hits);
    int64_t t = bench_now_ns();
    int rc = consume(x, total, next, &bad);
    t = bench_now_ns() - t;
    if (!rc)
        rc = check_burst(x, next, bad, per_producer);
    if (!rc && sh->tput_rounds < BENCH_MAX_ROUNDS) {
        sh->tput_ns[sh->tput_rounds] = (double)t / (double)total;
        sh->tput_floor_ns[sh->tput_rounds] = (double)fl->p50 / 2;
        sh->tput_rounds++;
        sh->tput_sleeps += stat_of(&x->st.sleeps) - sleeps;
        sh->tput_spins += stat_of(&x->st.spin_hits) - spins;
        sh->tput_msgs += total;
    }
    return rc;
}

/* One round: the cache-line floor between ranks 0 and 1 (the others wait
 * asleep at the barrier), then every producer sends per_producer messages. */
static int tput_round(sr_xport *x, int64_t *s, uint64_t per_producer)
{
    bench_lat fl = {0};
    int rc = bench_barrier_wait(&sh->bar, (uint32_t)x->world, WAIT_NS);
    if (!rc && x->rank <= 1)
        rc = timed_floor(x->rank, FLOOR_CACHELINE, n_spin, s, &fl);
    if (!rc)
        rc = bench_barrier_wait(&sh->bar, (uint32_t)x->world, WAIT_NS);
    if (rc)
        return rc;
    if (x->rank != 0) {
        uint64_t full = stat_of(&x->st.full);
        rc = produce(x, per_producer);
        /* relaxed: read by the parent after every worker exited */
        atomic_fetch_add_explicit(&sh->tput_full, stat_of(&x->st.full) - full, memory_order_relaxed);
        return rc;
    }
    return consume_round(x, per_producer, &fl);
}

static int tput_worker(int rank, int world, void *arg)
{
    (void)arg;
    uint64_t per_producer = burst_msgs / (uint64_t)(world - 1);
    sr_xport *x;
    int rc = sr__xport_attach(NULL, &x); /* the default, adaptive spin policy */
    if (rc)
        return fail(rank, "attach", rc);
    int64_t *s = malloc((n_spin + n_spin / WARMUP_DIV) * sizeof(*s));
    rc = s ? tput_round(x, s, per_producer / 8) : -ENOMEM; /* warm-up round, not recorded */
    if (rank == 0) /* forget the warm-up round */
        sh->tput_rounds = 0, sh->tput_sleeps = sh->tput_spins = sh->tput_msgs = 0;
    for (int r = 0; r < rounds && !rc; r++)
        rc = tput_round(x, s, per_producer);
    if (!rc)
        rc = bench_barrier_wait(&sh->bar, (uint32_t)x->world, WAIT_NS); /* nobody detaches mid-round */
    free(s);
    sr__xport_detach(x);
    return rc ? fail(rank, "burst", rc) : 0;
}

/* ---- the run ---- */

static void print_machine(void)
{
    char model[128] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, sizeof(model), "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f)
        fclose(f);
    struct utsname u;
    uname(&u);
    printf("bench_ring: %ld CPUs online, %s, Linux %s; %d rounds, medians over rounds\n",
           sysconf(_SC_NPROCESSORS_ONLN), model, u.release, rounds);
}

static int run_rtt(uint32_t doorbell, int spin_phase, int *met)
{
    struct rtt_cfg c = {.doorbell = doorbell, .spin_phase = spin_phase};
    memset(sh, 0, sizeof(*sh));
    int rc = sr_spawn(2, rtt_worker, &c, &(sr_spawn_opts){.name_prefix = "bench_ring"});
    if (rc)
        return rc;
    const char *db = doorbell == SR_DOORBELL_FUTEX ? "io_uring futex" : "eventfd";
    char cfg[64], extra[128];
    if (spin_phase) {
        bench_summary s = bench_summarize(&sh->spin), s2 = bench_summarize(&sh->twoline);
        snprintf(cfg, sizeof(cfg), "2 procs, fixed spin %lld ms", (long long)(spin_budget_ns / 1000000));
        snprintf(extra, sizeof(extra), "two-line floor p50 %.0f ns, ours %.2fx it | sleeps/rt %.2f", s2.floor50,
                 s2.ratio50, sh->spin_sleeps_per_rt / sh->spin.n);
        *met &= bench_print("ring rtt spin", cfg, "cacheline", &s, 2.0, extra);
    }
    bench_summary s = bench_summarize(&sh->sleep);
    snprintf(cfg, sizeof(cfg), "2 procs, spin 0, %s doorbell", db);
    snprintf(extra, sizeof(extra), "doorbell wakes/ping %.2f", sh->sleep_wakes_per_rt / sh->sleep.n);
    *met &= bench_print("ring rtt sleep", cfg, "futex", &s, 1.3, extra);
    return 0;
}

static int run_tput(int producers, int *met)
{
    memset(sh, 0, sizeof(*sh));
    int rc = sr_spawn(producers + 1, tput_worker, NULL, &(sr_spawn_opts){.name_prefix = "bench_ring"});
    if (rc)
        return rc;
    double ns[BENCH_MAX_ROUNDS], fl[BENCH_MAX_ROUNDS], ratio[BENCH_MAX_ROUNDS];
    int n = sh->tput_rounds;
    for (int i = 0; i < n; i++) {
        ns[i] = sh->tput_ns[i];
        fl[i] = sh->tput_floor_ns[i];
        ratio[i] = ns[i] / fl[i];
    }
    double mns = bench_median(ns, n), mfl = bench_median(fl, n), mratio = bench_median(ratio, n);
    double target = producers == 1 ? 2.0 : 4.0;
    *met &= mratio <= target;
    char name[32], cfg[64];
    snprintf(name, sizeof(name), "ring burst %d->1", producers);
    snprintf(cfg, sizeof(cfg), "%d procs on %ld CPUs, adaptive spin, burst %d", producers + 1,
             sysconf(_SC_NPROCESSORS_ONLN), BURST);
    printf("%-16s | %-38s | %6.2f M msg/s %6.1f ns/msg | floor 1 line transfer %6.1f ns | ratio %4.2f | "
           "target <= %.1fx %s | consumer spins/msg %.4f sleeps/msg %.4f, full %llu\n",
           name, cfg, 1e3 / mns, mns, mfl, mratio, target, bench_verdict(mratio <= target),
           (double)sh->tput_spins / (double)sh->tput_msgs, (double)sh->tput_sleeps / (double)sh->tput_msgs,
           (unsigned long long)atomic_load_explicit(&sh->tput_full, memory_order_relaxed));
    fflush(stdout);
    bench_rec r;
    bench_rec_begin(&r, name);
    bench_rec_str(&r, "config", cfg);
    bench_rec_num(&r, "per_s", 1e9 / mns);
    bench_rec_num(&r, "ns_per_msg", mns);
    bench_rec_str(&r, "floor", "1 line transfer");
    bench_rec_num(&r, "floor_ns", mfl);
    bench_rec_num(&r, "ratio", mratio);
    bench_rec_num(&r, "target_ratio", target);
    bench_rec_bool(&r, "target_met", mratio <= target);
    bench_rec_emit(&r);
    return 0;
}

static bench_cli cli = {.prog = "bench_ring", .names = {"futex", "eventfd", "burst", "memcpy"},
                        .smoke_what = "1 round of 20 round trips (spin 1 ms), 2000 burst messages, memcpy of 16 MiB"};

/* Groups: the command line names the ones to run (default: all). */
static int wanted(int argc, char **argv, const char *group)
{
    (void)argc, (void)argv;
    return bench_cli_wants(&cli, group);
}

static int run_groups(int argc, char **argv, int *met)
{
    int rc = 0;
    if (wanted(argc, argv, "futex") && !sr__waiter_futex_supported())
        printf("ring rtt: io_uring FUTEX_WAIT unsupported by this kernel; futex doorbell skipped\n");
    else if (wanted(argc, argv, "futex"))
        rc = run_rtt(SR_DOORBELL_FUTEX, 1, met);
    if (!rc && wanted(argc, argv, "eventfd"))
        rc = run_rtt(SR_DOORBELL_EVENTFD, 0, met);
    static const int producers[] = {1, 2, 4, 8};
    for (unsigned i = 0; !rc && wanted(argc, argv, "burst") && i < sizeof(producers) / sizeof(producers[0]); i++)
        rc = run_tput(producers[i], met);
    if (!rc && wanted(argc, argv, "memcpy")) {
        double gibs = bench_floor_memcpy_gibs(memcpy_bytes, bench_smoke_on() ? 1 : 3);
        printf("floor memcpy %zu MiB one core %.2f GiB/s\n", memcpy_bytes >> 20, gibs);
        bench_rec r;
        bench_rec_begin(&r, "floor memcpy 256 MiB one core");
        bench_rec_num(&r, "gib_per_s", gibs);
        bench_rec_emit(&r);
    }
    return rc;
}

/* bench_ring [--json] [futex] [eventfd] [burst] [memcpy]: the groups to run
 * (all by default). Exit 1 on an error (a wrong, lost or late message); a
 * missed target exits 1 only with BENCH_STRICT=1. */
int main(int argc, char **argv)
{
    bench_cli_parse(&cli, argc, argv);
    if (cli.smoke)
        rounds = 1, n_spin = 20, n_sleep = 20, burst_msgs = 2000, memcpy_bytes = 16u << 20, spin_budget_ns = 1000000;
    int met = 1;
    print_machine();
    sh = bench_shared_alloc(sizeof(*sh));
    if (!sh) {
        perror("bench_ring: mmap");
        return 1;
    }
    int rc = run_groups(argc, argv, &met);
    bench_shared_free(sh, sizeof(*sh));
    if (rc) {
        fprintf(stderr, "bench_ring: %s\n", sr_last_error());
        return 1;
    }
    const char *strict = getenv("BENCH_STRICT");
    return strict && *strict == '1' && !met && !cli.smoke ? 1 : 0;
}
