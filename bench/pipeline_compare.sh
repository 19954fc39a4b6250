#!/usr/bin/env bash
# Pipeline parallelism side by side with PyTorch, in the same run: samples/s
# of demo_pipeline (under shmrun) and of bench/compare/torch_pipeline.py
# (Debian's python3-torch), the same CNN, split and batch, for 1, 2, 4 and 8
# micro-batches per batch (docs/PERFORMANCE.md, "Pipeline parallelism").
#
#   bench/pipeline_compare.sh [BUILD_DIR [STAGES [BATCHES]]]   (defaults: build 2 30)
#
# Ours: BATCHES batches timed from the first (its warm-up included); PyTorch:
# BATCHES batches after 3 warm-up ones. One line per number of splits:
#   pipeline stages=2 splits=4 batch=64 batches=30 ours_samples_per_s=190 torch_samples_per_s=213 ratio=0.89
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build} stages=${2:-2} batches=${3:-30}
ninja -C "$build" launcher/shmrun bench/demo_pipeline >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A ours
for k in 1 2 4 8; do
  "$build/launcher/shmrun" -n $((stages + 1)) -- "$build/bench/demo_pipeline" --splits "$k" --epochs 1 \
    --limit-batches "$batches" --test-limit 1000 --loss-curve "$tmp/loss.svg" >"$tmp/ours.$k" 2>&1 ||
    { cat "$tmp/ours.$k" >&2; exit 1; }
  ours[$k]=$(sed -n 's/^time: .* steps, \([0-9]*\) samples\/s)$/\1/p' "$tmp/ours.$k")
done
/usr/bin/python3 "$here/compare/torch_pipeline.py" --stages "$stages" --splits 1,2,4,8 --batches "$batches" \
  >"$tmp/torch" 2>"$tmp/torch.err" || { cat "$tmp/torch.err" >&2; exit 1; }
for k in 1 2 4 8; do
  t=$(sed -n "s/^torch_pipeline stages=$stages splits=$k .*samples_per_s=\([0-9]*\)$/\1/p" "$tmp/torch")
  awk -v s="$stages" -v k="$k" -v b="$batches" -v o="${ours[$k]}" -v t="$t" 'BEGIN {
    printf "pipeline stages=%s splits=%s batch=64 batches=%s ours_samples_per_s=%s torch_samples_per_s=%s ratio=%.2f\n",
      s, k, b, o, t, (t > 0 ? o / t : 0) }'
done
