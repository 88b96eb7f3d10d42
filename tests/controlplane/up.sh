#!/usr/bin/env bash
# Starts the test control plane (etcd, kube-apiserver, kube-controller-manager) for you to use:
# builds the binaries on first use (slow once per machine, see build.sh), prints
#   export KUBECONFIG=...
#   export PATH=<dir with the matching kubectl and helm>:$PATH
# and stops everything on Ctrl-C. The startup logic lives in the Rust harness
# (tests/src/controlplane.rs); this only builds and runs its `controlplane` binary.
#
# Usage: tests/controlplane/up.sh [--dir DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
"$here/build.sh" >/dev/null
cargo build --quiet --manifest-path "$repo/Cargo.toml" -p tfjob-tests --bin controlplane
exec "$CARGO_TARGET_DIR/debug/controlplane" "$@"
