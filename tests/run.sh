#!/usr/bin/env bash
# The project's test command (README.md): installs or builds what the tests
# need, then runs every test of the workspace. Works on a fresh clone with no
# standard input.
#
# `bash tests/run.sh --long` runs, after the same installs and build, only the
# long tests kept out of the default run (marked `#[ignore = "long ..."]`: the
# chaos tests, the 1,000-worker job; about 2.5 minutes: 141 s on a cached run,
# their two binaries side by side, 2026-12-05).
set -euo pipefail
cd "$(dirname "$0")/.."

long=false
case "${1:-}" in
    "") ;;
    --long) long=true ;;
    *)
        echo "usage: bash tests/run.sh [--long]" >&2
        exit 2
        ;;
esac

export CARGO_TERM_COLOR=never
echo "== toolchain: $(cargo --version), $(go version 2>/dev/null || echo 'no go')"

# The test control plane (kube-apiserver, etcd, kube-controller-manager,
# kubectl, helm) from their Go modules: about 14 minutes the first time on a
# machine, then cached machine-wide. Fails loudly if it cannot be built.
echo "== test control plane"
bash tests/controlplane/build.sh

# Kueue (the batch queue, tests/tests/kueue_controlplane.rs and kueue_pod_groups.rs) from its Go module, the gang
# schedulers' PodGroup CRDs and kube-scheduler from the control plane's module
# (tests/tests/gang_controlplane.rs): about 6, 1 and 3 minutes the first time on a machine, then
# cached machine-wide like the control plane.
echo "== kueue"
bash tests/kueue/build.sh
# Kubeflow's training-operator v1.9.3 (the controller tests/tests/kubeflow_takeover.rs takes
# over from) from its Go module: about 2-4 minutes the first time on a machine, then cached.
echo "== Kubeflow's training-operator"
bash tests/kubeflow/build.sh
echo "== Kubeflow's Python SDK (a venv from PyPI, tests/tests/sdk_controlplane.rs)"
bash tests/sdk/setup.sh
echo "== gang scheduler CRDs, kube-scheduler"
bash tests/gang/crds.sh
bash tests/gang/scheduler.sh

# python3 with numpy: the runtime's Keras test (runtime/tests/keras.rs) checks
# exported weights with a NumPy forward pass, and fails when numpy is missing.
echo "== python3 numpy"
python3 -c 'import numpy' 2>/dev/null || python3 -m pip install --user --quiet numpy || python3 -m pip install --quiet numpy

# Where cargo builds: $CARGO_TARGET_DIR if set, else a target directory kept
# machine-wide beside the control plane's cache, so that a fresh clone does not
# compile the ~400 dependencies again (cargo still rebuilds what changed: the
# clone's own crates always, their sources being newer than any artifact). Each
# checkout path adds its own copies of the workspace crates, so the cache is
# emptied first when it has grown past TFJOB_CARGO_CACHE_MAX_GB (default 8).
if [[ -z ${CARGO_TARGET_DIR:-} ]]; then
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs/cargo-target
    mkdir -p "$cache"
    used_kb=$(du -sk "$cache" | cut -f1)
    if ((used_kb > ${TFJOB_CARGO_CACHE_MAX_GB:-8} * 1024 * 1024)); then
        echo "== cargo cache $cache holds $((used_kb / 1024 / 1024)) GB: emptied"
        rm -rf "$cache"
        mkdir -p "$cache"
    fi
    export CARGO_TARGET_DIR=$cache
fi

# The build of the tests: release for the dependencies (the end-to-end tests
# train real models: ndarray and matrixmultiply do the arithmetic), and
# opt-level 1 for the workspace's own crates. Their code, with the
# kube, k8s-openapi, tonic and serde generics it instantiates, is compiled again
# for every test binary: at opt-level 3 it took 3,650 of the 4,080 CPU-seconds
# of a build with the dependencies mostly cached (cargo --timings, on a host
# running at a tenth of its usual speed). The report of each build is in
# $CARGO_TARGET_DIR/cargo-timings.
# `cargo build --release` (README) still builds them at opt-level 3, and
# tfjob-bench's figures come from that build.
test_profile=(--release)
for crate in tfjob-api tfjob-operator tfjob tfjob-runtime tfjob-tests; do
    test_profile+=(--config "profile.release.package.$crate.opt-level=1")
done

# Every test binary and every program the end-to-end tests run (tfjob,
# tfjob-operator, tfjob-runtime, controlplane and tfjob-bench land in
# $CARGO_TARGET_DIR/release).
# `cargo test` builds each package's binaries with the same features as its
# tests, so the dependencies compile once, not twice. Its JSON lists the test
# binaries for tests/lanes.py.
echo "== build (target directory: $CARGO_TARGET_DIR)"
started=$SECONDS
binaries=$(mktemp -t tfjob-test-binaries.XXXXXX.json)
trap 'rm -f "$binaries"' EXIT
cargo test "${test_profile[@]}" --workspace --no-run --timings --message-format=json-render-diagnostics >"$binaries"
echo "== build took $((SECONDS - started)) s"

# The tests: tests/lanes.py runs the test binaries two at a time, longest first
# (one at a time left the cores half idle, 53 % busy: most binaries wait on a
# control plane, containers or training processes), and the doc tests with cargo.
# TFJOB_TEST_LANES=1 runs them one after another, as `cargo test` would.
# Each run's durations are kept for the next run of its kind (the long run's are not the
# default run's: most binaries have no long test).
if $long; then
    echo "== the long tests"
    test_args=(--ignored --test-threads=2)
    durations=$CARGO_TARGET_DIR/test-durations-long.tsv
else
    echo "== tests"
    test_args=(--test-threads=2)
    durations=$CARGO_TARGET_DIR/test-durations.tsv
fi
started=$SECONDS
doc_tests=$(printf '%q ' cargo test "${test_profile[@]}" --workspace --doc -- "${test_args[@]}")
python3 tests/lanes.py --messages "$binaries" --lanes "${TFJOB_TEST_LANES:-2}" \
    --durations "$durations" --doc "$doc_tests" -- "${test_args[@]}"
echo "== tests took $((SECONDS - started)) s"
