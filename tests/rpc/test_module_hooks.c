/* SPDX-License-Identifier: MIT */
/* A module's later per-call hooks on the callee (prepare, run_enter,
 * run_exit, response_out, call_done) run only on the calls where the module
 * took its state slot (sr__call_state; lib/rpc/module.h): a call that
 * carries no module's extension pays for none of them.
 *
 * A test module counts its hooks, on a page the job shares. worker0 calls
 * worker1 CALLS times without the module's extension (half the built-in
 * no-op, half a plain function, which runs on an executor), then WITH times
 * with it: its request_out writes one byte when the caller's thread asks,
 * and its request_in takes the slot. Every hook must then have run exactly
 * WITH times, each with the state request_in left, and call_done last.
 * Before the rule, every call ran them: CALLS + WITH each.
 *
 * Only worker1 serves calls, so the job's counts are its own. call_done runs
 * after the answer has gone out: worker0 waits for the last one on an
 * event word, bounded (WAIT_S). */
#include <stdatomic.h>
#include <stdint.h>

#include "module.h"
#include "helpers/shared_word.h"
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(module_hooks);

#define CALLS 100 /* without the extension */
#define WITH 10   /* with it */
#define WAIT_S 20 /* nothing here takes a second unless it is broken */
#define EXT_BYTE 0x5a

enum hook { REQUEST_IN, PREPARE, RUN_ENTER, RUN_EXIT, RESPONSE_OUT, CALL_DONE, NHOOKS };
static const char *const hook_name[NHOOKS] = {"request_in", "prepare", "run_enter", "run_exit", "response_out",
                                              "call_done"};

static struct shared {
    _Atomic uint32_t count[NHOOKS];
    _Atomic uint32_t bad; /* a hook found a state that request_in did not leave */
} *sh;

static int module_id = -1;
static _Thread_local bool want_ext; /* the caller's thread asks for the extension */
static int state_mark;              /* what request_in leaves in the slot */

static void count(enum hook h, sr_call *c)
{
    if (*sr__call_state(c, module_id) != &state_mark)
        atomic_fetch_add(&sh->bad, 1);
    shared_word_bump(&sh->count[h]);
}

static int m_request_out(const struct sr_call_out *o, uint8_t *ext, size_t *len)
{
    (void)o;
    if (want_ext) {
        ext[0] = EXT_BYTE;
        *len = 1;
    }
    return 0;
}

static int m_request_in(sr_call *c, const uint8_t *ext, size_t len)
{
    if (len != 1 || ext[0] != EXT_BYTE)
        atomic_fetch_add(&sh->bad, 1);
    *sr__call_state(c, module_id) = &state_mark;
    count(REQUEST_IN, c);
    return 0;
}

static int m_prepare(sr_call *c)
{
    count(PREPARE, c);
    return 0;
}
static void m_run_enter(sr_call *c) { count(RUN_ENTER, c); }
static void m_run_exit(sr_call *c) { count(RUN_EXIT, c); }
static void m_response_out(sr_call *c, sr_value *v, uint8_t *ext, size_t *len)
{
    (void)v, (void)ext, (void)len;
    count(RESPONSE_OUT, c);
}
static void m_call_done(sr_call *c)
{
    count(CALL_DONE, c);
    *sr__call_state(c, module_id) = NULL;
}

static sr_future *m_gate(sr_call *c)
{
    (void)c;
    return NULL; /* never holds a call: only its prepare is under test */
}

static const struct sr_module_call_ops counter_call = {
    .request_out = m_request_out, .request_in = m_request_in, .run_enter = m_run_enter,
    .run_exit = m_run_exit,       .response_out = m_response_out, .call_done = m_call_done,
};
static const struct sr_module_gate_ops counter_gate = {.gate = m_gate, .prepare = m_prepare};
static const sr_module counter = {.name = "hook_counter", .call = &counter_call, .gate = &counter_gate};

static int fn_plain(sr_call *c) { return sr_call_return(c, sr_none()); }

static void register_all(void)
{
    module_id = sr__module_register(&counter, NULL);
    sr_register("plain", fn_plain);
}

static int call_many(int n, bool ext)
{
    want_ext = ext;
    for (int i = 0; i < n; i++) {
        int rc = sr_rpc_sync(1, i % 2 ? "plain" : "noop", SR_NOARGS, SR_TIMEOUT_DEFAULT, NULL);
        WCHECK(rc == 0, "call %d (%s the extension): %s", i, ext ? "with" : "without", sr_last_error());
    }
    want_ext = false;
    return 0;
}

static int scenario(int rank, int world)
{
    (void)world;
    WCHECK(module_id >= 0, "rank %d: registering the test module: %s", rank, strerror(-module_id));
    if (rank != 0)
        return 0;
    if (call_many(CALLS, false) || call_many(WITH, true))
        return 1;
    uint32_t done = shared_word_wait(&sh->count[CALL_DONE], WITH, WAIT_S);
    WCHECK(done >= WITH, "only %u of the %d calls with the extension had ended on worker1 after %d s", done, WITH,
           WAIT_S);
    for (int h = 0; h < NHOOKS; h++) {
        uint32_t n = atomic_load(&sh->count[h]);
        WCHECK(n == WITH, "the module's %s hook ran %u times over %d calls without its extension and %d with it "
               "(%d expected: only the calls where it took its state slot)", hook_name[h], n, CALLS, WITH, WITH);
    }
    WCHECK(atomic_load(&sh->bad) == 0, "%u hooks found a state (or extension) that was not the module's own",
           atomic_load(&sh->bad));
    return 0;
}

Test(module_hooks, only_calls_with_module_state_run_its_hooks, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    RUN_JOB("modhooks", 2, .scenario = scenario, .register_fns = register_all);
}
