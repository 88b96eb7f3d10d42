#!/usr/bin/env bash
# Builds, on this machine and pulling no image, a kind node image for podman and the `kind`
# binary that runs it, so that tests/e2e/kind/run.sh can make a real cluster here (see
# tests/e2e/kind/README.md, "Running it here"):
#
#   - kind, kubelet, kubeadm, kube-scheduler, kube-proxy (kubernetes/go.mod: the release of the
#     test control plane, whose kube-apiserver, kube-controller-manager and kubectl are reused
#     from tests/controlplane/build.sh), etcd (etcd/go.mod) and CoreDNS (coredns/) at the
#     versions kubeadm of that release deploys, crictl (cri-tools/go.mod) and the pause program
#     of the same release (C, from the k8s.io/kubernetes module), all built from source;
#   - a Debian root filesystem (debootstrap) with systemd, Debian's containerd, runc, CNI plugins
#     and iptables: the base of the node image and of the images that need a shell or iptables;
#   - one image per control-plane component, etcd, CoreDNS, pause, kube-proxy and the pod network
#     (cni/: kindnetd cannot be built here, see cni/default-cni.yaml), under the names kubeadm
#     and the node's containerd ask for;
#   - the node image itself: the base with kind's node files (entrypoint, systemd units,
#     containerd configuration, from the kind module), the binaries, /kind/version,
#     /kind/manifests/default-cni.yaml and all those images preloaded into containerd, as
#     `kind build node-image` lays it out.
#
# Everything is cached machine-wide under
#   ${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs}/kind-node/
# (binaries keyed by a hash of this directory, the root filesystem by its package list), and
# the images live in the podman store of tests/images/podman-env.sh, tagged with that hash.
# Progress goes to stderr; the last two lines on stdout are
#   KIND_NODE_IMAGE=<image>
#   KIND_BIN_DIR=<directory with kind>
#
# Usage: build.sh [--force]     (--force rebuilds the images even when they exist)
# NICE (default 15) is the niceness of the Go and C builds.
set -euo pipefail

# The Kubernetes release of the node: the one of tests/controlplane (build.sh checks both).
KUBE_VERSION=v1.37.1
KIND_VERSION=v0.33.0
# What kubeadm of KUBE_VERSION deploys (cmd/kubeadm/app/constants: DefaultEtcdVersion,
# CoreDNSVersion, PauseVersion); the image tags below follow from them.
ETCD_VERSION=v3.7.0
COREDNS_VERSION=v1.14.6
# crictl: the version of kind's base image (images/base/Dockerfile: CRICTL_VERSION).
CRICTL_VERSION=v1.36.0
PAUSE_VERSION=3.10.2
DEBIAN_SUITE=bookworm
# The node's packages (kind's base image has the same, less NFS and iSCSI).
BASE_PACKAGES=(systemd systemd-sysv dbus conntrack iptables nftables iproute2 ethtool util-linux
    mount kmod libseccomp2 pigz fuse-overlayfs e2fsprogs bash ca-certificates curl jq procps
    containerd runc containernetworking-plugins)
NICE=${NICE:-15}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../../../.." && pwd -P)

log() { echo "kind-node/build.sh: $*" >&2; }
die() {
    echo "kind-node/build.sh: ERROR: $*" >&2
    exit 1
}

force=0
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (see --help)" ;;
    esac
done

# ---------------------------------------------------------------------------------------------
# Tools and pins.

