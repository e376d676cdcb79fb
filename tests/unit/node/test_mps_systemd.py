# SPDX-License-Identifier: GPL-2.0-or-later
"""Where systemd runs the node, each user's MPS daemon runs in a transient scope of its own
in gpushare.slice, made through systemd: the admin caps them all on the slice, and systemd
never finds a cgroup it did not make. Against a real systemd booted as PID 1 of a node of
its own (scripts/systemd_node.py) and the stand-in daemon, run for real."""

from __future__ import annotations

import json
import os
import re
import stat
import sys

import pytest

import systemd_node
from gpushare.common import proc
from gpushare.node.mps import MpsDevice, MpsError, isolation
from mps_standin.harness import StandinBed as Bed
from mps_standin.harness import ensure_users
from mps_standin.harness import unusable_reason as standin_unusable

REASON = standin_unusable() or systemd_node.unusable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

GPU0 = MpsDevice("GPU-11111111-2222-3333-4444-555555555555", 0, 80 << 30, "GPU 0")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SCOPE = re.compile(r"^/gpushare\.slice/(gpushare-mps-(?P<key>.+)-[0-9a-f]{8}\.scope)$")


@pytest.fixture(scope="module")
def users():
    return ensure_users()


@pytest.fixture(scope="module")
def node():
    with systemd_node.SystemdNode() as booted:
        yield booted
    # Nothing of the node outlives it: its processes die with its PID 1, its cgroups go.
    assert not os.path.exists(f"/proc/{booted.pid}/ns"), booted.pid
    assert not os.path.exists(booted.cgroup), booted.cgroup


def in_node(node: systemd_node.SystemdNode, bed: Bed, body: str) -> dict:
    """Run ``body`` (Python, with ``config`` and ``manager`` made for ``bed`` under
    mps_cgroup=auto, as a prolog's worker would) inside the node; its ``out`` as JSON."""
    script = f"""
import json, os, signal, sys, time
sys.path[:0] = {[p for p in sys.path if p]!r}
from gpushare.node.config import PluginConfig
from gpushare.node.mps import MpsDevice, MpsManager, isolation
# slurmd's usual state, which the daemon must not inherit
try:
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("-1000")
except PermissionError:  # where root may not lower it (a container), raised instead
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("500")
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2, signal.SIGTERM])
os.umask(0o022)
config = PluginConfig(state_dir={bed.config.state_dir!r}, mps_control={bed.standin.program!r},
                      timeout=5.0, mps_cgroup="auto")
manager = MpsManager(config, lock_timeout=60)
gpu = MpsDevice({GPU0.uuid!r}, 0, 80 << 30, "GPU 0")
out = {{}}
{body}
print(json.dumps(out))
"""
    result = node.run([sys.executable, "-c", script])
    return json.loads(result.stdout.splitlines()[-1])


def test_each_daemon_runs_in_a_scope_of_its_own_in_gpushare_slice(node, users):
    """mps_cgroup=auto under systemd: the daemon (and what it forks) starts in a transient
    scope that systemd made, as a job's process would start (oom_score_adj 0, no blocked
    or ignored signal, umask 077, the user's uid); the scope goes with the daemon."""
    u1 = users[0]
    bed = Bed()
    try:
        seen = in_node(node, bed, f"""
assert isolation.uses_systemd("auto")
lease = manager.acquire(1, {u1.pw_uid}, {u1.pw_gid}, [gpu], share_percent=25)
out["key"], out["pid"] = lease.key, lease.daemon_pid
out["cgroup"] = isolation.cgroup_of(lease.daemon_pid)
with open(f"/proc/{{lease.daemon_pid}}/status") as handle:
    out["status"] = dict(line.split(":\\t", 1) for line in handle.read().splitlines()
                         if ":\\t" in line)
with open(f"/proc/{{lease.daemon_pid}}/oom_score_adj") as handle:
    out["oom_score_adj"] = handle.read().strip()
""")
        found = SCOPE.match(seen["cgroup"])
        assert found and found["key"] == seen["key"], seen["cgroup"]
        unit = found[1]
        assert node.units("gpushare-mps-*") == [unit]
        shown = node.run(["systemctl", "show", "-p", "Slice,ActiveState,ControlGroup",
                          unit]).stdout.split()
        assert "Slice=gpushare.slice" in shown and "ActiveState=active" in shown
        assert f"ControlGroup={seen['cgroup']}" in shown
        status = seen["status"]
        assert seen["oom_score_adj"] == "0"
        assert int(status["SigBlk"], 16) == 0 and int(status["SigIgn"], 16) == 0, status
        assert status["Umask"] == "0077"
        assert status["Uid"].split()[0] == str(u1.pw_uid)
        assert status["Gid"].split()[0] == str(u1.pw_gid)
        assert set(status["Groups"].split()) <= {str(u1.pw_gid)}, status  # none of root's

        released = in_node(node, bed, 'out["released"] = manager.release(1)')
        assert released["released"] == [seen["key"]]
        assert node.units("gpushare-mps-*") == []
    finally:
        bed.close()


