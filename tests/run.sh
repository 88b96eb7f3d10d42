#!/usr/bin/env bash
# The project's test command (README.md): installs or builds what the tests
# need, then runs every test of the workspace. Works on a fresh clone with no
# standard input.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never
echo "== toolchain: $(cargo --version), $(go version 2>/dev/null || echo 'no go')"

# The test control plane (kube-apiserver, etcd, kube-controller-manager,
# kubectl, helm) from their Go modules: about 14 minutes the first time on a
# machine, then cached machine-wide. Fails loudly if it cannot be built.
echo "== test control plane"
bash tests/controlplane/build.sh

# Every test binary and every program the end-to-end tests run (they train
# real models, so release). `cargo test` builds each package's binaries with
# the same features as its tests, so the dependencies compile once, not twice.
echo "== build"
cargo test --release --workspace --no-run

echo "== tests"
cargo test --release --workspace --no-fail-fast -- --test-threads=2
