#!/usr/bin/env bash
# Trains the classic linear regression (y = 2x + 10 + noise) with 1 ps and
# 2 workers, each a separate tfjob-runtime process on 127.0.0.1, with
# SyncReplicasOptimizer semantics. Extra arguments go to every task
# (e.g. --train_steps=8000, --sync_replicas=false).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./target/release/tfjob-runtime
[ -x "$bin" ] || cargo build --release -p tfjob-runtime

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ps=$(free_port); w0=$(free_port); w1=$(free_port)
common=(--ps_hosts="127.0.0.1:$ps" --worker_hosts="127.0.0.1:$w0,127.0.0.1:$w1" --bind=127.0.0.1
        --model=linear --learning_rate=0.01 --train_steps=4000 --sync_replicas "$@")

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
"$bin" "${common[@]}" --job_name=ps --task_index=0 2> >(sed 's/^/[ps-0] /' >&2) & pids+=($!)
"$bin" "${common[@]}" --job_name=worker --task_index=0 2> >(sed 's/^/[worker-0] /' >&2) & pids+=($!)
"$bin" "${common[@]}" --job_name=worker --task_index=1 2> >(sed 's/^/[worker-1] /' >&2) & pids+=($!)
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
trap - EXIT
exit $status
