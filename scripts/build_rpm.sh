#!/bin/bash
# SPDX-License-Identifier: GPL-2.0-or-later
# Build the gpushare RPM on this machine (`make rpm`): the source tarball from this tree, the
# pinned source archives of the bundled pynvml.py/hostlist.py (scripts/vendored.sh), then
# rpmbuild with _topdir build/rpmbuild for the Slurm release of the installed headers.
# BuildRequires are not checked (--nodeps): this rpm database knows no Debian package.
#
#   scripts/build_rpm.sh [--lint] [--define 'MACRO VALUE']...
#     builds build/rpmbuild/RPMS/x86_64/gpushare-*.rpm; --lint then runs rpmlint (PyPI) with
#     packaging/rpmlint.toml on it; each --define goes to rpmbuild (e.g. another optflags).
set -euo pipefail
usage() { echo "usage: $0 [--lint] [--define 'MACRO VALUE']..." >&2; exit 2; }
LINT=no
DEFINES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --lint) LINT=yes ;;
        --define) [ $# -ge 2 ] || usage; DEFINES+=(--define "$2"); shift ;;
        *) usage ;;
    esac
    shift
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
SPEC=$REPO/packaging/gpushare.spec
TOP=$REPO/build/rpmbuild
SYSTEM_PYTHON=/usr/bin/python3

command -v rpmbuild >/dev/null || { echo "build_rpm: rpmbuild missing: run make deps" >&2; exit 1; }
test -r /usr/include/slurm/slurm_version.h ||
    { echo "build_rpm: Slurm headers missing: install libslurm-dev (make deps)" >&2; exit 1; }

spec_value() { awk -v key="$1" '$1 == key {print $2; exit}' "$SPEC"; }
VERSION=$(spec_value Version:)
CORE_VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/src/gpushare/__init__.py")
if [ "$VERSION" != "$CORE_VERSION" ]; then
    echo "build_rpm: spec Version $VERSION differs from gpushare.__version__ $CORE_VERSION" >&2
    exit 1
fi
SLURM_VERSION_NUMBER=$(awk '$2 == "SLURM_VERSION_NUMBER" {print $3}' \
    /usr/include/slurm/slurm_version.h)

rm -rf "$TOP"
mkdir -p "$TOP"/{SOURCES,SPECS,BUILD,RPMS,SRPMS}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Source0: what the spec builds and installs, without caches or simulated profiles.
SRC=$WORK/gpushare-$VERSION
mkdir -p "$SRC"
(cd "$REPO" && tar cf - --exclude=__pycache__ --exclude='*.pyc' --exclude='src/gpushare/gpu/profiles' \
    LICENSE README.md setup.py spank submit_hooks src/gpushare etc docs packaging) |
    tar xf - -C "$SRC"
tar czf "$TOP/SOURCES/gpushare-$VERSION.tar.gz" -C "$WORK" "gpushare-$VERSION"

# Sources 1 and 2: the bundled modules' source archives, as the spec pins them.
"$REPO/scripts/vendored.sh" --sdists "$TOP/SOURCES"

cp "$SPEC" "$TOP/SPECS/"
rpmbuild -bb --nodeps --define "_topdir $TOP" \
    --define "slurm_version_number $SLURM_VERSION_NUMBER" ${DEFINES[@]+"${DEFINES[@]}"} \
    "$TOP/SPECS/gpushare.spec" >"$WORK/rpmbuild.log" 2>&1 ||
    { cat "$WORK/rpmbuild.log" >&2; exit 1; }
find "$TOP/RPMS" -name '*.rpm' -print
[ "$LINT" = yes ] || exit 0

# rpmlint from PyPI needs rpm's Python bindings, which only the distribution's python3 has.
if ! "$SYSTEM_PYTHON" -c 'import rpm' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout=300 python3-rpm \
        >"$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log" >&2; exit 1; }
fi
LINT_VENV=$REPO/build/rpmlint-venv
if [ ! -x "$LINT_VENV/bin/rpmlint" ]; then
    "$SYSTEM_PYTHON" -m venv --system-site-packages "$LINT_VENV"
    "$LINT_VENV/bin/pip" install -q --disable-pip-version-check rpmlint >"$WORK/pip.log" 2>&1 ||
        { cat "$WORK/pip.log" >&2; exit 1; }
fi
"$LINT_VENV/bin/rpmlint" -c "$REPO/packaging/rpmlint.toml" "$SPEC" "$TOP"/RPMS/*/*.rpm
