#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Pipeline parallelism side by side with PyTorch, in the same run: samples/s
# of demo_pipeline (under shmrun) and of bench/compare/torch_pipeline.py
# (Debian's python3-torch), the same CNN, split and batch, for 1, 2, 4 and 8
# micro-batches per batch, and of the same model trained in one process
# without RPC (demo_pipeline --local) (docs/PERFORMANCE.md, "Pipeline
# parallelism").
#
#   bench/pipeline_compare.sh [--json] [--no-torch] [--smoke] [--workers W] [BUILD_DIR [STAGES [BATCHES]]]
#                                                        (defaults: build 2 30; W: STAGES, a worker per stage)
#
# The options may also come after the positional arguments.
#
# Both sides: BATCHES batches timed after 3 untimed warm-up ones (ours:
# demo_pipeline --warmup 3). One line per number of splits, then
# one for the best:
#   pipeline stages=2 workers=2 splits=4 batch=64 batches=30 ours_samples_per_s=190 torch_samples_per_s=213 ratio=0.89 (target >= 3: not met)
#   pipeline stages=2 workers=2 best_splits=8 ours_samples_per_s=545 speedup_over_1_split=1.34 (target >= 1.4: not met) local_samples_per_s=600 overhead_over_local=1.10 (target <= 1.3: met)
# --workers W below STAGES puts stage s on worker s mod W + 1 (both sides),
# so that a worker holds several stages (demo_pipeline --stages).
# overhead_over_local is a step's time in the pipeline over its time in one
# process (local samples/s over ours). --json: the same figures as JSON Lines
# on stdout (docs/PERFORMANCE.md, "Machine-readable output"), the lines above
# on stderr. Without python3-torch, or with --no-torch, PyTorch's figures are
# null and "torch" says why. --smoke (the smoke test of the suite bench,
# bench/meson.build): --no-torch, 1 batch unless BATCHES is given, the
# accuracy on 64 test images, no verdict: its figures are not measurements.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
json=0 no_torch=0 smoke=0 pos=() workers= prev=
for a in "$@"; do # options anywhere: before, between or after BUILD_DIR STAGES BATCHES
  if [ "$prev" = --workers ]; then workers=$a prev=; continue; fi
  case $a in
    --workers) prev=$a ;;
    --workers=*) workers=${a#--workers=} ;;
    --json) json=1 ;;
    --no-torch) no_torch=1 ;;
    --smoke) smoke=1 no_torch=1 ;;
    -*) echo "pipeline_compare.sh: unknown option '$a' (--json, --no-torch, --smoke, --workers W)" >&2; exit 2 ;;
    *) pos+=("$a") ;;
  esac
done
[ ${#pos[@]} -le 3 ] || { echo "pipeline_compare.sh: at most BUILD_DIR STAGES BATCHES, got: ${pos[*]}" >&2; exit 2; }
build=${pos[0]:-build} stages=${pos[1]:-2} batches=${pos[2]:-$([ $smoke = 1 ] && echo 1 || echo 30)}
workers=${workers:-$stages}
case $workers in
  [2-4]) [ "$workers" -le "$stages" ] || { echo "pipeline_compare.sh: --workers $workers: more workers than stages ($stages)" >&2; exit 2; } ;;
  *) echo "pipeline_compare.sh: --workers takes 2 to STAGES, got '$workers'" >&2; exit 2 ;;
esac
target=1.3 torch_target=3 speedup_target=1.4 test_limit=$([ $smoke = 1 ] && echo 64 || echo 1000)
warmup=$([ $smoke = 1 ] && echo 0 || echo 3) # as torch_pipeline.py's WARMUP: both time the same steps
[ $smoke = 0 ] || echo "# pipeline_compare.sh --smoke: $batches batch(es), no PyTorch; a check that every run works:" \
  "the figures below are not measurements" >&$([ $json = 1 ] && echo 2 || echo 1)
# --smoke runs as a meson test, which built both first: no second ninja in
# the build folder while meson test runs.
[ $smoke = 1 ] || ninja -C "$build" launcher/shmrun bench/demo_pipeline >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# samples/s from a demo_pipeline output file
rate() { sed -n 's/^time: .* steps, \([0-9]*\) samples\/s)$/\1/p' "$1"; }
run_ours() { # run_ours OUT ARGS...: demo_pipeline with the short-run options
  local out=$1; shift
  "$@" --epochs 1 --warmup "$warmup" --limit-batches $((batches + warmup)) --test-limit "$test_limit" \
    --loss-curve "$tmp/loss.svg" >"$out" 2>&1 ||
    { cat "$out" >&2; exit 1; }
}

declare -A ours torch
for k in 1 2 4 8; do
  run_ours "$tmp/ours.$k" "$build/launcher/shmrun" -n $((workers + 1)) -- "$build/bench/demo_pipeline" \
    --stages "$stages" --splits "$k"
  ours[$k]=$(rate "$tmp/ours.$k")
