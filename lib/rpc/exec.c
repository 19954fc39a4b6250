/* SPDX-License-Identifier: MIT */
/* The executor pool (agent.h): threads that run what must not run on the
 * polling thread (plain functions, which may block; module jobs), and the
 * jobs a waiting thread keeps to run itself once it has handed the inbox
 * back (sr__exec_take_jobs). A job is a function and its argument; the pool
 * knows nothing of calls: whoever queues one says how to end it should the
 * pool shut down first.
 *
 * Executors start on demand (agent.h, sr__exec_start): sr_init starts one,
 * and a queued job that finds fewer free executors than queued jobs starts
 * another, up to num_worker_threads. The decision is two counters compared
 * under q_lock, which the queueing already takes: no lock or system call is
 * added while an executor is free. An idle worker thus holds two threads
 * (its progress thread and one executor) rather than 17, which is what a
 * job of a thousand workers on a few cores pays for at start-up. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "error.h"
#include "log.h"
#include "thread.h"

/* An executor's work. shut: how to end it unrun at sr__exec_fini (NULL:
 * run fn there: a module job is a protocol step that releases what it holds). */
struct sr_job_item {
    struct sr_job_item *next;
    void (*fn)(void *arg);
    void (*shut)(void *arg);
    void *arg;
};

static int start_executor(sr_agent *a);

/* A job queued while no executor is free to take it: start one, unless the
 * pool is full or stopping. A free executor takes one job before it can
 * block in a function, and a busy one may never come back, so the queue
 * never holds more jobs than free executors while the pool can grow.
 * Under q_lock; returns the error of a start that failed (0: none). */
static int grow(sr_agent *a)
{
    int n = atomic_load_explicit(&a->nexec, memory_order_relaxed); /* relaxed: written under q_lock, held */
    if (a->q_len <= a->exec_free || a->exec_stopping || n >= a->exec_max)
        return 0;
    int rc = start_executor(a);
    if (rc) /* not retried: the pool keeps the executors it has */
        a->exec_max = n;
    return rc;
}

/* Under q_lock: it joins the queue, and a sleeping executor is told. */
static void append(sr_agent *a, struct sr_job_item *it)
{
    it->next = NULL;
    *a->q_tail = it;
    a->q_tail = &it->next;
    a->q_len++;
    pthread_cond_signal(&a->q_cond);
}

static void push_item(sr_agent *a, struct sr_job_item *it)
{
    pthread_mutex_lock(&a->q_lock);
    append(a, it);
    int rc = grow(a);
    int n = atomic_load_explicit(&a->nexec, memory_order_relaxed); /* relaxed: written under q_lock, held */
    pthread_mutex_unlock(&a->q_lock);
    if (rc)
        sr_logf(SR_LOG_WARN, "cannot start executor thread %d: %s; the pool keeps %d, and a queued call waits "
                "for one of them", n, strerror(-rc), n);
}

int sr__exec_push(sr_agent *a, void (*fn)(void *arg), void (*shut)(void *arg), void *arg)
{
    struct sr_job_item *it = malloc(sizeof(*it));
    if (!it)
        return -ENOMEM;
    *it = (struct sr_job_item){.fn = fn, .shut = shut, .arg = arg};
    push_item(a, it);
    return 0;
}

int sr__exec_push_now(sr_agent *a, void (*fn)(void *arg), void (*shut)(void *arg), void *arg)
{
    struct sr_job_item *it = malloc(sizeof(*it));
    if (!it)
        return -ENOMEM;
    *it = (struct sr_job_item){.fn = fn, .shut = shut, .arg = arg};
    pthread_mutex_lock(&a->q_lock);
    /* a free executor for every queued job, this one included: it is taken
     * at once, never behind functions that may block */
    bool now = a->q_len < a->exec_free && !a->exec_stopping;
    if (now)
        append(a, it);
    pthread_mutex_unlock(&a->q_lock);
    if (!now)
        free(it);
    return now ? 0 : -EBUSY;
}