def test_the_admin_caps_every_daemon_on_gpushare_slice(node, users):
    """The packages' gpushare.slice is the slice every daemon's scope runs in, and
    ``systemctl set-property gpushare.slice ...`` (docs/admin.md) caps them all; where the
    node's cgroup v2 has the memory controller, the kernel enforces it."""
    u1 = users[0]
    shipped = os.path.join(REPO, "packaging", "gpushare.slice")
    node.run(["cp", shipped, os.path.join(systemd_node.UNIT_DIR, "gpushare.slice")])
    node.run(["systemctl", "daemon-reload"])
    assert node.run(["systemctl", "show", "-p", "FragmentPath,Description", "gpushare.slice"]
                    ).stdout.splitlines() == [
        "Description=gpushare: the users' MPS daemons, a scope each",
        "FragmentPath=" + os.path.join(systemd_node.UNIT_DIR, "gpushare.slice")]
    node.run(["systemctl", "set-property", "--runtime", "gpushare.slice", "MemoryMax=1G",
              "TasksMax=512"])
    bed = Bed()
    try:
        seen = in_node(node, bed, f"""
lease = manager.acquire(2, {u1.pw_uid}, {u1.pw_gid}, [gpu], share_percent=50)
out["key"], out["cgroup"] = lease.key, isolation.cgroup_of(lease.daemon_pid)
""")
        shown = node.run(["systemctl", "show", "-p", "MemoryMax,TasksMax",
                          "gpushare.slice"]).stdout.split()
        assert shown == ["MemoryMax=1073741824", "TasksMax=512"]
        assert seen["cgroup"].startswith("/gpushare.slice/")
        controllers = node.run(["cat", "/sys/fs/cgroup/gpushare.slice/cgroup.controllers"]
                               ).stdout.split()
        if "memory" in controllers:  # a host whose memory controller is cgroup v2's
            limit = node.run(["cat", "/sys/fs/cgroup/gpushare.slice/memory.max"]).stdout
            assert limit.strip() == "1073741824"
        assert in_node(node, bed, 'out["released"] = manager.release(2)')["released"] == [
            seen["key"]]
    finally:
        bed.close()
        node.run(["systemctl", "set-property", "--runtime", "gpushare.slice",
                  "MemoryMax=infinity", "TasksMax=infinity"])


def test_a_daemon_killed_with_its_scope_is_started_anew_in_a_new_one(node, users):
    """What a killed daemon left (a scope systemd has not yet collected, a server) never
    blocks the next start: each start gets a scope of its own name."""
    u1 = users[0]
    bed = Bed()
    try:
        first = in_node(node, bed, f"""
lease = manager.acquire(3, {u1.pw_uid}, {u1.pw_gid}, [gpu], share_percent=25)
out["cgroup"] = isolation.cgroup_of(lease.daemon_pid)
os.kill(lease.daemon_pid, signal.SIGKILL)
while os.path.exists(f"/proc/{{lease.daemon_pid}}"):  # until PID 1 has reaped it
    time.sleep(0.01)
lease = manager.acquire(4, {u1.pw_uid}, {u1.pw_gid}, [gpu], share_percent=25)
out["again"] = isolation.cgroup_of(lease.daemon_pid)
out["released"] = manager.release(3) + manager.release(4)
""")
        assert SCOPE.match(first["again"]) and first["again"] != first["cgroup"]
        assert len(first["released"]) == 1
        assert node.units("gpushare-mps-*") == []
    finally:
        bed.close()


def test_a_scope_systemd_refuses_fails_the_start_as_the_nodes_fault(node, users):
    """A masked gpushare.slice (an admin's doing): systemd-run makes no scope and runs
    nothing; the start fails naming systemd, not the MPS program, and is the node's."""
    u1 = users[0]
    masked = os.path.join(systemd_node.UNIT_DIR, "gpushare.slice")
    node.run(["rm", "-f", masked])
    node.run(["ln", "-s", "/dev/null", masked])
    node.run(["systemctl", "daemon-reload"])
    bed = Bed()
    try:
        seen = in_node(node, bed, f"""
from gpushare.node.mps import MpsUserError
try:
    manager.acquire(6, {u1.pw_uid}, {u1.pw_gid}, [gpu], share_percent=25)
except MpsUserError as err:
    out["user"] = str(err)
except Exception as err:
    out["type"], out["error"], out["brief"] = type(err).__name__, str(err), err.brief
""")
        assert seen.get("type") == "MpsError", seen
        assert seen["brief"].startswith("MPS start failed: no systemd scope for the daemon")
        assert "systemd made no scope for its daemon in gpushare.slice" in seen["error"]
        assert "masked" in seen["error"], seen["error"]
        assert node.units("gpushare-mps-*") == []
    finally:
        bed.close()
        node.run(["rm", "-f", masked])
        node.run(["systemctl", "daemon-reload"])


