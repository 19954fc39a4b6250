/* SPDX-License-Identifier: MIT */
/* The owner's fork table. See forks.h for the rules. */
#include "forks.h"

#include <errno.h>
#include <stdlib.h>

#include "error.h"

struct sr_fork {
    uint64_t rref_id;
    uint32_t adds;      /* live: add messages received */
    uint32_t tomb_left; /* > 0: a tombstone; this many adds are still to be cancelled */
    int32_t holder;     /* the rank that holds the fork (-1: not known) */
    uint32_t holder_gen; /* and its generation */
};

static int count_change(sr_fork_table *t, uint64_t rid, int delta)
{
    uintptr_t c = (uintptr_t)sr__map_get(&t->counts, rid);
    c = (uintptr_t)((intptr_t)c + delta);
    if (!c) {
        sr__map_del(&t->counts, rid);
        return 0;
    }
    return sr__map_put(&t->counts, rid, (void *)c);
}

size_t sr__forks_count(const sr_fork_table *t, uint64_t rid)
{
    return (size_t)(uintptr_t)sr__map_get(&t->counts, rid);
}

static int new_entry(sr_fork_table *t, uint64_t rid, uint64_t fid, uint32_t adds, uint32_t tomb_left, int holder,
                     uint32_t holder_gen)
{
    struct sr_fork *f = malloc(sizeof(*f));
    if (!f)
        return sr__fail(-ENOMEM, "sr_rref", "out of memory for a fork entry");
    *f = (struct sr_fork){.rref_id = rid, .adds = adds, .tomb_left = tomb_left, .holder = holder,
                            .holder_gen = holder_gen};
    int rc = sr__map_put(&t->forks, fid, f);
    if (rc) {
        free(f);
        return rc;
    }
    if (tomb_left) {
        t->tombs++;
    } else if ((rc = count_change(t, rid, 1))) {
        free(sr__map_del(&t->forks, fid));
        return rc;
    } else {
        t->live++;
    }
    return 0;
}

int sr__forks_add(sr_fork_table *t, uint64_t rid, uint64_t fid, int holder, uint32_t holder_gen,
                  enum sr_fork_add *res)
{
    struct sr_fork *f = sr__map_get(&t->forks, fid);
    if (f && f->tomb_left) {
        *res = SR_FORK_CANCELLED;
        if (--f->tomb_left == 0) {
            free(sr__map_del(&t->forks, fid));
            t->tombs--;
        }
        return 0;
    }
    if (f) {
        *res = SR_FORK_DUPLICATE;
        f->adds++;
        return 0;
    }
    *res = SR_FORK_ADDED;
    return new_entry(t, rid, fid, 1, 0, holder, holder_gen);
}

int sr__forks_del(sr_fork_table *t, uint64_t rid, uint64_t fid, uint32_t adds_sent, bool confirmed,
                  enum sr_fork_del *res)
{
    struct sr_fork *f = sr__map_get(&t->forks, fid);
    *res = SR_FORK_IGNORED;
    if (f && (f->tomb_left || f->rref_id != rid))
        return 0; /* a duplicate delete (or a forged id): nothing to do */
    if (f) {
        *res = SR_FORK_REMOVED;
        count_change(t, rid, -1); /* a decrement never allocates */
        t->live--;
        if (adds_sent > f->adds) { /* adds still in flight: keep cancelling them */
            f->tomb_left = adds_sent - f->adds;
            t->tombs++;
        } else {
            free(sr__map_del(&t->forks, fid));
        }
        return 0;
    }
    if (confirmed || !adds_sent)
        return 0; /* its add arrived long ago: a duplicate */
    *res = SR_FORK_TOMBSTONE;
    return new_entry(t, rid, fid, 0, adds_sent, -1, 0);
}

size_t sr__forks_drop_holder(sr_fork_table *t, int holder, uint32_t holder_gen, uint64_t *rids, size_t cap)
{
    size_t pos = 0, n = 0;
    uint64_t fid;
    void *p;
    while (n < cap && sr__map_next(&t->forks, &pos, &fid, &p)) {
        struct sr_fork *f = p;
        if (f->tomb_left || f->holder != holder || f->holder_gen != holder_gen || holder < 0)
            continue;
        rids[n++] = f->rref_id;
        count_change(t, f->rref_id, -1); /* a decrement never allocates */
        t->live--;
        free(sr__map_del(&t->forks, fid));
        pos = 0; /* the map changed under the walk: start again (the dropped ones are gone) */
    }
    return n;
}

static void sort_u64(uint64_t *v, size_t n)
{
    for (size_t i = 1; i < n; i++) /* insertion sort: debug listings are short */
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            uint64_t x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
}

size_t sr__forks_list(const sr_fork_table *t, uint64_t rid, uint64_t *out, size_t cap)
{
    size_t pos = 0, n = 0;
    uint64_t fid;
    void *p;
    while (sr__map_next(&t->forks, &pos, &fid, &p)) {
        struct sr_fork *f = p;
        if (f->tomb_left || f->rref_id != rid)
            continue;
        if (n < cap)
            out[n] = fid;
        n++;
    }
    sort_u64(out, n < cap ? n : cap);
    return n;
}

size_t sr__forks_all(const sr_fork_table *t, uint64_t (*out)[2], size_t cap)
{
    size_t pos = 0, n = 0;
    uint64_t fid;
    void *p;
    while (sr__map_next(&t->forks, &pos, &fid, &p)) {
        struct sr_fork *f = p;
        if (f->tomb_left)
            continue;
        if (n < cap) {
            out[n][0] = f->rref_id;
            out[n][1] = fid;
        }
        n++;
    }
    return n;
}

void sr__forks_free(sr_fork_table *t)
{
    size_t pos = 0;
    uint64_t k;
    void *p;
    while (sr__map_next(&t->forks, &pos, &k, &p))
        free(p);
    sr__map_free(&t->forks);
    sr__map_free(&t->counts);
    t->live = t->tombs = 0;
}
