#!/usr/bin/env bash
# Builds Kubeflow's training-operator (github.com/kubeflow/training-operator, the v1 TFJob
# controller this project takes over from) from its published Go module, for the takeover test
# (tests/tests/kubeflow_takeover.rs), and caches it machine-wide:
#   ${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs}/kubeflow/<hash>/
#     bin/training-operator   its manager (about 3-4 minutes to build on 2 cores, the first time)
#     crds/                   its TFJob CustomResourceDefinition (manifests/base/crds)
#     certs/                  a self-signed pair for the webhook server it always starts
# so later runs reuse it in milliseconds. The last line on stdout is that directory.
#
# Usage: build.sh [--force]     (--force rebuilds even when cached)
set -euo pipefail

VERSION=v1.9.3

die() { echo "kubeflow/build.sh: ERROR: $*" >&2; exit 1; }
log() { echo "kubeflow/build.sh: $*" >&2; }

force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) die "unknown argument: $arg" ;;
    esac
done

command -v go >/dev/null 2>&1 || die "'go' is not on PATH"
command -v openssl >/dev/null 2>&1 || die "'openssl' is not on PATH (it makes the webhook server's certificate)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hash="$(sha256sum < "$here/build.sh" | cut -c1-16)"
cache_root="${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/tfjob-rs}/kubeflow"
dir="$cache_root/$hash"

cached() { [[ -f "$dir/complete" && -x "$dir/bin/training-operator" ]]; }

mkdir -p "$cache_root"
if [[ $force == 0 ]] && cached; then
    log "cached: $dir"
    echo "$dir"
    exit 0
fi
exec 9>"$cache_root/$hash.lock"
flock 9
if [[ $force == 0 ]] && cached; then
    echo "$dir"
    exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"
started=$SECONDS
module="$(cd "$(mktemp -d)" && go mod download -json "github.com/kubeflow/training-operator@${VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
[[ -n $module && -d $module/cmd/training-operator.v1 ]] || die "github.com/kubeflow/training-operator@${VERSION} did not download (GOPROXY=$(go env GOPROXY))"
rm -rf "$dir.tmp" "$dir"
mkdir -p "$dir.tmp/bin" "$dir.tmp/crds" "$dir.tmp/certs"
cp "$module/manifests/base/crds/kubeflow.org_tfjobs.yaml" "$dir.tmp/crds/"
openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=training-operator.kubeflow.svc \
    -keyout "$dir.tmp/certs/tls.key" -out "$dir.tmp/certs/tls.crt" -days 3650 2>/dev/null \
    || die "openssl could not make a certificate"
log "building training-operator ${VERSION} (cmd/training-operator.v1)"
GOBIN="$dir.tmp/bin" go install "github.com/kubeflow/training-operator/cmd/training-operator.v1@${VERSION}" \
    || die "go install of training-operator ${VERSION} failed"
mv "$dir.tmp/bin/training-operator.v1" "$dir.tmp/bin/training-operator"
touch "$dir.tmp/complete"
mv "$dir.tmp" "$dir"
log "built in $((SECONDS - started))s: $dir"
echo "$dir"
