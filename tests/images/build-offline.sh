#!/usr/bin/env bash
# Builds the images localhost/tfjob-runtime:latest and localhost/tfjob-operator:latest, also
# tagged with their published names ghcr.io/tfjob-rs/tfjob-{runtime,operator}:<appVersion>
# (the names the examples and the chart use, so that they run here without a pull), with
# podman from binaries that `cargo build --release` already made, pulling nothing: each image is
# FROM scratch with the binary, the shared libraries it links (as `ldd` lists them), the files
# name resolution reads (/etc/nsswitch.conf; since glibc 2.34 the files and dns NSS modules live
# in libc.so.6 itself), /etc/passwd and /etc/group with the user nonroot (65532), and /tmp.
# runtime/Dockerfile and operator/Dockerfile describe the same images for machines that can pull.
#
#   tests/images/build-offline.sh [--bin-dir DIR] [--force]
#
# DIR (or $TFJOB_BIN_DIR; default target/release of the repository) holds tfjob-runtime and
# tfjob-operator. An image is rebuilt only when its content (binary, libraries, recipe) changed: the hash
# of the build context is a label of the image. Podman is set up by podman-env.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
bin_dir=${TFJOB_BIN_DIR:-$repo/target/release}
force=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) [ $# -ge 2 ] || { echo "--bin-dir needs a directory" >&2; exit 2; }; bin_dir=$2; shift 2 ;;
        --bin-dir=*) bin_dir=${1#--bin-dir=}; shift ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

missing=()
for b in tfjob-runtime tfjob-operator; do [ -x "$bin_dir/$b" ] || missing+=("$bin_dir/$b"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build-offline: missing ${missing[*]}; build them first:" >&2
    echo "  cargo build --release -p tfjob-runtime -p tfjob-operator   (or pass --bin-dir DIR)" >&2
    exit 1
fi
bin_dir=$(cd "$bin_dir" && pwd -P)

# shellcheck source=podman-env.sh
. "$here/podman-env.sh"
tfjob_podman_setup

# One build at a time per image store.
exec 9>"$TFJOB_PODMAN_DIR/build-offline.lock"
flock 9

work=$(mktemp -d "${TMPDIR:-/tmp}/tfjob-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

glibc_version=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}') || true

# Copies file $1 (following symlinks) to the same path under rootfs $2.
copy_into() {
    mkdir -p "$2$(dirname "$1")"
    cp -L "$1" "$2$1"
}

# Writes the build context of one image into $work/$1.
#   $1 context name, $2 binary name, $3 extra Containerfile lines
assemble() {
    local ctx=$work/$1 bin=$2 extra=$3 rootfs lib
    rootfs=$ctx/rootfs
    mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/tmp" "$ctx/home/nonroot"
    chmod 0755 "$ctx" "$rootfs" "$rootfs/etc" "$rootfs/usr" "$rootfs/usr/local" "$rootfs/usr/local/bin"
    chmod 1777 "$rootfs/tmp"
    chmod 0750 "$ctx/home/nonroot"
    # Without DWARF (8 MB instead of 40 MB for tfjob-runtime); the symbol table stays, so
    # backtraces still name functions.
    if command -v strip >/dev/null 2>&1; then
        strip --strip-debug -o "$rootfs/usr/local/bin/$bin" "$bin_dir/$bin"
    else
        echo "build-offline: no strip (binutils); $bin goes in with its debug info" >&2
        cp "$bin_dir/$bin" "$rootfs/usr/local/bin/$bin"
    fi
    chmod 0755 "$rootfs/usr/local/bin/$bin"

    # The libraries the binary links, at the paths the dynamic linker looks for them.
    local libs
    if ! libs=$(ldd "$bin_dir/$bin" 2>&1); then
        echo "build-offline: ldd $bin_dir/$bin failed: $libs" >&2
        return 1
    fi
    if grep -q 'not found' <<<"$libs"; then
        echo "build-offline: $bin links libraries this machine does not have:" >&2
        echo "$libs" >&2
        return 1
    fi
    for lib in $(grep -o '/[^ ]*' <<<"$libs" | sort -u); do
        copy_into "$lib" "$rootfs"
    done
    # Before glibc 2.34, getaddrinfo loads the NSS modules as separate libraries from libc's
    # directory; since 2.34 they are part of libc.so.6.
    if [ -n "$glibc_version" ] && [ "$(printf '%s\n2.34\n' "$glibc_version" | sort -V | head -1)" != 2.34 ]; then
        local libc_dir
        libc_dir=$(dirname "$(grep -o '/[^ ]*/libc\.so\.6' <<<"$libs" | head -1)")
        for lib in "$libc_dir/libnss_files.so.2" "$libc_dir/libnss_dns.so.2"; do
            [ -e "$lib" ] && copy_into "$lib" "$rootfs"
        done
    fi
    find "$rootfs/lib" "$rootfs/lib64" "$rootfs/usr/lib" -type d -exec chmod 0755 {} + 2>/dev/null || true

    cat >"$rootfs/etc/nsswitch.conf" <<'NSS'
passwd: files
group:  files
hosts:  files dns
NSS
    cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
    cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
    chmod 0644 "$rootfs/etc/nsswitch.conf" "$rootfs/etc/passwd" "$rootfs/etc/group"

    cat >"$ctx/Containerfile" <<FILE
FROM scratch
COPY rootfs/ /
COPY --chown=65532:65532 home/ /home/
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65532:65532
$extra
FILE
    # Every byte of the context, with names and modes: equal hashes mean equal images.
    (cd "$ctx" && find . -printf '%p %m %l\n' | LC_ALL=C sort && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) \
        | sha256sum | cut -d' ' -f1 >"$work/$1.sha256"
}

# Builds image $2 from context $1 unless an image with the same context hash exists.
build() {
    local ctx=$work/$1 image=$2 hash have start
    hash=$(cat "$work/$1.sha256")
    have=$(podman image inspect --format '{{index .Config.Labels "io.tfjob.context-sha256"}}' "$image" 2>/dev/null || true)
    if [ "$force" = 0 ] && [ "$have" = "$hash" ]; then
        echo "build-offline: $image is up to date" >&2
        return 0
    fi
    start=$(date +%s.%N)
    podman build --quiet --pull=never --layers=false \
        --label "io.tfjob.context-sha256=$hash" \
        --label "org.opencontainers.image.title=$1" \
        --label "org.opencontainers.image.source=https://github.com/tfjob-rs/tfjob-rs" \
        -f "$ctx/Containerfile" -t "$image" "$ctx" >/dev/null
    echo "build-offline: built $image in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')s" >&2
}

assemble tfjob-runtime tfjob-runtime 'WORKDIR /tmp
EXPOSE 2222
ENTRYPOINT ["tfjob-runtime"]'

operator_extra='ENTRYPOINT ["tfjob-operator"]'
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    mkdir -p "$work/tfjob-operator/rootfs/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$work/tfjob-operator/rootfs/etc/ssl/certs/"
fi
assemble tfjob-operator tfjob-operator "$operator_extra"

build tfjob-runtime localhost/tfjob-runtime:latest
build tfjob-operator localhost/tfjob-operator:latest

# The published names (.github/workflows/release.yml), at the chart's appVersion.
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$repo/charts/tfjob-operator/Chart.yaml")
[ -n "$app_version" ] || { echo "build-offline: no appVersion in charts/tfjob-operator/Chart.yaml" >&2; exit 1; }
for name in tfjob-runtime tfjob-operator; do
    podman tag "localhost/$name:latest" "ghcr.io/tfjob-rs/$name:$app_version"
done

# Superseded builds leave untagged images behind.
podman image prune -f >/dev/null 2>&1 || true

for image in localhost/tfjob-runtime:latest localhost/tfjob-operator:latest; do
    size=$(podman image inspect --format '{{.Size}}' "$image")
    printf '%s\t%s bytes\t%s MB\n' "$image" "$size" "$(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1000000}')"
done
