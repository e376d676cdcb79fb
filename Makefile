# SPDX-License-Identifier: GPL-2.0-or-later
# gpushare: one entry point. Every target works as root on a fresh Debian 12 machine.
SHELL := /bin/bash
SYSTEM_PYTHON := /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
# The oldest Python the core supports (RHEL 9's python3), when this machine has one.
PY39 := $(firstword $(wildcard $(HOME)/.pyenv/versions/3.9*/bin/python3.9) $(shell command -v python3.9 2>/dev/null))

.PHONY: all deps build venv venv39 test test-quick test-host test-other release-root unit unit39 \
	lint ctest demo bench rpm deb slurm-testsuite clean

all: build

# Debian packages and test users the builds, tests and demo need (only what is missing).
deps:
	@$(SYSTEM_PYTHON) -c 'import sys' 2>/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3)
	@python3 scripts/ensure_deps.py

# The CLI and test tools in a virtual environment of the system python3 (.venv, editable:
# what the tests and lint use); and the `gpushare` command for every user: the package
# installed (not editable) in a root-owned, world-readable environment of the system python3
# (CLI_VENV), linked onto PATH, so that it runs wherever the clone lives (root's 0700 home
# included). scripts/install_cli.sh reinstalls it only when the sources changed.
CLI_VENV := /usr/local/lib/gpushare/venv
venv: deps
	@test -x $(PY) || $(SYSTEM_PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[test]'
	@scripts/install_cli.sh $(SYSTEM_PYTHON) $(CLI_VENV) /usr/local/bin/gpushare

# The SPANK plugin (built by the system python3 it embeds, hardened, with CFLAGS/LDFLAGS
# from the environment) and the Python it runs: the core and the two modules the RPM bundles,
# from the source archives packaging/gpushare.spec pins. build/pylib is what the plugin accepts
# as pythonpath=: the builder's (root's) files, writable by no one else whatever the umask.
build: deps
	@$(SYSTEM_PYTHON) spank/build.py --out build/spank_gpushare.so
	@rm -rf build/pylib && mkdir -p build/pylib
	@scripts/vendored.sh --modules build/pylib
	@cp -r src/gpushare build/pylib/gpushare && find build/pylib -name __pycache__ -prune -exec rm -rf {} +
	@$(SYSTEM_PYTHON) -m compileall -q build/pylib >/dev/null
	@chmod -R u=rwX,go=rX build/pylib

# ruff, then mypy (configured in pyproject.toml) for the oldest Python the core supports and
# the newest one tested (Debian 13's python3); then every C file with gcc -Wall -Wextra
# -Wformat=2 -Wshadow -Werror, gcc -fanalyzer and cppcheck (tests/c/lint.py).
MYPY_PYTHONS := 3.9 3.13
lint: venv
	@$(VENV)/bin/ruff check src spank tests bench submit_hooks scripts
	@for version in $(MYPY_PYTHONS); do \
		printf 'mypy --python-version %s: ' $$version; \
		$(VENV)/bin/mypy --python-version $$version || exit 1; \
	done
	@$(SYSTEM_PYTHON) tests/c/lint.py

# The C glue's unit tests, fuzz harnesses and parity tests under ASan and UBSan (tests/c;
# `make test` runs them too, on both releases). GPUSHARE_FUZZ_RUNS=N fuzzes each parser N runs.
ctest: venv
	@$(PY) -m pytest tests/unit/test_c_units.py tests/unit/test_c_fuzz.py \
		tests/unit/test_c_parity.py tests/unit/test_c_parity_fs.py -q

unit: venv
	@$(PY) -m pytest tests/unit -q

# A virtual environment of Python 3.9, where one is installed (the unit tests run under it too).
venv39: venv
	@if [ -n "$(PY39)" ]; then \
		test -x .venv39/bin/python || $(PY39) -m venv .venv39; \
		.venv39/bin/python -m pip install -q -e '.[test]'; \
	fi

# The unit tests again under Python 3.9, where one is installed.
unit39: venv39
	@if [ -x .venv39/bin/python ]; then \
		.venv39/bin/python -m pytest tests/unit -q -p no:cacheprovider; \
	else echo "no Python 3.9 on this machine: unit tests under 3.9 skipped"; fi

# Every suite at once, each with a log of its own under build/test-logs: lint, the unit tests
# under Python 3.9, the whole suite on this machine's Slurm, and on each other release's in a
# cached Debian root (bookworm 22.05, trixie 24.11, forky 26.05; built first where missing).
# tests/release_root.py runs them and ends with one line per suite and its time; it fails
# if any fails.
test: build venv venv39
	@$(SYSTEM_PYTHON) tests/release_root.py make-test $(PY)

# The edit loop (a few minutes): lint, the unit tests, and one real-Slurm test per
# capability (marked `smoke`) on this machine's Slurm. `make test` stays the whole check.
test-quick: build venv
	@$(SYSTEM_PYTHON) tests/release_root.py quick $(PY)

# The suite on this machine's Slurm only.
test-host: build venv lint unit39
	@$(PY) -m pytest tests -q -ra

# The other releases' builds and suites only, one after another (roots built when missing);
# RELEASE=forky (or bookworm, trixie) runs one.
test-other:
	@$(SYSTEM_PYTHON) tests/release_root.py suite $(if $(RELEASE),--release $(RELEASE))

# Build (or refresh) the other releases' cached roots.
release-root:
	@$(SYSTEM_PYTHON) tests/release_root.py ensure $(if $(RELEASE),--release $(RELEASE))

demo: build venv
	@$(PY) demo/demo.py

bench: build venv
	@$(PY) bench/run_all.py

# Slurm's own GRES/MPS/SPANK tests without and with gpushare, and their A/B table
# (docs/transparency.md; about 15 minutes, not part of `make test`). SLURM_SOURCE: a Slurm
# git mirror, source tree or tarball holding the installed release (else GitHub is tried).
slurm-testsuite: build
	@$(SYSTEM_PYTHON) scripts/slurm_testsuite.py $(if $(SLURM_SOURCE),--source $(SLURM_SOURCE)) $(SLURM_TESTSUITE_ARGS)

# The RPM (build/rpmbuild/RPMS): both plugins built against the installed Slurm.
rpm: deps
	@scripts/build_rpm.sh

# The Debian package (build/deb): both plugins in Debian's Slurm plugin directory, built
# against the installed Slurm (libslurm-dev) with debhelper from packaging/debian.
deb: deps
	@scripts/build_deb.sh

clean:
	rm -rf build dist rpmbuild *.egg-info src/*.egg-info
