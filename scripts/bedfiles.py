# SPDX-License-Identifier: GPL-2.0-or-later
"""What a local Slurm bed is (``slurmbed.SlurmBed``'s configuration) and the files it writes
under its root before a daemon starts: slurm.conf, gres.conf, cgroup.conf, plugstack.conf,
the munge key, the simulated GPUs' device files and node profiles, and the plugin with its
Python, copied as a site installs them. ``slurmbed`` starts, runs and stops the bed."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from bedclient import BedClient, BedError
from mps_standin.harness import install_standin

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(REPO, "build")


_RELEASE: list[tuple[int, int]] = []


def slurm_release() -> tuple[int, int]:
    """(major, minor) of the Slurm this machine runs (the tests' beds run it)."""
    if not _RELEASE:
        from gpushare.admin.slurm_client import installed_release

        found = installed_release()
        if found is None:
            raise BedError("no Slurm installed here (slurmctld -V / slurmd -V): make deps")
        major, minor = found.split(".")[:2]
        _RELEASE.append((int(major), int(minor)))
    return _RELEASE[0]


@dataclass
class Node:
    """One simulated node: its GPUs as gres.conf lines and the profile NVML is simulated from."""

    name: str
    port: int
    cpus: int = 8
    memory_mb: int = 4000
    gres: str = ""  # slurm.conf Gres=, e.g. "gpu:h100:8,mps:800"
    features: str = ""  # slurm.conf Features=, e.g. "gpushare_whole"
    profile: str = ""  # simulated node profile (JSON path), copied to <root>/nodes/<name>.json
    simulated: Optional[dict[str, Any]] = None  # or the profile itself (gpushare simulate)


@dataclass
class BedFiles(BedClient):
    """A bed's configuration, and the files it writes from it."""

    root: str
    nodes: list[Node]
    gres_conf: str = ""  # gres.conf text; "@ROOT@" is replaced by the bed's root
    topology_conf: str = ""  # topology.conf text (enables topology_plugin when set)
    topology_plugin: str = "topology/tree"  # or topology/block (24.05+)
    plugstack: Optional[str] = None  # None: gpushare with default args; "" : no plugin
    plugin_args: dict[str, str] = field(default_factory=dict)
    job_submit: str = ""  # JobSubmitPlugins= value ("lua", "gpushare", ...)
    job_submit_lua: str = ""  # path of a job_submit.lua copied next to slurm.conf
    extra_conf: str = ""
    cluster: str = "gsbed"
    ctld_port: int = 16817
    cgroup: Optional[bool] = None  # None: use cgroup v1 when this machine has it
    device_count: int = 8
    mig_caps: Sequence[int] = ()
    device_files: Sequence[str] = ()  # exact device files to create (from a rendered gres.conf)
    prolog_flags: str = ""  # slurm.conf PrologFlags= (none, as docs/admin.md configures)
    facts_json: str = ""  # the submit hooks' facts, written to etc/gpushare-facts.json
    plan_source: str = ""  # an ownership plan copied to etc/plan.yaml
    # etc/fake_gpus.conf: the GPUs slurmd takes as detected, with their UUIDs (26.05 reads
    # it beside slurm.conf; gres.conf Flags=env_uuid needs a UUID). One for every node.
    fake_gpus: str = ""
    # A booted systemd_node.SystemdNode: each slurmd runs there as a service of its own, as
    # a site's slurmd.service (Delegate=yes, KillMode=process); None: a plain process.
    systemd: Any = None
    # The plugin's state directories on a tmpfs of their own, as state_dir='s default
    # (/run/gpushare) is on a node (the benchmarks); False: on the root's file system.
    state_tmpfs: bool = False

    def use_cgroup(self) -> bool:
        if os.environ.get("GPUSHARE_BED_CGROUP") == "no":
            return False
        if self.cgroup is None:
            return os.path.isdir("/sys/fs/cgroup/devices") and os.path.isdir(
                "/sys/fs/cgroup/freezer")
        return self.cgroup

    @property
    def daemon_cgroups(self) -> Optional[str]:
        """The cgroup v2 directory of this bed's MPS daemons' cgroups, one below it per node
        (plugstack mps_cgroup=<it>/%n): the bed's own, and each node's own, since a daemon's
        retirement kills its whole cgroup and other beds, and the bed's other nodes (whose
        simulated GPUs share UUIDs), have daemons of the same keys on this host; None: the
        plugin's default (no cgroup v2 here, or a bed whose slurmd runs under systemd: its
        scopes)."""
        from gpushare.node.mps.isolation import cgroup2_mount

        mount = cgroup2_mount()
        if self.systemd is not None or mount is None:
            return None
        return os.path.join(mount, f"gpushare-bed-{os.path.basename(self.root.rstrip('/'))}")

    def default_plugin_args(self) -> dict[str, str]:
        args = {
            "pythonpath": self.path("lib", "python"),
            "state_dir": os.path.join(self.state_dir, "%n"),  # several slurmd on one host
            "debug_log": self.debug_log,
            "inventory": "sim:" + self.path("nodes", "%n.json"),
            "mps_control": self.path("bin", "nvidia-cuda-mps-control"),
            "timeout": "5",
        }
        if self.daemon_cgroups:
            args["mps_cgroup"] = os.path.join(self.daemon_cgroups, "%n")
        args.update(self.plugin_args)
        return args

    def plugstack_line(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in self.default_plugin_args().items())
        return f"required {self.path('lib', 'spank_gpushare.so')} {args}\n"

    # ---- files ----------------------------------------------------------------------

    def _make_devices(self) -> None:
        if self.device_files:
            for path in self.device_files:
                name = os.path.basename(path)
                major = 240 if name.startswith("nvidia-cap") else 195
                minor = int(name.rsplit("p" if major == 240 else "a", 1)[1])
                os.mknod(path, (0o444 if major == 240 else 0o666) | 0o020000,
                         os.makedev(major, minor))
            return
        for minor in range(self.device_count):
            os.mknod(self.path("dev", f"nvidia{minor}"), 0o666 | 0o020000, os.makedev(195, minor))
        for minor in self.mig_caps:
            os.mknod(self.path("dev", "nvidia-caps", f"nvidia-cap{minor}"), 0o444 | 0o020000,
                     os.makedev(240, minor))

    def _install_gpushare(self) -> None:
        """Copy the built plugin and its Python where the job's user can read them, with
        their owners and modes: the plugin checks them as it would the build's own files."""
        plugin = os.path.join(BUILD, "spank_gpushare.so")
        pylib = os.path.join(BUILD, "pylib")
        if self.plugstack != "" and not (os.path.exists(plugin) and os.path.isdir(pylib)):
            raise BedError(f"{plugin} or {pylib} missing: run `make build` first")
        for name in ("spank_gpushare.so", "spank_gpushare_core.so"):
            if os.path.exists(os.path.join(BUILD, name)):
                subprocess.run(["cp", "-a", os.path.join(BUILD, name), self.path("lib", name)],
                               check=True)
        if os.path.isdir(pylib):
            subprocess.run(["cp", "-a", pylib, self.path("lib", "python")], check=True)
            # Always the current core, even when pylib was built earlier.
            shutil.rmtree(self.path("lib", "python", "gpushare"), ignore_errors=True)
            shutil.copytree(os.path.join(REPO, "src", "gpushare"),
                            self.path("lib", "python", "gpushare"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            subprocess.run(["/usr/bin/python3", "-m", "compileall", "-q",
                            self.path("lib", "python")], check=True, stdout=subprocess.DEVNULL)
        install_standin(self.path("bin"))
        for node in self.nodes:
            if node.profile or node.simulated is not None:
                self._install_profile(node)

    def _install_profile(self, node: Node) -> None:
        if node.simulated is not None:
            profile = dict(node.simulated)
        else:
            with open(node.profile) as handle:
                profile = json.load(handle)
        profile["device_dir"] = self.path("dev")
        profile["hostname"] = node.name
        with open(self.path("nodes", f"{node.name}.json"), "w") as handle:
            json.dump(profile, handle, indent=1)

    def _write_munge_key(self) -> None:
        key = self.path("munge", "munge.key")
        with open(key, "wb") as handle:
            handle.write(os.urandom(1024))
        munge = pwd.getpwnam("munge")
        for entry in (self.path("munge"), key):
            os.chown(entry, munge.pw_uid, munge.pw_gid)
        os.chmod(self.path("munge"), 0o711)
        os.chmod(key, 0o400)

    def _write_configs(self) -> None:
        hostname = os.uname().nodename
        cgroup = self.use_cgroup()
        lines = [
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={hostname}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.path('munge', 'munge.socket')}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.path('spool', 'ctld')}",
            f"SlurmdSpoolDir={self.path('spool', '%n')}",
            f"SlurmctldPidFile={self.path('run', 'slurmctld.pid')}",
            f"SlurmdPidFile={self.path('run', 'slurmd-%n.pid')}",
            f"SlurmctldLogFile={self.path('log', 'slurmctld.log')}",
            f"SlurmdLogFile={self.path('log', 'slurmd-%n.log')}",
            "SlurmdDebug=debug",
            "SlurmctldDebug=info",
            "SlurmdParameters=config_overrides",
            "ProctrackType=" + ("proctrack/cgroup" if cgroup else "proctrack/linuxproc"),
            "TaskPlugin=" + ("task/cgroup,task/affinity" if cgroup else "task/none"),
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu,mps,shard",
            *([f"PrologFlags={self.prolog_flags}"] if self.prolog_flags else []),
            "KillWait=5",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SchedulerParameters=max_switch_wait=3600",
            f"PlugStackConfig={self.path('etc', 'plugstack.conf')}",
        ]
        if self.topology_conf:
            lines.append(f"TopologyPlugin={self.topology_plugin}")
        if self.job_submit:
            lines.append(f"JobSubmitPlugins={self.job_submit}")
        if self.extra_conf:
            # A key extra_conf sets replaces the bed's own (slurmctld logs an error for a
            # key given twice): a site's slurm.conf lines can be tried as they are.
            extra = self.extra_conf.replace("@ROOT@", self.root)
            keys = {line.split("=", 1)[0].strip().lower() for line in extra.splitlines()
                    if "=" in line and not line.lstrip().startswith("#")}
            lines = [line for line in lines if line.split("=", 1)[0].lower() not in keys]
            lines.append(extra)
        for node in self.nodes:
            gres = f" Gres={node.gres}" if node.gres else ""
            features = f" Features={node.features}" if node.features else ""
            lines.append(f"NodeName={node.name} NodeHostname={hostname} NodeAddr=127.0.0.1 "
                         f"Port={node.port} CPUs={node.cpus} RealMemory={node.memory_mb}{gres}"
                         f"{features} State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self._write("etc/slurm.conf", "\n".join(lines) + "\n")
        # CgroupAutomount is defunct in 24.11 (every daemon and step logs an error).
        automount = "CgroupAutomount=no\n" if slurm_release() < (24, 11) else ""
        self._write("etc/cgroup.conf", "CgroupPlugin=cgroup/v1\n" + automount +
                    "ConstrainCores=yes\nConstrainRAMSpace=no\nConstrainDevices=yes\n")
        self._write("etc/gres.conf", self.gres_conf.replace("@ROOT@", self.root) or
                    "AutoDetect=off\n")
        if self.topology_conf:
            self._write("etc/topology.conf", self.topology_conf)
        self.write_plugstack(self.plugstack_line() if self.plugstack is None else self.plugstack)
        if self.job_submit_lua:
            shutil.copy2(self.job_submit_lua, self.path("etc", "job_submit.lua"))
        if self.facts_json:
            self._write("etc/gpushare-facts.json", self.facts_json)
        if self.plan_source:
            shutil.copy2(self.plan_source, self.path("etc", "plan.yaml"))
        if self.fake_gpus:
            self._write("etc/fake_gpus.conf", self.fake_gpus.replace("@ROOT@", self.root))

    def write_plugstack(self, text: str) -> None:
        """Replace plugstack.conf; Slurm re-reads it for every job."""
        self._write("etc/plugstack.conf", text)

    def _write(self, relative: str, text: str) -> None:
        """Replace the file in one rename: slurmd re-reads plugstack.conf for every epilog,
        and one that found it half written would load no gpushare and clean nothing up."""
        path = self.path(relative)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as handle:
            handle.write(text)
        os.replace(temporary, path)
