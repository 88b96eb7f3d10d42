#!/usr/bin/env bash
# Builds kube-scheduler from the test control plane's own Go module (tests/controlplane: the same
# k8s.io/kubernetes release as its API server), for the test of Kubernetes' own gang scheduling
# (tests/tests/gang_controlplane.rs), cached machine-wide in
#   ${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs}/gang/kube-scheduler-<hash>
# (a few minutes the first time, less when the control plane's build has filled Go's build
# cache). The last line on stdout is the binary's path.
set -euo pipefail

die() { echo "gang/scheduler.sh: ERROR: $*" >&2; exit 1; }
log() { echo "gang/scheduler.sh: $*" >&2; }

command -v go >/dev/null 2>&1 || die "'go' is not on PATH"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/../controlplane"
hash="$(cat "$here/scheduler.sh" "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-16)"
cache_root="${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/tfjob-rs}/gang"
bin="$cache_root/kube-scheduler-$hash"
if [[ -x $bin ]]; then
    log "cached: $bin"
    echo "$bin"
    exit 0
fi
mkdir -p "$cache_root"
exec 9>"$bin.lock"
flock 9
if [[ -x $bin ]]; then
    echo "$bin"
    exit 0
fi
kube_version="$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes[[:space:]]\+\(v[0-9.]*\).*/\1/p' "$module/go.mod" | head -1)"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"
log "building kube-scheduler ${kube_version} (k8s.io/kubernetes/cmd/kube-scheduler)"
started=$SECONDS
(cd "$module" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${kube_version}" -o "$bin.tmp" k8s.io/kubernetes/cmd/kube-scheduler) \
    || die "go build of kube-scheduler failed"
mv "$bin.tmp" "$bin"
log "built in $((SECONDS - started))s: $bin"
echo "$bin"
