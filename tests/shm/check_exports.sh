#!/bin/sh
# SPDX-License-Identifier: MIT
# libshmrpc.so must not configure nor replace the allocator of the program
# that links it: no jemalloc configuration symbol (malloc_conf and the like,
# which jemalloc reads process-wide from whoever defines them first) and no
# allocator entry point (malloc, free, ... would interpose the program's).
# The shared heap sets its arena's options itself (mallctl, docs/HEAP.md).
#   check_exports.sh path/to/libshmrpc.so
set -eu
lib=$1
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}') || { echo "nm -D $lib failed" >&2; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -E '^(je_)?(malloc_conf|malloc_conf_2_conf_harder|malloc_message|_malloc_options)$|^(je_)?(malloc|free|calloc|realloc|aligned_alloc|posix_memalign|memalign|valloc|pvalloc|malloc_usable_size|mallocx|rallocx|xallocx|sallocx|dallocx|sdallocx|nallocx|mallctl|mallctlnametomib|mallctlbymib)$' || true)
if [ -n "$bad" ]; then
  echo "$lib exports allocator symbols a program linking it would pick up:" >&2
  printf '  %s\n' $bad >&2
  exit 1
fi
n=$(printf '%s\n' "$syms" | grep -c '^sr_' || true)
[ "$n" -gt 0 ] || { echo "$lib: no sr_ symbol defined: is this the library?" >&2; exit 1; }
echo "$lib: $n sr_ symbols, no allocator symbol"
