#!/bin/bash
# Build the gpushare RPM on this machine (`make rpm`): the source tarball from this tree, the
# vendored pynvml.py/hostlist.py from PyPI, then rpmbuild with _topdir build/rpmbuild.
# BuildRequires are not checked (--nodeps): this rpm database knows no Debian package.
#
#   scripts/build_rpm.sh          build build/rpmbuild/RPMS/x86_64/gpushare-*.rpm
#   scripts/build_rpm.sh --lint   then run rpmlint (PyPI) with packaging/rpmlint.toml on it
set -euo pipefail
LINT=no
case "${1:-}" in
    --lint) LINT=yes ;;
    "") ;;
    *) echo "usage: $0 [--lint]" >&2; exit 2 ;;
esac

REPO=$(cd "$(dirname "$0")/.." && pwd)
SPEC=$REPO/packaging/gpushare.spec
TOP=$REPO/build/rpmbuild
SYSTEM_PYTHON=/usr/bin/python3

command -v rpmbuild >/dev/null || { echo "build_rpm: rpmbuild missing: run make deps" >&2; exit 1; }
test -r /usr/include/slurm/slurm_version.h ||
    { echo "build_rpm: Slurm headers missing: install libslurm-dev (make deps)" >&2; exit 1; }

spec_value() { awk -v key="$1" '$1 == key {print $2; exit}' "$SPEC"; }
spec_global() { awk -v name="$1" '$1 == "%global" && $2 == name {print $3; exit}' "$SPEC"; }
VERSION=$(spec_value Version:)
CORE_VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/src/gpushare/__init__.py")
if [ "$VERSION" != "$CORE_VERSION" ]; then
    echo "build_rpm: spec Version $VERSION differs from gpushare.__version__ $CORE_VERSION" >&2
    exit 1
fi
PYNVML=$(spec_global pynvml_version)
HOSTLIST=$(spec_global hostlist_version)

rm -rf "$TOP"
mkdir -p "$TOP"/{SOURCES,SPECS,BUILD,RPMS,SRPMS}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Source0: what the spec builds and installs, without caches or simulated profiles.
SRC=$WORK/gpushare-$VERSION
mkdir -p "$SRC"
(cd "$REPO" && tar cf - --exclude=__pycache__ --exclude='*.pyc' --exclude='src/gpushare/profiles' \
    README.md setup.py spank submit_hooks src/gpushare etc docs packaging) | tar xf - -C "$SRC"
tar czf "$TOP/SOURCES/gpushare-$VERSION.tar.gz" -C "$WORK" "gpushare-$VERSION"

# Source1: the two pure-Python modules RHEL-like systems do not package, with their licenses.
"$SYSTEM_PYTHON" -m pip install -q --no-deps --no-compile --disable-pip-version-check \
    --break-system-packages --target "$WORK/pip" \
    "nvidia-ml-py==$PYNVML" "python-hostlist==$HOSTLIST" >"$WORK/pip.log" 2>&1 ||
    { cat "$WORK/pip.log" >&2; exit 1; }
mkdir -p "$WORK/vendor/vendor"
cp "$WORK/pip/pynvml.py" "$WORK/pip/hostlist.py" "$WORK/vendor/vendor/"
# nvidia-ml-py ships its BSD license only as pynvml.py's header comment.
awk 'NR > 1 && !/^#/ {exit} {print}' "$WORK/pip/pynvml.py" | sed 's/^# \{0,1\}//' \
    > "$WORK/vendor/vendor/LICENSE.nvidia-ml-py"
cp "$WORK"/pip/python_hostlist-*.dist-info/licenses/COPYING \
    "$WORK/vendor/vendor/COPYING.python-hostlist"
tar czf "$TOP/SOURCES/gpushare-vendor-$VERSION.tar.gz" -C "$WORK/vendor" vendor

cp "$SPEC" "$TOP/SPECS/"
rpmbuild -bb --nodeps --define "_topdir $TOP" "$TOP/SPECS/gpushare.spec" >"$WORK/rpmbuild.log" 2>&1 ||
    { cat "$WORK/rpmbuild.log" >&2; exit 1; }
find "$TOP/RPMS" -name '*.rpm' -print
[ "$LINT" = yes ] || exit 0

# rpmlint from PyPI needs rpm's Python bindings, which only the distribution's python3 has.
if ! "$SYSTEM_PYTHON" -c 'import rpm' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-rpm \
        >"$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log" >&2; exit 1; }
fi
LINT_VENV=$REPO/build/rpmlint-venv
if [ ! -x "$LINT_VENV/bin/rpmlint" ]; then
    "$SYSTEM_PYTHON" -m venv --system-site-packages "$LINT_VENV"
    "$LINT_VENV/bin/pip" install -q --disable-pip-version-check rpmlint >"$WORK/pip.log" 2>&1 ||
        { cat "$WORK/pip.log" >&2; exit 1; }
fi
"$LINT_VENV/bin/rpmlint" -c "$REPO/packaging/rpmlint.toml" "$SPEC" "$TOP"/RPMS/*/*.rpm
