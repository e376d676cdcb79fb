# SPDX-License-Identifier: GPL-2.0-or-later
"""A plan's node that slurmctld does not know (a typo, a node not yet in slurm.conf) is left
out of relayout's rounds, and the decision says so instead of passing over it in silence."""

from __future__ import annotations

import json

from tests.unit.admin.relayout_plans import mig_plan
from tests.unit.admin.relayout_site import TRACKED


def test_the_plans_nodes_slurmctld_does_not_know_are_named(tmp_path, capsys):
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"  # nodes h1 and h2
    plan.write_text(mig_plan(["{layout: 7x1g.10gb}", "{layout: 2x3g.40gb}"]))
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\nexit 0\n")  # nothing waits, nothing runs
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        f"[ \"$*\" = 'show config' ] && echo '{TRACKED}' && exit 0\n"
        "echo 'NodeName=h1 State=IDLE Gres=gpu:1g.10gb:15 GresUsed=gpu:1g.10gb:0(IDX:N/A)'\n")
    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\necho 'debug|h1'\n")
    for stub in (squeue, scontrol, sinfo):
        stub.chmod(0o755)
    argv = ["relayout", "--plan", str(plan), "--backend", "scontrol", "--scontrol",
            str(scontrol), "--squeue", str(squeue), "--sinfo", str(sinfo), "--keep-hours", "0"]
    assert main([*argv, "--json"]) == 0
    why = json.loads(capsys.readouterr().out)["why"]
    assert [line for line in why if line.startswith("left out: h2, the plan's nodes with a "
                                                     "relayout menu that slurmctld does not "
                                                     "know")], why
    scontrol.write_text(scontrol.read_text().replace(
        "(IDX:N/A)'\n", "(IDX:N/A)'\necho 'NodeName=h2 State=IDLE Gres=gpu:1g.10gb:15 "
        "GresUsed=gpu:1g.10gb:0(IDX:N/A)'\n"))
    assert main([*argv, "--json"]) == 0
    assert not [line for line in json.loads(capsys.readouterr().out)["why"]
                if line.startswith("left out:")]
