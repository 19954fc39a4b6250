/* SPDX-License-Identifier: MIT */
/* Checkpoint internals shared by save.c, tmpfile.c, load.c and checkpoint.c. */
#ifndef SR_LIB_CHECKPOINT_IMPL_H
#define SR_LIB_CHECKPOINT_IMPL_H

#if !defined(SR__IN_TRAIN)
#error "checkpoint_impl.h is private to the training (train) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "file.h"
#include "shmrpc/checkpoint.h"

/* A loaded checkpoint. Immutable after sr_checkpoint_load returns. Both
 * item structs start with their name, so one comparator sorts and searches
 * arrays of pointers to either (by_name, meta_by_name). */
struct sr__ckpt_item {
    const char *name; /* points into names */
    sr_tensor *t;     /* owned */
};
struct sr__ckpt_mitem {
    const char *name;
    int64_t value;
};
struct sr_checkpoint {
    char *path; /* for errors */
    size_t n, nmeta;
    struct sr__ckpt_item *items;        /* file order */
    struct sr__ckpt_mitem *meta;        /* file order */
    void **by_name;      /* struct sr__ckpt_item *, sorted by name */
    void **meta_by_name; /* struct sr__ckpt_mitem *, sorted by name */
    char *names; /* every name, NUL-terminated */
};

/* strcmp on the names of two items (arguments are pointers to item
 * pointers, as qsort and bsearch pass them). */
int sr__ckpt_cmp_items(const void *a, const void *b);
/* bsearch comparator: key is a const char * name. */
int sr__ckpt_cmp_key(const void *key, const void *item);

/* ---- opening files (checkpoint.c) ---- */
/* ---- the phases of a save, and a test-only hook to stop at one ---- */
enum sr__ckpt_phase {
    SR__CKPT_TMP_CREATED,  /* the temporary file exists, locked and empty */
    SR__CKPT_HALF_WRITTEN, /* header and about half of the tensors written */
    SR__CKPT_WRITTEN,      /* every write completed, nothing fsynced */
    SR__CKPT_SYNCED,       /* the file fsynced, not yet renamed */
    SR__CKPT_RENAMED,      /* renamed over the target, directory not fsynced */
    SR__CKPT_NPHASES,
};
/* When set, every save calls it at each phase with the temporary file's
 * path (and, for HALF_WRITTEN, only after the writes so far completed).
 * Tests set it in a forked child to kill a save at a chosen moment. Not
 * synchronised: set it before any save starts. */
extern void (*sr__ckpt_test_hook)(int phase, const char *tmp_path);

/* ---- temporary files: "<base>.tmp.<pid>" beside the target (tmpfile.c) ---- */
/* Whether name is a temporary file of target base. */
bool sr__ckpt_is_tmp_name(const char *name, const char *base);
/* Create (or take over) the temporary file name in dirfd: returns a
 * writable, empty fd holding an exclusive flock, or -errno. path is for
 * errors. */
int sr__ckpt_tmp_open(int dirfd, const char *name, const char *path);
/* Remove the temporary files of base that no live writer holds locked
 * (left by a writer that crashed). Best effort: errors are ignored. */
void sr__ckpt_tmp_clean(int dirfd, const char *base);
/* The same for the temporary files beside path (a load's cleanup). */
void sr__ckpt_tmp_clean_path(const char *path);

#endif
