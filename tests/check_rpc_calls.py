#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""No two files of lib/rpc call each other both ways (run by check_seam.sh).

Each file of the RPC core has one job; where a callee must reach back into
its caller it is handed a function (lib/rpc/agent.h says where), so the
direct calls between two files run one way. This finds every function a
file of lib/rpc defines, and which other files call it by name (comments
and strings left out), and reports each pair of files that call each other.
Usage: check_rpc_calls.py SOURCE_ROOT
"""
import collections
import glob
import os
import re
import sys


def strip(text):
    text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
    text = re.sub(r'//[^\n]*', '', text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def main():
    root = os.path.join(sys.argv[1], 'lib', 'rpc')
    files = sorted(glob.glob(os.path.join(root, '*.c')))
    if not files:
        print(f'check_rpc_calls.py: no sources under {root}')
        return 1
    src = {os.path.basename(f): strip(open(f, encoding='utf-8').read()) for f in files}
    defined = {}
    for name, text in src.items():
        for m in re.finditer(r'^[A-Za-z_][\w \*]*?\b(sr_\w+)\s*\([^;{]*?\)\s*\{', text, re.M):
            defined[m.group(1)] = name
    calls = collections.defaultdict(set)
    for name, text in src.items():
        for fn, home in defined.items():
            if home != name and re.search(r'\b' + fn + r'\s*\(', text):
                calls[(name, home)].add(fn)
    bad = sorted((a, b) for (a, b) in calls if a < b and (b, a) in calls)
    for a, b in bad:
        print(f'lib/rpc/{a} and lib/rpc/{b} call each other: {a} calls {", ".join(sorted(calls[(a, b)]))}; '
              f'{b} calls {", ".join(sorted(calls[(b, a)]))}')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
