#!/usr/bin/env bash
# The one podman setup of tfjob-rs: shell scripts source this file, the Rust helper
# (tests/src/podman.rs) executes it. Machines here have no Docker daemon and pull no image;
# Debian's podman 4.3 runs containers as root with runc, the cgroupfs cgroup manager, the
# overlay storage driver and netavark + aardvark-dns (container networks with DNS).
#
# Sourced:   . tests/images/podman-env.sh && tfjob_podman_setup
#            (installs what is missing, writes the configuration, exports CONTAINERS_CONF and
#            CONTAINERS_STORAGE_CONF; then every `podman` command of the shell uses it)
#            tfjob_podman_service_start /path/api.sock  -> pid of a `podman system service`
#            tfjob_podman_service_stop PID
# Executed:  tests/images/podman-env.sh env       prints KEY=VALUE lines (after the setup)
#            tests/images/podman-env.sh service /path/api.sock
#                                                 runs the Docker-compatible API in the foreground
#
# TFJOB_PODMAN_DIR (default /var/tmp/tfjob-podman) holds the configuration, the image store
# (storage/) and podman's run state (run/), apart from any podman setup of the machine.
# TFJOB_PODMAN_STORAGE_DRIVER (default overlay) may be set to vfs where overlay mounts fail.
# TFJOB_PODMAN_NO_INSTALL=1 makes a missing package an error instead of an apt-get install.

TFJOB_PODMAN_PACKAGES=(podman runc netavark aardvark-dns iptables)

tfjob_podman_log() { echo "podman-env: $*" >&2; }

# Installs the Debian packages podman needs here, when one is missing.
tfjob_podman_install() {
    local missing=() p
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    [ -x /usr/lib/podman/netavark ] || missing+=(netavark)
    [ -x /usr/lib/podman/aardvark-dns ] || missing+=(aardvark-dns)
    command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || missing+=(iptables)
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "${TFJOB_PODMAN_NO_INSTALL:-0}" = 1 ]; then
        tfjob_podman_log "missing: ${missing[*]} (TFJOB_PODMAN_NO_INSTALL=1 forbids installing them)"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        tfjob_podman_log "missing: ${missing[*]}; install them (podman >= 4 with runc, netavark, aardvark-dns, iptables)"
        return 1
    fi
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
    tfjob_podman_log "installing ${missing[*]} with apt-get"
    local install=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${TFJOB_PODMAN_PACKAGES[@]}")
    if ! "${sudo[@]}" "${install[@]}" </dev/null >&2; then
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2 || return 1
        "${sudo[@]}" "${install[@]}" </dev/null >&2 || return 1
    fi
    for p in podman runc; do
        command -v "$p" >/dev/null 2>&1 || { tfjob_podman_log "$p still missing after apt-get install"; return 1; }
    done
}

# Writes $1 with the content of stdin unless it already has exactly that content.
tfjob_podman_write_if_changed() {
    local tmp
    tmp=$(mktemp "$1.XXXXXX") || return 1
    cat >"$tmp"
    if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

# Writes containers.conf and storage.conf into $TFJOB_PODMAN_DIR and exports them.
tfjob_podman_configure() {
    local dir=${TFJOB_PODMAN_DIR:-/var/tmp/tfjob-podman}
    local driver=${TFJOB_PODMAN_STORAGE_DRIVER:-overlay}
    mkdir -p "$dir/storage" "$dir/run" "$dir/networks" || return 1
    dir=$(cd "$dir" && pwd -P) || return 1
    # default_ulimits = []: podman as root raises RLIMIT_NOFILE to 1048576 by default, which
    #   this sandbox refuses ("error setting rlimit type 7: operation not permitted").
    # events_logger = "file", log_driver = "k8s-file": there is no journald (nor systemd).
    # network_backend = "netavark": Debian's podman package ships a CNI conflist, which makes
    #   podman pick CNI (whose plugins are not installed) unless told otherwise; netavark with
    #   aardvark-dns gives networks with DNS. Networks live in $dir/networks, apart from the
    #   machine's own.
    tfjob_podman_write_if_changed "$dir/containers.conf" <<CONF || return 1
# Written by tests/images/podman-env.sh; edits are overwritten.
[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
network_config_dir = "$dir/networks"
CONF
    tfjob_podman_write_if_changed "$dir/storage.conf" <<CONF || return 1
# Written by tests/images/podman-env.sh; edits are overwritten.
[storage]
driver = "$driver"
graphroot = "$dir/storage"
runroot = "$dir/run"
CONF
    export TFJOB_PODMAN_DIR="$dir"
    export CONTAINERS_CONF="$dir/containers.conf"
    export CONTAINERS_STORAGE_CONF="$dir/storage.conf"
}

# Install + configure + check that podman answers with this configuration.
tfjob_podman_setup() {
    tfjob_podman_install || return 1
    tfjob_podman_configure || return 1
    local info
    if ! info=$(podman info --format '{{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}} {{.Host.NetworkBackend}} {{.Host.CgroupManager}}' 2>&1); then
        tfjob_podman_log "podman does not work with $CONTAINERS_CONF and $CONTAINERS_STORAGE_CONF:"
        echo "$info" >&2
        return 1
    fi
}

# Starts the Docker-compatible API on the unix socket $1 in the background; prints its pid once
# the socket answers. Stop it with tfjob_podman_service_stop.
tfjob_podman_service_start() {
    local sock=$1 pid i
    [ -n "$sock" ] || { tfjob_podman_log "usage: tfjob_podman_service_start SOCKET"; return 1; }
    rm -f "$sock"
    podman system service --time=0 "unix://$sock" </dev/null >"$sock.log" 2>&1 &
    pid=$!
    for i in $(seq 1 200); do
        if [ -S "$sock" ] && curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; then
            echo "$pid"; return 0
        fi
        # Without curl, the socket existing is the best sign.
        if [ -S "$sock" ] && ! command -v curl >/dev/null 2>&1; then echo "$pid"; return 0; fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    tfjob_podman_log "podman system service did not come up on $sock:"
    cat "$sock.log" >&2
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    return 1
}

# SIGTERM, then SIGKILL after 10 s; returns once the process is gone. Works also when the
# service was started in a subshell (pid=$(tfjob_podman_service_start ...)), where `wait`
# cannot wait for it.
tfjob_podman_service_stop() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 1 200); do
        kill -0 "$pid" 2>/dev/null || break
        # A zombie of ours is gone for every purpose but the process table.
        [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = Z ] && break
        sleep 0.05
    done
    kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" != Z ] && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
        env)
            tfjob_podman_setup
            for v in TFJOB_PODMAN_DIR CONTAINERS_CONF CONTAINERS_STORAGE_CONF; do
                printf '%s=%s\n' "$v" "${!v}"
            done
            ;;
        service)
            [ $# -eq 2 ] || { echo "usage: $0 service SOCKET" >&2; exit 2; }
            tfjob_podman_setup
            rm -f "$2"
            exec podman system service --time=0 "unix://$2"
            ;;
        *)
            echo "usage: $0 env | service SOCKET   (or source it)" >&2
            exit 2
            ;;
    esac
fi
