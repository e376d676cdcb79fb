# SPDX-License-Identifier: GPL-2.0-or-later
"""Check, at job start, that the devices Slurm gave a job are what Slurm believes they are.

Slurm names a job's devices by its own GRES indices (``SLURM_JOB_GPUS``, indices even with
26.05's gres.conf ``Flags=env_uuid``; integer ``CUDA_VISIBLE_DEVICES`` in the prolog) or by
``GPU-``/``MIG-`` UUIDs (the prolog's ``CUDA_VISIBLE_DEVICES`` wherever slurmd learnt the
device's UUID: AutoDetect, or fake_gpus.conf in a test bed). Both are checked against each
other. Each is resolved through gres.conf's device files to NVML:
``/dev/nvidia<N>`` is the GPU with minor N, ``/dev/nvidia-caps/nvidia-cap<M>`` the MIG slice
whose GI/CI capability has minor M. Then: the device exists; a slice's profile is the type
Slurm allocated; a GPU handed out whole is not in MIG mode; the plan does not give it to
someone other than Slurm; no process outside the job uses it.

A pure function of its inputs: the caller reads the environment, gres.conf and NVML.
"""

import os
import re
from collections.abc import Collection, Mapping
from typing import Callable, NamedTuple, Optional

from gpushare.gpu.gresconf import GresConf, GresDevice
from gpushare.gpu.inventory import Gpu, Inventory, MigDevice
from gpushare.node.devices import ResolvedDevice, gres_name_of, is_uuid

__all__ = ["ERROR", "WARNING", "Finding", "ResolvedDevice", "VerifyResult",
           "profile_of_gres_type", "verify_job_devices"]

ERROR = "error"
WARNING = "warning"

_PROFILE_IN_TYPE = re.compile(r"(?:^|_)((?:\d+c\.)?\d+g\.\d+gb(?:\+[a-z]+)*)$", re.IGNORECASE)
_GPU_FILE = re.compile(r"^nvidia(\d+)$")
_CAP_FILE = re.compile(r"^nvidia-cap(\d+)$")
_SHARED = ("mps", "shard")


class Finding(NamedTuple):
    """One disagreement: what is wrong, where, and how to fix it (the job-start check
    here, ``gpushare check`` in gpushare.admin.check)."""

    severity: str  # ERROR | WARNING
    what: str
    where: str
    fix: str
    brief: str = ""  # ``what`` with the disagreement first and no file list, when they differ

    def to_dict(self) -> dict[str, str]:
        """As ``gpushare check --json`` prints it."""
        return {"severity": self.severity, "what": self.what, "where": self.where,
                "fix": self.fix}

    def reason(self) -> str:
        """One line, fit for a Slurm drain reason (cut at ~100 characters) or a prolog
        failure message: what disagrees comes first, identifiers last."""
        return "gpushare: " + " ".join((self.brief or self.what).split())


class VerifyResult(NamedTuple):
    devices: list[ResolvedDevice]
    findings: list[Finding]
    # Slurm indices of the job's devices that are no NVIDIA GPU: gpushare leaves them to Slurm.
    not_nvidia: list[int]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors

    def reason(self) -> str:
        """The first error's one-line reason ("" when there is none)."""
        return self.errors[0].reason() if self.errors else ""


def profile_of_gres_type(gres_type: str) -> str:
    """The MIG profile a GRES type names: ``nvidia_a100_1g.10gb`` or ``1g.10gb`` → ``1g.10gb``."""
    match = _PROFILE_IN_TYPE.search(gres_type)
    return match.group(1).lower() if match else ""


def _label(dev: GresDevice) -> str:
    kind = f"{dev.name}:{dev.type}" if dev.type else dev.name
    return f"GRES {kind} index {dev.slurm_index} ({','.join(dev.files) or 'no device file'})"


def _short_label(dev: GresDevice) -> str:
    kind = f"{dev.name}:{dev.type}" if dev.type else dev.name
    return f"GRES {kind} index {dev.slurm_index}"


def _where(node: str, conf: GresConf, dev: Optional[GresDevice]) -> str:
    if dev is None:
        return f"node {node}, job environment"
    if dev.line == 0:
        return f"node {node}, {conf.path} (AutoDetect)"
    return f"node {node}, {conf.path}:{dev.line}"


