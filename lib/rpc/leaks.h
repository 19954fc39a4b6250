/* SPDX-License-Identifier: MIT */
/* The shutdown leak check of tensors and values (internal; docs/API.md,
 * "Leak checks"): what this process made since sr_init and still holds
 * when sr_shutdown has torn the runtime down is a leak. */
#ifndef SR_RPC_LEAKS_H
#define SR_RPC_LEAKS_H

#if !defined(SR__IN_RPC)
#error "leaks.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif

/* At a successful sr_init: the live counts now are the baseline. */
void sr__leaks_baseline(void);
/* After a graceful shutdown's teardown: 0, or -EBUSY naming worker `who`,
 * the counts and their kinds (each kind also logged as a warning), unless
 * sr_set_ignore_leak(true), which only logs. */
int sr__leaks_check(const char *who);

#endif
