#!/usr/bin/env bash
# Builds Kueue (sigs.k8s.io/kueue, the batch queue) from its published Go module, for the tests
# that queue TFJobs in it (tests/tests/kueue_controlplane.rs), and caches it machine-wide:
#   ${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs}/kueue/<hash>/
#     bin/kueue     the manager (about 4 minutes to build on 2 cores, the first time)
#     crds/         its CustomResourceDefinitions, from the module (config/components/crd/bases)
#     certs/        a self-signed serving pair (tls.crt, tls.key) for its webhook and metrics servers
#     module        the module's directory in the Go module cache
# so later runs reuse it in milliseconds. The last line on stdout is that directory.
#
# Out of a cluster, Kueue's main reads its metrics serving pair from a path it hard-codes
# (/etc/kueue/metrics/certs, cmd/kueue/main.go), even with metrics off, and no flag moves it.
# Rather than write under /etc, the build compiles a copy of the module whose main.go names
# certs/ instead (that one path changed by sed; nothing else).
#
# Usage: build.sh [--force]     (--force rebuilds even when cached)
set -euo pipefail

KUEUE_VERSION=v0.19.2

die() {
    echo "kueue/build.sh: ERROR: $*" >&2
    exit 1
}
log() { echo "kueue/build.sh: $*" >&2; }

force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) die "unknown argument: $arg" ;;
    esac
done

command -v go >/dev/null 2>&1 || die "'go' is not on PATH (Kueue ${KUEUE_VERSION} needs Go >= 1.26)"
command -v openssl >/dev/null 2>&1 || die "'openssl' is not on PATH (it makes Kueue's serving certificate)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hash="$(cat "$here/build.sh" | sha256sum | cut -c1-16)"
cache_root="${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/tfjob-rs}/kueue"
dir="$cache_root/$hash"

cached() { [[ -f "$dir/complete" && -x "$dir/bin/kueue" && -f "$dir/certs/tls.crt" ]]; }

mkdir -p "$cache_root"
if [[ $force == 0 ]] && cached; then
    log "cached: $dir"
    echo "$dir"
    exit 0
fi
exec 9>"$cache_root/$hash.lock"
if ! flock -n 9; then
    log "another build of Kueue is running; waiting for it"
    flock 9
fi
if [[ $force == 0 ]] && cached; then
    echo "$dir"
    exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"
started=$SECONDS
log "downloading sigs.k8s.io/kueue@${KUEUE_VERSION} (Go module cache $(go env GOMODCACHE))"
module="$(cd "$(mktemp -d)" && go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
[[ -n $module && -f $module/cmd/kueue/main.go ]] || die "sigs.k8s.io/kueue@${KUEUE_VERSION} did not download (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"

rm -rf "$dir.tmp" "$dir/complete"
mkdir -p "$dir.tmp/bin" "$dir.tmp/certs" "$dir.tmp/crds"
log "a self-signed serving pair for its webhook and metrics servers"
openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
    -keyout "$dir.tmp/certs/tls.key" -out "$dir.tmp/certs/tls.crt" -days 3650 2>/dev/null \
    || die "openssl could not make a certificate"
cp "$module"/config/components/crd/bases/*.yaml "$dir.tmp/crds/"

# A writable copy of the module (30 MB; Go refuses overlays of files in its module cache), its
# main.go with the metrics certificate directory moved from /etc/kueue/metrics/certs to ours.
grep -q '"/etc/kueue/metrics/certs"' "$module/cmd/kueue/main.go" \
    || die "cmd/kueue/main.go of ${KUEUE_VERSION} no longer names /etc/kueue/metrics/certs: look at how it finds its metrics certificates"
src="$cache_root/src-$hash"
rm -rf "$src"
cp -r "$module" "$src"
chmod -R u+w "$src"
sed -i "s#\"/etc/kueue/metrics/certs\"#\"$dir/certs\"#" "$src/cmd/kueue/main.go"

log "building kueue ${KUEUE_VERSION} (the first time about 4 minutes on 2 cores)"
(cd "$src" && go build -trimpath -ldflags "-s -w" -o "$dir.tmp/bin/kueue" ./cmd/kueue) \
    || die "go build of sigs.k8s.io/kueue/cmd/kueue failed"
rm -rf "$src"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
ln -sfn "$module" "$dir/module"
{
    echo "kueue=${KUEUE_VERSION}"
    echo "go=$(go env GOVERSION)"
    echo "seconds=$((SECONDS - started))"
} > "$dir/complete"
log "done in $((SECONDS - started))s: $dir"
echo "$dir"
