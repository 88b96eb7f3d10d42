#!/usr/bin/env bash
# Builds the test control plane from the published Go modules pinned in go.mod:
#   kube-apiserver, kube-controller-manager, kubectl (Kubernetes), helm, etcd.
#
# The binaries go to a machine-wide cache keyed by a hash of go.mod, go.sum and
# this script:
#   ${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs}/controlplane/<hash>/bin
# so a fresh clone on the same machine reuses them in milliseconds. Only the
# first build on a machine is slow (compiling Kubernetes: ~10-20 minutes on 2
# cores, plus the module download).
#
# Progress goes to stderr. On success the last line on stdout is the bin
# directory (the Rust harness reads it). Exit status is non-zero with a message
# on any failure.
#
# Usage: build.sh [--force]     (--force rebuilds even when cached)
set -euo pipefail

# The release these binaries are. Must match go.mod (k8s.io/kubernetes
# v$KUBE_VERSION, every k8s.io/* replace at v0.$minor.$patch), helm.sh/helm/v4
# and go.etcd.io/etcd/server/v3 there; build.sh checks that they agree.
KUBE_VERSION=v1.37.1
HELM_VERSION=v4.3.1
ETCD_VERSION=v3.7.3

die() {
    echo "" >&2
    echo "controlplane/build.sh: ERROR: $*" >&2
    echo "controlplane/build.sh: the test control plane (kube-apiserver, etcd, ...) could NOT be built;" >&2
    echo "controlplane/build.sh: tests that need it will fail." >&2
    exit 1
}
log() { echo "controlplane/build.sh: $*" >&2; }

force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) die "unknown argument: $arg" ;;
    esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

command -v go >/dev/null 2>&1 || die "'go' is not on PATH; install Go >= 1.26 (the Kubernetes module requires it)"
command -v sha256sum >/dev/null 2>&1 || die "'sha256sum' (coreutils) is not on PATH"

go_version="$(go env GOVERSION 2>/dev/null || true)"
case "$go_version" in
    go1.2[6-9]*|go1.[3-9][0-9]*|go[2-9]*) ;;
    *) die "Go >= 1.26 is required to build Kubernetes ${KUBE_VERSION}; found '${go_version:-unknown}'" ;;
esac

# The pins in go.mod must be the ones named above (they become --version output).
check_pin() {
    local mod="$1" want="$2"
    grep -Eq "^[[:space:]]*${mod//./\\.}[[:space:]]+${want//./\\.}([[:space:]]|$)" go.mod \
        || die "go.mod does not require ${mod} ${want}; update KUBE_VERSION/HELM_VERSION/ETCD_VERSION in build.sh together with go.mod"
}
check_pin k8s.io/kubernetes "$KUBE_VERSION"
check_pin helm.sh/helm/v4 "$HELM_VERSION"
check_pin go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
staging="v0.${KUBE_VERSION#v1.}"
if grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ => ' go.mod | grep -Fv " ${staging}" >/dev/null; then
    die "a k8s.io/* replace line in go.mod is not at ${staging} (Kubernetes ${KUBE_VERSION})"
fi

hash="$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
cache_root="${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/tfjob-rs}/controlplane"
dir="$cache_root/$hash"
bin="$dir/bin"
binaries=(etcd kube-apiserver kube-controller-manager kubectl helm)

cached() {
    [[ -f "$dir/complete" ]] || return 1
    local b
    for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
}

mkdir -p "$cache_root" || die "cannot create cache directory $cache_root"

if [[ $force == 0 ]] && cached; then
    log "cached: $bin"
    echo "$bin"
    exit 0
fi

# One build per machine at a time: concurrent test binaries wait for the first.
exec 9>"$cache_root/$hash.lock" || die "cannot open lock file $cache_root/$hash.lock"
if ! flock -n 9; then
    log "another build of the same control plane is running; waiting for it (lock $cache_root/$hash.lock)"
    flock 9 || die "could not take the build lock"
