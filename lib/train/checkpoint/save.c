/* SPDX-License-Identifier: MIT */
/* sr_checkpoint_save: lay the file out, then write it crash-safely.
 *
 * The steps, and what a crash after each leaves at `path`
 * (docs/CHECKPOINT.md argues each one):
 *   1. remove stale temporary files of crashed writers   -> the old file
 *   2. create and lock <path>.tmp.<pid>                 -> the old file
 *   3. write header, TOC and data through io_uring      -> the old file
 *   4. fsync the temporary file (IORING_OP_FSYNC)       -> the old file
 *   5. rename it over path (the commit point)           -> the new file
 *   6. fsync the directory (IORING_OP_FSYNC)            -> the new file,
 *      now also across a power loss
 * Nothing ever writes to `path` itself, so it always holds a complete file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "format.h"
#include "io.h"
#include "error.h"
#include "tensor_seam.h"

void (*sr__ckpt_test_hook)(int phase, const char *tmp_path);

static const uint8_t zeros[SR__CKPT_ALIGN]; /* padding source; read-only memory is fine for a write */

/* The file as laid out in memory before any I/O. */
typedef struct plan {
    size_t n;
    sr_tensor **src;          /* contiguous references to the caller's tensors */
    sr__ckpt_entry *entries;  /* their TOC entries */
    uint8_t *head;            /* header + TOC + zero padding: [0, data_offset) */
    sr__ckpt_header h;
} plan;

/* The names a save works with: <dir>/<base>, and <base>.tmp.<pid>. */
typedef struct names {
    char *dir, *base, *tmp, *tmp_path;
} names;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_names(const char *what, size_t n, const char *const *names)
{
    const char **sorted = malloc((n ? n : 1) * sizeof(*sorted));
    if (!sorted)
        return sr__fail(-ENOMEM, "sr_checkpoint_save", "no memory for %zu names", n);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t len = names[i] ? strlen(names[i]) : 0;
        if (!len || len > SR_CHECKPOINT_NAME_MAX)
            rc = sr__fail(-EINVAL, "sr_checkpoint_save", "%s name %zu is %s", what, i,
                          !names[i] ? "NULL" : !len ? "empty" : "longer than SR_CHECKPOINT_NAME_MAX");
        sorted[i] = names[i];
    }
    if (!rc) {
        qsort(sorted, n, sizeof(*sorted), cmp_str);
        for (size_t i = 1; i < n && !rc; i++)
            if (!strcmp(sorted[i - 1], sorted[i]))
                rc = sr__fail(-EINVAL, "sr_checkpoint_save", "%s name '%s' appears twice", what, sorted[i]);
    }
    free(sorted);
    return rc;
}

static int check_args(const char *path, size_t n, const char *const *nm, sr_tensor *const *ts, size_t nmeta,
                      const char *const *mnames, const int64_t *mvalues)
{
    if (!path || !*path)
        return sr__fail(-EINVAL, "sr_checkpoint_save", "path is %s", path ? "empty" : "NULL");
    if ((n && (!nm || !ts)) || (nmeta && (!mnames || !mvalues)))
        return sr__fail(-EINVAL, "sr_checkpoint_save", "%s: names or values are NULL", path);
    if (n > UINT32_MAX || nmeta > UINT32_MAX)
        return sr__fail(-EINVAL, "sr_checkpoint_save", "%s: too many entries (%zu tensors, %zu metadata)", path, n,
                        nmeta);
    for (size_t i = 0; i < n; i++)
        if (!ts[i])
            return sr__fail(-EINVAL, "sr_checkpoint_save", "%s: tensor %zu ('%s') is NULL", path, i,
                            nm[i] ? nm[i] : "?");
    int rc = check_names("tensor", n, nm);
    return rc ? rc : check_names("metadata", nmeta, mnames);
}

static void plan_free(plan *p)
{
    for (size_t i = 0; p->src && i < p->n; i++)
        sr_tensor_unref(p->src[i]);
    free(p->src);
    free(p->entries);
    free(p->head);
}

