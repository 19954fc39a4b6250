/* SPDX-License-Identifier: MIT */
/* The envelope's extension block. See ext.h. */
#include "ext.h"

#include <errno.h>
#include <string.h>

#include "error.h"

/* Append one module's record: hook writes into the record's data bytes. */
static void begin_record(struct sr_ext_buf *e, int id, uint8_t **data)
{
    if (!e->len)
        e->len = 1; /* the count byte */
    e->b[e->len] = (uint8_t)id;
    *data = e->b + e->len + 2;
}

static void end_record(struct sr_ext_buf *e, size_t n)
{
    if (!n || n > SR_EXT_MAX) {
        if (e->len == 1)
            e->len = 0;
        return;
    }
    e->b[e->len + 1] = (uint8_t)n;
    e->len += 2 + n;
    e->b[0]++;
}

void sr__ext_request_out(const struct sr_call_out *o, int own, const uint8_t *bytes, size_t len,
                         struct sr_ext_buf *e)
{
    e->len = 0;
    e->b[0] = 0;
    unsigned mask = sr__hooks[SR_HOOK_REQUEST_OUT];
    if (own >= 0 && own < SR_MODULE_MAX && sr__modules[own])
        mask |= 1u << own;
    while (mask) {
        int id = sr__hook_next(&mask);
        const sr_module *m = sr__modules[id];
        uint8_t *data;
        size_t n = 0;
        begin_record(e, id, &data);
        if (id == own && len <= SR_EXT_MAX) {
            memcpy(data, bytes, len);
            n = len;
        } else if (id != own && m->call->request_out(o, data, &n)) {
            n = 0;
        }
        end_record(e, n);
    }
}

void sr__ext_response_out(sr_call *c, unsigned mods, sr_value *v, struct sr_ext_buf *e)
{
    e->len = 0;
    e->b[0] = 0;
    for (unsigned mask = sr__hooks[SR_HOOK_RESPONSE_OUT] & mods; mask;) {
        int id = sr__hook_next(&mask);
        uint8_t *data;
        size_t n = 0;
        begin_record(e, id, &data);
        sr__modules[id]->call->response_out(c, v, data, &n);
        end_record(e, n);
    }
}

int sr__ext_parse(const uint8_t *p, size_t len, int from, struct sr_ext_view *v, size_t *used)
{
    memset(v, 0, sizeof(*v));
    if (len < 1)
        return sr__fail(-EBADMSG, "sr_rpc", "extension block from worker%d is empty", from);
    size_t at = 1;
    for (unsigned i = 0; i < p[0]; i++) {
        if (len - at < 2)
            return sr__fail(-EBADMSG, "sr_rpc", "extension record %u from worker%d is truncated", i, from);
        unsigned id = p[at], n = p[at + 1];
        if (id >= SR_MODULE_MAX || (v->mask & (1u << id)) || n > SR_EXT_MAX || len - at - 2 < n)
            return sr__fail(-EBADMSG, "sr_rpc", "extension record %u from worker%d is malformed (module %u, %u bytes)",
                            i, from, id, n);
        v->data[id] = p + at + 2;
        v->len[id] = (uint8_t)n;
        v->mask |= (uint8_t)(1u << id);
        at += 2 + n;
    }
    *used = at;
    return 0;
}

void sr__ext_response_in(int from, const struct sr_ext_view *v, sr_value *result)
{
    for (unsigned mask = v->mask & sr__hooks[SR_HOOK_RESPONSE_IN]; mask;) {
        int id = sr__hook_next(&mask);
        sr__modules[id]->call->response_in(from, v->data[id], v->len[id], result);
    }
}