done
run_ours "$tmp/local" "$build/bench/demo_pipeline" --local
local_rate=$(rate "$tmp/local")

torch_why=
if [ $no_torch = 1 ]; then
  torch_why=$([ $smoke = 1 ] && echo --smoke || echo --no-torch)
elif ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  torch_why="torch not installed (apt-get install python3-torch)"
elif ! /usr/bin/python3 "$here/compare/torch_pipeline.py" --stages "$stages" --workers "$workers" --splits 1,2,4,8 \
    --batches "$batches" \
    >"$tmp/torch" 2>"$tmp/torch.err"; then
  cat "$tmp/torch.err" >&2
  torch_why="torch_pipeline.py failed"
fi
for k in 1 2 4 8; do
  torch[$k]=
  [ -n "$torch_why" ] || torch[$k]=$(sed -n "s/^torch_pipeline stages=$stages workers=$workers splits=$k .*samples_per_s=\([0-9]*\)$/\1/p" "$tmp/torch")
done

report() { # the human-readable lines, on stdout (stderr with --json)
  for k in 1 2 4 8; do
    awk -v s="$stages workers=$workers" -v k="$k" -v b="$batches" -v o="${ours[$k]}" -v t="${torch[$k]:-0}" -v w="$torch_why" \
        -v tt="$torch_target" 'BEGIN {
      printf "pipeline stages=%s splits=%s batch=64 batches=%s ours_samples_per_s=%s ", s, k, b, o
      if (w != "") printf "torch_samples_per_s=- (%s)\n", w
      else printf "torch_samples_per_s=%s ratio=%.2f (target >= %s: %s)\n", t, (t > 0 ? o / t : 0), tt,
        (t > 0 && o / t >= tt ? "met" : "not met") }'
  done
  awk -v s="$stages workers=$workers" -v bk="$best" -v o="${ours[$best]}" -v o1="${ours[1]}" -v l="$local_rate" -v tg="$target" \
      -v st="$speedup_target" -v sm="$smoke" 'BEGIN {
    ov = o > 0 ? l / o : 0; sp = o1 > 0 ? o / o1 : 0
    printf "pipeline stages=%s best_splits=%s ours_samples_per_s=%s speedup_over_1_split=%.2f (target >= %s: %s) local_samples_per_s=%s overhead_over_local=%.2f (target <= %s: %s)\n",
      s, bk, o, sp, st, (sm == 1 ? "not judged (--smoke)" : sp >= st ? "met" : "not met"), l, ov, tg,
      (sm == 1 ? "not judged (--smoke)" : ov <= tg ? "met" : "not met") }'
}

json_lines() { # one object per number of splits, then the best split's
  for k in 1 2 4 8; do
    awk -v s="$stages" -v wk="$workers" -v k="$k" -v b="$batches" -v o="${ours[$k]}" -v t="${torch[$k]:-0}" -v w="$torch_why" \
        -v tt="$torch_target" 'BEGIN {
      printf "{\"bench\":\"pipeline_compare\",\"name\":\"pipeline splits=%s\",\"config\":\"stages=%s workers=%s batch=64 batches=%s\",", k, s, wk, b
      printf "\"stages\":%s,\"workers\":%s,\"splits\":%s,\"batch\":64,\"batches\":%s,\"samples_per_s\":%s,", s, wk, k, b, o
      if (w != "") printf "\"torch_per_s\":null,\"ratio\":null,\"torch\":\"%s\"}\n", w
      else printf "\"torch_per_s\":%s,\"ratio\":%.3f,\"target_ratio\":%s,\"target_met\":%s}\n", t, (t > 0 ? o / t : 0), tt,
        (t > 0 && o / t >= tt ? "true" : "false") }'
  done
  awk -v s="$stages" -v wk="$workers" -v b="$batches" -v bk="$best" -v o="${ours[$best]}" -v o1="${ours[1]}" -v l="$local_rate" -v tg="$target" \
      -v st="$speedup_target" 'BEGIN {
    ov = o > 0 ? l / o : 0; sp = o1 > 0 ? o / o1 : 0
    printf "{\"bench\":\"pipeline_compare\",\"name\":\"pipeline best split\",\"config\":\"stages=%s workers=%s batch=64 batches=%s\",", s, wk, b
    printf "\"stages\":%s,\"workers\":%s,\"splits\":%s,\"samples_per_s\":%s,\"speedup_over_1_split\":%.3f,", s, wk, bk, o, sp
    printf "\"target_speedup\":%s,\"speedup_target_met\":%s,", st, (sp >= st ? "true" : "false")
    printf "\"local_samples_per_s\":%s,\"overhead_over_local\":%.3f,\"target_ratio\":%s,\"target_met\":%s}\n", l, ov, tg, (ov <= tg ? "true" : "false") }'
}

best=1
for k in 2 4 8; do [ "${ours[$k]}" -gt "${ours[$best]}" ] && best=$k; done
if [ $json = 1 ]; then
  report >&2
  json_lines
else
  report
fi
