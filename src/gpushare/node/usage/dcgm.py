# SPDX-License-Identifier: GPL-2.0-or-later
"""dcgm-exporter's job mapping files (``--hpc-job-mapping-dir``), kept true to the node.

dcgm-exporter labels a GPU's series with every job id listed, one a line, in the file
named after the GPU; a file with no job drops the GPU's series, so a device without jobs
has no file. Names are NVML indices (``0``; a MIG GPU instance ``0-<GI id>``, which
exporters that only know whole GPUs skip), or with ``uuid`` naming the devices' UUIDs, as
nodes whose gres.conf has ``Flags=env_uuid`` name them. Each file is replaced atomically;
files of devices that no longer run a job are removed, and nothing else in the directory
is touched.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from gpushare.common import safefs

__all__ = ["mapping_files", "write_mapping"]

_OURS = re.compile(r"([0-9]+(-[0-9]+)?|(GPU|MIG)-[0-9a-fA-F-]{1,64})\Z")


def mapping_files(devices: list[tuple[str, int, Optional[int], list[int]]],
                  names: str) -> dict[str, str]:
    """File name -> content for ``(uuid, gpu index, GI id or None, job ids)`` devices. A
    GPU's file (index naming) also lists the jobs of its MIG slices, as dcgm-exporter
    labels a slice's series with its GPU's index."""
    files: dict[str, set[int]] = {}
    for uuid, gpu, gi_id, job_ids in devices:
        if not job_ids:
            continue
        if names == "uuid":
            files.setdefault(uuid, set()).update(job_ids)
            continue
        files.setdefault(str(gpu), set()).update(job_ids)
        if gi_id is not None:
            files.setdefault(f"{gpu}-{gi_id}", set()).update(job_ids)
    return {name: "".join(f"{job}\n" for job in sorted(jobs)) for name, jobs in files.items()}


def write_mapping(directory: str, files: dict[str, str]) -> None:
    """Make ``directory`` (root's) hold exactly ``files`` among the names this writes."""
    fd = safefs.open_root_dir(directory, create=True)
    try:
        for name in os.listdir(fd):
            if _OURS.match(name) and name not in files:
                safefs.remove_file_at(fd, name)
        for name, content in files.items():
            if safefs.read_small_file_at(fd, name) != content.encode():
                safefs.write_file_atomic_at(fd, name, content.encode(), 0o644, exact_mode=True)
    finally:
        os.close(fd)
