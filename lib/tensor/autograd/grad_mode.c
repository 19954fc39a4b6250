/* SPDX-License-Identifier: MIT */
/* Grad mode: per thread, like torch.no_grad / torch.set_grad_enabled. */
#include "engine.h"

/* Thread-local, so no synchronisation: each thread has its own mode. */
static _Thread_local bool grad_disabled;

bool sr__grad_mode(void) { return !grad_disabled; }

SR_API bool sr_is_grad_enabled(void) { return !grad_disabled; }

SR_API bool sr_set_grad_enabled(bool enabled)
{
    bool previous = !grad_disabled;
    grad_disabled = !enabled;
    return previous;
}

SR_API bool sr_no_grad_enter(void) { return sr_set_grad_enabled(false); }

SR_API void sr_no_grad_exit(bool previous) { sr_set_grad_enabled(previous); }
