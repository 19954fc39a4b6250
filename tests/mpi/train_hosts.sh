#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The training demo across 2 pretend hosts: the parameter server
# on one, the trainer on the other, every forward, backward and optimizer
# step crossing through MPI. With one trainer a run is deterministic, so the
# run under mpirun must end with the parameters of the same run under
# shmrun, bit for bit, and print the same test accuracy. Then 3 trainers on
# 2 hosts (the server and a trainer on one, two trainers on the other): the
# order of their updates varies, the accuracy must still be reached.
#   train_hosts.sh SHMRUN DEMO_TRAIN
set -euo pipefail
shmrun=$1 demo=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "$0")/mpirun_env.sh"
args=(--limit-batches 200 --plot "$dir/loss.svg")

"$shmrun" -n 2 -- "$demo" "${args[@]}" --dump-params "$dir/shm.params" > "$dir/shm.out" 2>&1 ||
  { cat "$dir/shm.out"; echo "train_hosts: the shmrun run failed"; exit 1; }
"${MPIRUN[@]}" -n 2 -x SHMRPC_HOSTS=2 "$demo" "${args[@]}" --dump-params "$dir/mpi.params" > "$dir/mpi.out" 2>&1 ||
  { cat "$dir/mpi.out"; echo "train_hosts: the mpirun run (2 pretend hosts) failed"; exit 1; }
acc_shm=$(grep -o 'test accuracy: [0-9.]* %' "$dir/shm.out" || true)
acc_mpi=$(grep -o 'test accuracy: [0-9.]* %' "$dir/mpi.out" || true)
echo "shmrun, 1 trainer:             $acc_shm"
echo "mpirun, 2 pretend hosts:       $acc_mpi"
[ -n "$acc_shm" ] && [ "$acc_shm" = "$acc_mpi" ] ||
  { echo "train_hosts: the accuracies differ"; exit 1; }
cmp "$dir/shm.params" "$dir/mpi.params" ||
  { echo "train_hosts: the final parameters differ from the shmrun run's"; exit 1; }
echo "final parameters identical, bit for bit"

"${MPIRUN[@]}" -n 4 -x SHMRPC_HOSTS=2 "$demo" "${args[@]}" > "$dir/mpi3.out" 2>&1 ||
  { cat "$dir/mpi3.out"; echo "train_hosts: the 3-trainer run on 2 pretend hosts failed"; exit 1; }
acc3=$(grep -o 'test accuracy: [0-9.]*' "$dir/mpi3.out" | grep -o '[0-9.]*$' || true)
echo "mpirun, 3 trainers, 2 hosts:   test accuracy: $acc3 %"
awk -v a="${acc3:-0}" 'BEGIN { exit !(a >= 65) }' ||
  { cat "$dir/mpi3.out"; echo "train_hosts: 3 trainers on 2 pretend hosts reached $acc3 %, below 65 %"; exit 1; }
