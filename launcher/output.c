/* SPDX-License-Identifier: MIT */
/* Worker output relay, tags, log files and folding. See output.h. */
#include "output.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "segment.h"

#define LINE_CAP 65536 /* a longer line is cut: the relay's memory stays bounded */

struct stream {
    int fd;         /* piped: the read end (non-blocking); -1 otherwise or at end of file */
    int child;      /* the worker's end (pipe or log file) until it is forked; -1 after */
    FILE *file;     /* piped with --output-dir: the log file */
    char *part;     /* the line read so far (no newline yet) */
    size_t len, cap;
};

/* One stderr line waiting for copies (folding). */
struct fold {
    struct fold *next;
    uint64_t seq;  /* arrival order: a rank's line may only join a later entry than its previous one */
    int64_t due;   /* CLOCK_MONOTONIC ns: printed then at the latest */
    int count;     /* ranks in `ranks` */
    bool *ranks;   /* [n] */
    size_t len;
    char text[];
};

struct out {
    sr_job *job;
    struct rlimit nofile; /* the limit the workers get back (we may raise ours) */
    enum tag_kind tag;
    bool piped;
    int n;
    struct stream *s;  /* [2n]: rank r's stdout at 2r, its stderr at 2r + 1 */
    int *fds;          /* [2n]: the read ends, for the supervisor */
    char (*names)[SR_NAME_MAX]; /* [n]: worker names once published ("" until then) */
    char scratch[LINE_CAP];
    /* folding */
    int64_t fold_ns;   /* 0: off */
    struct fold *head, **tail;
    uint64_t seq;
    uint64_t *last_seq; /* [n]: seq of the entry holding the rank's last stderr line */
    int open_err;       /* ranks whose stderr is still open */
};

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* "[3] " or "[trainer] ": the worker's name once it has attached. */
static const char *tag_of(struct out *o, int rank, char *buf, size_t len)
{
    if (o->tag == TAG_NAME && !o->names[rank][0]) {
        struct sr_worker_info *w = sr__seg_worker(&o->job->seg, rank);
        /* acquire: pairs with the worker's release store of ATTACHED, after it wrote its name */
        if (atomic_load_explicit(&w->state, memory_order_acquire) != SR_WORKER_EMPTY) {
            memcpy(o->names[rank], w->name, SR_NAME_MAX); /* read once, then kept */
            o->names[rank][SR_NAME_MAX - 1] = 0;
        }
    }
    if (o->tag == TAG_NAME && o->names[rank][0])
        snprintf(buf, len, "%s", o->names[rank]);
    else
        snprintf(buf, len, "%d", rank);
    return buf;
}

static void print_line(FILE *f, const char *tag, const char *line, size_t len)
{
    fprintf(f, "[%s] %.*s\n", tag, (int)len, line);
}

static void fold_print(struct out *o, struct fold *e)
{
    char tag[SR_NAME_MAX + 16];
    if (e->count > 1) {
        sr__rank_list(e->ranks, o->n, tag, sizeof(tag));
    } else {
        int r = 0;
        while (!e->ranks[r])
            r++;
        tag_of(o, r, tag, sizeof(tag));
    }
    print_line(stderr, tag, e->text, e->len);
}

/* Every rank still able to send the line has sent it. */
static bool fold_complete(const struct out *o, const struct fold *e)
{
    if (e->count < o->open_err)
        return false;
    for (int r = 0; r < o->n; r++)
        if (!e->ranks[r] && o->s[2 * r + 1].fd >= 0)
            return false;
    return true;
}

/* Print the waiting lines, oldest first, while the oldest is complete or
 * due (all: at the end of the job). */
static void fold_flush(struct out *o, int64_t now, bool all)
{
    struct fold *e;
    while ((e = o->head) && (all || e->due <= now || fold_complete(o, e))) {
        fold_print(o, e);
        o->head = e->next;
        if (!o->head)
            o->tail = &o->head;
        free(e->ranks);
        free(e);
    }
}

static struct fold *fold_find(struct out *o, int rank, const char *line, size_t len)
{
    for (struct fold *e = o->head; e; e = e->next)
        if (e->seq > o->last_seq[rank] && !e->ranks[rank] && e->len == len && !memcmp(e->text, line, len))
            return e;
    return NULL;
}

static void fold_add(struct out *o, int rank, const char *line, size_t len)
{
    struct fold *e = fold_find(o, rank, line, len);
    if (!e) {
        e = malloc(sizeof(*e) + len);
        bool *ranks = calloc((size_t)o->n, sizeof(bool));
        if (!e || !ranks) { /* no memory to wait: print it now */
            free(e), free(ranks);
            char tag[SR_NAME_MAX + 16];
            print_line(stderr, tag_of(o, rank, tag, sizeof(tag)), line, len);
            return;
        }
        *e = (struct fold){.seq = ++o->seq, .due = now_ns() + o->fold_ns, .ranks = ranks, .len = len};
        memcpy(e->text, line, len);
        *o->tail = e;
        o->tail = &e->next;
    }
    e->ranks[rank] = true;
    e->count++;
    o->last_seq[rank] = e->seq;
}

