#!/bin/bash
# SPDX-License-Identifier: GPL-2.0-or-later
# Build the gpushare Debian package on this machine (`make deb`): a scratch copy of the tree
# with packaging/debian/ as its debian/ and the pinned source archives of the bundled
# pynvml.py/hostlist.py in vendor/ (scripts/vendored.sh), then dpkg-buildpackage -b for the
# Slurm release of the installed headers (libslurm-dev). Nothing is written into the tree
# but build/deb/.
#
#   scripts/build_deb.sh [--lint]
#     builds build/deb/gpushare_<version>+slurm<X.YY>_<arch>.deb and prints its path; --lint
#     then runs lintian on it and fails on any error or warning. dpkg-buildflags' variables
#     (DEB_CFLAGS_APPEND, DEB_LDFLAGS_APPEND, ...) and DEB_BUILD_OPTIONS pass through.
set -euo pipefail
usage() { echo "usage: $0 [--lint]" >&2; exit 2; }
LINT=no
while [ $# -gt 0 ]; do
    case "$1" in
        --lint) LINT=yes ;;
        *) usage ;;
    esac
    shift
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=$REPO/build/deb

test -r /usr/include/slurm/slurm_version.h ||
    { echo "build_deb: Slurm headers missing: install libslurm-dev (make deps)" >&2; exit 1; }

# The Debian packaging tools (only what is missing): the Build-Depends beyond them are the
# ones `make deps` installs.
TOOLS=(build-essential dpkg-dev debhelper dh-python help2man)
[ "$LINT" = yes ] && TOOLS+=(lintian)
MISSING=()
for package in "${TOOLS[@]}"; do
    dpkg-query -W -f '${db:Status-Status}\n' "$package" 2>/dev/null | grep -qx installed ||
        MISSING+=("$package")
done
if [ ${#MISSING[@]} -gt 0 ]; then
    apt_install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -o DPkg::Lock::Timeout=300 "${MISSING[@]}" >"$REPO/build/deb-apt.log" 2>&1
    }
    mkdir -p "$REPO/build"
    # Package lists may be older than the mirror: refresh them once when an install fails.
    apt_install || { apt-get update -qq >>"$REPO/build/deb-apt.log" 2>&1 && apt_install; } ||
        { cat "$REPO/build/deb-apt.log" >&2; exit 1; }
fi

VERSION=$(dpkg-parsechangelog -l "$REPO/packaging/debian/changelog" -S Version)
CORE_VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/src/gpushare/__init__.py")
if [ "${VERSION%-*}" != "$CORE_VERSION" ]; then
    echo "build_deb: packaging/debian/changelog's version $VERSION is not gpushare.__version__" \
        "$CORE_VERSION" >&2
    exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The tree the RPM's Source0 holds, without caches or simulated profiles.
SRC=$WORK/gpushare-$CORE_VERSION
mkdir -p "$SRC"
(cd "$REPO" && tar cf - --exclude=__pycache__ --exclude='*.pyc' --exclude='src/gpushare/gpu/profiles' \
    --exclude=packaging/debian LICENSE README.md setup.py spank submit_hooks src/gpushare etc \
    docs packaging) | tar xf - -C "$SRC"
cp -r "$REPO/packaging/debian" "$SRC/debian"
"$REPO/scripts/vendored.sh" --sdists "$SRC/vendor"

(cd "$SRC" && dpkg-buildpackage -b --no-sign) >"$WORK/build.log" 2>&1 ||
    { cat "$WORK/build.log" >&2; echo "build_deb: dpkg-buildpackage failed" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
cp "$WORK"/*.deb "$WORK"/*.buildinfo "$WORK"/*.changes "$OUT/"
cp "$WORK/build.log" "$OUT/build.log"
find "$OUT" -name '*.deb' -print
[ "$LINT" = yes ] || exit 0

# --info shows the informational tags too; only errors and warnings fail the build.
lintian --info --fail-on error,warning "$OUT"/*.deb
