# SPDX-License-Identifier: GPL-2.0-or-later
"""A real local Slurm for tests, the demo and the benchmarks.

Debian's slurmctld/slurmd/munge, installed if missing, run under one private root:
configs, spool, logs, the munge socket, simulated GPUs (``mknod`` character devices, major
195) and the gpushare plugin and its Python. Several nodes share this host (``slurmd -N``).
Everything is stopped by pid (SIGKILL after a timeout) and removed; on a failure the
daemon logs are shown.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

import procfs
from bedclient import TERMINAL_STATES as TERMINAL_STATES
from bedclient import TEST_USERS as TEST_USERS
from bedclient import WORKER_STARTED as WORKER_STARTED
from bedclient import BedError
from bedclient import eligible_in as eligible_in
from bedclient import requeued_held as requeued_held
from bedclient import wait_until as wait_until
from bedclient import worker_ended as worker_ended
from bedfiles import BUILD as BUILD
from bedfiles import REPO as REPO
from bedfiles import BedFiles
from bedfiles import Node as Node
from bedfiles import slurm_release as slurm_release

APT_PACKAGES = (
    "slurmctld", "slurmd", "slurm-client", "munge", "libslurm-dev", "slurm-wlm-basic-plugins",
    "python3-cffi", "python3-dev", "python3-jinja2", "python3-yaml", "python3-pip", "lua5.1",
    "gcc", "libc6-dev",  # the plugins and the MPS stand-in are C
    "python3-setuptools",  # cffi compiles through setuptools on Python >= 3.12
)


def debian_codename(root: str = "/") -> str:
    """The Debian release of the system at ``root`` (its /etc/os-release); "" for none."""
    with contextlib.suppress(FileNotFoundError), \
            open(os.path.join(root, "etc/os-release")) as handle:
        for line in handle:
            key, _, value = line.strip().partition("=")
            if key == "VERSION_CODENAME":
                return value.strip('"')
    return ""


def slash_gres() -> bool:
    """Whether this Slurm writes GRES requests as ``gres/gpu:1`` (23.11 on), not ``gres:``."""
    return slurm_release() >= (23, 11)


def stored(text: str, per_task: bool = False) -> str:
    """A request string in 22.05's syntax (``gres:gpu:h100:1``), as the running Slurm stores
    and the hooks write it: from 23.11 ``gres/gpu:h100:1``, and ``gres/gpu:h100=1`` in
    ``tres_per_task`` (``per_task``). Text around the ``gres:`` items is kept."""
    if not slash_gres():
        return text

    def convert(match: re.Match[str]) -> str:
        item = match.group(1)
        if per_task and item.count(":") >= 1:
            head, _, count = item.rpartition(":")
            item = f"{head}={count}"
        return "gres/" + item

    return re.sub(r"gres:([A-Za-z][\w.+\-]*(?::[\w.+\-]+)*)", convert, text)


def missing_packages(packages: Iterable[str] = APT_PACKAGES) -> list[str]:
    missing = []
    for name in packages:
        result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name],
                                capture_output=True, text=True)
        if "install ok installed" not in result.stdout:
            missing.append(name)
    return missing


def finish_interrupted_dpkg() -> None:
    """Finish a dpkg run that was killed half-way (`dpkg --configure -a`, what apt asks for):
    until then every apt-get call on the machine fails with "dpkg was interrupted". A run of
    the package test stopped while it installs leaves the machine so."""
    if not any(entry.name.isdigit() for entry in os.scandir("/var/lib/dpkg/updates")):
        return
    result = subprocess.run(["dpkg", "--configure", "-a"], capture_output=True, text=True,
                            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if result.returncode != 0:
        raise RuntimeError("dpkg was interrupted and `dpkg --configure -a` failed; run it by "
                           f"hand and fix what it says:\n{result.stdout}{result.stderr}")


def ensure_packages(packages: Iterable[str] = APT_PACKAGES) -> None:
    """Install the Debian packages the bed needs (only those missing)."""
    missing = missing_packages(packages)
    if not missing:
        return
    finish_interrupted_dpkg()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Waits for dpkg's lock rather than failing where another apt-get holds it (`make
    # test` runs several suites, and builds the packages, at once).
    wait = ["-o", "DPkg::Lock::Timeout=600"]
    subprocess.run(["apt-get", *wait, "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends",
                    *missing], check=True, env=env)


def ensure_user(name: str) -> pwd.struct_passwd:
    """A non-root test user (created once, idempotent)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
        return pwd.getpwnam(name)


