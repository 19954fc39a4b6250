/* SPDX-License-Identifier: MIT */
/* Fuzzer of the segment as a worker or a launcher finds it: the header
 * that sr__segment_attach validates, an inbox ring as its consumer and its
 * producers use it, the worker table's lines that peers and the supervisor
 * read (states, exits, crash reports, names), and the heap's area table
 * that the heap's attach reads. Built with -Dfuzz=true (clang, libFuzzer,
 * ASan, UBSan); README.md says how to run it.
 *
 * An input: one byte whose low two bits are the world size less one (1 to
 * 4 workers) and whose third bit picks how the ring's consumer attaches
 * (0: as a worker at sr_init; 1: as the successor of a consumer that died,
 * discarding what it left), then bytes written over a freshly created,
 * valid segment of that world: first the header's creator lines
 * (everything before its `attached` line), then the worker table, line
 * after line, then rank 0's inbox ring, then the area table; an input
 * shorter than that leaves the rest as created. Seeds are segments this
 * library wrote (gen_corpus.c), with messages in the ring, exits, a crash report
 * and the job policies set, so that mutations start from a valid layout.
 *
 * The oracles: no crash, no sanitizer report, no leak, no hang, nothing
 * read or written outside the mapping; attach fails only with -EPROTO or
 * -EINVAL and a message; what attaches is read as peers read it (every
 * rank's exit and crash texts, printable and bounded); the ring's consumer
 * attaches or says why not (-EPROTO), then reads and frees what it can,
 * a producer fills it, a dead producer's claims are reaped, and a read
 * that meets a corrupt slot latches it; then the heap attaches as rank 0
 * (or fails with -ENOSPC, no free area, or -EINVAL, areas below the heap's
 * minimum), allocates, frees and detaches. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fuzz_env.h"
#include "heap.h"
#include "ring.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *report; /* where the oracles report (fz_report_open) */
static bool trace;   /* FUZZ_TRACE=1: print what each attach answered */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    trace = getenv("FUZZ_TRACE") != NULL;
    report = fz_report_open();
    return 0;
}

static void __attribute__((noreturn)) fail(const char *what, int rc)
{
    fprintf(report, "fuzz_segment: %s returned %d (%s)\n", what, rc, sr_last_error());
    abort();
}

/* A text made of what a peer wrote must be terminated within its buffer
 * and printable: the readers validate what they print. */
static void check_text(const char *what, int rank, const char *t, size_t cap)
{
    size_t n = strnlen(t, cap);
    for (size_t i = 0; i < n && n < cap; i++)
        if (t[i] < 0x20 || t[i] > 0x7e)
            n = cap;
    if (n < cap)
        return;
    fprintf(report, "fuzz_segment: rank %d's %s is unterminated or unprintable\n", rank, what);
    abort();
}

/* What peers and the supervisor read of every rank's line. */
static void read_lines(const sr_segment *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        char text[256];
        sr__seg_exit_text(sr__seg_worker(s, (int)r), text, sizeof(text));
        check_text("exit text", (int)r, text, sizeof(text));
        sr__seg_crash_text(s, (int)r, text, sizeof(text));
        check_text("crash text", (int)r, text, sizeof(text));
        (void)sr__seg_attaches(s, (int)r);
    }
}

/* A consumer's and a producer's use of rank 0's inbox: everything a worker
 * does with a ring whose shared words a peer may have scribbled on. */
static void use_ring(const sr_segment *s, bool recover)
{
    struct sr_ring *r = sr__seg_inbox(s, 0);
    uint32_t n = s->ring_slots;
    struct sr_ring_cons c;
    char why[256] = "";
    int rc = recover ? sr__ring_cons_recover(&c, r, n, SR_RING_RECOVER_DISCARD, why, sizeof(why))
                     : sr__ring_cons_attach(&c, r, n, why, sizeof(why));
    if (trace)
        fprintf(report, "fuzz_segment: ring %s: %d %s\n", recover ? "recover" : "attach", rc, why);
    if (rc == -EPROTO) {
        check_text("ring's refusal", 0, why, sizeof(why));
        return;
    }
    if (rc)
        fail(recover ? "sr__ring_cons_recover" : "sr__ring_cons_attach", rc);
    sr_msg m[8], one = {.type = 1};
    for (int i = 0; i < 3; i++) {
        (void)sr__ring_cons_pending(&c);
        (void)sr__ring_ready(&c);
        sr__ring_read_burst(&c, m, 8);
        sr__ring_release(&c);
        (void)sr__ring_space_take(r);
    }
    for (uint32_t i = 0; i <= n && sr__ring_enqueue(r, n, 1, &one) == 0; i++)
        ;
    (void)sr__ring_probe(r, n);
    if (sr__ring_depth(r, n) > n)
        fail("sr__ring_depth", (int)sr__ring_depth(r, n));
    (void)sr__ring_reap_producer(r, n, 2);
    sr__ring_cons_check(&c);
    sr__ring_dequeue_burst(&c, m, 8);
    uint32_t pos, seq;
    if (sr__ring_cons_error(&c, &pos, &seq) && trace)
        fprintf(report, "fuzz_segment: ring corrupt at %u (sequence %u)\n", pos, seq);
    sr__ring_cons_detach(&c);
}

/* The heap's attach reads the area table: attach as rank 0, use, detach. */
static void use_heap(const sr_segment *s)
{
    int rc = sr__heap_attach(s, 0);
    if (trace)
        fprintf(report, "fuzz_segment: heap attach: %d %s\n", rc, rc ? sr_last_error() : "");
    if (rc == -ENOSPC || (rc == -EINVAL && s->heap_stride < SR_HEAP_MIN))
        return; /* no free area; areas too small for a heap (a segment of rings only) */
    if (rc)
        fail("sr__heap_attach", rc);
    sr_block *b = sr__block_alloc(4096);
    if (!b)
        fail("sr__block_alloc", -ENOMEM);
    memset(sr__block_data(b), 0x5a, 4096);
    sr__block_unref(b);
    sr__heap_detach();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int world = (data[0] & 3) + 1;
    sr_segment_opts o = fz_segment_opts(world);
    sr_segment made;
    int rc = sr__segment_create(&o, &made);
    if (rc)
        fail("sr__segment_create", rc);
    fz_segment_overlay(&made, data + 1, size - 1);
    sr_segment seg;
    rc = sr__segment_attach(made.fd, &seg);
    if (trace)
        fprintf(report, "fuzz_segment: %d workers, %zu bytes: attach %d %s\n", world, size - 1, rc,
                rc ? sr_last_error() : "");
    if (rc && ((rc != -EPROTO && rc != -EINVAL) || !strstr(sr_last_error(), "sr__segment_attach")))
        fail("sr__segment_attach", rc);
    if (!rc) {
        read_lines(&seg);
        use_ring(&seg, data[0] & 4);
        use_heap(&seg);
        sr__segment_detach(&seg, false);
    }
    sr__segment_detach(&made, true);
    return 0;
}
