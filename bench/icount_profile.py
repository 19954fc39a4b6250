#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Name the addresses of a BENCH_ICOUNT_PROFILE file (bench/icount.h).

    icount_profile.py FILE [CALLS] [--top N] [--annotate FUNCTION] [--inline] [--locked]

Prints the instructions each function executed, per call if CALLS (the
region's count of calls) is given, largest first, with the share of the
total; --annotate prints FUNCTION's disassembly (objdump) with the count of
each instruction instead. --inline counts each function with the
functions inlined into it (addr2line -i; needs a build with -g, such as
`-Dc_args=-g`, which does not change the code), so that a link-time
optimised build still says what its big functions are made of. --locked
lists the executed instructions that order memory (a lock prefix, xchg,
mfence), each with its count and the source line it came from (addr2line -i,
best with -g): the atomic read-modify-writes and fences a call pays for. Symbols come from `nm` (the file's own, else its dynamic ones);
addresses are mapped through the "map" lines the tracer wrote, assuming a
mapping's file offset equals its addresses in the file (as the default
x86-64 link layout has it)."""
import bisect
import collections
import subprocess
import sys


def symbols(path, cache={}):
    if path in cache:
        return cache[path]
    syms = []
    for flags in (["-n", "--defined-only"], ["-n", "-D", "--defined-only"]):
        try:
            out = subprocess.run(["nm"] + flags + [path], capture_output=True, text=True).stdout
        except OSError:
            out = ""
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "tTwWiI":
                syms.append((int(parts[0], 16), parts[2]))
        if syms:
            break
    syms.sort()
    cache[path] = ([a for a, _ in syms], [n for _, n in syms])
    return cache[path]


def print_annotated(per_addr, calls):
    if not per_addr:
        return print("no instruction of that function was counted")
    path = next(iter(per_addr.values()))[1]
    lo, hi = min(per_addr), max(per_addr) + 16
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={lo:#x}",
                          f"--stop-address={hi:#x}", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split(":", 1)
        try:
            a = int(f[0].strip(), 16)
        except ValueError:
            continue
        n = per_addr.get(a, (0, path))[0]
        print(f"{n / calls:8.2f} {line}" if n else f"{'':8} {line}")


def print_inline(rows, maps, calls, top):
    by_file = collections.defaultdict(list)
    for addr, n in rows:
        for lo, hi, off, path in maps:
            if lo <= addr < hi:
                by_file[path].append((addr - lo + off, n))
                break
    incl = collections.Counter()
    for path, addrs in by_file.items():
        out = subprocess.run(["addr2line", "-a", "-i", "-f", "-e", path], capture_output=True, text=True,
                             input="\n".join(hex(a) for a, _ in addrs) + "\n").stdout.splitlines()
        frames, cur = {}, None
        for i, line in enumerate(out):
            if line.startswith("0x"):
                cur = int(line, 16)
                frames[cur] = set()
            elif cur is not None and not line.startswith(("/", "??:")) and ":" not in line:
                frames[cur].add(line)
        for a, n in addrs:
            for fn in frames.get(a, ()):
                if fn != "??":
                    incl[fn] += n
    for name, n in incl.most_common(top):
        print(f"{n / calls:10.1f}  {name}")


def disassembly(path, cache={}):
    if path not in cache:
        out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True).stdout
        insns = {}
        for line in out.splitlines():
            f = line.split(":", 1)
            if len(f) == 2 and f[0].strip() and f[1].startswith("\t"):
                try:
                    insns[int(f[0].strip(), 16)] = " ".join(f[1].split())
                except ValueError:
                    pass
        cache[path] = insns
    return cache[path]


def ordering(insn):
    op = insn.split(" ", 1)[0]
    return op == "lock" or op == "mfence" or (op.startswith("xchg") and "(" in insn)


def print_locked(rows, maps, calls):
    found = []
    for addr, n in rows:
        for lo, hi, off, path in maps:
            if lo <= addr < hi:
                insn = disassembly(path).get(addr - lo + off, "")
                if ordering(insn):
                    found.append((path, addr - lo + off, n, insn))
                break
    total = 0
    for path, a, n, insn in sorted(found, key=lambda f: (f[0], f[1])):
        where = subprocess.run(["addr2line", "-i", "-f", "-e", path, hex(a)], capture_output=True,
                               text=True).stdout.split()
        src = " < ".join(w.rsplit("/", 1)[-1] for w in where[1::2][:3])
        print(f"{n / calls:6.2f}  {insn:40.40s}  {where[0] if where else '?'}  {src}")
        total += n
    print(f"{total / calls:6.2f}  ordering instructions{' per call' if calls != 1 else ''} in all")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = 40
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
        args.remove(str(top))
    annotate = None
    if "--annotate" in sys.argv:
        annotate = sys.argv[sys.argv.index("--annotate") + 1]
        args.remove(annotate)
    calls = float(args[1]) if len(args) > 1 else 1.0
    per_addr = {}
    maps, counts, rows = [], collections.Counter(), []
    total = 0
    for line in open(args[0]):
        if line.startswith("map "):
            f = line.split()
            lo, hi = (int(x, 16) for x in f[1].split("-"))
            maps.append((lo, hi, int(f[3], 16), f[6] if len(f) > 6 else "?"))
            continue
        addr, n = (int(x, 16) if i == 0 else int(x) for i, x in enumerate(line.split()))
        rows.append((addr, n))
        total += n
        name = "?"
        for lo, hi, off, path in maps:
            if lo <= addr < hi:
                addrs, names = symbols(path)
                k = bisect.bisect_right(addrs, addr - lo + off) - 1
                name = (names[k] if k >= 0 else "?") + " (" + path.rsplit("/", 1)[-1] + ")"
                if annotate and k >= 0 and names[k] == annotate:
                    per_addr[addr - lo + off] = (n, path)
                break
        counts[name] += n
    if annotate:
        return print_annotated(per_addr, calls)
    if "--inline" in sys.argv:
        return print_inline(rows, maps, calls, top)
    if "--locked" in sys.argv:
        return print_locked(rows, maps, calls)
    print(f"{total / calls:10.1f} instructions{' per call' if calls != 1 else ''} in all")
    for name, n in counts.most_common(top):
        print(f"{n / calls:10.1f} {100.0 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