/* Entry i and its place in the data section; *cursor moves past it. */
static int plan_tensor(plan *p, size_t i, sr_tensor *t, uint64_t *cursor)
{
    /* What is saved is read twice (its CRC now, its bytes later), so it is a
     * tensor nobody writes: a private copy of a view, or a snapshot (its own
     * block reference) of a contiguous tensor, which a concurrent in-place
     * write (an optimizer step) then moves away from (tensor_impl.h). */
    bool prev = sr_no_grad_enter(); /* a copy of a view must not record history */
    sr_tensor *c = sr_tensor_is_contiguous(t) ? sr__tensor_snapshot(t) : sr_contiguous(t);
    sr_no_grad_exit(prev);
    if (!c)
        return sr__fail(-ENOMEM, "sr_checkpoint_save", "no memory for a contiguous copy of tensor %zu", i);
    p->src[i] = c;
    sr__ckpt_entry *e = &p->entries[i];
    memset(e, 0, sizeof(*e));
    e->dtype = (uint32_t)sr_tensor_dtype(c);
    e->ndim = (uint32_t)sr_tensor_ndim(c);
    memcpy(e->shape, sr_tensor_shape(c), e->ndim * sizeof(int64_t));
    e->nbytes = (uint64_t)sr_tensor_numel(c) * sr_dtype_size(sr_tensor_dtype(c));
    e->offset = *cursor;
    e->crc = e->nbytes ? sr__ckpt_crc(sr_tensor_data(c), e->nbytes) : 0;
    *cursor = sr__ckpt_align(*cursor + e->nbytes);
    return 0;
}

static size_t names_size(size_t n, const char *const *nm)
{
    size_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += strlen(nm[i]);
    return s;
}

/* Encode the TOC: entries, metadata, then the name table. */
static void plan_toc(plan *p, const char *const *nm, size_t nmeta, const char *const *mnames, const int64_t *mvals)
{
    uint8_t *toc = p->head + SR__CKPT_HEADER_SIZE;
    uint8_t *table = toc + p->n * SR__CKPT_ENTRY_SIZE + nmeta * SR__CKPT_META_SIZE;
    uint32_t at = 0;
    for (size_t i = 0; i < p->n; i++) {
        p->entries[i].name_off = at;
        p->entries[i].name_len = (uint32_t)strlen(nm[i]);
        memcpy(table + at, nm[i], p->entries[i].name_len);
        at += p->entries[i].name_len;
        sr__ckpt_put_entry(toc + i * SR__CKPT_ENTRY_SIZE, &p->entries[i]);
    }
    for (size_t i = 0; i < nmeta; i++) {
        sr__ckpt_meta m = {at, (uint32_t)strlen(mnames[i]), mvals[i]};
        memcpy(table + at, mnames[i], m.name_len);
        at += m.name_len;
        sr__ckpt_put_meta(toc + p->n * SR__CKPT_ENTRY_SIZE + i * SR__CKPT_META_SIZE, &m);
    }
}

static int plan_build(plan *p, size_t n, const char *const *nm, sr_tensor *const *ts, size_t nmeta,
                      const char *const *mnames, const int64_t *mvals)
{
    memset(p, 0, sizeof(*p));
    p->n = n;
    uint64_t table = names_size(n, nm) + names_size(nmeta, mnames);
    if (table > UINT32_MAX) /* name offsets are 32-bit */
        return sr__fail(-EINVAL, "sr_checkpoint_save", "names total %llu bytes, at most 4 GiB",
                        (unsigned long long)table);
    p->h = (sr__ckpt_header){.version = SR__CKPT_VERSION, .header_size = SR__CKPT_HEADER_SIZE,
                             .ntensors = (uint32_t)n, .nmeta = (uint32_t)nmeta};
    p->h.toc_size = n * SR__CKPT_ENTRY_SIZE + nmeta * SR__CKPT_META_SIZE + table;
    p->h.data_offset = sr__ckpt_align(SR__CKPT_HEADER_SIZE + p->h.toc_size);
    p->src = calloc(n ? n : 1, sizeof(*p->src));
    p->entries = calloc(n ? n : 1, sizeof(*p->entries));
    p->head = calloc(1, p->h.data_offset);
    if (!p->src || !p->entries || !p->head)
        return sr__fail(-ENOMEM, "sr_checkpoint_save", "no memory for a %llu-byte table of contents",
                        (unsigned long long)p->h.toc_size);
    uint64_t cursor = p->h.data_offset;
    for (size_t i = 0; i < n; i++) {
        int rc = plan_tensor(p, i, ts[i], &cursor);
        if (rc)
            return rc;
    }
    plan_toc(p, nm, nmeta, mnames, mvals);
    p->h.file_size = cursor;
    p->h.toc_crc = sr__ckpt_crc(p->head + SR__CKPT_HEADER_SIZE, p->h.toc_size);
    sr__ckpt_put_header(p->head, &p->h);
    return 0;
}

static void names_free(names *s)
{
    free(s->dir);
    free(s->base);
    free(s->tmp);
    free(s->tmp_path);
}

