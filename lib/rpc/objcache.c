/* SPDX-License-Identifier: MIT */
/* Per-thread caches of freed objects: enrolment and the drain at thread
 * exit (objcache.h). */
#include "objcache.h"

#include <pthread.h>

static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static bool exit_key_ok;

/* This thread's enrolled caches (the key's value is the same list), and
 * whether its exit destructor ran. */
static _Thread_local struct sr__objcache *enrolled;
static _Thread_local bool exited;

/* The key's destructor, on the exiting thread: free every enrolled cache's
 * objects; from now on, puts on this thread refuse. */
static void drain_at_exit(void *list)
{
    exited = true;
    enrolled = NULL;
    for (struct sr__objcache *c = list; c; c = c->next) {
        c->state = SR__OBJCACHE_OFF; /* before the drops: a drop that frees another object frees it */
        while (c->n)
            c->drop(c->obj[--c->n]);
    }
}

static void exit_key_make(void) { exit_key_ok = pthread_key_create(&exit_key, drain_at_exit) == 0; }

bool sr__objcache_enrol(struct sr__objcache *c)
{
    if (c->state == SR__OBJCACHE_NEW && !exited) {
        pthread_once(&exit_once, exit_key_make);
        c->next = enrolled;
        if (exit_key_ok && pthread_setspecific(exit_key, c) == 0) {
            enrolled = c;
            c->state = SR__OBJCACHE_ON;
            return true;
        }
    }
    c->state = SR__OBJCACHE_OFF; /* no destructor would free its objects: keep none */
    return false;
}
