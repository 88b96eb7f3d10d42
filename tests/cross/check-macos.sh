#!/usr/bin/env bash
# Type-checks `tfjob` (the tfjob crate, with the tfjob-api and tfjob-operator crates it
# builds on) for macOS from Linux:
#   cargo check --target x86_64-apple-darwin -p tfjob
# so that Linux-only calls stay behind cfg(target_os = "linux"). The release workflow builds it
# on macOS for real (.github/workflows/release.yml, job cli); this is the check that runs here.
#
# Needs the target's standard library (`rustup target add x86_64-apple-darwin`, done here when
# missing) and clang, which compiles ring's C for the target. There is no macOS SDK here: ring
# is built freestanding (RING_CORE_NOSTDLIBINC, its mode without a C library) with a stand-in
# for the SDK's TargetConditionals.h. Nothing is linked, so nothing of that C is ever run.
#
# Usage: tests/cross/check-macos.sh [--target x86_64-apple-darwin|aarch64-apple-darwin]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target=x86_64-apple-darwin
while [ $# -gt 0 ]; do
    case $1 in
        --target) [ $# -ge 2 ] || { echo "--target needs a target" >&2; exit 2; }; target=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
case $target in *-apple-darwin) ;; *) echo "not a macOS target: $target" >&2; exit 2 ;; esac

rustup target list --installed | grep -qx "$target" || rustup target add "$target"
cc=$(command -v clang || ls /usr/bin/clang-[0-9]* 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$cc" ] || { echo "check-macos: no clang (apt-get install clang)" >&2; exit 1; }

include=$(mktemp -d "${TMPDIR:-/tmp}/tfjob-macos-include.XXXXXX")
trap 'rm -rf "$include"' EXIT
cat >"$include/TargetConditionals.h" <<'H'
/* Stand-in for the macOS SDK's header (tests/cross/check-macos.sh): macOS, not iOS. */
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
#define TARGET_OS_IOS 0
#define TARGET_OS_TV 0
#define TARGET_OS_WATCH 0
H
var=${target//-/_}
export "CC_$var=$cc" "CFLAGS_$var=-ffreestanding -DRING_CORE_NOSTDLIBINC -I$include"
cd "$repo"
cargo check --locked --target "$target" -p tfjob --bins --lib
echo "check-macos: tfjob type-checks for $target"
