# SPDX-License-Identifier: GPL-2.0-or-later
"""A user who attacks their own daemon while it starts, inside the real local Slurm.

From a CPU-only job of theirs on the node, the user loops ``chmod 0`` over their own MPS
directories, or ``pkill -KILL`` / ``pkill -STOP`` over their own MPS processes, then asks
for a shared GPU. The stand-in daemon takes 1.5 s to start (``slow_start``), so every
attack lands inside the start. For each: their job fails with a message saying their own
processes did it, the node is never drained, and once the attack ends the same user's and
another user's shared jobs run, with nothing left behind.
"""

from __future__ import annotations

import pytest
from tests.slurm.test_mps import NODE, U1, U2, assert_nothing_left, set_fault
from tests.slurm.test_mps import mps_bed as _mps_bed  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slurm

ATTACKS = {
    # Each runs as the job's user for at most 90 s; $STATE is the node's state_dir.
    "chmod_loop": ("while :; do chmod 0 \"$STATE\"/mps/u$(id -u)-*/pipe "
                   "\"$STATE\"/mps/u$(id -u)-*/log 2>/dev/null; done"),
    "kill_loop": "while :; do pkill -KILL -u \"$(id -u)\" nvidia-cuda-mps; done",
    "stop_loop": "while :; do pkill -STOP -u \"$(id -u)\" nvidia-cuda-mps; done",
}
# What the failed job's user is told, per attack.
TOLD = {
    "chmod_loop": "which only its user can do while the daemon starts",
    "kill_loop": "ended, stopped or disturbed this daemon while it started",
    "stop_loop": "ended, stopped or disturbed this daemon while it started",
}


def not_drained(bed) -> None:
    state = bed.node_state(NODE)
    assert "DRAIN" not in state["State"], state


@pytest.fixture
def attack_bed(_mps_bed):  # noqa: F811  (the fixture imported above)
    """test_mps.py's bed, daemons starting in 1.5 s, checked clean after the test."""
    set_fault(_mps_bed, "slow_start")
    return _mps_bed


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_attack_on_ones_own_starting_daemon_fails_only_that_job(attack_bed, attack):
    bed = attack_bed
    loop = ATTACKS[attack].replace("while :;", "while [ \"$(date +%s)\" -lt \"$end\" ];")
    attacker = bed.sbatch(f"STATE={bed.state_of(NODE)}\nend=$(( $(date +%s) + 90 ))\n{loop}\n",
                          "-w", NODE, "-c1", user=U1)
    bed.wait_job(attacker, states={"RUNNING"}, timeout=120)
    try:
        shared = bed.run(["srun", "-w", NODE, "--gres=mps:21", "-c1", "true"], user=U1,
                         check=False, timeout=180)
        assert shared.returncode != 0, shared.stderr
        assert TOLD[attack] in shared.stderr, shared.stderr
        not_drained(bed)
    finally:
        bed.run(["scancel", str(attacker)], check=False)
        bed.wait_job(attacker, timeout=120)
    not_drained(bed)
    for user in (U1, U2):
        ran = bed.run(["srun", "-w", NODE, "--gres=mps:21", "-c1", "true"], user=user,
                      check=False, timeout=180)
        assert ran.returncode == 0, (user, ran.stderr)
    not_drained(bed)
    assert_nothing_left(bed)
