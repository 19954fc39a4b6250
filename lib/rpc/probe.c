/* SPDX-License-Identifier: MIT */
/* Probes: the profiler's switch and the module names. See module.h,
 * "Probes". */
#include <errno.h>
#include <stdio.h>

#include "module.h"
#include "wire.h"

_Atomic uint32_t sr__probe_mask;
const struct sr_probe_ops *sr__probe_ops; /* set by sr__module_register */

uint32_t sr__probe_set(uint32_t mask)
{
    if (!sr__probe_ops)
        return 0;
    /* relaxed: see sr__probe_mask in module.h */
    return atomic_exchange_explicit(&sr__probe_mask, mask, memory_order_relaxed);
}

const char *sr__probe_module_name(int module, int type, uint8_t sub, const uint8_t *bytes, char *buf, size_t len)
{
    const sr_module *m = module >= 0 && module < SR_MODULE_MAX ? sr__modules[module] : NULL;
    const char *what = NULL;
    if (m && type == SR_MSG_MOD_REQ && m->request && m->request->describe)
        what = m->request->describe(sub);
    else if (m && type != SR_MSG_MOD_REQ && m->msg && m->msg->describe)
        what = m->msg->describe(sub, bytes, SR_MODULE_MSG_MAX);
    if (what)
        snprintf(buf, len, "%s:%s", m->name, what);
    else if (type == SR_MSG_MOD_REQ)
        snprintf(buf, len, "%s:request%u", m ? m->name : "module", sub);
    else
        snprintf(buf, len, "%s:msg%u", m ? m->name : "module", sub);
    return buf;
}

void sr__probe_span(const char *cat, const char *name, int64_t t0)
{
    if (sr__probing())
        sr__probe_ops->span(cat, name, t0, sr__probe_now());
}
