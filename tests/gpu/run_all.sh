#!/usr/bin/env bash
# Every real-GPU check in one run (as root, from the repository root, on a GPU machine).
# Results go to $OUT when set (a lent device machine), else to tests/gpu/results/.
# Neither check changes the GPU's settings (compute mode, MIG mode, clocks).
set -u
out=${OUT:-tests/gpu/results}
mkdir -p "$out"
host=$(hostname -s)
python3 -m pip install -q nvidia-ml-py python-hostlist jinja2 PyYAML >/dev/null 2>&1 || true
nvidia-smi -q > "$out/nvidia-smi-$host.txt" 2>&1 || true
rc=0
PYTHONPATH=src python3 tests/gpu/check_inventory.py "$out/inventory-$host.json" || rc=1
PYTHONPATH=src python3 tests/gpu/check_mps.py "$out/mps-$host.json" || rc=1
exit $rc
