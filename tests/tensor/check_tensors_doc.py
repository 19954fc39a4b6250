#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""docs/TENSORS.md lists every public tensor and nn function.

    check_tensors_doc.py SOURCE_ROOT [DOC]

Reads every function declared SR_API in the public headers of the tensor
and training layers (tensor.h, autograd_function.h, nn.h, optim.h,
checkpoint.h) and checks that DOC (default docs/TENSORS.md) has a table row
for it whose first cell is its signature, `... name(...)`, and whose second
cell (its ownership) is not empty. It also checks itself: with any one
function's row taken out of DOC, that function must be reported missing.
Exit 0 when all are there, 1 with one line per problem otherwise.
"""
import os
import re
import sys

HEADERS = ["tensor.h", "autograd_function.h", "nn.h", "optim.h", "checkpoint.h"]


def declared(path):
    with open(path) as f:
        src = f.read()
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    return re.findall(r"\bSR_API\b[^;{]*?\b(sr_\w+)\s*\(", src)


def documented(doc):
    """Names whose row is | `... name(...)` | ownership |."""
    rows = {}
    for line in doc.splitlines():
        m = re.match(r"\|\s*`([^`]*?\b(sr_\w+)\s*\([^`]*\))`\s*\|([^|]*)\|\s*$", line)
        if m and m.group(3).strip():
            rows[m.group(2)] = m.group(1)
    return rows


def missing(names, doc):
    rows = documented(doc)
    return [(h, n) for h, n in names if n not in rows]


def main():
    root = sys.argv[1]
    doc_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "docs", "TENSORS.md")
    with open(doc_path) as f:
        doc = f.read()
    names = [(h, n) for h in HEADERS for n in declared(os.path.join(root, "lib", "include", "shmrpc", h))]
    problems = [f"{os.path.basename(doc_path)}: shmrpc/{h}'s {n} has no row (| `signature` | ownership |)"
                for h, n in missing(names, doc)]
    if not names:
        problems.append("found no SR_API function in the headers: the parser is broken")
    # The check must fail when a row is missing: take out each row in turn.
    lines = doc.splitlines()
    for h, n in names:
        cut = "\n".join(l for l in lines if not re.match(r"\|\s*`[^`]*\b" + n + r"\s*\(", l))
        if (h, n) not in missing(names, cut):
            problems.append(f"self-check: without its row, {n} is not reported missing")
    for p in problems:
        print(p)
    return 1 if problems else 0


sys.exit(main())
