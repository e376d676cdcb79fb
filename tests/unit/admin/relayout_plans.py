# SPDX-License-Identifier: GPL-2.0-or-later
"""The plan the relayout tests share: a group of two 4-GPU H100 nodes whose GPU 0 is
Kubernetes', GPU 1 mixed, and GPUs 2-3 Slurm's 7 x 1g.10gb, with the relayout block each
test gives."""

from __future__ import annotations

from typing import Optional

_GROUP = """\
version: 1
{slurm}node_groups:
  - name: mig
    nodes: h[1-2]
    gpu_model: h100-80gb
    gpus: 4
    layout:
      0: {{owner: kubernetes, mig: [{{profile: 3g.40gb}}]}}
      1:
        mig:
          - {{profile: 3g.40gb, owner: kubernetes}}
          - {{profile: 1g.10gb, owner: slurm}}
      all: {{owner: slurm, mig: [{{profile: 1g.10gb, count: 7}}]}}
    relayout:
{relayout}"""


def mig_plan(menu: list[str], min_interval_s: Optional[int] = None,
             slurm: Optional[str] = "24.11") -> str:
    """The plan's text with this menu (YAML items as written) and interval."""
    lines = [f"      min_interval_s: {min_interval_s}"] if min_interval_s is not None else []
    lines += ["      menu:"] + [f"        - {item}" for item in menu]
    return _GROUP.format(slurm=f"slurm: {{version: '{slurm}'}}\n" if slurm else "",
                         relayout="\n".join(lines) + "\n")
