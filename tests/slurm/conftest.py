# SPDX-License-Identifier: GPL-2.0-or-later
"""One real local Slurm for the whole session, stopped at the end: munge, slurmctld and five
slurmd whose GPUs, gres.conf and topology come from tests/plans/bed.yaml.

``GPUSHARE_BED_ROOT`` and ``GPUSHARE_BED_PORT`` move it, so that two beds can run at once.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import slurmbed

ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed")
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200"))


def _ensure_built() -> None:
    if not os.path.exists(os.path.join(slurmbed.BUILD, "spank_gpushare.so")):
        subprocess.run(["make", "-C", slurmbed.REPO, "build"], check=True)


@pytest.fixture(scope="session")
def bed():
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    _ensure_built()
    cluster = slurmbed.plan_bed(root=ROOT, port_base=PORT)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def clean_bed(bed):
    """The bed with its default plugstack, every node usable, after the test too."""
    bed.write_plugstack(bed.plugstack_line())
    yield bed
    bed.write_plugstack(bed.plugstack_line())
    bed.resume(*(node.name for node in bed.nodes))