fi
if [[ $force == 0 ]] && cached; then
    log "cached (built by another process): $bin"
    echo "$bin"
    exit 0
fi

log "building the test control plane: Kubernetes ${KUBE_VERSION}, helm ${HELM_VERSION}, etcd ${ETCD_VERSION} with ${go_version}"
log "into $bin"
log "the first build on a machine takes a long time (Kubernetes is large); later runs reuse the cache"

rm -rf "$dir/bin.tmp" "$dir/complete"
mkdir -p "$dir/bin.tmp"

build_date="$(date -u +'%Y-%m-%dT%H:%M:%SZ')"
kube_minor="${KUBE_VERSION#v1.}"; kube_minor="${kube_minor%%.*}"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
    kube_ldflags+=" -X ${pkg}.gitMajor=1"
    kube_ldflags+=" -X ${pkg}.gitMinor=${kube_minor}"
    # The Go module zip carries no git metadata; say where it came from instead
    # of leaving the "\$Format:%H\$" placeholder.
    kube_ldflags+=" -X ${pkg}.gitCommit=go-module-k8s.io/kubernetes@${KUBE_VERSION}"
    kube_ldflags+=" -X ${pkg}.gitTreeState=clean"
    kube_ldflags+=" -X ${pkg}.buildDate=${build_date}"
done
helm_ldflags="-s -w"
helm_ldflags+=" -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}"
helm_ldflags+=" -X helm.sh/helm/v4/internal/version.metadata="
helm_ldflags+=" -X helm.sh/helm/v4/internal/version.gitCommit=go-module-helm.sh/helm/v4@${HELM_VERSION}"
helm_ldflags+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
etcd_ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=go-module-${ETCD_VERSION}"

export CGO_ENABLED=0          # static binaries, no C toolchain needed
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOTOOLCHAIN=local
export GOWORK=off

log "downloading Go modules (cached in $(go env GOMODCACHE))"
go mod download || die "go mod download failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"

total_start=$SECONDS
build_one() {
    local name="$1" pkg="$2" ldflags="$3" start=$SECONDS
    log "building ${name} (${pkg}) ..."
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin.tmp/$name" "$pkg" \
        || die "go build of ${name} (${pkg}) failed"
    log "built ${name} in $((SECONDS - start))s"
}
build_one kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build_one kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
build_one kubectl k8s.io/kubernetes/cmd/kubectl "$kube_ldflags"
build_one helm helm.sh/helm/v4/cmd/helm "$helm_ldflags"
build_one etcd go.etcd.io/etcd/server/v3 "$etcd_ldflags"

# Smoke-check: each binary runs and reports the pinned version. (Not `... | grep -q`: with
# pipefail, grep -q ending at its first match fails the pipe when the program is still writing,
# as kubectl does: it then dies of SIGPIPE. The output is read whole first.)
reports() {
    local want="$1" out
    shift
    out=$("$@" 2>&1) || true
    [[ $out == *"$want"* ]]
}
reports "$KUBE_VERSION" "$dir/bin.tmp/kubectl" version --client \
    || die "the built kubectl does not report ${KUBE_VERSION}"
reports "$KUBE_VERSION" "$dir/bin.tmp/kube-apiserver" --version \
    || die "the built kube-apiserver does not report ${KUBE_VERSION}"
reports "$HELM_VERSION" "$dir/bin.tmp/helm" version \
    || die "the built helm does not report ${HELM_VERSION}"
reports "${ETCD_VERSION#v}" "$dir/bin.tmp/etcd" --version \
    || die "the built etcd does not report ${ETCD_VERSION}"

rm -rf "$bin"
mv "$dir/bin.tmp" "$bin"
{
    echo "kubernetes=${KUBE_VERSION}"
    echo "helm=${HELM_VERSION}"
    echo "etcd=${ETCD_VERSION}"
    echo "go=${go_version}"
    echo "built=${build_date}"
    echo "seconds=$((SECONDS - total_start))"
} > "$dir/complete"
log "done in $((SECONDS - total_start))s: $bin"
echo "$bin"
