#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-or-later
# Every real-GPU check in one run (as root, from the repository root, on a GPU machine).
# Results go to $OUT when set (a lent device machine), else to tests/gpu/results/.
# No check here changes the GPU's settings (compute mode, MIG mode, clocks).
set -u
out=${OUT:-tests/gpu/results}
mkdir -p "$out"
host=$(hostname -s)
# build/pylib (made by `make build`) holds pynvml and python-hostlist, which the checks import:
# a machine without network access uses it when it travels with the tree.
pythonpath=src
if [ -d build/pylib ]; then
    pythonpath=src:build/pylib
elif ! python3 -c "import pynvml" 2>/dev/null; then
    python3 -m pip install -q nvidia-ml-py python-hostlist jinja2 PyYAML >/dev/null 2>&1 || true
fi
nvidia-smi -q > "$out/nvidia-smi-$host.txt" 2>&1 || true
rc=0
PYTHONPATH=$pythonpath python3 tests/gpu/check_inventory.py "$out/inventory-$host.json" || rc=1
PYTHONPATH=$pythonpath python3 tests/gpu/check_mps.py "$out/mps-$host.json" || rc=1
PYTHONPATH=$pythonpath python3 tests/gpu/check_usage.py "$out/usage-$host.json" || rc=1
exit $rc
