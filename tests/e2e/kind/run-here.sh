#!/usr/bin/env bash
# Runs the kind end to end scenario (run.sh, unchanged) on this machine, where no image can be
# pulled and there is no Docker daemon: kind with podman as its provider, on a node image built
# here (node-image/build.sh), with the tfjob images built from release binaries
# (tests/images/build-offline.sh). See README.md next to this file, "Running it here".
#
#   bash tests/e2e/kind/run-here.sh
#
# Steps: podman (tests/images/podman-env.sh); kind, the node image and its images
# (node-image/build.sh, cached machine-wide); `cargo build --release` of tfjob and
# tfjob-runtime as tests/run.sh builds them (skipped when TFJOB_BIN_DIR names built
# binaries) and their images (tests/images/build-offline.sh); then
# run.sh with KIND_EXPERIMENTAL_PROVIDER=podman, KIND_NODE_IMAGE=<the local node image>,
# SKIP_BUILD=1 and a `docker` command that is podman.
#
# Settings (environment): those of run.sh (CLUSTER_NAME, KEEP_CLUSTER, JOB_TIMEOUT,
# ARTIFACTS_DIR, ...), and
#   TFJOB_KIND_PODMAN_DIR  podman's state for this run: images, node containers, the kind network
#                   (default /var/tmp/tfjob-podman-kind, apart from the other tests' store)
#   TFJOB_BIN_DIR   directory with release builds of tfjob and tfjob-runtime (default: build
#                   them into $CARGO_TARGET_DIR/release; CARGO_TARGET_DIR defaults to
#                   tests/run.sh's ~/.cache/tfjob-rs/cargo-target)
#   NICE            niceness of the builds (default 15)
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../../.." && pwd -P)
NICE=${NICE:-15}
export NICE

log() { printf '%s [kind-here] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
    log "FAIL: $*"
    exit 1
}
start=$SECONDS

# kind's podman provider bind-mounts the machine's /lib/modules into every node; a machine
# without kernel modules (a VM with a monolithic kernel) has none.
[[ -d /lib/modules ]] || mkdir -p /lib/modules || die "/lib/modules is missing and cannot be created"

# A podman store of its own: the tfjob images are renamed in it (below), which the other tests,
# using the default store, must not see.
export TFJOB_PODMAN_DIR=${TFJOB_KIND_PODMAN_DIR:-/var/tmp/tfjob-podman-kind}
# shellcheck source=../../images/podman-env.sh
. "$repo/tests/images/podman-env.sh"
tfjob_podman_setup || die "podman cannot be set up (tests/images/podman-env.sh)"

# kind, kubectl, helm and the node image.
log "kind and the node image (tests/e2e/kind/node-image/build.sh; cached after the first run)"
built=$(bash "$here/node-image/build.sh") || die "tests/e2e/kind/node-image/build.sh failed"
KIND_NODE_IMAGE=$(sed -n 's/^KIND_NODE_IMAGE=//p' <<<"$built")
KIND_BIN_DIR=$(sed -n 's/^KIND_BIN_DIR=//p' <<<"$built")
[[ -n $KIND_NODE_IMAGE && -x $KIND_BIN_DIR/kind ]] || die "node-image/build.sh printed no image or kind: $built"
log "node image $KIND_NODE_IMAGE ($((SECONDS - start))s so far)"

# The operator and runtime images, from release binaries.
# Built as tests/run.sh builds them (same target directory and profile), so either reuses the
# other's build.
if [[ -z ${TFJOB_BIN_DIR:-} ]]; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs/cargo-target}
    profile=()
    for crate in tfjob-api tfjob-operator tfjob tfjob-runtime tfjob-tests; do
        profile+=(--config "profile.release.package.$crate.opt-level=1")
    done
    log "cargo build --release of tfjob-operator and tfjob-runtime (into $CARGO_TARGET_DIR)"
    (cd "$repo" && nice -n "$NICE" cargo build --release "${profile[@]}" --bins -p tfjob-operator -p tfjob-runtime) ||
        die "cargo build failed"
    TFJOB_BIN_DIR=$CARGO_TARGET_DIR/release
fi
bash "$repo/tests/images/build-offline.sh" --bin-dir "$TFJOB_BIN_DIR" >&2 || die "tests/images/build-offline.sh failed"
# The names run.sh loads into the nodes and the manifests run: the published names
# ghcr.io/tfjob-rs/tfjob-{runtime,operator}:<appVersion>, which build-offline.sh also tags.
# `podman save` of a short name writes the name podman resolved into the archive, so the
# images keep only their published names here.
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$repo/charts/tfjob-operator/Chart.yaml")
[[ -n $app_version ]] || die "no appVersion in charts/tfjob-operator/Chart.yaml"
rename_image() {
    podman tag "$1" "$2" && podman untag "$1" "$1" || die "cannot rename $1 to $2"
}
rename_image localhost/tfjob-runtime:latest "ghcr.io/tfjob-rs/tfjob-runtime:$app_version"
rename_image localhost/tfjob-operator:latest "ghcr.io/tfjob-rs/tfjob-operator:$app_version"

# run.sh calls `docker` (kind load docker-image saves with it): here that is podman.
shim=$(mktemp -d "${TMPDIR:-/tmp}/tfjob-kind-here.XXXXXX")
trap 'rm -rf "$shim"' EXIT
printf '#!/bin/sh\nexec podman "$@"\n' >"$shim/docker"
chmod +x "$shim/docker"

log "running tests/e2e/kind/run.sh with kind $("$KIND_BIN_DIR/kind" version | awk '{print $2}') on podman ($((SECONDS - start))s of preparation)"
export PATH=$shim:$KIND_BIN_DIR:$PATH
export KIND_EXPERIMENTAL_PROVIDER=podman KIND_NODE_IMAGE SKIP_BUILD=1
rc=0
bash "$here/run.sh" || rc=$?
log "run.sh exited $rc after $((SECONDS - start))s in all"
exit "$rc"
