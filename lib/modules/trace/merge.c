/* SPDX-License-Identifier: MIT */
/* Merging a job's trace parts into one Trace Event Format file. See
 * trace.h.
 *
 * "<path>.<rank>.part" holds a worker's events, one per line (write.c),
 * written by the launcher from the worker's record area (job.c), or by a
 * worker without one at sr_shutdown. The merger reads them all, keeps only the flow events whose
 * other end is there too (a worker that crashed, or whose buffer filled,
 * leaves half-flows behind), and writes {"traceEvents":[...]} to a
 * temporary file beside path, renamed over path once complete; the parts
 * and the temporary file are removed, whatever happens. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "trace.h"

struct ids {
    uint64_t *v;
    size_t n, cap;
};

void sr__trace_part_name(const char *path, int r, char *buf, size_t len)
{
    snprintf(buf, len, "%s.%d.part", path, r);
}

/* 's' or 'f' for a flow line (its id in *id), else 0. */
static char flow_of(const char *line, uint64_t *id)
{
    if (strncmp(line, "{\"ph\":\"", 7) || (line[7] != 's' && line[7] != 'f') || strncmp(line + 8, "\",\"id\":", 7))
        return 0;
    *id = strtoull(line + 15, NULL, 10);
    return line[7];
}

static int push(struct ids *s, uint64_t id)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        uint64_t *v = realloc(s->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = id;
    return 0;
}

static int cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool has(const struct ids *s, uint64_t id) { return s->n && bsearch(&id, s->v, s->n, sizeof(id), cmp); }

/* Pass 1: every flow id of every part, starts and ends apart. */
static int collect(const char *path, int world, struct ids *st, struct ids *fn, int *found)
{
    char name[4096], *line = NULL;
    size_t cap = 0;
    int rc = 0;
    *found = 0;
    for (int r = 0; r < world && !rc; r++) {
        sr__trace_part_name(path, r, name, sizeof(name));
        FILE *f = fopen(name, "r");
        if (!f)
            continue;
        ++*found;
        uint64_t id;
        while (!rc && getline(&line, &cap, f) > 0) {
            char ph = flow_of(line, &id);
            rc = ph == 's' ? push(st, id) : ph == 'f' ? push(fn, id) : 0;
        }
        fclose(f);
    }
    free(line);
    if (st->n) /* qsort's array may not be NULL, even when empty */
        qsort(st->v, st->n, sizeof(uint64_t), cmp);
    if (fn->n)
        qsort(fn->v, fn->n, sizeof(uint64_t), cmp);
    return rc;
}

/* Pass 2: copy every part's events (paired flows only) into out; remove the parts. */
static uint64_t copy_parts(const char *path, int world, const struct ids *st, const struct ids *fn, FILE *out)
{
    char name[4096], *line = NULL;
    size_t cap = 0;
    uint64_t dropped = 0;
    bool first = true;
    for (int r = 0; r < world; r++) {
        sr__trace_part_name(path, r, name, sizeof(name));
        FILE *f = fopen(name, "r");
        if (!f)
            continue;
        ssize_t n;
        uint64_t id;
        while ((n = getline(&line, &cap, f)) > 0) {
            char ph = flow_of(line, &id);
            if ((ph == 's' && !has(fn, id)) || (ph == 'f' && !has(st, id))) {
                dropped++;
                continue;
            }
            if (line[n - 1] == '\n')
                line[--n] = '\0';
            fprintf(out, "%s%s", first ? "" : ",\n", line);
            first = false;
        }
        fclose(f);
        unlink(name);
    }
    free(line);
    return dropped;
}

static void remove_parts(const char *path, int world)
{
    char name[4096];
    for (int r = 0; r < world; r++) {
        sr__trace_part_name(path, r, name, sizeof(name));
        unlink(name);
    }
}

int sr__trace_merge(const char *path, int world, int parts)
{
    struct ids st = {0}, fn = {0};
    int found = 0, rc = collect(path, parts, &st, &fn, &found);
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    FILE *out = NULL;
    if (!rc && !found)
        rc = sr__fail(-ENOENT, "trace merge", "no worker wrote a trace part for '%s'", path);
    else if (!rc && !(out = fopen(tmp, "w")))
        rc = sr__fail(-errno, "trace merge", "cannot create '%s': %s", tmp, strerror(errno));
    if (out) {
        fputs("{\"traceEvents\":[\n", out);
        uint64_t dropped = copy_parts(path, parts, &st, &fn, out);
        fprintf(out, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"workers\":%d,\"parts\":%d,\"unpaired_flows_dropped\":%" PRIu64 "}}\n",
                world, found, dropped);
        int bad = ferror(out);
        if (fclose(out) || bad)
            rc = sr__fail(-EIO, "trace merge", "cannot write '%s'", tmp);
        else if (rename(tmp, path))
            rc = sr__fail(-errno, "trace merge", "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        if (rc)
            unlink(tmp);
    }
    remove_parts(path, parts);
    free(st.v);
    free(fn.v);
    return rc;
}
