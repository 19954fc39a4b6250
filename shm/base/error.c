/* SPDX-License-Identifier: MIT */
#include "error.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];
/* The code behind last_error (sr_last_error_code()); 0: none recorded. */
static _Thread_local int last_code;
/* -1 before attach: the prefix is the function alone (launchers, sr_spawn).
 * Written once per process at attach, before any thread that reads it exists
 * (or by the same thread); plain int is enough. */
static int error_rank = -1;

void sr__error_set_rank(int rank) { error_rank = rank; }
int sr__error_rank(void) { return error_rank; }

int sr__fail(int err, const char *fn, const char *fmt, ...)
{
    int n;
    last_code = err;
    if (error_rank >= 0)
        n = snprintf(last_error, sizeof(last_error), "worker%d: %s: ", error_rank, fn);
    else
        n = snprintf(last_error, sizeof(last_error), "%s: ", fn);
    if (n < 0 || (size_t)n >= sizeof(last_error))
        return err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof(last_error) - (size_t)n, fmt, ap);
    va_end(ap);
    return err;
}

SR_API int sr_errorf(int err, const char *fmt, ...)
{
    last_code = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return err;
}

/* Keep a message that is already formatted (e.g. one kept across a teardown). */
void sr__error_set_text(const char *msg)
{
    snprintf(last_error, sizeof(last_error), "%s", msg);
}

void sr__error_set(int code, const char *msg)
{
    last_code = code;
    snprintf(last_error, sizeof(last_error), "%s", msg);
}

int sr__error_cause(int rc) { return rc == -SR_EREMOTE && last_code ? last_code : rc; }

SR_API const char *sr_last_error(void) { return last_error; }

SR_API int sr_last_error_code(void) { return last_code; }

SR_API const char *sr_strerror(int err)
{
    if (err == INT_MIN) /* its negation does not exist */
        return "Unknown error";
    int e = err < 0 ? -err : err;
    switch (e) {
    case SR_EWORKER: return "a worker of the job failed";
    case SR_EREMOTE: return "the remote function failed";
    case SR_ESHUTDOWN: return "shmrpc is not initialised or has shut down";
    case SR_EOWNERLOST: return "the owner of the RRef died: its value is lost";
    default: return strerror(e);
    }
}