/* One whole line of stream i. */
static void emit(struct out *o, int i, const char *line, size_t len)
{
    struct stream *s = &o->s[i];
    int rank = i / 2;
    bool err = i & 1;
    if (s->file) {
        fwrite(line, 1, len, s->file);
        fputc('\n', s->file);
    }
    if (err && o->fold_ns) {
        fold_add(o, rank, line, len);
        return;
    }
    char tag[SR_NAME_MAX + 16];
    print_line(err ? stderr : stdout, tag_of(o, rank, tag, sizeof(tag)), line, len);
}

static void part_append(struct out *o, int i, const char *p, size_t len)
{
    struct stream *s = &o->s[i];
    if (s->len + len > s->cap) {
        size_t cap = s->len + len > 256 ? s->len + len : 256;
        char *b = realloc(s->part, cap);
        if (!b) { /* no memory to keep the piece: what we have becomes a line */
            emit(o, i, s->part, s->len);
            s->len = 0;
            emit(o, i, p, len);
            return;
        }
        s->part = b, s->cap = cap;
    }
    memcpy(s->part + s->len, p, len);
    s->len += len;
    if (s->len >= LINE_CAP) {
        emit(o, i, s->part, s->len);
        s->len = 0;
    }
}

/* Cut what was read into lines; the unfinished one waits in s->part. */
static void split_lines(struct out *o, int i, const char *p, size_t len)
{
    struct stream *s = &o->s[i];
    const char *end = p + len, *nl;
    while ((nl = memchr(p, '\n', (size_t)(end - p)))) {
        if (s->len) {
            part_append(o, i, p, (size_t)(nl - p));
            emit(o, i, s->part, s->len);
            s->len = 0;
        } else {
            emit(o, i, p, (size_t)(nl - p));
        }
        p = nl + 1;
    }
    if (p < end)
        part_append(o, i, p, (size_t)(end - p));
}

static void close_stream(struct out *o, int i)
{
    struct stream *s = &o->s[i];
    if (s->len)
        emit(o, i, s->part, s->len); /* a last line without its newline */
    s->len = 0;
    close(s->fd);
    s->fd = -1;
    if (i & 1)
        o->open_err--;
}

static void flush_sinks(struct out *o)
{
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2 * o->n; i++)
        if (o->s[i].file)
            fflush(o->s[i].file);
}

/* Read once; false at end of file (or a read error: nothing more will come). */
static bool read_stream(struct out *o, int i)
{
    ssize_t got = read(o->s[i].fd, o->scratch, sizeof(o->scratch));
    if (got > 0) {
        split_lines(o, i, o->scratch, (size_t)got);
        return true;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return true;
    close_stream(o, i);
    return false;
}

static bool on_input(void *ctx, int i)
{
    struct out *o = ctx;
    if (o->s[i].fd < 0)
        return false;
    bool more = read_stream(o, i);
    if (o->fold_ns)
        fold_flush(o, now_ns(), false);
    flush_sinks(o);
    return more;
}

static int64_t next_due(void *ctx)
{
    struct out *o = ctx;
    return o->head ? o->head->due : INT64_MAX;
}

static void on_due(void *ctx, int64_t now)
{
    struct out *o = ctx;
    fold_flush(o, now, false);
    flush_sinks(o);
}

/* Every worker is gone: what they wrote is in the pipes already. Read it
 * all, without waiting for an end of file that a process the worker left
 * behind could hold back. */
static void on_end(void *ctx)
{
    struct out *o = ctx;
    for (int i = 0; i < 2 * o->n; i++)
        while (o->s[i].fd >= 0) {
            ssize_t got = read(o->s[i].fd, o->scratch, sizeof(o->scratch));
            if (got > 0)
                split_lines(o, i, o->scratch, (size_t)got);
            else if (!(got < 0 && errno == EINTR))
                close_stream(o, i); /* end of file, or nothing more for now */
        }
    fold_flush(o, 0, true);
    flush_sinks(o);
}

/* DIR/RANK/{stdout,stderr}.log, truncated; appended to after a restart
 * (the failed attempt's lines are what says why). */
static int open_logs(const char *dir, int rank, bool append, int fd[2])
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%d", dir, rank);
    if (mkdir(path, 0777) && errno != EEXIST)
        return sr__fail(-errno, "shmrun", "--output-dir: cannot create %s: %s", path, strerror(errno));
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof(path), "%s/%d/%s.log", dir, rank, k ? "stderr" : "stdout");
        fd[k] = open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0666);
        if (fd[k] < 0)
            return sr__fail(-errno, "shmrun", "--output-dir: cannot open %s: %s", path, strerror(errno));
    }
    return 0;
}

