#!/bin/bash
# The MLP 784-100-10 on 1 ps + 2 async workers over TLS (or plaintext with PLAIN=1), launched by
# hand as tfjob-bench launches its tasks, for paired timing with farm-bench:
#   farm-bench -n 10 --timeout 600 --vs "benchmarks/mlp-1ps2w-tls.sh OLD/tfjob-runtime 30" -- \
#       benchmarks/mlp-1ps2w-tls.sh NEW/tfjob-runtime 30
# usage: mlp-1ps2w-tls.sh RUNTIME EPOCHS   (CA_DIR: a job CA's ca.crt and ca.key, as
# `tfjob-bench --only tls --out DIR` leaves in DIR/tls; default bench-out/tls)
set -euo pipefail
RT=$1; EPOCHS=$2; CA_DIR=${CA_DIR:-bench-out/tls}
read -r P0 P1 P2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
TLS="--tls_ca=$CA_DIR/ca.crt --tls_ca_key=$CA_DIR/ca.key"
[ "${PLAIN:-0}" = "1" ] && TLS=""
COMMON="--ps_hosts=127.0.0.1:$P0 --worker_hosts=127.0.0.1:$P1,127.0.0.1:$P2 --bind=127.0.0.1 --shutdown_grace_secs=5
  --model=mlp --hidden_units=100 --batch_size=100 --learning_rate=0.5 --num_epochs=$EPOCHS --log_every_steps=0
  --eval_examples=500 $TLS"
# shellcheck disable=SC2086
"$RT" --job_name=ps --task_index=0 $COMMON >/dev/null 2>&1 &
PS=$!
# shellcheck disable=SC2086
"$RT" --job_name=worker --task_index=0 $COMMON >/dev/null 2>&1 &
W0=$!
# shellcheck disable=SC2086
"$RT" --job_name=worker --task_index=1 $COMMON >/dev/null 2>&1
wait "$W0"
wait "$PS"
