#!/bin/bash
# SPDX-License-Identifier: GPL-2.0-or-later
# The two pure-Python modules gpushare bundles (pynvml.py from nvidia-ml-py, hostlist.py
# from python-hostlist), taken from their source archives at the versions and SHA-256 sums
# packaging/gpushare.spec pins. Only the archives' own files are used, so the result does not
# depend on a build backend's layout, on pip's cache or on what the index serves today.
#
#   scripts/vendored.sh --sdists DIR    the two verified archives in DIR (the RPM's sources)
#   scripts/vendored.sh --modules DIR   pynvml.py and hostlist.py from them in DIR (make build),
#                                       the builder's files (root's under make build), mode 0644
#
# Archives already in build/vendored with the pinned sum are used again; others are fetched
# with `pip download --no-binary :all:` and refused unless their sum is the pinned one.
set -euo pipefail

usage() { echo "usage: $0 --sdists DIR | --modules DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
MODE=$1
DEST=$2
case "$MODE" in --sdists | --modules) ;; *) usage ;; esac

REPO=$(cd "$(dirname "$0")/.." && pwd)
SPEC=$REPO/packaging/gpushare.spec
STORE=$REPO/build/vendored
SYSTEM_PYTHON=/usr/bin/python3

spec_global() {
    local value
    value=$(awk -v name="$1" '$1 == "%global" && $2 == name {print $3; exit}' "$SPEC")
    [ -n "$value" ] || { echo "vendored: $SPEC has no %global $1" >&2; exit 1; }
    echo "$value"
}

PYNVML=$(spec_global pynvml_version)
HOSTLIST=$(spec_global hostlist_version)
PYNVML_SUM=$(spec_global pynvml_sha256)
HOSTLIST_SUM=$(spec_global hostlist_sha256)
# project, version, archive, pinned SHA-256, the module gpushare takes from it.
PROJECTS=$(cat <<EOF
nvidia-ml-py $PYNVML nvidia_ml_py-$PYNVML.tar.gz $PYNVML_SUM pynvml.py
python-hostlist $HOSTLIST python_hostlist-$HOSTLIST.tar.gz $HOSTLIST_SUM hostlist.py
EOF
)

sum_of() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$STORE" "$DEST"
FETCHED=$(mktemp -d)
trap 'rm -rf "$FETCHED"' EXIT
while read -r project version archive sum module; do
    if [ ! -f "$STORE/$archive" ] || [ "$(sum_of "$STORE/$archive")" != "$sum" ]; then
        rm -f "$STORE/$archive"
        mkdir -p "$FETCHED/$project"
        "$SYSTEM_PYTHON" -m pip download -q --no-deps --no-binary :all: \
            --disable-pip-version-check --dest "$FETCHED/$project" "$project==$version" \
            >"$FETCHED/pip.log" 2>&1 || {
            cat "$FETCHED/pip.log" >&2
            echo "vendored: cannot download the source archive of $project $version" >&2
            exit 1
        }
        if [ ! -f "$FETCHED/$project/$archive" ]; then
            echo "vendored: pip gave '$(ls "$FETCHED/$project")', not $archive," \
                "for $project $version" >&2
            exit 1
        fi
        got=$(sum_of "$FETCHED/$project/$archive")
        if [ "$got" != "$sum" ]; then
            echo "vendored: $archive has SHA-256 $got; $SPEC pins $sum." >&2
            echo "vendored: check the new archive before changing the pin." >&2
            exit 1
        fi
        mv "$FETCHED/$project/$archive" "$STORE/$archive"
    fi
    if [ "$MODE" = --sdists ]; then
        cp "$STORE/$archive" "$DEST/"
    else
        # Installed, not unpacked in place: tar run as root keeps the archive's owner and
        # mode, and the plugin refuses a pythonpath= file that is not root's or that group
        # or others can write. install leaves the builder's own file, mode 0644.
        mkdir -p "$FETCHED/unpacked"
        tar xzf "$STORE/$archive" -C "$FETCHED/unpacked" --no-same-owner --no-same-permissions \
            --strip-components=1 "${archive%.tar.gz}/$module"
        install -m 0644 "$FETCHED/unpacked/$module" "$DEST/$module"
    fi
done <<<"$PROJECTS"