@dataclass
class SlurmBed(BedFiles):
    """One private Slurm cluster on this host."""

    # Keep the root after stop, logs and all (for debugging): GPUSHARE_BED_KEEP=1.
    keep: bool = field(default_factory=lambda: os.environ.get("GPUSHARE_BED_KEEP") == "1")
    _pids: dict[str, int] = field(default_factory=dict, repr=False)
    _made: list[str] = field(default_factory=list, repr=False)  # empty dirs outside root

    # ---- setup ----------------------------------------------------------------------

    def prepare(self) -> None:
        ensure_packages()
        for user in TEST_USERS:
            ensure_user(user)
        if os.path.exists(self.root):
            self._unmount_state()
            shutil.rmtree(self.root)
        for sub in ("etc", "log", "run", "spool/ctld", "munge", "dev/nvidia-caps", "lib",
                    "nodes", "bin", "out"):
            os.makedirs(self.path(sub), mode=0o755, exist_ok=True)
        if self.state_tmpfs:
            os.makedirs(self.state_dir, mode=0o755, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=256m",
                            "gpushare-bed-state", self.state_dir], check=True)
        for node in self.nodes:
            os.makedirs(self.path("spool", node.name), exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.out_dir, 0o1777)
        self._make_devices()
        self._install_gpushare()
        self._write_munge_key()
        self._write_configs()

    # ---- daemons --------------------------------------------------------------------

    def start(self) -> SlurmBed:
        self.prepare()
        if self.daemon_cgroups:  # the nodes' mps_cgroup= directories below it
            os.makedirs(self.daemon_cgroups, mode=0o755, exist_ok=True)
        try:
            self._start_munge()
            self._spawn("slurmctld", ["slurmctld", "-i", "-c"], self.path("run", "slurmctld.pid"))
            for node in self.nodes:
                self.start_slurmd(node.name)
            self.wait_idle()
        except BaseException:
            print(self.logs())
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        pid_file = self.path("munge", "munged.pid")
        subprocess.run(
            ["runuser", "-u", "munge", "--", "munged",
             f"--socket={self.path('munge', 'munge.socket')}",
             f"--key-file={self.path('munge', 'munge.key')}",
             f"--log-file={self.path('munge', 'munged.log')}",
             f"--pid-file={pid_file}", f"--seed-file={self.path('munge', 'munged.seed')}"],
            check=True, timeout=30)
        self._pids["munged"] = self._read_pid(pid_file)

    def start_slurmd(self, node: str, conf_server: str = "") -> None:
        """The node's slurmd; with ``conf_server`` ("host:port") configless: no SLURM_CONF,
        it fetches slurm.conf and the rest from slurmctld and keeps them in
        ``<SlurmdSpoolDir>/conf-cache``."""
        if conf_server:
            self._spawn(f"slurmd-{node}", self._configless(node, conf_server),
                        self.path("run", f"slurmd-{node}.pid"),
                        env={k: v for k, v in self.env.items() if k != "SLURM_CONF"})
            return
        if self.systemd is not None:  # stopped with the systemd node, or by _kill_leftovers
            self.systemd.run(["systemd-run", f"--unit=slurmd-{node}.service",
                              "--property=Delegate=yes", "--property=KillMode=process",
                              "--property=DefaultDependencies=no",
                              f"--setenv=SLURM_CONF={self.conf}",
                              f"--setenv=GPUSHARE_FACTS={self.facts_path}",
                              shutil.which("slurmd") or "/usr/sbin/slurmd", "-D", "-N", node])
            return
        self._spawn(f"slurmd-{node}", ["slurmd", "-N", node],
                    self.path("run", f"slurmd-{node}.pid"))

    def _configless(self, node: str, conf_server: str) -> list[str]:
        """A configless slurmd's command. It asks slurmctld for its configuration before it
        has read AuthInfo=, so through munge's default socket: in a mount namespace of its
        own, /run/munge is a tmpfs whose munge.socket.2 leads to the bed's munged. The empty
        /run/munge it mounts on, where this machine had none, goes with the bed."""
        if not os.path.isdir("/run/munge"):
            os.makedirs("/run/munge", mode=0o755)
            self._made.append("/run/munge")
        script = ("mount -t tmpfs -o mode=0755 gsbed-munge /run/munge && "
                  f"ln -s {shlex.quote(self.path('munge', 'munge.socket'))} "
                  "/run/munge/munge.socket.2 && exec slurmd \"$@\"")
        return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script,
                "slurmd", "-N", node, "--conf-server", conf_server]

    def _spawn(self, name: str, argv: list[str], pid_file: str,
               env: Optional[dict[str, str]] = None) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pid_file)
        subprocess.run(argv, check=True, env=self.env if env is None else env, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._pids[name] = self._read_pid(pid_file)

    @staticmethod
    def _read_pid(pid_file: str, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError), open(pid_file) as handle:
                return int(handle.read().strip())
            time.sleep(0.05)
        raise BedError(f"{pid_file} did not appear")

    def restart_slurmctld(self) -> None:
        """Stop slurmctld (whichever process its pid file names: a site's restart command may
        have started it) and start it again with its saved state, as a service restart does."""
        pid_file = self.path("run", "slurmctld.pid")
        self._pids.pop("slurmctld", None)
        with contextlib.suppress(FileNotFoundError, ValueError), open(pid_file) as handle:
            procfs.terminate(int(handle.read().strip()))
        self._spawn("slurmctld", ["slurmctld", "-i"], pid_file)

    def slurmctld_restart_command(self) -> str:
        """A shell command that restarts this bed's slurmctld from outside, as
        ``systemctl restart slurmctld`` does on a site."""
        script = (f"pid=$(cat {shlex.quote(self.path('run', 'slurmctld.pid'))}) && kill $pid && "
                  "while kill -0 $pid 2>/dev/null; do sleep 0.1; done && "
                  f"exec env SLURM_CONF={shlex.quote(self.conf)} "
                  f"GPUSHARE_FACTS={shlex.quote(self.facts_path)} "
                  "slurmctld -i </dev/null >/dev/null 2>&1")
        return shlex.join(["/bin/sh", "-c", script])

    def adopt_slurmctld(self) -> None:
        """Track the slurmctld a command outside the bed started."""
        self._pids["slurmctld"] = self._read_pid(self.path("run", "slurmctld.pid"))

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL a slurmd (as a crash would); its jobs' slurmstepds live on."""
        pid = self._pids.pop(f"slurmd-{node}")
        os.kill(pid, signal.SIGKILL)
        procfs.wait_gone(pid, 10)

    def stop_slurmd(self, node: str) -> None:
        """Stop a slurmd as its service's stop does (SIGTERM): whichever process its pid file
        names (from 23.11 a reconfigure starts slurmd anew, under another pid)."""
        pid = self._pids.pop(f"slurmd-{node}")
        with contextlib.suppress(FileNotFoundError, ValueError), \
                open(self.path("run", f"slurmd-{node}.pid")) as handle:
            pid = int(handle.read().strip())
        procfs.terminate(pid)

    def wait_idle(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            result = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise BedError(f"nodes not idle after {timeout:.0f}s: {states}")

    def stop(self) -> None:
        """Stop every daemon by pid, then remove what Slurm and jobs left behind."""
        if "slurmctld" in self._pids:
            self.run(["scancel", "--quiet", "--full", "-u", "root"], check=False, timeout=10)
            for user in TEST_USERS:
                self.run(["scancel", "--quiet", "-u", user], check=False, timeout=10)
        for name in sorted(self._pids, key=lambda n: (n == "munged", n == "slurmctld")):
            procfs.terminate(self._pids[name])
        self._pids.clear()
        self._kill_leftovers()
        self._remove_cgroups()
        for made in self._made:
            with contextlib.suppress(OSError):
                os.rmdir(made)
        self._made.clear()
        if not self.keep:
            self._unmount_state()
            shutil.rmtree(self.root, ignore_errors=True)

    def prefork_running(self, node: str) -> bool:
        """Whether a prefork server (``prefork=yes``) holds the node's lock."""
        import fcntl

        try:
            fd = os.open(os.path.join(self.state_of(node), "prefork.lock"),
                         os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def prefork_serving(self, node: str) -> bool:
        """Whether the node's prefork server takes jobs: it holds the lock and its socket
        listens. It takes the lock, imports, and only then listens; a job that comes in
        between runs in place."""
        return self.prefork_running(node) and procfs.unix_listening(
            os.path.join(self.state_of(node), "prefork.sock"))

    def stop_prefork(self, timeout: float = 30.0) -> None:
        """End every node's prefork server: each ends within a second of its socket's
        removal, and lets go of its lock."""
        for node in self.nodes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.state_of(node.name), "prefork.sock"))
            wait_until(f"{node.name}'s prefork server gone",
                       lambda name=node.name: not self.prefork_running(name), timeout)

    def _unmount_state(self) -> None:
        """Every mount at or below the state directories (the state_tmpfs, daemons' spaces
        an epilog did not unmount), deepest first."""
        top = os.path.realpath(self.state_dir)
        with open("/proc/self/mountinfo") as handle:
            points = [line.split()[4] for line in handle]
        for point in sorted((p for p in points if p == top or p.startswith(top + "/")),
                            key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)

    def _kill_leftovers(self) -> None:
        """slurmstepds and stand-in daemons that use a path inside this root (only ours).

        The test runner and its ancestors are spared even when their environment names the
        root (a ``GPUSHARE_BED_ROOT`` setting, a wrapper such as ``timeout``).
        """
        spared = procfs.ancestors(os.getpid())
        for pid in procfs.pids_mentioning(self.root.rstrip("/") + "/"):
            if pid not in spared:
                procfs.terminate(pid, grace=2.0)

    def _remove_cgroups(self) -> None:
        tops = [self.daemon_cgroups] if self.daemon_cgroups else []
        for node in self.nodes:
            for top in [*_glob_dirs("/sys/fs/cgroup", f"slurm_{node.name}"), *tops]:
                for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda e: -len(e[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)

    def __enter__(self) -> SlurmBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _glob_dirs(top: str, name: str) -> list[str]:
    if not os.path.isdir(top):
        return []
    return [os.path.join(top, ctrl, name) for ctrl in os.listdir(top)
            if os.path.isdir(os.path.join(top, ctrl, name))]


def whole_gpu_gres(node_names: Iterable[str], gpus: int = 8, gpu_type: str = "h100",
                   mps_per_gpu: int = 100) -> str:
    """gres.conf text for nodes with whole GPUs shared through gres/mps (@ROOT@ devices)."""
    names = ",".join(node_names)
    last = gpus - 1
    return (f"AutoDetect=off\n"
            f"NodeName={names} Name=gpu Type={gpu_type} File=@ROOT@/dev/nvidia[0-{last}]\n"
            f"NodeName={names} Name=mps Count={mps_per_gpu * gpus} "
            f"File=@ROOT@/dev/nvidia[0-{last}] Flags=all_sharing\n")


def default_bed(root: str = "/tmp/gpushare-bed", port_base: int = 17100,
                node_count: int = 4, prefix: str = "n", **kwargs: object) -> SlurmBed:
    """<prefix>1..N, each 8 simulated H100s (the 8-GPU NVSwitch profile) shared through MPS.

    A second bed running beside another one needs its own ``prefix``: Slurm names its
    cgroups after the node (``slurm_<node>``).
    """
    profile = os.path.join(REPO, "src", "gpushare", "gpu", "profiles", "h100-8x-nvswitch.json")
    names = [f"{prefix}{i}" for i in range(1, node_count + 1)]
    nodes = [Node(name=name, port=port_base + i, gres="gpu:h100:8,mps:800",
                  profile=profile if os.path.exists(profile) else "")
             for i, name in enumerate(names, start=1)]
    kwargs.setdefault("gres_conf", whole_gpu_gres(names))
    kwargs.setdefault("ctld_port", port_base)
    return SlurmBed(root=root, nodes=nodes, **kwargs)  # type: ignore[arg-type]


BED_PLAN = os.path.join(REPO, "tests", "plans", "bed.yaml")
PROFILES = {  # the simulated NVML profile of each node group of the bed plan
    "train": os.path.join(REPO, "src", "gpushare", "gpu", "profiles", "h100-8x-nvswitch.json"),
    "mig": os.path.join(REPO, "src", "gpushare", "gpu", "profiles", "a100-mig-mixed.json"),
}


def renamed_plan(plan_path: str, prefix: str, out: str) -> str:
    """A copy of a plan whose nodes n1.. are called <prefix>1.. (for a bed beside another:
    Slurm names cgroups after nodes, ``slurm_<node>``)."""
    with open(plan_path) as handle:
        text = handle.read()
    with open(out, "w") as handle:
        handle.write(re.sub(r"(?<![\w-])n(?=\[|\d)", prefix, text))
    return out


def plan_bed(root: str = "/tmp/gpushare-bed", port_base: int = 17100,
             plan_path: str = BED_PLAN, profiles: Optional[dict[str, str]] = None,
             simulate: bool = False, node_prefix: str = "", fake_gpus: bool = False,
             **kwargs: object) -> SlurmBed:
    """A bed whose gres.conf, node GRES, topology.conf and submit facts are rendered by
    gpushare from an ownership plan, with each node's NVML simulated from a profile.

    The plan is rendered for the installed Slurm, as ``gpushare render`` does it (a plan
    without ``slurm.version`` takes its release). ``simulate``: every node's profile is
    generated from the plan (``gpushare simulate``) and gres.conf is rendered as a site
    does, without inventories; else each node group's profile file comes from ``profiles``
    (default: the bed plan's) and gres.conf from it. ``node_prefix`` renames the plan's
    nodes n1.. to <prefix>1.. (the plan is copied to ``<root>.plan.yaml``). ``fake_gpus``:
    slurmd takes the one node's whole GPUs from fake_gpus.conf, UUIDs and all, as from
    AutoDetect (what a plan's ``slurm.env_uuid`` needs on 26.05); not with ``simulate``.
    """
    from gpushare.admin.plan import load_plan
    from gpushare.admin.render import (
        WHOLE_GPU_FEATURE,
        for_installed_slurm,
        render_gres_conf,
        render_topology,
        slurm_node_gres,
        whole_gpu_nodes,
    )
    from gpushare.admin.render_facts import render_facts
    from gpushare.admin.slurm_client import installed_release
    from gpushare.gpu.gresconf import parse_gres_conf
    from gpushare.gpu.inventory import collect, load_nvml
    from gpushare.gpu.nvml_sim_plan import profile_from_plan

    if node_prefix:
        plan_path = renamed_plan(plan_path, node_prefix, root.rstrip("/") + ".plan.yaml")
    plan, _note = for_installed_slurm(load_plan(plan_path), installed_release())
    profiles = profiles or PROFILES
    # Imported here: the bed's own setup needs no gpushare, the plan bed renders with it.
    nodes, inventories = [], {}
    whole = set(whole_gpu_nodes(plan))  # NodeName's Features=, as render slurm-conf says
    for group in plan.groups:
        for name in group.nodes:
            port = port_base + len(nodes) + 1
            features = WHOLE_GPU_FEATURE if name in whole else ""
            if simulate:
                nodes.append(Node(name=name, port=port, gres=slurm_node_gres(group),
                                  features=features, simulated=profile_from_plan(plan, name)))
                continue
            nvml = load_nvml("sim:" + profiles[group.name])
            inventories[name] = collect(nvml, "sim", nvml.mig_minors_text, nvml.device_dir, name)
            nodes.append(Node(name=name, port=port, gres=slurm_node_gres(group),
                              features=features, profile=profiles[group.name]))
    if fake_gpus:
        from gpushare.gpu.nvml_sim import SimNvml, load_profile

        if simulate or len(nodes) != 1:
            raise BedError("fake_gpus.conf is slurmd's for every node: one node, a profile")
        sim = SimNvml(load_profile(nodes[0].profile, device_root=root))
        kwargs.setdefault("fake_gpus", sim.fake_gpus_conf(nodes[0].cpus))
    gres = render_gres_conf(plan, inventories, device_root=os.path.join(root, "dev"))
    files = {f for name in plan.nodes for device in parse_gres_conf(gres).devices(name)
             for f in device.files}
    kwargs.setdefault("ctld_port", port_base)
    kwargs.setdefault("topology_conf", render_topology(plan))
    kwargs.setdefault("topology_plugin", f"topology/{plan.slurm.topology}")
    bed = SlurmBed(root=root, nodes=nodes, gres_conf=gres,  # type: ignore[arg-type]
                   device_files=sorted(files), facts_json=json.dumps(render_facts(plan)),
                   **kwargs)
    bed.plugin_args.setdefault("plan", os.path.join(root, "etc", "plan.yaml"))
    bed.plan_source = plan_path
    return bed


PYTHON_HOOK_BUILD = os.path.join(REPO, "submit_hooks", "build.py")


def build_python_hook(bed: SlurmBed) -> str:
    """job_submit/gpushare compiled against this Slurm and the bed's own copy of the core,
    into <root>/jobsubmit; returns that directory (for slurm.conf's PluginDir)."""
    plugin_dir = bed.path("jobsubmit")
    os.makedirs(plugin_dir, exist_ok=True)
    subprocess.run(["/usr/bin/python3", PYTHON_HOOK_BUILD, "--pythonpath",
                    bed.path("lib", "python"), "--out",
                    os.path.join(plugin_dir, "job_submit_gpushare.so")],
                   check=True, capture_output=True, text=True)
    return plugin_dir


def with_python_hook(bed: SlurmBed) -> SlurmBed:
    """The bed with JobSubmitPlugins=gpushare, built when the bed is prepared."""
    bed.job_submit = "gpushare"
    bed.extra_conf = f"PluginDir=/usr/lib/x86_64-linux-gnu/slurm-wlm:{bed.path('jobsubmit')}"
    prepare = bed.prepare

    def prepare_with_plugin() -> None:
        prepare()
        build_python_hook(bed)

    bed.prepare = prepare_with_plugin  # type: ignore[method-assign]
    return bed


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True,
                          check=True).stdout


def assert_hardened(plugin: str) -> tuple[str, str]:
    """A plugin built as pyxis builds: BIND_NOW, RELRO, no executable stack, stack
    protector and FORTIFY calls. Returns readelf's dynamic section and program headers."""
    dynamic = readelf("-d", plugin)
    assert re.search(r"\(FLAGS\)\s.*\bBIND_NOW\b", dynamic), (plugin, dynamic)
    headers = readelf("-l", plugin)
    assert re.search(r"^\s*GNU_RELRO\s", headers, re.M), (plugin, headers)
    stack = [line.split() for line in headers.splitlines() if "GNU_STACK" in line]
    assert len(stack) == 1 and "E" not in stack[0][6], (plugin, headers)
    symbols = readelf("--dyn-syms", plugin)
    assert "__stack_chk_fail" in symbols, plugin
    assert re.search(r"\b__\w+_chk\b", symbols), (plugin, "no FORTIFY call")
    return dynamic, headers


def uid_of(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


def gid_of(group: str) -> int:
    return grp.getgrnam(group).gr_gid
