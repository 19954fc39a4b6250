/* Probes: the profiler's registration and the module names. See probe.h. */
#include "probe.h"

#include <errno.h>
#include <stdio.h>

#include "module.h"
#include "wire.h"

_Atomic uint32_t sr__probe_mask;
const struct sr_probe_ops *sr__probe_ops;

int sr__probe_register(const struct sr_probe_ops *ops)
{
    if (sr__probe_ops)
        return -EEXIST;
    sr__probe_ops = ops;
    return 0;
}

uint32_t sr__probe_set(uint32_t mask)
{
    if (!sr__probe_ops)
        return 0;
    /* relaxed: see sr__probe_mask in probe.h */
    return atomic_exchange_explicit(&sr__probe_mask, mask, memory_order_relaxed);
}

const char *sr__probe_module_name(int module, int type, uint8_t sub, char *buf, size_t len)
{
    const sr_module *m = module >= 0 && module < SR_MOD_MAX ? sr__modules[module] : NULL;
    const char *what = m && m->describe ? m->describe(type, sub) : NULL;
    if (what)
        snprintf(buf, len, "%s:%s", m->name, what);
    else if (type == SR_MSG_MOD_REQ)
        snprintf(buf, len, "%s:request%u", m ? m->name : "module", sub);
    else
        snprintf(buf, len, "%s:msg%d.%u", m ? m->name : "module", type, sub);
    return buf;
}

void sr__probe_span(const char *cat, const char *name, int64_t t0)
{
    if (sr__probing())
        sr__probe_ops->span(cat, name, t0, sr_probe_now());
}
