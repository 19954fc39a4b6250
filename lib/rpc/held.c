/* SPDX-License-Identifier: MIT */
/* Messages from a generation not known yet (agent.h, held). A replaced
 * rank's new process may send before this worker has taken its return: a
 * thread of ours may still be handling the old generation's death (failing
 * its calls, running the callbacks that completes; segment.h, "Replacement
 * in place"). Such a message is for us and from the newest generation of
 * its sender: refusing it would lose a call its sender waits on. It waits
 * here, in arrival order, until the return is taken (then it is dispatched
 * as if it had just arrived). A generation that dies before its return is
 * taken is never taken: its messages are refused when a later generation
 * of the rank is (they are older then), or let go at the end. Nothing
 * bounds the list but the time a death takes to handle (the sender's
 * inbox slots are free again once read). Every list operation is the
 * token holder's. */
#include <errno.h>
#include <stdlib.h>

#include "agent.h"
#include "log.h"

struct sr_held {
    struct sr_held *next;
    sr_msg m;
};

/* Does m come from a generation of its sender newer than the one we know
 * (modulo 16: 1 to 7 ahead), sent to ours? */
bool sr__held_newer(sr_agent *a, const sr_msg *m)
{
    sr_tport *t = a->tp[m->src];
    if (!a->replaces || !(t->caps & SR_TPORT_REPLACES) || (unsigned)(m->gens >> 4) != (a->gen & 0xfu))
        return false;
    unsigned ahead = ((unsigned)m->gens - t->ops->live->generation(t, m->src)) & 0xfu;
    return ahead >= 1 && ahead <= 7;
}

int sr__held_add(sr_agent *a, const sr_msg *m)
{
    struct sr_held *h = malloc(sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->next = NULL;
    sr__msg_copy(&h->m, m);
    *(a->held ? a->held_tail : &a->held) = h;
    a->held_tail = &h->next;
    /* relaxed: a statistic for tests; nothing is published with it */
    if (!atomic_fetch_add_explicit(&a->held_early, 1, memory_order_relaxed))
        sr_logf(SR_LOG_DEBUG, "%s: a message (type %u) from %s's generation not known here yet waits for its return",
                a->names[a->rank], m->type, a->names[m->src]);
    return 0;
}

bool sr__held_from(const sr_agent *a, unsigned src)
{
    for (const struct sr_held *h = a->held; h; h = h->next)
        if (h->m.src == src)
            return true;
    return false;
}

/* h may leave the list: its stamp is expected now, or a later generation
 * of its sender was taken (its own died first): refused then. */
static bool can_go(sr_agent *a, const struct sr_held *h)
{
    /* relaxed: see agent.h, expect; the fence and poke after a return (exits.c, returned) order it for a sleeper */
    return (int16_t)h->m.gens == atomic_load_explicit(&a->expect[h->m.src], memory_order_relaxed) ||
           !sr__held_newer(a, &h->m);
}

/* The first entry that can go and has no older one of the same sender
 * before it (each sender's messages leave in their order); *link: where it hangs. */
static struct sr_held **first_to_go(sr_agent *a)
{
    for (struct sr_held **link = &a->held; *link; link = &(*link)->next) {
        const struct sr_held *h = *link;
        bool behind = false;
        for (const struct sr_held *o = a->held; o != h && !behind; o = o->next)
            behind = o->m.src == h->m.src;
        if (!behind && can_go(a, h))
            return link;
    }
    return NULL;
}

bool sr__held_due_slow(sr_agent *a) { return first_to_go(a) != NULL; }

/* Unlink the entry at *link into out. */
static void take(sr_agent *a, struct sr_held **link, sr_msg *out)
{
    struct sr_held *h = *link;
    *link = h->next;
    if (a->held_tail == &h->next)
        a->held_tail = link;
    sr__msg_copy(out, &h->m);
    free(h);
}

bool sr__held_next(sr_agent *a, sr_msg *out)
{
    struct sr_held **link = first_to_go(a);
    if (link)
        take(a, link, out);
    return link != NULL;
}

bool sr__held_pop(sr_agent *a, sr_msg *out)
{
    if (!a->held)
        return false;
    take(a, &a->held, out);
    return true;
}
