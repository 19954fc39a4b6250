#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every benchmark's command line (bench/bench_util.h, bench_cli_parse):
an unknown option or workload name is refused with exit status 2 and a
message naming it, before anything runs; --help succeeds and mentions
--json. Then bench_codec --json (a fraction of a second) writes only JSON
Lines on stdout, each an object with the schema's required keys
(docs/PERFORMANCE.md, "Machine-readable output").

    check_bench_cli.py BENCH_EXE...   (bench_codec among them)
"""
import json
import os
import subprocess
import sys


def fail(msg):
    print("check_bench_cli: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, timeout=60):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def main():
    exes = sys.argv[1:]
    if not exes:
        fail("no benchmarks given")
    for exe in exes:
        name = os.path.basename(exe)
        for arg, what in (("--no-such-option", "unknown option"), ("no_such_workload", "unknown name")):
            p = run([exe, arg])
            if p.returncode != 2:
                fail(f"{name} {arg}: exit status {p.returncode}, expected 2 (stderr: {p.stderr.strip()[:300]})")
            if f"{what} '{arg}'" not in p.stderr or not p.stderr.startswith(name + ":"):
                fail(f"{name} {arg}: stderr does not say \"{name}: {what} '{arg}'\": {p.stderr.strip()[:300]}")
            if p.stdout:
                fail(f"{name} {arg}: printed on stdout before refusing: {p.stdout[:200]}")
        p = run([exe, "--help"])
        if p.returncode != 0 or "--json" not in p.stdout:
            fail(f"{name} --help: status {p.returncode}, output {p.stdout[:300]}")
        print(f"{name}: refuses unknown options and names (exit 2), --help ok")
    codec = [e for e in exes if os.path.basename(e) == "bench_codec"]
    if not codec:
        fail("bench_codec is not among the benchmarks given")
    p = run([codec[0], "--json"])
    if p.returncode != 0:
        fail(f"bench_codec --json: status {p.returncode}: {p.stderr[:300]}")
    lines = p.stdout.splitlines()
    if not lines:
        fail("bench_codec --json printed no JSON")
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError as e:
            fail(f"bench_codec --json: not a JSON line ({e}): {line[:200]}")
        if not isinstance(obj, dict) or obj.get("bench") != "bench_codec" or not isinstance(obj.get("name"), str):
            fail(f"bench_codec --json: an object without bench/name: {line[:200]}")
        if not isinstance(obj.get("p50_ns"), (int, float)) or obj["p50_ns"] <= 0:
            fail(f"bench_codec --json: no positive p50_ns: {line[:200]}")
    if "codec 2-int args" not in p.stderr:
        fail("bench_codec --json: the human-readable report did not go to stderr")
    print(f"bench_codec --json: {len(lines)} JSON line(s), the report on stderr")


if __name__ == "__main__":
    main()