/* Rank's pipes (piped) and/or log files. */
static int open_rank(struct out *o, const char *dir, int rank, bool append)
{
    int logs[2] = {-1, -1}, rc = dir ? open_logs(dir, rank, append, logs) : 0;
    for (int k = 0; k < 2 && !rc; k++) {
        struct stream *s = &o->s[2 * rank + k];
        if (!o->piped) {
            s->child = logs[k], logs[k] = -1;
            continue;
        }
        int p[2];
        if (pipe2(p, O_CLOEXEC))
            return sr__fail(-errno, "shmrun", "pipe for the output of rank %d: %s", rank, strerror(errno));
        fcntl(p[0], F_SETFL, O_NONBLOCK); /* the read end only: the worker's end stays blocking */
        s->fd = o->fds[2 * rank + k] = p[0];
        s->child = p[1];
        if (logs[k] >= 0 && !(s->file = fdopen(logs[k], "w")))
            return sr__fail(-errno, "shmrun", "fdopen of a log file of rank %d: %s", rank, strerror(errno));
        logs[k] = -1;
        if (k)
            o->open_err++;
    }
    for (int k = 0; k < 2; k++)
        if (logs[k] >= 0)
            close(logs[k]);
    return rc;
}

static int alloc_out(struct out **po, const struct args *a, sr_job *job)
{
    struct out *o = calloc(1, sizeof(*o));
    if (!o)
        return sr__fail(-ENOMEM, "shmrun", "no memory for the output relay");
    *po = o;
    *o = (struct out){.job = job, .tag = a->tag, .piped = a->tag != TAG_NONE, .n = job->n,
                      .fold_ns = a->tag != TAG_NONE ? a->fold_ns : 0};
    o->tail = &o->head;
    o->s = calloc((size_t)(2 * o->n), sizeof(*o->s));
    o->fds = calloc((size_t)(2 * o->n), sizeof(int));
    o->names = calloc((size_t)o->n, sizeof(*o->names));
    o->last_seq = calloc((size_t)o->n, sizeof(uint64_t));
    if (!o->s || !o->fds || !o->names || !o->last_seq)
        return sr__fail(-ENOMEM, "shmrun", "no memory for the output relay of %d workers", o->n);
    for (int i = 0; i < 2 * o->n; i++)
        o->s[i].fd = o->s[i].child = o->fds[i] = -1;
    return 0;
}

/* Four pipe ends per rank exist until it is forked, and two stay: with
 * the pidfds and eventfds, a large job passes the usual soft limit of 1024
 * descriptors. Raise ours as far as the hard limit allows; each worker gets
 * the original back before exec. */
static void raise_nofile(struct out *o)
{
    getrlimit(RLIMIT_NOFILE, &o->nofile);
    rlim_t need = (rlim_t)o->n * 8 + 64;
    if (o->nofile.rlim_cur != RLIM_INFINITY && o->nofile.rlim_cur < need) {
        struct rlimit more = {.rlim_cur = need < o->nofile.rlim_max ? need : o->nofile.rlim_max,
                              .rlim_max = o->nofile.rlim_max};
        setrlimit(RLIMIT_NOFILE, &more);
    }
}

int out_create(struct out **po, const struct args *a, sr_job *job)
{
    *po = NULL;
    if (a->tag == TAG_NONE && !a->output_dir)
        return 0;
    if (a->output_dir && mkdir(a->output_dir, 0777) && errno != EEXIST)
        return sr__fail(-errno, "shmrun", "--output-dir: cannot create %s: %s", a->output_dir, strerror(errno));
    struct out *o = NULL;
    int rc = alloc_out(&o, a, job);
    if (!rc)
        raise_nofile(o);
    for (int r = 0; r < job->n && !rc; r++)
        rc = open_rank(o, a->output_dir, r, job->restart > 0);
    if (rc) {
        out_destroy(o);
        return rc;
    }
    *po = o;
    return 0;
}

int out_child(const struct out *o, int rank)
{
    if (!o)
        return 0;
    for (int k = 0; k < 2; k++) /* dup2 clears close-on-exec on the copy */
        if (dup2(o->s[2 * rank + k].child, 1 + k) < 0)
            return -errno;
    setrlimit(RLIMIT_NOFILE, &o->nofile);
    return 0;
}

void out_forked(struct out *o, int rank)
{
    if (!o)
        return;
    for (int k = 0; k < 2; k++) {
        struct stream *s = &o->s[2 * rank + k];
        if (s->child >= 0)
            close(s->child);
        s->child = -1;
    }
}

void out_hooks(struct out *o, sr_job_hooks *h)
{
    if (!o || !o->piped)
        return;
    h->ctx = o;
    h->nfds = 2 * o->n;
    h->fds = o->fds;
    h->on_input = on_input;
    h->next_due = next_due;
    h->on_due = on_due;
    h->on_end = on_end;
}

void out_destroy(struct out *o)
{
    if (!o)
        return;
    if (o->s)
        for (int i = 0; i < 2 * o->n; i++) {
            struct stream *s = &o->s[i];
            if (s->fd >= 0)
                close(s->fd);
            if (s->child >= 0)
                close(s->child);
            if (s->file)
                fclose(s->file);
            free(s->part);
        }
    fold_flush(o, 0, true);
    free(o->s);
    free(o->fds);
    free(o->names);
    free(o->last_seq);
    free(o);
}