bool sr__exec_take_jobs(bool on)
{
    bool was = sr__thr.takes_jobs;
    sr__thr.takes_jobs = on;
    return was;
}

int sr__exec_submit(void (*fn)(void *arg), void *arg)
{
    struct sr_job_item *it = malloc(sizeof(*it));
    if (!it)
        return sr__fail(-ENOMEM, "sr__exec_submit", "out of memory");
    *it = (struct sr_job_item){.fn = fn, .arg = arg};
    /* This thread only waits: no executor hop, no wake. One job kept at a
     * time, as one plain call of a burst (serve.c, defer): a second kept
     * behind a first that blocks until it has run would never run (a
     * backward pass's runner waits for the requests that join it, each a
     * job: test_dist_autograd_core, requests_of_a_running_pass_join_its_runner).
     * A job that the kept one submits as it runs is kept again: the list is
     * empty by then (sr__exec_run_kept). */
    if (sr__thr.takes_jobs && !sr__thr.jobs_head) {
        sr__thr.jobs_head = sr__thr.jobs_tail = it;
        return 0;
    }
    sr_agent *a = sr__agent_get("sr__exec_submit");
    if (!a) {
        free(it);
        return -SR_ESHUTDOWN;
    }
    push_item(a, it);
    sr__agent_put(a);
    return 0;
}

bool sr__exec_has_kept(void) { return sr__thr.jobs_head != NULL; }

void sr__exec_run_kept(void)
{
    while (sr__thr.jobs_head) {
        struct sr_job_item *it = sr__thr.jobs_head;
        sr__thr.jobs_head = it->next;
        if (!sr__thr.jobs_head)
            sr__thr.jobs_tail = NULL;
        it->fn(it->arg);
        free(it);
    }
}

void sr__exec_hand_off_kept(sr_agent *a)
{
    while (sr__thr.jobs_head) {
        struct sr_job_item *it = sr__thr.jobs_head;
        sr__thr.jobs_head = it->next;
        push_item(a, it);
    }
    sr__thr.jobs_tail = NULL;
}

/* What an executor is started with: its agent and its index, for its name. */
struct exec_start {
    sr_agent *a;
    int index;
};

/* Take the next job, or NULL once the pool stops and the queue is empty.
 * Under q_lock; the caller was free, and is busy with the job it got. */
static struct sr_job_item *take_job(sr_agent *a)
{
    while (!a->q_head && !a->exec_stopping) {
        atomic_fetch_add_explicit(&a->exec_idle, 1, memory_order_relaxed); /* relaxed: statistics */
        pthread_cond_wait(&a->q_cond, &a->q_lock);
        atomic_fetch_sub_explicit(&a->exec_idle, 1, memory_order_relaxed); /* relaxed: statistics */
    }
    struct sr_job_item *it = a->q_head;
    if (it) {
        a->q_head = it->next;
        if (!a->q_head)
            a->q_tail = &a->q_head;
        a->q_len--;
    }
    a->exec_free--;
    return it;
}

static void *executor_main(void *p)
{
    struct exec_start st = *(struct exec_start *)p;
    free(p);
    sr_agent *a = st.a;
    /* Its name in top -H, gdb and the profiler's traces (docs/PROFILING.md),
     * set before it can record anything: "shmrpc-exec0", ... (15 bytes at most) */
    char name[16];
    snprintf(name, sizeof(name), "shmrpc-exec%d", st.index);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&a->q_lock);
    struct sr_job_item *it;
    while ((it = take_job(a))) {
        pthread_mutex_unlock(&a->q_lock);
        it->fn(it->arg);
        free(it);
        pthread_mutex_lock(&a->q_lock);
        a->exec_free++;
    }
    pthread_mutex_unlock(&a->q_lock);
    return NULL;
}

/* Under q_lock: one more executor, counted free from now on, since it
 * takes a job before it can block. 0 or -errno (no message: a start on
 * demand must not overwrite the polling thread's sr_last_error). */
