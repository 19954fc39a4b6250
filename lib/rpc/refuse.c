/* SPDX-License-Identifier: MIT */
/* Generation stamps (agent.h, expect; segment.h, "Replacement in place"):
 * a message whose sr_msg.gens does not say the generations this worker
 * knows, of its sender and of itself, is refused: what it carries is let
 * go, and one line says who sent it to whom. */
#include <inttypes.h>
#include <stdio.h>

#include "agent.h"
#include "codec.h"
#include "ext.h"
#include "log.h"
#include "payload.h"
#include "wire.h"

void sr__agent_stamps_init(sr_agent *a)
{
    a->replaces = (a->self->caps & SR_TPORT_REPLACES) != 0;
    a->elastic = (a->self->caps & SR_TPORT_ELASTIC) != 0;
    a->gen = a->replaces ? a->self->ops->live->generation(a->self, a->rank) : 0;
    for (int r = 0; r < a->world; r++)
        /* relaxed: before any thread of the agent starts */
        atomic_store_explicit(&a->expect[r], sr__agent_stamp_for(a, r), memory_order_relaxed);
}

/* What a message that will never be read carried: the payload's references
 * (tensor blocks, RRef forks: the codec lets them go), then its block. */
void sr__msg_release(const sr_msg *m)
{
    size_t len, used = 0;
    const uint8_t *p = sr__payload_get(m, &len);
    if (!p)
        return;
    struct sr_wire w = sr__wire_get(m);
    struct sr_ext_view ext;
    bool carries = m->type == SR_MSG_REQ || m->type == SR_MSG_KEEP_CALL || m->type == SR_MSG_MOD_REQ ||
                   m->type == SR_MSG_RESP;
    if (carries && (!(w.flags & SR_WIRE_EXT) || !sr__ext_parse(p, len, m->src, &ext, &used))) {
        size_t name = m->type == SR_MSG_REQ || m->type == SR_MSG_KEEP_CALL ? w.name_len : 0;
        if (used + name <= len)
            sr__codec_release(p + used + name, len - used - name);
    }
    sr__payload_done(m);
}

/* The generation that stamp's nibble stands for: the latest at or below
 * `now` with the same value modulo 16, or, for a newer one (1 to 7 ahead,
 * sr__held_newer), the one above it. */
static uint32_t unstamp(uint32_t now, unsigned nibble)
{
    uint32_t ahead = (nibble - now) & 0xfu;
    return ahead >= 1 && ahead <= 7 ? now + ahead : now - ((now - nibble) & 0xfu);
}

static void refuse(sr_agent *a, const sr_msg *m)
{
    int from = m->src;
    sr_tport *t = a->tp[from];
    uint32_t src_now = a->replaces ? t->ops->live->generation(t, from) : 0;
    uint32_t src_gen = unstamp(src_now, m->gens & 0xfu), dst_gen = unstamp(a->gen, m->gens >> 4);
    bool gone = atomic_load_explicit(&a->expect[from], memory_order_relaxed) < 0; /* relaxed: see expect */
    char why[200];
    if (dst_gen == a->gen && sr__held_newer(a, m)) /* sr__held_add failed */
        snprintf(why, sizeof(why), "it comes from a generation not known here yet and there was no memory to keep it");
    else if (dst_gen != a->gen)
        snprintf(why, sizeof(why), "it was sent to an older generation: this is generation %u", a->gen);
    else if (gone)
        snprintf(why, sizeof(why), "its sender's generation died");
    else
        snprintf(why, sizeof(why), "it comes from an older generation: %s is generation %u now", a->names[from],
                 src_now);
    /* relaxed: a statistic; nothing is published with it */
    uint64_t n = atomic_fetch_add_explicit(&a->refused, 1, memory_order_relaxed) + 1;
    if (n <= 8 || !(n & (n - 1))) /* the first few, then at powers of two: a flood must not flood stderr */
        sr_logf(SR_LOG_WARN, "refused a message (type %u) from %s generation %u to %s generation %u: %s (%" PRIu64
                " refused so far)", m->type, a->names[from], src_gen, a->names[a->rank], dst_gen, why, n);
    sr__msg_release(m);
}

bool sr__agent_stamp_slow(sr_agent *a, const sr_msg *m)
{
    if (m->src >= (unsigned)a->world) {
        sr_logf(SR_LOG_WARN, "dropped a message (type %u) from rank %u: out of range [0, %d)", m->type, m->src,
                a->world);
        return false;
    }
    if (a->replaces && sr__held_newer(a, m) && !sr__held_add(a, m)) {
        /* A generation whose return is not taken yet: held first, so that
         * whatever the check below dispatches (callbacks that poll) comes
         * behind it; it goes once the return is taken (held.c), by this
         * check or by whoever handles the old generation's death now. */
        sr__agent_check_exits(a);
        return false;
    }
    if (a->replaces) { /* a generation that came back since we last looked: learn it first */
        sr__agent_check_exits(a);
        /* relaxed: see expect */
        if ((int16_t)m->gens == atomic_load_explicit(&a->expect[m->src], memory_order_relaxed))
            return true;
    }
    refuse(a, m);
    return false;
}

void sr__agent_release_held(sr_agent *a)
{
    unsigned n = 0;
    for (sr_msg m; sr__held_pop(a, &m); n++)
        sr__msg_release(&m);
    if (n)
        sr_logf(SR_LOG_WARN, "%s: let go of %u message%s from a generation never known here (the job ended first)",
                a->names[a->rank], n, n == 1 ? "" : "s");
}
