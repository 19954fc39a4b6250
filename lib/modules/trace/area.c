/* SPDX-License-Identifier: MIT */
/* This process's record area: attached from the launcher's memfd, or
 * private. See trace.h.
 *
 * Attaching is lazy (the first record, name or snapshot) or at sr_init
 * (module.c), whichever comes first; `mine` is published once with a
 * release store and read with acquire loads. A forked child forgets its
 * parent's area (tables.c): the parent's records are not its own. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace.h"

#define ALIGN 64

static _Atomic(struct sr_area *) mine; /* release when attached, acquire by users */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int given_fd = -1, given_slot = -1; /* sr__area_give; under lock */
static bool env_read; /* SHMRPC_TRACE_AREA is read once per program image; under lock */

static uint64_t round_up(uint64_t n) { return (n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

void sr__area_init(struct sr_area *a, int rank, int slot, uint32_t generation, uint32_t flags)
{
    a->magic = SR_AREA_MAGIC;
    a->size = SR_AREA_SIZE;
    a->rank = rank;
    a->slot = slot;
    a->generation = generation;
    atomic_init(&a->flags, flags);
    atomic_init(&a->used, round_up(sizeof(*a)));
}

/* Slot `slot` of the memfd fd; the fd is closed (the mapping keeps it). */
static struct sr_area *attach(int fd, int slot)
{
    struct stat st; /* a stale variable may name another file now: too short, it would fault */
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < ((uint64_t)slot + 1) * SR_AREA_SIZE) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, SR_AREA_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd,
                   (off_t)slot * (off_t)SR_AREA_SIZE);
    close(fd);
    if (p == MAP_FAILED)
        return NULL;
    struct sr_area *a = p;
    if (a->magic != SR_AREA_MAGIC || a->size != SR_AREA_SIZE || a->slot != slot) {
        munmap(p, SR_AREA_SIZE);
        return NULL;
    }
    a->pid = getpid();
    /* relaxed: the launcher reads the flags only after this process is reaped */
    atomic_fetch_or_explicit(&a->flags, SR_AREA_ATTACHED, memory_order_relaxed);
    return a;
}

static struct sr_area *make_private(void)
{
    void *p = mmap(NULL, SR_AREA_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    struct sr_area *a = p;
    sr__area_init(a, -1, -1, 0, SR_AREA_ATTACHED);
    a->pid = getpid();
    return a;
}

/* "fd:slot" from the launcher (job.c), once. Under lock. */
static void read_env(void)
{
    const char *v = getenv("SHMRPC_TRACE_AREA");
    int fd, slot;
    char end;
    env_read = true;
    if (given_fd < 0 && v && sscanf(v, "%d:%d%c", &fd, &slot, &end) == 2 && fd > 2 && slot >= 0) {
        given_fd = fd;
        given_slot = slot;
    }
}

struct sr_area *sr__area(void)
{
    struct sr_area *a = atomic_load_explicit(&mine, memory_order_acquire); /* pairs with the release below */
    if (a)
        return a;
    pthread_mutex_lock(&lock);
    if (!(a = atomic_load_explicit(&mine, memory_order_relaxed))) { /* relaxed: under lock */
        if (!env_read)
            read_env();
        if (given_fd >= 0)
            a = attach(given_fd, given_slot);
        given_fd = -1;
        if (!a)
            a = make_private();
        atomic_store_explicit(&mine, a, memory_order_release); /* pairs with the acquire above */
    }
    pthread_mutex_unlock(&lock);
    return a;
}

void sr__area_give(int fd, int slot)
{
    pthread_mutex_lock(&lock);
    given_fd = fd;
    given_slot = slot;
    pthread_mutex_unlock(&lock);
}

void sr__area_forget(void)
{
    /* one thread exists: the lock may have been held by another at the fork */
    pthread_mutex_init(&lock, NULL);
    atomic_store_explicit(&mine, NULL, memory_order_relaxed); /* relaxed: one thread */
    given_fd = -1;
    env_read = true; /* the program's variable names its parent's slot */
}

uint64_t sr__area_alloc(struct sr_area *a, uint64_t bytes)
{
    bytes = round_up(bytes);
    /* relaxed: the bytes are zero (fresh pages) and published by their user's own release */
    uint64_t at = atomic_fetch_add_explicit(&a->used, bytes, memory_order_relaxed);
    return at + bytes <= SR_AREA_SIZE ? at : 0;
}

const void *sr__area_get(const struct sr_area *a, uint64_t off, uint64_t bytes)
{
    /* the constant, not a->size: a crashed worker may have scribbled anywhere in its area */
    return off >= sizeof(*a) && off < SR_AREA_SIZE && bytes <= SR_AREA_SIZE - off ? SR_AT(a, off) : NULL;
}

const char *sr__area_name(const struct sr_area *a, uint32_t id)
{
    if (id == SR_TRACE_FNS - 1)
        return "(other)";
    /* acquire: pairs with the release in sr__trace_name_id: name[< n] is set */
    if (id >= SR_TRACE_FNS || id >= atomic_load_explicit(&((struct sr_area *)a)->nnames, memory_order_acquire))
        return "?";
    const char *s = sr__area_get(a, a->name[id], 1);
    return s && memchr(s, '\0', SR_AREA_SIZE - a->name[id]) ? s : "?";
}
