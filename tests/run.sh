#!/usr/bin/env bash
# The project's test command (README.md): installs or builds what the tests
# need, then runs every test of the workspace. Works on a fresh clone with no
# standard input.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== toolchain: $(cargo --version)"
export CARGO_TERM_COLOR=never
# Optimised test builds: the end-to-end tests train real models.
cargo build --release --workspace --bins
cargo test --release --workspace --no-fail-fast -- --test-threads=2
