/* SPDX-License-Identifier: MIT */
/* CPU binding from the sysfs topology. See bind.h. */
#include "bind.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "job.h"
#include "log.h"

static const char *sysfs(void)
{
    const char *root = getenv("SHMRUN_SYSFS");
    return root && *root ? root : "/sys";
}

/* "0-3,8,10-11" into set. 0, or -1 when the file is missing or malformed. */
static int read_cpulist(const char *path, cpu_set_t *set)
{
    char buf[4096];
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    bool ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    CPU_ZERO(set);
    for (char *p = buf; ok && *p && *p != '\n';) {
        char *end;
        long lo = strtol(p, &end, 10), hi = lo;
        if (end == p || lo < 0)
            return -1;
        if (*end == '-' && (p = end + 1, hi = strtol(p, &end, 10), end == p || hi < lo))
            return -1;
        for (long c = lo; c <= hi && c < CPU_SETSIZE; c++)
            CPU_SET((int)c, set);
        p = end + (*end == ',');
    }
    return ok ? 0 : -1;
}

static int first_cpu(const cpu_set_t *s)
{
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, s))
            return c;
    return -1;
}

static int add_unit(struct bind_plan *p, const cpu_set_t *cpus, int node)
{
    struct bind_unit *u = realloc(p->unit, (size_t)(p->n + 1) * sizeof(*u));
    if (!u)
        return sr__fail(-ENOMEM, "shmrun", "no memory for the CPU binding");
    p->unit = u;
    u[p->n].cpus = *cpus;
    u[p->n].node = node;
    p->n++;
    return 0;
}

/* The NUMA nodes of sysfs, as units restricted to `allowed`; one unit of
 * every allowed CPU when the kernel has no node directory. */
static int numa_nodes(struct bind_plan *p, const cpu_set_t *allowed)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/devices/system/node", sysfs());
    int rc = 0, max = -1;
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) {
        int node;
        if (sscanf(e->d_name, "node%d", &node) == 1 && node > max)
            max = node;
    }
    if (d)
        closedir(d);
    for (int node = 0; node <= max && !rc; node++) {
        cpu_set_t cpus;
        snprintf(path, sizeof(path), "%s/devices/system/node/node%d/cpulist", sysfs(), node);
        if (read_cpulist(path, &cpus))
            continue; /* node numbers may have holes */
        CPU_AND(&cpus, &cpus, allowed);
        if (CPU_COUNT(&cpus))
            rc = add_unit(p, &cpus, node);
    }
    return rc || p->n ? rc : add_unit(p, allowed, -1);
}

/* The allowed CPUs of cpu's core (core_cpus_list, or thread_siblings_list
 * on older kernels; the CPU alone when sysfs says nothing). */
static void core_of(int cpu, const cpu_set_t *allowed, cpu_set_t *core)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/devices/system/cpu/cpu%d/topology/core_cpus_list", sysfs(), cpu);
    if (read_cpulist(path, core)) {
        snprintf(path, sizeof(path), "%s/devices/system/cpu/cpu%d/topology/thread_siblings_list", sysfs(), cpu);
        if (read_cpulist(path, core)) {
            CPU_ZERO(core);
            CPU_SET(cpu, core);
        }
    }
    CPU_AND(core, core, allowed);
}

/* Cores node by node: ranks fill node 0's cores first, as mpirun's map-by core. */
static int cores(struct bind_plan *p, const cpu_set_t *allowed)
{
    struct bind_plan nodes = {0};
    int rc = numa_nodes(&nodes, allowed);
    for (int i = 0; i < nodes.n && !rc; i++)
        for (int c = 0; c < CPU_SETSIZE && !rc; c++) {
            cpu_set_t core;
            if (!CPU_ISSET(c, &nodes.unit[i].cpus))
                continue;
            core_of(c, &nodes.unit[i].cpus, &core);
            if (CPU_ISSET(c, &core) && first_cpu(&core) == c) /* a core is added at its first CPU */
                rc = add_unit(p, &core, nodes.unit[i].node);
        }
    bind_plan_free(&nodes);
    return rc;
}

static const char *unit_word(enum bind_kind k) { return k == BIND_CORE ? "core" : "NUMA node"; }

int bind_plan_make(struct bind_plan *p, enum bind_kind kind, int ranks)
{
    cpu_set_t allowed;
    *p = (struct bind_plan){.kind = kind};
    if (sched_getaffinity(0, sizeof(allowed), &allowed))
        return sr__fail(-errno, "shmrun", "sched_getaffinity: %s", strerror(errno));
    int rc = kind == BIND_NONE ? add_unit(p, &allowed, -1)
             : kind == BIND_CORE ? cores(p, &allowed)
                                 : numa_nodes(p, &allowed);
    if (!rc && !p->n)
        rc = sr__fail(-ENODEV, "shmrun", "--bind-to %s: no allowed CPU found", kind == BIND_CORE ? "core" : "numa");
    if (rc) {
        bind_plan_free(p);
        return rc;
    }
    if (kind != BIND_NONE && ranks > p->n)
        sr_logf(SR_LOG_WARN, "--bind-to %s: %d ranks on %d %s%s: binding wraps round robin (up to %d ranks per %s)",
                kind == BIND_CORE ? "core" : "numa", ranks, p->n, unit_word(kind), p->n > 1 ? "s" : "",
                (ranks + p->n - 1) / p->n, unit_word(kind));
    return 0;
}

void bind_plan_free(struct bind_plan *p)
{
    free(p->unit);
    p->unit = NULL;
    p->n = 0;
}

int bind_apply(const struct bind_plan *p, int rank)
{
    if (p->kind == BIND_NONE)
        return 0;
    return sched_setaffinity(0, sizeof(cpu_set_t), &p->unit[rank % p->n].cpus) ? -errno : 0;
}

/* "0-3,8" */
static const char *cpu_list(const cpu_set_t *s, char *buf, size_t len)
{
    bool mask[CPU_SETSIZE];
    for (int c = 0; c < CPU_SETSIZE; c++)
        mask[c] = CPU_ISSET(c, s);
    return sr__rank_list(mask, CPU_SETSIZE, buf, len);
}

void bind_report(const struct bind_plan *p, int rank, pid_t pid)
{
    char cpus[256], node[32] = "";
    int u = rank % p->n;
    cpu_list(&p->unit[u].cpus, cpus, sizeof(cpus));
    if (p->kind == BIND_NONE) {
        fprintf(stderr, "shmrun: rank %d (pid %d) not bound: cpus %s\n", rank, (int)pid, cpus);
        return;
    }
    if (p->kind == BIND_CORE && p->unit[u].node >= 0)
        snprintf(node, sizeof(node), " (NUMA node %d)", p->unit[u].node);
    fprintf(stderr, "shmrun: rank %d (pid %d) bound to %s %d of %d: cpus %s%s\n", rank, (int)pid, unit_word(p->kind),
            p->kind == BIND_NUMA && p->unit[u].node >= 0 ? p->unit[u].node : u, p->n, cpus, node);
}
