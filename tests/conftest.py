"""Make the core (src/) and the test bed (tests/slurmbed.py) importable in every test."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(HERE, "..", "src"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)
