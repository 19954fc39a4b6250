#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""SHMRPC_STATS=1 tables of a job (docs/PROFILING.md, "Statistics").

  check_stats.py SHMRUN STATS_PROG

STATS_PROG (tests/helpers/stats_prog.c) under `shmrun -n 4`: the launcher
prints every worker's table once the job has ended (after each worker's
"after sr_shutdown" line), in rank order, and each latency column (p50,
p99, max) is in one unit across the job, although it holds microseconds
(no-op calls) and milliseconds (a 15 ms function). Run alone (a one-worker
job, no launcher), the worker prints its own table, one unit per column.
"""
import os
import re
import subprocess
import sys

HEAD = re.compile(r"^shmrpc stats for (\S+) \(rank (\d+)[,)]")
ROW = re.compile(r"^  (\S+)\s+(call|queue|run)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)$")
VALUE = re.compile(r"^\d+(?:\.\d+)?(ns|us|ms)$")


def fail(msg, err=""):
    print("check_stats: FAILED: %s\nstderr:\n%s" % (msg, err), file=sys.stderr)
    sys.exit(1)


def run(argv, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHMRPC_", "OMPI_", "PMIX_"))}
    env.update(extra, SHMRPC_STATS="1")
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        fail("%s did not exit within 120 s" % " ".join(argv))
    if p.returncode != 0:
        fail("%s exited with %d" % (" ".join(argv), p.returncode), p.stderr)
    return p.stderr


def tables(err):
    """[(rank, first line index, [rows])], and the index of each 'after sr_shutdown' line."""
    out, after = [], []
    for i, line in enumerate(err.splitlines()):
        m = HEAD.match(line)
        if m:
            out.append((int(m.group(2)), i, []))
        elif re.match(r"^rank \d+: after sr_shutdown$", line):
            after.append(i)
        elif out and line.startswith("  ") and not line.lstrip().startswith("function"):
            r = ROW.match(line)
            if not r:
                fail("a row that does not parse: %r" % line, err)
            out[-1][2].append(r.groups())
    return out, after


def one_unit_per_column(ts, err):
    for col, name in ((4, "p50"), (5, "p99"), (6, "max")):
        units = set()
        for _, _, rows in ts:
            for row in rows:
                v = VALUE.match(row[col])
                if not v:
                    fail("%s value %r has no unit" % (name, row[col]), err)
                units.add(v.group(1))
        if len(units) != 1:
            fail("the %s column mixes units %s" % (name, sorted(units)), err)


def main():
    shmrun, prog = sys.argv[1], sys.argv[2]
    err = run([shmrun, "-n", "4", "--", prog], {})
    ts, after = tables(err)
    if [t[0] for t in ts] != [0, 1, 2, 3]:
        fail("expected the tables of ranks 0, 1, 2, 3 in that order, got ranks %s" % [t[0] for t in ts], err)
    if len(after) != 4 or min(t[1] for t in ts) < max(after):
        fail("the tables must come after every worker's sr_shutdown (printed by shmrun at the job's end)", err)
    rows0 = {(r[0], r[1]) for r in ts[0][2]}
    if ("nap", "call") not in rows0 or ("noop", "call") not in rows0:
        fail("rank 0's table lacks its calls of noop and nap", err)
    one_unit_per_column(ts, err)
    print("shmrun -n 4: 4 tables in rank order after the job, one unit per column (%s)"
          % ", ".join(VALUE.match(ts[0][2][0][c]).group(1) for c in (4, 5, 6)))

    err = run([prog], {"SHMRPC_WORLD_SIZE": "1"})
    ts, after = tables(err)
    if [t[0] for t in ts] != [0] or not after or ts[0][1] > after[0]:
        fail("a one-worker job prints its own table at sr_shutdown", err)
    one_unit_per_column(ts, err)
    print("one-worker job: its own table, one unit per column")
    print("check_stats: ok")


main()