def test_a_scope_allows_only_its_gpus_and_ends_whole_with_its_daemon(node, users):
    """The scope may open only the daemon's GPU and the driver's common files
    (``DevicePolicy=closed``); a process of the user in the scope that is no MPS program
    (what a takeover of the daemon would fork) ends with the daemon, and so does the
    scope."""
    u1 = users[0]
    bed = Bed()
    try:
        seen = in_node(node, bed, f"""
import subprocess
gpu = gpu._replace(device_files=("/dev/nvidia3",))
lease = manager.acquire(7, {u1.pw_uid}, {u1.pw_gid}, [gpu], share_percent=25)
out["key"], out["cgroup"] = lease.key, isolation.cgroup_of(lease.daemon_pid)
child = subprocess.Popen(["/bin/sleep", "600"], user={u1.pw_uid}, group={u1.pw_gid},
                         start_new_session=True)
with open("/sys/fs/cgroup" + out["cgroup"] + "/cgroup.procs", "w") as handle:
    handle.write(str(child.pid))
out["child_cgroup"] = isolation.cgroup_of(child.pid)
unit = out["cgroup"].rsplit("/", 1)[1]
out["shown"] = subprocess.run(["systemctl", "show", "-p", "DevicePolicy,DeviceAllow", unit],
                              capture_output=True, text=True).stdout.splitlines()
out["released"] = manager.release(7)
out["child"] = child.wait(timeout=30)
""")
        assert seen["child_cgroup"] == seen["cgroup"]
        assert seen["shown"][0] == "DevicePolicy=closed"
        allowed = [line for line in seen["shown"] if line.startswith("DeviceAllow=")]
        assert sorted(allowed) == sorted(f"DeviceAllow={path} rw" for path in (
            "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia3"))
        assert seen["released"] == [seen["key"]]
        assert seen["child"] == -9
        assert node.units("gpushare-mps-*") == []
    finally:
        bed.close()


def test_mps_cgroup_systemd_without_systemd_fails_the_start_saying_so(monkeypatch, users):
    monkeypatch.setattr(isolation, "systemd_booted", lambda run_root="/run": False)
    bed = Bed(cgroup="systemd")
    try:
        with pytest.raises(MpsError, match=r"no cgroup for its daemon under "
                           r"mps_cgroup=systemd: .*systemd does not run this node"):
            bed.manager().acquire(5, users[0].pw_uid, users[0].pw_gid, [GPU0],
                                  share_percent=25)
    finally:
        bed.close()


def test_auto_without_systemd_keeps_the_cgroup_directory(monkeypatch):
    monkeypatch.setattr(isolation, "systemd_booted", lambda run_root="/run": False)
    assert not isolation.uses_systemd("auto")
    assert isolation.uses_systemd("systemd")
    assert not isolation.uses_systemd("/sys/fs/cgroup/mps")


def test_a_systemd_run_root_does_not_own_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "systemd-run"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o777)
    os.chown(fake, 65534, 65534)
    assert fake.stat().st_mode & stat.S_IWOTH
    monkeypatch.setattr(isolation, "systemd_booted", lambda run_root="/run": True)
    monkeypatch.setattr(isolation, "SYSTEMD_RUN", str(fake))
    with pytest.raises(OSError, match=r"systemd-run refused: .* must be owned by root"):
        isolation.isolation("systemd", "k")


def test_a_scopes_devices_are_its_gpus_and_mig_caps_and_the_drivers_common_files():
    """A MIG slice brings its parent GPU and its nvidia-caps files; a device whose files
    are unknown (a record of an earlier release) means no device policy at all, since a
    closed one would take the daemon's GPU away."""
    gpu = GPU0._replace(device_files=("/dev/nvidia0",))
    mig = MpsDevice("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 1, 10 << 30, "MIG slice 1",
                    ("/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap30",
                     "/dev/nvidia-caps/nvidia-cap31"))
    assert isolation.daemon_devices([gpu, mig]) == (
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0",
        "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31")
    assert isolation.daemon_devices([gpu, GPU0]) == ()
    # systemd refuses DeviceAllow= of a path outside /dev (a simulated node's files).
    assert isolation.daemon_devices([GPU0._replace(device_files=("/tmp/bed/dev/nvidia0",))]
                                    ) == ()
    scoped = proc._in_scope(["mps"], proc.Isolation(
        scope="s.scope", scope_slice="gpushare.slice", systemd_run="/usr/bin/systemd-run",
        devices=("/dev/nvidiactl", "/dev/nvidia0")), 1001, 1001)
    assert scoped[scoped.index("--slice=gpushare.slice") + 1:scoped.index("--uid=1001")] == [
        "--property=DevicePolicy=closed", "--property=DeviceAllow=/dev/nvidiactl rw",
        "--property=DeviceAllow=/dev/nvidia0 rw"]
    assert not any("Device" in arg for arg in proc._in_scope(["mps"], proc.Isolation(
        scope="s.scope", scope_slice="gpushare.slice", systemd_run="/x"), 1001, 1001))
