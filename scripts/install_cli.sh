#!/bin/bash
# SPDX-License-Identifier: GPL-2.0-or-later
# Install the `gpushare` command for every user of this machine (`make venv`): the package,
# not editable, with its runtime dependencies, in a root-owned virtual environment of the
# system python3 that everyone may read, and link it onto PATH. Users run it wherever the
# clone lives (a clone in root's 0700 home included); the repository's own .venv (editable,
# with the test extra) stays what the tests and lint use.
#
#   scripts/install_cli.sh PYTHON VENV LINK
#     e.g. scripts/install_cli.sh /usr/bin/python3 /usr/local/lib/gpushare/venv \
#          /usr/local/bin/gpushare
#
# Idempotent and quick: the package is reinstalled only when the sources (src/, setup.py,
# pyproject.toml), the clone they come from or the system python3 changed since the last
# install (VENV/gpushare-source records them); the environment is made anew when it no
# longer runs (its python3 upgraded away).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PYTHON VENV LINK" >&2; exit 2; }
PYTHON=$1 VENV=$2 LINK=$3
REPO=$(cd "$(dirname "$0")/.." && pwd)
STAMP=$VENV/gpushare-source
umask 022  # world-readable whatever root's umask is

[ "$(id -u)" = 0 ] || { echo "install_cli: run as root (it installs into $VENV)" >&2; exit 1; }

# What the installed package was built from: the clone, the system python3, the sources.
sources() {
    echo "repo $REPO"
    echo "python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
    cd "$REPO" && find setup.py pyproject.toml LICENSE src -type f \
        ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 |
        LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}
wanted=$(sources)

# One install at a time (two `make demo` at once both make venv).
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if ! "$VENV/bin/python" -c '' 2>/dev/null; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
if [ ! -x "$VENV/bin/gpushare" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$wanted" ]; then
    rm -f "$STAMP"
    # From a scratch copy of what the package is built from: building in the tree would
    # leave setuptools' build/lib (stale modules included) and egg-info in the clone.
    scratch=$(mktemp -d /tmp/gpushare-cli.XXXXXX)
    trap 'rm -rf "$scratch"' EXIT
    mkdir "$scratch/tree"
    (cd "$REPO" && tar -cf - --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' \
        setup.py pyproject.toml LICENSE src) | tar -xf - -C "$scratch/tree"
    "$VENV/bin/python" -m pip wheel -q --no-deps -w "$scratch/dist" "$scratch/tree"
    # The wheel over whatever was there (same version number, other sources), then the
    # runtime dependencies still missing.
    "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$scratch"/dist/*.whl
    "$VENV/bin/python" -m pip install -q "$scratch"/dist/*.whl
    printf '%s\n' "$wanted" >"$STAMP"
fi
chmod -R u=rwX,go=rX "$VENV"
ln -sfn "$VENV/bin/gpushare" "$LINK"