static int start_executor(sr_agent *a)
{
    int n = atomic_load_explicit(&a->nexec, memory_order_relaxed); /* relaxed: written under q_lock, held */
    struct exec_start *st = malloc(sizeof(*st)); /* the thread frees it */
    if (st)
        *st = (struct exec_start){.a = a, .index = n};
    int rc = st ? pthread_create(&a->executors[n], &a->exec_attr, executor_main, st) : ENOMEM;
    if (rc) {
        free(st);
        return -rc;
    }
    a->exec_free++;
    atomic_store_explicit(&a->nexec, n + 1, memory_order_relaxed); /* relaxed: a statistic outside q_lock */
    return 0;
}

/* The executors' attributes: those of the thread in sr_init, which started
 * every executor before they were started on demand (its signal mask; its
 * CPU affinity: shmrun --bind-to), whichever thread starts one now. */
static void exec_attr_init(sr_agent *a)
{
    pthread_attr_init(&a->exec_attr); /* glibc: cannot fail */
    sigset_t mask;
    cpu_set_t cpus;
    if (!pthread_sigmask(SIG_BLOCK, NULL, &mask))
        pthread_attr_setsigmask_np(&a->exec_attr, &mask);
    if (!pthread_getaffinity_np(pthread_self(), sizeof(cpus), &cpus)) /* more CPUs than a cpu_set_t: inherited */
        pthread_attr_setaffinity_np(&a->exec_attr, sizeof(cpus), &cpus);
}

int sr__exec_start(sr_agent *a, int n)
{
    pthread_mutex_init(&a->q_lock, NULL);
    pthread_cond_init(&a->q_cond, NULL);
    exec_attr_init(a);
    a->q_head = NULL;
    a->q_tail = &a->q_head;
    a->q_len = a->exec_free = 0;
    a->exec_max = n;
    atomic_init(&a->nexec, 0);
    a->executors = calloc((size_t)n, sizeof(pthread_t));
    if (!a->executors)
        return sr__fail(-ENOMEM, "sr_init", "no memory for %d executor threads", n);
    pthread_mutex_lock(&a->q_lock);
    int rc = start_executor(a);
    pthread_mutex_unlock(&a->q_lock);
    if (rc)
        return sr__fail(rc, "sr_init", "cannot start executor thread 0: %s", strerror(-rc));
    return 0;
}

/* Executors finish the queue and the functions they run, then exit. Called
 * while the progress thread still serves the inbox, so a function finishing
 * a nested call is answered. */
void sr__exec_stop(sr_agent *a)
{
    pthread_mutex_lock(&a->q_lock);
    a->exec_stopping = true; /* no executor starts from now on */
    int n = atomic_load_explicit(&a->nexec, memory_order_relaxed); /* relaxed: written under q_lock, held */
    pthread_cond_broadcast(&a->q_cond);
    pthread_mutex_unlock(&a->q_lock);
    for (int i = 0; i < n; i++)
        pthread_join(a->executors[i], NULL);
    pthread_mutex_lock(&a->q_lock);
    atomic_store_explicit(&a->nexec, 0, memory_order_relaxed); /* relaxed: a statistic; every executor is joined */
    pthread_mutex_unlock(&a->q_lock);
    free(a->executors); /* only a start reads it, and none comes after exec_stopping */
    a->executors = NULL;
}

/* What the polling threads queued after the executors had gone (a request
 * that arrived during teardown): calls are ended by their shut (answered
 * with an error), module jobs run here (they are protocol steps that release what they hold).
 * Called once no thread polls any more; the queue is then destroyed. */
void sr__exec_fini(sr_agent *a)
{
    pthread_mutex_lock(&a->q_lock);
    struct sr_job_item *it = a->q_head;
    a->q_head = NULL;
    a->q_tail = &a->q_head;
    a->q_len = 0;
    pthread_mutex_unlock(&a->q_lock);
    while (it) {
        struct sr_job_item *next = it->next;
        if (it->shut)
            it->shut(it->arg);
        else
            it->fn(it->arg);
        free(it);
        it = next;
    }
    pthread_cond_destroy(&a->q_cond);
    pthread_mutex_destroy(&a->q_lock);
    pthread_attr_destroy(&a->exec_attr);
}
