#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The layering, proved by the compiler in the real build configuration.

Every header under shm/ and lib/ says which layer owns it and who may
include it, in its first lines:
    #if !defined(SR__IN_RPC)         private: the rpc layer only
    #if !defined(SR__SEES_RPC)       the rpc layer's seam: it and the layers above
    #if defined(SR__BUILDING) && !defined(SR__SEES_RPC)
                                     public (lib/include): users, and layers from rpc up
Each layer's library is compiled with -DSR__IN_<itself> and -DSR__SEES_<L>
for itself and every layer below it (meson.build), and sees, by include
path, only its own folder and the folders of the layers below it.

For every layer this test takes the compile command of one of its real
sources from compile_commands.json and compiles scratch sources with it:
  - each seam and public header of the layer and of the layers below it,
    by its bare name: must compile (the include paths are right);
  - each private header of every other layer, and each header of every
    layer not below it, by its absolute path: must fail, with the header's
    own #error (a relative "../rpc/agent.h" cannot get round the rule);
  - the same headers by their bare name: must fail (not found, or #error);
    of a layer above, one header per layer (its folder is off the path).
It also fails if a header declares no layer, or a layer has no source.

usage: check_layers.py BUILD_DIR SOURCE_ROOT NAME=FOLDER:SEES[,SEES...] ...
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

GUARD = [
    (re.compile(r'^#if defined\(SR__BUILDING\) && !defined\(SR__SEES_(\w+)\)'), 'public'),
    (re.compile(r'^#if !defined\(SR__IN_(\w+)\)'), 'private'),
    (re.compile(r'^#if !defined\(SR__SEES_(\w+)\)'), 'seam'),
]


def header_layer(path):
    with open(path, encoding='utf-8') as f:
        for line in f:
            for rx, kind in GUARD:
                m = rx.match(line)
                if m:
                    return m.group(1).lower(), kind
    return None, None


def compile_command(entries, root, folder, layer_folders):
    """A real source of the layer: in its folder, not in a deeper layer's."""
    base = os.path.join(root, folder) + os.sep
    deeper = [os.path.join(root, d) + os.sep for d in layer_folders if d != folder and
              (os.path.join(root, d) + os.sep).startswith(base)]
    for e in entries:
        src = os.path.normpath(os.path.join(e['directory'], e['file']))
        if src.startswith(base) and not any(src.startswith(d) for d in deeper) and 'noprobe' not in e['output']:
            return e
    return None


def scratch_command(entry, scratch):
    args = shlex.split(entry['command'])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ('-o', '-MF', '-MQ', '-MT', '-c'):
            skip = True
            continue
        if a in ('-MD', '-MMD'):
            continue
        out.append(a)
    src = os.path.normpath(os.path.join(entry['directory'], entry['file']))
    out = [a for a in out if os.path.normpath(os.path.join(entry['directory'], a)) != src]
    return out + ['-fdiagnostics-color=never', '-E', '-o', os.devnull, scratch]


def run(entry, tmp, name, include):
    scratch = os.path.join(tmp, re.sub(r'\W', '_', name) + '.c')
    with open(scratch, 'w') as f:
        f.write('#include "%s"\nint sr__scratch;\n' % include)
    p = subprocess.run(scratch_command(entry, scratch), cwd=entry['directory'], capture_output=True, text=True)
    return p.returncode, p.stderr


def main():
    build, root = sys.argv[1], os.path.realpath(sys.argv[2])
    layers = {}
    for spec in sys.argv[3:]:
        name, rest = spec.split('=', 1)
        folder, sees = rest.split(':', 1)
        layers[name] = (folder, set(sees.split(',')))
    with open(os.path.join(build, 'compile_commands.json')) as f:
        entries = json.load(f)

    headers, failures = [], []
    for top in ('shm', 'lib'):
        for d, _, files in os.walk(os.path.join(root, top)):
            for fn in sorted(files):
                if fn.endswith('.h'):
                    path = os.path.join(d, fn)
                    owner, kind = header_layer(path)
                    rel = os.path.relpath(path, root)
                    if owner is None:
                        failures.append('%s declares no layer (docs/ARCHITECTURE.md, "Layers")' % rel)
                    elif owner not in layers:
                        failures.append('%s names layer %s, which meson.build does not build' % (rel, owner))
                    else:
                        headers.append((path, rel, owner, kind))

    folders = [layers[l][0] for l in layers]
    jobs = []
    for layer, (folder, sees) in layers.items():
        entry = compile_command(entries, root, folder, folders)
        if entry is None:
            failures.append('layer %s: no source of %s in compile_commands.json' % (layer, folder))
            continue
        visible = {os.path.relpath(p, os.path.join(root, layers[o][0])) for p, _, o, k in headers
                   if o == layer or (o in sees and k != 'private')}
        bare_done = set()
        for path, rel, owner, kind in headers:
            base = os.path.basename(path)
            name = os.path.relpath(path, os.path.join(root, layers[owner][0]))  # as its layer's -I finds it
            if owner == layer or (owner in sees and kind != 'private'):
                # by the name the layer's own sources write
                jobs.append((layer, entry, rel, 'shmrpc/' + base if kind == 'public' else name, True))
            else:
                why = 'private to ' + owner if kind == 'private' else 'of layer ' + owner + ', not below ' + layer
                jobs.append((layer, entry, rel + ' (' + why + ')', path, False))
                if kind == 'public':
                    jobs.append((layer, entry, rel + ' (' + why + ', bare name)', 'shmrpc/' + base, False))
                elif name not in visible and (owner in sees or owner not in bare_done):
                    # else a same-named header of its own is found, rightly. A
                    # layer above is off the include path as a whole: one of
                    # its headers by bare name shows it (the guards refuse
                    # the rest by path, above).
                    bare_done.add(owner)
                    jobs.append((layer, entry, rel + ' (' + why + ', bare name)', name, False))

    checked = {'ok': 0, 'refused': 0}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        def one(i_job):
            i, (layer, entry, rel, include, should_compile) = i_job
            return i_job[1], run(entry, tmp, '%d_%s' % (i, layer), include)
        for (layer, entry, rel, include, should_compile), (rc, err) in pool.map(one, enumerate(jobs)):
            if should_compile and rc != 0:
                failures.append('layer %s cannot include %s: %s' % (layer, include, err.strip()[:400]))
            elif not should_compile and rc == 0:
                failures.append('layer %s COMPILES #include "%s" (%s): the layering is not enforced' %
                                (layer, include, rel))
            elif not should_compile and 'No such file' not in err and not (
                    '#error' in err and os.path.basename(include) + ':' in err):
                failures.append('layer %s: #include "%s" failed, but not for the layering: %s' %
                                (layer, include, err.strip()[:400]))
            else:
                checked['ok' if should_compile else 'refused'] += 1
    for f in failures:
        print('FAIL', f)
    print('layering: %d layers, %d headers; %d includes allowed and compiled, %d forbidden and refused; %d failures'
          % (len(layers), len(headers), checked['ok'], checked['refused'], len(failures)))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
