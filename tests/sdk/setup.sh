#!/usr/bin/env bash
# A Python venv with Kubeflow's training SDK (kubeflow-training, pinned with its dependencies in
# tests/sdk/requirements.txt), for tests/tests/sdk_controlplane.rs, cached machine-wide in
#   ${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfjob-rs}/sdk/venv-<hash>
# (about 20 s the first time, from PyPI). The last line on stdout is the venv's directory.
set -euo pipefail

die() { echo "sdk/setup.sh: ERROR: $*" >&2; exit 1; }
log() { echo "sdk/setup.sh: $*" >&2; }

python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || die "'$python' is not on PATH"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hash="$(cat "$here/setup.sh" "$here/requirements.txt" <("$python" --version) | sha256sum | cut -c1-16)"
cache_root="${TFJOB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/tfjob-rs}/sdk"
venv="$cache_root/venv-$hash"
if [[ -x $venv/bin/python && -f $venv/.complete ]]; then
    log "cached: $venv"
    echo "$venv"
    exit 0
fi
mkdir -p "$cache_root"
exec 9>"$venv.lock"
flock 9
if [[ -f $venv/.complete ]]; then
    echo "$venv"
    exit 0
fi
rm -rf "$venv"
started=$SECONDS
"$python" -m venv "$venv" || die "cannot create a venv (Debian: apt-get install python3-venv)"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$here/requirements.txt" \
    || die "pip install of tests/sdk/requirements.txt failed"
touch "$venv/.complete"
log "venv ready in $((SECONDS - started))s: $venv"
echo "$venv"