def _resolved(slurm_index: int, name: str, gres_type: str, gpu: Gpu,
              mig: Optional[MigDevice]) -> ResolvedDevice:
    if mig is None:
        return ResolvedDevice(slurm_index, name, gres_type, gpu.uuid, gpu.uuid, gpu.nvml_index,
                              gpu.minor, False, gpu.memory_total, "", [gpu.device_file])
    return ResolvedDevice(slurm_index, name, gres_type, mig.uuid, gpu.uuid, gpu.nvml_index,
                          gpu.minor, True, mig.memory_total, mig.profile,
                          [gpu.device_file, *mig.caps_files])


class _Verifier:
    def __init__(self, node: str, conf: GresConf, inventory: Inventory,
                 owner: Optional[Callable[[str], Optional[str]]], job_pids: Collection[int],
                 gres_name: str) -> None:
        self.node = node
        self.conf = conf
        self.inventory = inventory
        self.owner = owner
        self.job_pids = set(job_pids)
        self.gres_name = gres_name
        self.result = VerifyResult([], [], [])

    def error(self, what: str, where: str, fix: str, severity: str = ERROR,
              brief: str = "") -> None:
        self.result.findings.append(Finding(severity, what, where, fix, brief))

    def resolve_files(self, dev: GresDevice) -> Optional[tuple[Gpu, Optional[MigDevice]]]:
        """Map a GRES device's files to the GPU (and MIG slice) NVML knows by those minors."""
        where = _where(self.node, self.conf, dev)
        names = [os.path.basename(f) for f in dev.files]
        gpu_minors = sorted({int(m.group(1)) for m in map(_GPU_FILE.match, names) if m})
        caps = {int(m.group(1)) for m in map(_CAP_FILE.match, names) if m}
        if names and not any(name.startswith("nvidia") for name in names):
            self.not_nvidia(dev, where)
            return None
        if len(gpu_minors) != 1:
            self.error(f"{_label(dev)} names {len(gpu_minors)} GPU device files "
                       "(/dev/nvidiaN); a GRES device must name exactly one GPU", where,
                       "give each GPU its own File= entry, and each MIG slice one "
                       "MultipleFiles= record with its GPU and two nvidia-cap files")
            return None
        gpu = self.inventory.gpu_by_minor(gpu_minors[0])
        if gpu is None:
            known = ", ".join(f"/dev/nvidia{g.minor}" for g in self.inventory.gpus) or "none"
            self.error(f"{_label(dev)}: no GPU with minor {gpu_minors[0]} on this node per "
                       f"NVML (GPUs: {known})", where,
                       "fix gres.conf's File= to the node's real /dev/nvidiaN files "
                       "(gpushare inventory lists them)")
            return None
        if not caps:
            return gpu, None
        for mig in gpu.mig_devices:
            mig_caps = {int(m.group(1)) for m in (
                _CAP_FILE.match(os.path.basename(f)) for f in mig.caps_files) if m}
            if mig_caps == caps:
                return gpu, mig
        if not gpu.mig_current:
            self.error(f"{_label(dev)} is a MIG slice to Slurm but GPU {gpu.nvml_index} "
                       f"({gpu.uuid}) is not in MIG mode per NVML", where,
                       "enable MIG and create the slices in the plan's layout, or describe "
                       "the GPU as a whole gpu (File=/dev/nvidiaN) in gres.conf")
        else:
            self.error(f"{_label(dev)}: no MIG slice on GPU {gpu.nvml_index} ({gpu.uuid}) has "
                       "these nvidia-cap files per NVML and mig-minors", where,
                       "regenerate gres.conf from the node's MIG layout "
                       "(gpushare render gres) or recreate the missing slice")
        return None

    def not_nvidia(self, dev: GresDevice, where: str) -> None:
        """A GRES device with no NVIDIA file at all (another vendor's GPU, or Slurm's own
        test layout ``File=/dev/tty0``): nothing NVML can say about it, and nothing wrong with
        the node either, as gres.conf says what it is. Whole or shared, the job is left to
        Slurm, with a warning: MPS cannot run on such a device, so a share runs as Slurm runs
        it."""
        self.result.not_nvidia.append(dev.slurm_index)
        if dev.name in _SHARED:
            self.error(f"{_label(dev)} is not an NVIDIA GPU (no /dev/nvidiaN file), so gpushare "
                       "cannot run MPS on it and leaves the job's share to Slurm", where,
                       "nothing if it is another kind of device; if it is an NVIDIA GPU, give "
                       f"gres/{dev.name} the same File=/dev/nvidiaN as the node's gres/gpu",
                       severity=WARNING)
        else:
            self.error(f"{_label(dev)} is not an NVIDIA GPU (no /dev/nvidiaN file); gpushare "
                       "neither verifies nor shares it", where,
                       "nothing if it is another kind of device; if it is an NVIDIA GPU, name "
                       "its /dev/nvidiaN file in gres.conf", severity=WARNING)

    def check_device(self, dev: Optional[GresDevice], gpu: Gpu,
                     mig: Optional[MigDevice]) -> None:
        where = _where(self.node, self.conf, dev)
        label = _label(dev) if dev is not None else "CUDA_VISIBLE_DEVICES device"
        short = _short_label(dev) if dev is not None else label
        gres_type = dev.type if dev is not None else ""
        wanted = profile_of_gres_type(gres_type)
        if mig is not None:
            if wanted and wanted != mig.profile.lower():
                self.error(f"{label} is MIG {mig.profile} on GPU {gpu.nvml_index} ({mig.uuid}) "
                           f"per NVML, not {wanted}", where,
                           f"make gres.conf's Type= for this slice {mig.profile} (or recreate "
                           f"the slice as {wanted}) so Slurm and the GPU agree",
                           brief=f"{short} is MIG {mig.profile} per NVML, not {wanted} (GPU "
                           f"{gpu.nvml_index}, {mig.uuid})")
        else:
            if wanted:
                self.error(f"{label} is a whole GPU {gpu.nvml_index} ({gpu.uuid}) per NVML, not "
                           f"a MIG {wanted} slice", where,
                           "create the MIG slices the plan describes, or change gres.conf's "
                           "Type= to a whole-GPU type")
            elif gpu.mig_current:
                self.error(f"{label} is handed out as a whole GPU but GPU {gpu.nvml_index} "
                           f"({gpu.uuid}) is in MIG mode per NVML", where,
                           "describe its MIG slices in gres.conf (MultipleFiles=), or disable "
                           "MIG on it")
            elif gpu.mig_pending:
                self.error(f"{label}: GPU {gpu.nvml_index} ({gpu.uuid}) has MIG mode enable "
                           "pending; the next GPU reset will partition it", where,
                           "finish the MIG change (reset the GPU while it is drained) or "
                           "cancel it (nvidia-smi -i N -mig 0)", severity=WARNING)
        uuid = mig.uuid if mig is not None else gpu.uuid
        if self.owner is not None:
            # A slice has its own owner: its GPU may be "mixed" (slices of Slurm and
            # Kubernetes side by side), which says nothing about this slice.
            owner = self.owner(uuid)
            if owner is None and mig is not None and self.owner(gpu.uuid) != "mixed":
                owner = self.owner(gpu.uuid)  # a slice the plan does not tell apart
            if owner not in (None, "slurm"):
                self.error(f"{label} ({uuid}) belongs to {owner} in the ownership plan, not "
                           "to slurm", where,
                           "remove it from Slurm's gres.conf (gpushare render gres) or give "
                           "it to slurm in the plan",
                           brief=f"{short} belongs to {owner} in the ownership plan, not to "
                           f"slurm ({uuid})")
        if self.gres_name not in _SHARED:  # sharing GRES expect other jobs on the device
            procs = list(mig.processes if mig is not None else gpu.processes)
            if mig is not None:
                procs = procs + [p for p in gpu.processes if p.gi_id == mig.gi_id]
            foreign = sorted({p.pid for p in procs if p.pid not in self.job_pids})
            if foreign:
                self.error(f"{label} ({uuid}) is in use by process(es) "
                           f"{','.join(map(str, foreign))} outside this job per NVML", where,
                           "find them with nvidia-smi and stop them (or give the device to "
                           "whoever runs them in the plan); drain the node meanwhile",
                           brief=f"{short} is in use by process(es) "
                           f"{','.join(map(str, foreign))} outside this job per NVML ({uuid})")

    def uuid_target(self, token: str) -> Optional[tuple[Gpu, Optional[MigDevice]]]:
        if token.startswith("MIG-"):
            found = self.inventory.mig_by_uuid(token)
            return found if found else None
        gpu = self.inventory.gpu_by_uuid(token)
        return (gpu, None) if gpu else None

    def run(self, env: Mapping[str, str]) -> VerifyResult:
        devices = self.conf.devices(self.node, self.gres_name, self.inventory)
        where_env = _where(self.node, self.conf, None)
        job_gpus = env.get("SLURM_JOB_GPUS", "").strip()
        cvd = [t.strip() for t in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if t.strip()]
        indices: list[int] = []
        for token in filter(None, (t.strip() for t in job_gpus.split(","))):
            if not token.isdigit():
                self.error(f"SLURM_JOB_GPUS={job_gpus} holds {token!r}, not a GRES index",
                           where_env, "this Slurm sets SLURM_JOB_GPUS differently from what "
                           "gpushare expects; report it with the Slurm version")
                return self.result
            indices.append(int(token))
        int_tokens = [int(t) for t in cvd if t.isdigit()]
        uuid_tokens = [t for t in cvd if not t.isdigit()]
        if not indices and int_tokens:
            indices = int_tokens  # the prolog's integer CUDA_VISIBLE_DEVICES are GRES indices
        elif indices and int_tokens and sorted(int_tokens) != sorted(indices):
            self.error(f"CUDA_VISIBLE_DEVICES={','.join(cvd)} disagrees with "
                       f"SLURM_JOB_GPUS={job_gpus}", where_env,
                       "check gres.conf Flags= (env flags) and that slurmd runs with this "
                       "gres.conf")
        for token in uuid_tokens:
            if not is_uuid(token):
                self.error(f"CUDA_VISIBLE_DEVICES holds {token!r}, neither an index nor a "
                           "GPU-/MIG- UUID", where_env,
                           "set CUDA_VISIBLE_DEVICES only through Slurm's GRES")
        uuid_tokens = [t for t in uuid_tokens if is_uuid(t)]
        if indices and uuid_tokens and len(uuid_tokens) != len(indices):
            self.error(f"CUDA_VISIBLE_DEVICES names {len(uuid_tokens)} device(s) but "
                       f"SLURM_JOB_GPUS={job_gpus} names {len(indices)}", where_env,
                       "check that slurmd runs with this gres.conf")
        resolved_uuids: list[str] = []
        for index in indices:
            if not 0 <= index < len(devices):
                self.error(f"Slurm gave the job {self.gres_name} index {index} but "
                           f"{self.conf.path} describes {len(devices)} {self.gres_name} "
                           f"device(s) for node {self.node}", where_env,
                           "make gres.conf match the node's GRES in slurm.conf and restart "
                           "slurmd")
                continue
            dev = devices[index]
            target = self.resolve_files(dev)
            if target is None:
                continue
            gpu, mig = target
            self.check_device(dev, gpu, mig)
            device = _resolved(index, dev.name, dev.type, gpu, mig)
            self.result.devices.append(device)
            resolved_uuids.append(device.uuid)
        for token in uuid_tokens:
            target = self.uuid_target(token)
            if target is None:
                self.error(f"CUDA_VISIBLE_DEVICES names {token}, which is not on this node "
                           "per NVML", where_env,
                           "the slice or GPU was destroyed or renamed since slurmd started; "
                           "restart slurmd after MIG changes")
            elif not indices:
                gpu, mig = target
                self.check_device(None, gpu, mig)
                self.result.devices.append(_resolved(-1, self.gres_name, "", gpu, mig))
            elif token not in resolved_uuids:
                self.error(f"CUDA_VISIBLE_DEVICES names {token} but gres.conf maps "
                           f"SLURM_JOB_GPUS={job_gpus} to "
                           f"{','.join(resolved_uuids) or 'no device'} per NVML", where_env,
                           "regenerate gres.conf from the node's layout and restart slurmd")
        return self.result


def verify_job_devices(
    env: Mapping[str, str],
    node: str,
    gres_conf: GresConf,
    inventory: Inventory,
    owner: Optional[Callable[[str], Optional[str]]] = None,
    job_pids: Collection[int] = (),
    gres_name: Optional[str] = None,
) -> VerifyResult:
    """Resolve and check every device Slurm gave the job on ``node``.

    ``gres_name`` is the GRES the job holds on the node (gpu, mps or shard); by default mps
    when Slurm set ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, else gpu. ``owner(uuid)`` returns who
    the ownership plan gives a GPU or slice to ("slurm", "kubernetes", ...; None: no plan).
    """
    return _Verifier(node, gres_conf, inventory, owner, job_pids,
                     gres_name or gres_name_of(env)).run(env)
