#!/usr/bin/env bash
# One linear-regression job, 1 ps + 2 workers at batch 1, launched by hand on 127.0.0.1 the way
# tfjob-bench's `linear` section does; prints worker 0's figures and ps 0's shard plan.
#   benchmarks/linear-1ps2w.sh RUNTIME sync|async STEPS [more tfjob-runtime flags]
# Two builds compared pair by pair (what BENCHMARKS.md quotes):
#   farm-bench -n 3 --warmup 0 --timeout 300 \
#     --vs "sh -c 'exec benchmarks/linear-1ps2w.sh OLD/tfjob-runtime sync 20000 >>/tmp/old.txt 2>&1'" \
#     -- sh -c 'exec benchmarks/linear-1ps2w.sh NEW/tfjob-runtime sync 20000 >>/tmp/new.txt 2>&1'
set -euo pipefail
if (($# < 3)) || [[ $2 != sync && $2 != async ]]; then
    echo "usage: $0 RUNTIME sync|async STEPS [more tfjob-runtime flags]" >&2
    exit 2
fi
bin=$1 mode=$2 steps=$3
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
port=$((20000 + RANDOM % 20000))
sync=false
[[ $mode == sync ]] && sync=true
flags=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2)) --bind=127.0.0.1
    --shutdown_grace_secs=5 --model=linear --learning_rate=0.01 --batch_size=1 --log_every_steps=0
    --train_steps="$steps" --sync_replicas=$sync "$@")
"$bin" "${flags[@]}" --job_name=ps --task_index=0 >"$dir/ps.log" 2>&1 &
"$bin" "${flags[@]}" --job_name=worker --task_index=1 >"$dir/worker1.log" 2>&1 &
"$bin" "${flags[@]}" --job_name=worker --task_index=0 >"$dir/worker0.log" 2>&1
wait
grep -o '"global_step":[0-9]*\|"steps_per_sec":[0-9.]*' "$dir/worker0.log" | tr '\n' ' '
echo
grep -h "dispatching" "$dir/ps.log" | head -1