static int names_make(names *s, const char *path)
{
    memset(s, 0, sizeof(*s));
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base)
        return sr__fail(-EINVAL, "sr_checkpoint_save", "%s names a directory, not a file", path);
    int pid = (int)getpid();
    s->dir = !slash ? strdup(".") : slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
    s->base = strdup(base);
    if (asprintf(&s->tmp, "%s.tmp.%d", base, pid) < 0)
        s->tmp = NULL;
    if (asprintf(&s->tmp_path, "%s.tmp.%d", path, pid) < 0)
        s->tmp_path = NULL;
    if (!s->dir || !s->base || !s->tmp || !s->tmp_path)
        return sr__fail(-ENOMEM, "sr_checkpoint_save", "no memory for the names of %s", path);
    return 0;
}

static void phase(sr__ckpt_io *io, int ph, const names *s)
{
    if (!sr__ckpt_test_hook)
        return;
    if (ph == SR__CKPT_HALF_WRITTEN && sr__ckpt_io_drain(io))
        return;
    sr__ckpt_test_hook(ph, s->tmp_path);
}

/* Steps 3 and 4: every byte of the file, then its fsync. */
static int write_file(const plan *p, sr__ckpt_io *io, const names *s)
{
    int rc = sr__ckpt_io_write(io, p->head, p->h.data_offset, 0);
    for (size_t i = 0; i < p->n && !rc; i++) {
        const sr__ckpt_entry *e = &p->entries[i];
        if (e->nbytes)
            rc = sr__ckpt_io_write(io, sr_tensor_data(p->src[i]), e->nbytes, e->offset);
        uint64_t pad = sr__ckpt_align(e->nbytes) - e->nbytes;
        if (!rc && pad)
            rc = sr__ckpt_io_write(io, zeros, pad, e->offset + e->nbytes);
        if (i == p->n / 2)
            phase(io, SR__CKPT_HALF_WRITTEN, s);
    }
    if (!rc)
        rc = sr__ckpt_io_drain(io);
    if (!rc)
        phase(io, SR__CKPT_WRITTEN, s);
    if (!rc)
        rc = sr__ckpt_io_fsync(io, SR__CKPT_FILE);
    if (!rc)
        phase(io, SR__CKPT_SYNCED, s);
    return rc;
}

/* Steps 2 to 6 with the directory open. The rename is a plain syscall: it
 * is one metadata operation that the next step must wait for anyway, so a
 * ring would add a round trip and no overlap. */
static int commit(const plan *p, int dirfd, const names *s, const char *path)
{
    int fd = sr__ckpt_tmp_open(dirfd, s->tmp, s->tmp_path);
    if (fd < 0)
        return fd;
    sr__ckpt_io io;
    int rc = sr__ckpt_io_init(&io, fd, s->tmp_path, dirfd, s->dir);
    if (!rc) {
        phase(&io, SR__CKPT_TMP_CREATED, s);
        rc = write_file(p, &io, s);
    }
    if (!rc && renameat(dirfd, s->tmp, dirfd, s->base))
        rc = sr__fail(-errno, "sr_checkpoint_save", "renaming %s to %s: %s", s->tmp_path, path, strerror(errno));
    if (rc)
        unlinkat(dirfd, s->tmp, 0); /* while we still hold its lock */
    if (!rc) {
        phase(&io, SR__CKPT_RENAMED, s);
        rc = sr__ckpt_io_fsync(&io, SR__CKPT_DIR);
    }
    sr__ckpt_io_fini(&io);
    close(fd);
    return rc;
}

static int save_file(const plan *p, const char *path)
{
    names s;
    int rc = names_make(&s, path);
    int dirfd = rc ? -1 : open(s.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!rc && dirfd < 0)
        rc = sr__fail(-errno, "sr_checkpoint_save", "opening directory %s of %s: %s", s.dir, path, strerror(errno));
    if (!rc) {
        sr__ckpt_tmp_clean(dirfd, s.base);
        rc = commit(p, dirfd, &s, path);
    }
    if (dirfd >= 0)
        close(dirfd);
    names_free(&s);
    return rc;
}

SR_API int sr_checkpoint_save(const char *path, size_t n, const char *const *names, sr_tensor *const *tensors,
                              size_t nmeta, const char *const *meta_names, const int64_t *meta_values)
{
    int rc = check_args(path, n, names, tensors, nmeta, meta_names, meta_values);
    if (rc)
        return rc;
    plan p;
    rc = plan_build(&p, n, names, tensors, nmeta, meta_names, meta_values);
    if (!rc)
        rc = save_file(&p, path);
    plan_free(&p);
    return rc;
}