need_packages=()
command -v debootstrap >/dev/null 2>&1 || need_packages+=(debootstrap)
command -v jq >/dev/null 2>&1 || need_packages+=(jq)
command -v cc >/dev/null 2>&1 || need_packages+=(gcc libc6-dev)
if ((${#need_packages[@]})); then
    log "installing ${need_packages[*]} with apt-get"
    sudo=()
    [[ $(id -u) == 0 ]] || sudo=(sudo -n)
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_packages[@]}" </dev/null >&2 ||
        { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2 &&
            "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_packages[@]}" </dev/null >&2; } ||
        die "could not install ${need_packages[*]}"
fi
command -v go >/dev/null 2>&1 || die "'go' is not on PATH (Go >= 1.26, as for tests/controlplane)"
grep -q "k8s.io/kubernetes $KUBE_VERSION" "$here/kubernetes/go.mod" ||
    die "kubernetes/go.mod does not require k8s.io/kubernetes $KUBE_VERSION"
grep -q "^KUBE_VERSION=$KUBE_VERSION\$" "$repo/tests/controlplane/build.sh" ||
    die "tests/controlplane/build.sh is not at KUBE_VERSION=$KUBE_VERSION: update both together"
grep -q "sigs.k8s.io/kind $KIND_VERSION" "$here/kubernetes/go.mod" || die "kubernetes/go.mod does not require kind $KIND_VERSION"
grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "$here/etcd/go.mod" || die "etcd/go.mod does not require etcd $ETCD_VERSION"
grep -q "github.com/coredns/coredns $COREDNS_VERSION" "$here/coredns/go.mod" || die "coredns/go.mod does not require CoreDNS $COREDNS_VERSION"
grep -q "sigs.k8s.io/cri-tools $CRICTL_VERSION" "$here/cri-tools/go.mod" || die "cri-tools/go.mod does not require crictl $CRICTL_VERSION"

# shellcheck source=../../../images/podman-env.sh
. "$repo/tests/images/podman-env.sh"
tfjob_podman_setup || die "podman cannot be set up (tests/images/podman-env.sh)"

# The test control plane's binaries (built once per machine, cached).
cp_bin=$("$repo/tests/controlplane/build.sh" | tail -n 1) || die "tests/controlplane/build.sh failed"

# The binaries are keyed by what they are built from, the images by every file here as well.
bin_key=$({
    echo "$cp_bin $KUBE_VERSION $KIND_VERSION $ETCD_VERSION $COREDNS_VERSION $PAUSE_VERSION $CRICTL_VERSION"
    cd "$here" && cat kubernetes/go.* etcd/go.* coredns/* cri-tools/go.*
} | sha256sum | cut -c1-12)
hash=$({
    echo "$bin_key"
    cd "$here" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
} | sha256sum | cut -c1-12)
cache_root=${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/tfjob-rs}/kind-node
bin=$cache_root/bin-$bin_key
mkdir -p "$bin" || die "cannot create $bin"

# One build per machine at a time.
exec 9>"$cache_root/build.lock"
flock 9

export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local GOWORK=off

# ---------------------------------------------------------------------------------------------
# Binaries.

build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kube_minor=${KUBE_VERSION#v1.}
kube_minor=${kube_minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
    kube_ldflags+=" -X $pkg.gitCommit=go-module-k8s.io/kubernetes@$KUBE_VERSION -X $pkg.gitTreeState=clean"
    kube_ldflags+=" -X $pkg.buildDate=$build_date"
done

# go_build MODULE_DIR NAME PACKAGE LDFLAGS: builds $bin/NAME unless it is there.
go_build() {
    local module=$1 name=$2 pkg=$3 ldflags=$4 start=$SECONDS
    [[ -x $bin/$name ]] && return 0
    log "building $name ($pkg) ..."
    (cd "$here/$module" && nice -n "$NICE" go build -trimpath -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg") ||
        die "go build of $name ($pkg) failed"
    mv "$bin/$name.tmp" "$bin/$name"
    log "built $name in $((SECONDS - start))s"
}

(cd "$here/kubernetes" && go mod download) || die "go mod download failed in kubernetes/ (is the Go module proxy reachable?)"
go_build kubernetes kubelet k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
go_build kubernetes kubeadm k8s.io/kubernetes/cmd/kubeadm "$kube_ldflags"
go_build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kube_ldflags"
go_build kubernetes kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$kube_ldflags"
go_build kubernetes kind sigs.k8s.io/kind "-s -w"
go_build etcd etcd go.etcd.io/etcd/server/v3 "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=go-module-$ETCD_VERSION"
go_build coredns coredns . "-s -w"
go_build cri-tools crictl sigs.k8s.io/cri-tools/cmd/crictl "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"

kubernetes_src=$(cd "$here/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
kind_src=$(cd "$here/kubernetes" && go list -m -f '{{.Dir}}' sigs.k8s.io/kind)
if [[ ! -x $bin/pause ]]; then
    log "building pause $PAUSE_VERSION (build/pause/linux/pause.c of k8s.io/kubernetes@$KUBE_VERSION)"
    nice -n "$NICE" cc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-$KUBE_VERSION" \
        -o "$bin/pause.tmp" "$kubernetes_src/build/pause/linux/pause.c" || die "cc pause.c failed"
    strip "$bin/pause.tmp" 2>/dev/null || true
    mv "$bin/pause.tmp" "$bin/pause"
fi

# (The output read whole: `| grep -q` under pipefail fails when the program is still writing.)
[[ $("$bin/kubelet" --version 2>&1) == *"$KUBE_VERSION"* ]] || die "the built kubelet does not report $KUBE_VERSION"
[[ $("$bin/kind" version 2>&1) == *"$KIND_VERSION"* ]] || die "the built kind does not report $KIND_VERSION"

# ---------------------------------------------------------------------------------------------
# The Debian root filesystem (keyed by suite and packages only: edits of this script keep it).

rootfs_key=$(printf '%s\n' "$DEBIAN_SUITE" "${BASE_PACKAGES[@]}" | sha256sum | cut -c1-12)
rootfs_tar=$cache_root/rootfs-$DEBIAN_SUITE-$rootfs_key.tar
if [[ ! -f $rootfs_tar ]]; then
    log "debootstrap $DEBIAN_SUITE with ${BASE_PACKAGES[*]} (a few minutes)"
    tmp=$cache_root/rootfs-$rootfs_key.tmp
    rm -rf "$tmp"
    mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null |
        awk '{print $2; exit}') || true
    include=$(IFS=,; echo "${BASE_PACKAGES[*]}")
    nice -n "$NICE" debootstrap --variant=minbase --include="$include" "$DEBIAN_SUITE" "$tmp" \
        "${mirror:-http://deb.debian.org/debian}" >"$cache_root/debootstrap.log" 2>&1 ||
        die "debootstrap failed (log: $cache_root/debootstrap.log)"
    # What a container image needs no copy of.
    rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
    tar -C "$tmp" --numeric-owner -cf "$rootfs_tar.tmp" . || die "cannot pack $tmp"
    mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$tmp"
fi

# ---------------------------------------------------------------------------------------------
# Images.

work=$(mktemp -d "${TMPDIR:-/tmp}/tfjob-kind-node.XXXXXX")
stage=""
cleanup() {
    [[ -z $stage ]] || podman rm -f -t 0 "$stage" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# An image is up to date when it carries this build's hash: the names of the component images
# do not change when what is in them does.
have_image() {
    [[ $force == 0 ]] &&
        [[ $(podman image inspect --format '{{index .Labels "io.tfjob.kind-node"}}' "$1" 2>/dev/null) == "$hash" ]]
}

base_image=localhost/tfjob-kind-base:$DEBIAN_SUITE-$rootfs_key
if ! have_image "$base_image"; then
    log "importing the root filesystem as $base_image"
    podman import --change "LABEL io.tfjob.kind-node=$hash" "$rootfs_tar" "$base_image" >/dev/null ||
        die "podman import $rootfs_tar failed"
fi

# image NAME FROM FILE:PATH... -- CONTAINERFILE-LINES: builds NAME from FROM with the files
# copied to their paths (mode 0755), unless it exists.
image() {
    local name=$1 from=$2 ctx
    shift 2
    have_image "$name" && return 0
    ctx=$work/ctx-$RANDOM$RANDOM
    mkdir -p "$ctx/rootfs"
    while [[ $1 != -- ]]; do
        install -D -m 0755 "${1%%:*}" "$ctx/rootfs/${1#*:}"
        shift
    done
    shift
    { echo "FROM $from"; echo "COPY rootfs/ /"; printf '%s\n' "$@"; } >"$ctx/Containerfile"
    podman build --quiet --pull=never --layers=false --network=none \
        --label "io.tfjob.kind-node=$hash" -f "$ctx/Containerfile" -t "$name" "$ctx" >/dev/null ||
        die "podman build of $name failed"
    log "built $name"
}

# The control plane's own binaries sit next to the node's (kind's PATH gets kubectl and helm).
ln -sf "$cp_bin/kube-apiserver" "$bin/kube-apiserver"
ln -sf "$cp_bin/kube-controller-manager" "$bin/kube-controller-manager"
ln -sf "$cp_bin/kubectl" "$bin/kubectl"
ln -sf "$cp_bin/helm" "$bin/helm"
kube_image() {
    image "registry.k8s.io/$1:$KUBE_VERSION" scratch "$bin/$1:/usr/local/bin/$1" -- \
        "ENV PATH=/usr/local/bin" "ENTRYPOINT [\"/usr/local/bin/$1\"]"
}
kube_image kube-apiserver
kube_image kube-controller-manager
kube_image kube-scheduler
# kube-proxy runs iptables, iptables-restore and conntrack: the Debian base has them.
image "registry.k8s.io/kube-proxy:$KUBE_VERSION" "$base_image" "$bin/kube-proxy:/usr/local/bin/kube-proxy" -- \
    'ENTRYPOINT ["/usr/local/bin/kube-proxy"]'
image "registry.k8s.io/etcd:${ETCD_VERSION#v}-0" scratch "$bin/etcd:/usr/local/bin/etcd" -- \
    "ENV PATH=/usr/local/bin" 'ENTRYPOINT ["/usr/local/bin/etcd"]'
image "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" scratch "$bin/coredns:/coredns" -- \
    'ENTRYPOINT ["/coredns"]'
image "registry.k8s.io/pause:$PAUSE_VERSION" scratch "$bin/pause:/pause" -- \
    'ENTRYPOINT ["/pause"]'
cni_image=localhost/tfjob-kind-cni:$hash
image "$cni_image" "$base_image" "$here/cni/tfjob-kind-cni.sh:/usr/local/bin/tfjob-kind-cni" -- \
    'ENTRYPOINT ["/usr/local/bin/tfjob-kind-cni"]'
preloaded=("registry.k8s.io/kube-apiserver:$KUBE_VERSION" "registry.k8s.io/kube-controller-manager:$KUBE_VERSION"
    "registry.k8s.io/kube-scheduler:$KUBE_VERSION" "registry.k8s.io/kube-proxy:$KUBE_VERSION"
    "registry.k8s.io/etcd:${ETCD_VERSION#v}-0" "registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
    "registry.k8s.io/pause:$PAUSE_VERSION" "$cni_image")

# The node image: the base, kind's node files, the binaries, the images in containerd.
node_image=localhost/tfjob-kind-node:$KUBE_VERSION-$hash
if ! have_image "$node_image"; then
    log "assembling $node_image"
    stage=tfjob-kind-node-stage-$$
    podman run -d --name "$stage" --privileged --network=none "$base_image" sleep infinity >/dev/null ||
        die "cannot start a container of $base_image"
    # kind's node files (images/base/files of the kind module), as its base image has them.
    tar -C "$kind_src/images/base/files" --owner=0 --group=0 --mode=u+w -cf - usr etc kind |
        podman cp - "$stage:/" || die "cannot copy kind's node files"
    for b in kubeadm kubelet kubectl crictl; do
        podman cp "$bin/$b" "$stage:/usr/bin/$b" || die "cannot copy $b"
    done
    sed "s|@CNI_IMAGE@|$cni_image|" "$here/cni/default-cni.yaml" >"$work/default-cni.yaml"
    podman cp "$work/default-cni.yaml" "$stage:/kind/default-cni.yaml"
    podman exec -i -e KUBE_VERSION="$KUBE_VERSION" -e PAUSE_IMAGE="registry.k8s.io/pause:$PAUSE_VERSION" \
        "$stage" bash -euo pipefail <<'NODE' || die "setting up the node image failed"
chmod 0755 /usr/local/bin/* /kind /kind/bin /kind/bin/* /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl /usr/bin/crictl
find /etc/systemd/system /etc/containerd /etc/default /etc/sysctl.d /etc/crictl.yaml /kind -type f \
    ! -path '/kind/bin/*' -exec chmod 0644 {} +
# Debian's containerd, runc and CNI plugins where kind's units and containerd's defaults look.
ln -sf /usr/bin/containerd /usr/local/bin/containerd
mkdir -p /opt/cni/bin
cp -a /usr/lib/cni/. /opt/cni/bin/
# systemd as a container's init, as kind's base image sets it up.
find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
    /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
    /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo ReadKMsg=no >>/etc/systemd/journald.conf
systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
systemctl mask systemd-binfmt.service >/dev/null 2>&1
mkdir -p /etc/kubernetes/manifests /kind/manifests
mv /kind/default-cni.yaml /kind/manifests/default-cni.yaml
# containerd's OCI defaults plus kind's hook that gives each container its own product_uuid.
ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
    jq 'del(.process.rlimits)' >/etc/containerd/cri-base.json
# The pause image built with the node (kubeadm's PauseVersion of the release).
sed -i "s|^\( *sandbox_image *= *\).*|\1\"$PAUSE_IMAGE\"|" /etc/containerd/config.toml
grep -q "sandbox_image = \"$PAUSE_IMAGE\"" /etc/containerd/config.toml
# This machine refuses a negative oom_score_adj even to root ("write error: Permission denied"),
# which fails every pod sandbox in runc (kubelet gives pause -998); containerd then raises what a
# pod asks for to its own score instead.
sed -i 's/^\( *restrict_oom_score_adj *= *\).*/\1true/' /etc/containerd/config.toml
grep -q 'restrict_oom_score_adj = true' /etc/containerd/config.toml
# Kubernetes v1.35+ refuses cgroup v1 unless told otherwise; this machine has cgroup v1.
echo 'KUBELET_EXTRA_ARGS=--runtime-cgroups=/system.slice/containerd.service --fail-cgroupv1=false' >/etc/default/kubelet
echo "$KUBE_VERSION" >/kind/version
NODE
    # Preload the images (unpacked on first use), pinned so that the kubelet's image garbage
    # collection keeps them, as `kind build node-image` does.
    podman exec "$stage" bash -c 'nohup containerd >/tmp/containerd.log 2>&1 & for i in $(seq 50); do ctr version >/dev/null 2>&1 && exit 0; sleep 0.2; done; cat /tmp/containerd.log; exit 1' ||
        die "containerd does not start in the node image"
    for img in "${preloaded[@]}"; do
        podman save --format docker-archive "$img" 2>/dev/null |
            podman exec -i "$stage" ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
                --all-platforms --no-unpack --digests - >/dev/null || die "cannot preload $img"
    done
    imported=$(podman exec "$stage" ctr --namespace=k8s.io images list -q)
    for img in "${preloaded[@]}"; do
        grep -qxF "$img" <<<"$imported" || die "$img is missing from the node's containerd after the import: $imported"
    done
    podman exec "$stage" bash -c 'kill $(pidof containerd); while pidof containerd >/dev/null; do sleep 0.1; done; rm -rf /tmp/* /run/containerd'
    podman commit --quiet \
        --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
        --change 'ENV container=docker' --change 'STOPSIGNAL SIGRTMIN+3' \
        --change "LABEL io.tfjob.kind-node=$hash" "$stage" "$node_image" >/dev/null || die "podman commit failed"
    podman rm -f -t 0 "$stage" >/dev/null
    stage=""
    log "built $node_image"
fi

# Node and network images of earlier builds, and the images their names moved away from.
for old in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter reference='localhost/tfjob-kind-*'); do
    case $old in "$node_image" | "$cni_image" | "$base_image") ;; *) podman rmi "$old" >/dev/null 2>&1 || true ;; esac
done
podman image prune -f >/dev/null 2>&1 || true

echo "KIND_NODE_IMAGE=$node_image"
echo "KIND_BIN_DIR=$bin"
