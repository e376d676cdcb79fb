# SPDX-License-Identifier: GPL-2.0-or-later
"""What gpushare does for one job on one node: prolog, task environment, epilog.

The SPANK adapter calls these with plain values; nothing here knows about cffi. Errors
are split by who must act:
  * ``NodeError``: the node is wrong (GPUs disagree with Slurm, a daemon cannot be
    stopped). The prolog/epilog fails and Slurm drains the node with the reason.
  * ``UserError``: the request is wrong. The prolog records it and succeeds (a node must
    not be drained for a user's typo); every task of the job then fails with the message.
"""

import contextlib
import fcntl
import os
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional, Sequence

from gpushare.common.log import get_logger
from gpushare.node import counters, ticket
from gpushare.node.config import PluginConfig, beside_slurm_conf
from gpushare.node.mps import MpsDevice, MpsError, MpsManager, MpsUserError, limits_for
from gpushare.node.phases import Phases, doing, time_left
from gpushare.node.state import LOCK_SUFFIX, JobRecord, JobStore

if TYPE_CHECKING:
    from typing import Collection, Iterable

    from gpushare.gpu.inventory import Inventory
    from gpushare.node import inventory_cache
    from gpushare.node.devices import ResolvedDevice
    from gpushare.node.verify import VerifyResult

    ResolvedDevices = list[ResolvedDevice]
else:
    ResolvedDevices = list  # a real annotation: a string one is compiled at every import

log = get_logger("gpushare.job")

SHARE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


class NodeError(RuntimeError):
    """The node cannot run the job correctly; Slurm should drain it.

    ``drain`` asks the caller to drain the node itself with this message as the reason, so
    the sysadmin reads gpushare's words in ``sinfo -R`` rather than Slurm's generic one.
    """

    def __init__(self, message: str, drain: bool = False, brief: str = "") -> None:
        super().__init__(message)
        self.drain = drain
        self.brief = brief or message  # the drain reason: the cause first, short


class UserError(ValueError):
    """The job's request cannot be honoured; the message says what to type instead."""


class JobRequest(NamedTuple):
    """The facts job_prolog has about one job, all from Slurm (env and SPANK items)."""

    job_id: int
    uid: int
    gid: int
    node: str
    gpu_share: Optional[str] = None  # --gpu-share value as the job carries it (user text)
    private_mps: bool = False  # --gpu-mps
    env: Mapping[str, str] = MappingProxyType({})

    @property
    def slurm_gpus(self) -> list[str]:
        return _split(self.env.get("SLURM_JOB_GPUS", ""))

    @property
    def visible_devices(self) -> list[str]:
        return _split(self.env.get("CUDA_VISIBLE_DEVICES", ""))

    @property
    def slurm_share(self) -> Optional[int]:
        """The share Slurm's gres/mps computed for this job, if it is an mps job."""
        value = self.env.get(SHARE_ENV, "")
        return int(value) if value.isdigit() and 1 <= int(value) <= 100 else None


def _split(value: str) -> list[str]:
    return [token for token in value.split(",") if token]


def parse_share(text: str) -> int:
    """Validate ``--gpu-share`` again on the node: the value is user-controlled."""
    # ASCII digits only, as the C glue takes them: str.isdigit also takes other scripts'.
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 100:
        raise UserError(f"--gpu-share={text} is invalid: give a whole percent of one GPU from "
                        "1 to 100, e.g. --gpu-share=25")
    return int(text)


def share_matches(asked: int, granted: int) -> bool:
    """Whether Slurm's percentage for an mps job is ``--gpu-share=asked`` as the submit
    hooks turn it into mps units (``asked * units // 100``), which Slurm turns back into
    ``count * 100 // units``. The node does not know the units per GPU; with 100 or more
    (the plan's default is 100) the round trip gives ``asked`` or ``asked - 1``."""
    return granted in (asked, asked - 1)


def uses_sharing(request: JobRequest) -> bool:
    return request.gpu_share is not None or request.private_mps or request.slurm_share is not None


def plan_job(request: JobRequest, devices: "Sequence[ResolvedDevice]" = ()) -> JobRecord:
    """Decide mode, share and task environment; raise UserError for an impossible request."""
    asked = parse_share(request.gpu_share) if request.gpu_share is not None else None
    granted = request.slurm_share
    gpus = request.slurm_gpus
    if request.private_mps:
        if granted is not None or asked is not None:
            raise UserError("--gpu-mps runs a private MPS daemon over whole GPUs; it cannot be "
                            "combined with a share (--gpu-share or --gres=mps). Ask for "
                            "--gres=gpu:N --gpu-mps, or only a share")
        if not gpus:
            raise UserError("--gpu-mps needs whole GPUs on every node: add --gres=gpu:N")
        mode, share = "private", 100
    else:
        if not gpus:
            raise UserError(f"--gpu-share={request.gpu_share} got no GPU on this node: the "
                            "share was not turned into an MPS request at submit time. Ask "
                            f"--gres=mps:{asked or 100} (or enable gpushare's submit hook)")
        if len(gpus) != 1:
            raise UserError(f"a share runs on one GPU, but Slurm gave {len(gpus)} "
                            f"({','.join(gpus)}); ask whole GPUs with --gres=gpu:N instead")
        if granted is None:
            # The submit hooks refuse a share beside whole GPUs; so does the node.
            raise UserError(f"--gpu-share={request.gpu_share} is a share of one GPU and "
                            "cannot be combined with whole GPUs (--gres=gpu:N); ask for the "
                            "share alone (--gpu-share or --gres=mps), or for whole GPUs alone")
        if asked is not None and not share_matches(asked, granted):
            raise UserError(f"--gpu-share={asked} and the job's --gres=mps ({granted}% of a "
                            f"GPU) ask for different shares; give only one of them, e.g. "
                            f"--gpu-share={asked}")
        share = granted
        mode = "shared"
    record = JobRecord(job_id=request.job_id, uid=request.uid, gid=request.gid,
                       node=request.node, mode=mode, share_percent=share,
                       slurm_gpus=gpus, visible_devices=request.visible_devices,
                       devices=[device.to_dict() for device in devices])
    record.env = task_environment(record)
    return record


def task_environment(record: JobRecord) -> dict[str, str]:
    """The variables every task of the job gets; the MPS lease's take precedence.

    The daemon is started with ``CUDA_VISIBLE_DEVICES=<uuids>`` and numbers its devices
    from 0, so the task sees 0..n-1; ``GPUSHARE_GPUS`` (Slurm's indices on the node) and
    ``GPUSHARE_GPU_UUIDS`` say which devices those are. A task Slurm gave the devices'
    UUIDs (gres.conf ``Flags=env_uuid``, 26.05) keeps them instead: they name the daemon's
    devices too (the C glue's rule, ``gpushare.node.devices.uuid_list``).
    """
    devices = ",".join(str(i) for i in range(len(record.slurm_gpus)))
    # Which of the node's GPUs these are: Slurm tells an mps job's tasks nothing of it.
    env = {"CUDA_VISIBLE_DEVICES": devices, "GPUSHARE_GPUS": ",".join(record.slurm_gpus)}
    uuids = [str(d.get("uuid")) for d in record.devices if d.get("uuid")]
    if uuids:
        env["GPUSHARE_GPU_UUIDS"] = ",".join(uuids)
    env.update(limits_for(record.mode, [record.share_percent]).env(record.mode))
    if record.mps:
        env.update(record.mps.get("env", {}))
    return env


def gres_conf_path(env: Mapping[str, str]) -> str:
    return beside_slurm_conf(env, "gres.conf")


class CheckedDevices(NamedTuple):
    """The job's devices as the check resolved them, and when NVML was asked about them
    (None: not asked, the job needs no check)."""

    devices: ResolvedDevices
    asked: Optional[float] = None
    not_nvidia: bool = False  # a device that is no NVIDIA GPU: the job is left to Slurm


def verify_devices(config: PluginConfig, request: JobRequest,
                   phases: Optional[Phases] = None) -> CheckedDevices:
    """Resolve the job's devices through NVML and check them against Slurm and the plan.

    Sharing needs the devices' UUIDs and memory, so they are resolved even with
    ``verify=off``; only the findings are then ignored. A shared job's check may use the
    layout NVML gave another job at most ``verify_reuse=`` seconds before, and take the
    devices of a clean check done on it for a job like this one
    (``gpushare.node.inventory_cache``); a check that fails on reused facts is done again
    on NVML's own answer. NodeError when strict and wrong.
    """
    wanted = config.verify != "off" or uses_sharing(request)
    if not wanted or not (request.slurm_gpus or request.visible_devices):
        return CheckedDevices([])
    from gpushare.node import inventory_cache
    from gpushare.node.devices import check_key

    phases = phases or Phases()
    source = config.for_node(request.node).inventory
    files = checked_files(config, request.env)
    key = check_key(request.node, request.env)
    # Only a shared GRES's check (verify's mps) can do without processes, so only it reuses.
    reused = (inventory_cache.load(config.state_dir, source, files, config.verify_reuse)
              if request.slurm_share is not None else None)
    known = reused.devices(key) if reused is not None else None
    if reused is not None and known is not None:
        phases.done("check-reused")
        return CheckedDevices(known, reused.asked)
    # Imported here, not at the top: the epilog (and a job that needs no check) never uses
    # them, and every prolog and epilog starts a fresh interpreter.
    from gpushare.gpu.gresconf import GresConfError, load_gres_conf
    from gpushare.gpu.nvml import InventoryError
    from gpushare.node.verify import verify_job_devices

    phases.done("gpu-imports")
    try:
        owner_of = _plan_owners(config, request.node)
        phases.done("plan")
        inventory = _layout(reused)
        if reused is not None and inventory is not None:
            phases.done("nvml-reused")
            result = verify_job_devices(request.env, request.node, load_gres_conf(files[0]),
                                        inventory, owner_of(inventory))
            if result.ok:
                clean = _clean_devices(result)
                if clean:
                    inventory_cache.save_check(config.state_dir, source, reused, key, clean)
                return _checked(config, result, reused.asked)
            log.info("the GPU layout NVML gave %.0f s ago does not pass this job's check; "
                     "asking NVML", time.time() - reused.asked)
        asked = time.time()
        inventory = _ask_nvml(source)
        phases.done("nvml")
        gres = load_gres_conf(files[0])
        phases.done("gres.conf")
        result = verify_job_devices(request.env, request.node, gres, inventory,
                                    owner_of(inventory))
    except (InventoryError, GresConfError, OSError) as err:
        raise NodeError(f"cannot verify the job's GPUs: {err}") from None
    if config.verify_reuse > 0:
        clean = _clean_devices(result) if request.slurm_share is not None else None
        inventory_cache.save(config.state_dir, source, files, inventory, asked,
                             {key: clean} if clean else {})
    return _checked(config, result, asked)


def _layout(reused: "Optional[inventory_cache.Reusable]") -> "Optional[Inventory]":
    """The reused layout; None when there is none, or it is not one this release reads."""
    try:
        return reused.inventory() if reused is not None else None
    except ValueError:
        return None


def _clean_devices(result: "VerifyResult") -> "Optional[list[ResolvedDevice]]":
    """The devices of a check that found nothing at all, for the next shared job like this
    one to take (a warning is said again by each job's own check); None otherwise."""
    return result.devices if result.devices and not result.findings else None


def _ask_nvml(source: str) -> "Inventory":
    from gpushare.gpu.inventory import open_inventory

    return open_inventory(source, topology=False)


def checked_files(config: PluginConfig, env: Mapping[str, str]) -> list[str]:
    """The files a GPU check reads besides NVML (gres.conf first): a reused NVML answer
    and a join ticket stand only while they are unchanged (``gpushare check`` leaves
    NVML's answer stamped with them too)."""
    files = [gres_conf_path(env)]
    if config.plan:
        files.append(config.plan)
    if config.inventory.startswith("sim:"):
        files.append(config.inventory[4:])
    return files


def _plan_owners(config: PluginConfig, node: str
                 ) -> "Callable[[Inventory], Optional[Callable[[str], Optional[str]]]]":
    """``owners(inventory)``: who the plan gives each GPU and slice to (None: no plan)."""
    if not config.plan:
        return lambda inventory: None
    from gpushare.node.ownership import OwnersError, node_owners, owner_lookup

    try:
        planned = node_owners(config.plan, node, config.state_dir)
    except OwnersError as err:
        raise NodeError(str(err)) from None
    return lambda inventory: owner_lookup(planned, inventory)


def _checked(config: PluginConfig, result: "VerifyResult", asked: float) -> CheckedDevices:
    if config.verify == "off":
        return CheckedDevices(result.devices, asked, bool(result.not_nvidia))
    for finding in result.findings:
        log.warning("%s (%s); fix: %s", finding.what, finding.where, finding.fix)
    if not result.ok and config.verify == "strict":
        raise NodeError(result.reason(), drain=True)  # reason(): the cause first already
    return CheckedDevices(result.devices, asked, bool(result.not_nvidia))


def prolog(config: PluginConfig, request: JobRequest,
           phases: Optional[Phases] = None) -> Optional[JobRecord]:
    """Run at job start on each node; returns the record written, if the job shares.
    ``phases`` is told where the time went."""
    phases = phases or Phases()
    sharing = uses_sharing(request)
    doing("checking the GPUs (NVML)")
    checked = verify_devices(config, request, phases)
    devices = checked.devices
    phases.done("verify")
    if sharing and checked.not_nvidia:
        # Nothing is wrong with the node (gres.conf says what the device is), so no drain;
        # MPS cannot run there, so the job runs as without gpushare.
        log.info("a GPU of the job is not an NVIDIA GPU: its share is left to Slurm")
        sharing = False
    if not sharing:
        log.debug("no sharing asked")
        JobStore(config.state_dir).write_unshared(request.job_id)
        return None
    store = JobStore(config.state_dir)
    try:
        record = plan_job(request, devices)
    except UserError as err:
        record = JobRecord(job_id=request.job_id, uid=request.uid, gid=request.gid,
                           node=request.node, mode="error", share_percent=0,
                           slurm_gpus=request.slurm_gpus, error=str(err))
        store.write(record)
        log.info("request refused: %s", err)
        counters.refused(str(err))
        return record
    # The record goes down first, so an epilog always finds what a prolog may have started;
    # the tasks' environment only once the daemon answers.
    store.write(record, tasks=False)
    phases.done("record")
    doing(f"waiting for epilogs on GPU {','.join(record.slurm_gpus)}")
    wait_for_epilogs(config, record.slurm_gpus)
    phases.done("epilogs")
    manager = MpsManager(config)
    try:
        # References of jobs whose epilog never ran go first: their record is gone, or
        # slurmctld no longer runs them here (asked at most every SLURM_CHECK_INTERVAL s).
        doing("giving back shares of ended jobs")
        lost = lost_jobs(config, store, request.node, exclude={record.job_id})
        manager.reap_stale(_alive(store, lost))
        _forget(store, lost)
        phases.done("reap")
        daemon_devices = mps_devices(record, devices)
        doing("starting or joining the MPS daemon")
        lease = manager.acquire(record.job_id, record.uid, record.gid,
                                daemon_devices, mode=record.mode,
                                share_percent=record.share_percent, phases=phases,
                                caps_later=True)
    except MpsUserError as err:
        # What the job's user did to their own daemon: their job fails, the node stays.
        record.mode, record.error = "error", str(err)
        store.write(record)
        log.warning("MPS for job %s refused: %s", record.job_id, err)
        counters.refused(str(err))
        return record
    except MpsError as err:
        raise NodeError(f"MPS for job {record.job_id}: {err}", drain=True,
                        brief=err.brief) from None
    phases.done("mps")
    record.mps = lease.to_record()
    record.env = task_environment(record)
    store.write(record, show=describe(record.env, record.job_id) if config.show else "")
    phases.done("env")
    # The tasks may start now; a join's higher caps follow (until then the old, stricter
    # ones hold the daemon).
    doing("setting the MPS daemon's limits")
    manager.update_caps(lease.key)
    phases.done("caps")
    _write_tickets(config, request, record, manager, lease.key, checked.asked)
    phases.done("ticket")
    log.info("%s MPS, %d%% of GPU %s, daemon %s", record.mode,
             record.share_percent, ",".join(record.slurm_gpus), lease.key)
    return record


def _write_tickets(config: PluginConfig, request: JobRequest, record: JobRecord,
                   manager: MpsManager, key: str, asked: Optional[float]) -> None:
    """Let the C glue join the same user's next shared job like this one to this job's
    daemon by itself, once its caps cover it (the join ticket, ``gpushare.node.ticket``),
    until ``verify_reuse=`` seconds after NVML was ``asked`` about its GPUs."""
    name = ticket.name(request.uid, request.env) if record.mode == "shared" else None
    if name is None or config.verify_reuse <= 0:
        return
    checked = os.path.join(config.state_dir, _SLURM_CHECKED)
    try:
        # Not past the node's next look for lost jobs, which only a worker does.
        until = min((time.time() if asked is None else asked) + config.verify_reuse,
                    os.stat(checked).st_mtime + SLURM_CHECK_INTERVAL)
    except FileNotFoundError:
        return
    files = [*checked_files(config, request.env), checked]
    show = describe(record.env, ticket.JOB_ID_MARK) if config.show else ""
    file_lines = ticket.file_lines(files)
    conditions: dict[str, Any] = {
        "until": until, "share": record.share_percent, "args": config.args,
        "env": request.env, "options": {"gpu-share": request.gpu_share}, "files": file_lines}
    manager.write_ticket(key, record.share_percent, name, lambda daemon, record_stamp:
                         ticket.render(key=key, uid=record.uid, gid=record.gid,
                                       daemon=daemon, record_stamp=record_stamp,
                                       record=record, show=show, **conditions))


def record_failure(config: PluginConfig, job_id: int, uid: int, gid: int, node: str,
                   message: str) -> None:
    """Leave the job's tasks a record that fails them with ``message``; what the prolog
    set up stays recorded (the epilog undoes it)."""
    store = JobStore(config.state_dir)
    record = store.read(job_id)
    if record is None:
        record = JobRecord(job_id=job_id, uid=uid, gid=gid, node=node, mode="error",
                           share_percent=0)
    record.error = message
    store.write(record)


# The epilog barrier (the C glue's gs_hold_epilog_barrier): each epilog worker holds one
# lock per GPU of its job shared, by Slurm's index, or the node's when it cannot tell them.
EPILOGS_LOCK = "epilogs.lock"
GPU_EPILOGS_LOCK = "epilogs.gpu{}.lock"
# One deadline per worker: WORKER_DEADLINE_TIMEOUTS times timeout= (its commands are each
# bounded by timeout=, and it runs a few of them) plus WORKER_DEADLINE_MARGIN seconds. The
# C glue kills a worker still running then (spank/gs_deadline.c) and hands the failure to
# `worker_lost`, which may take FAULT_TIMEOUTS times timeout= more (drain, the scheduler's
# parameters, requeue). A task or an epilog waits for a worker that long and no longer.
# A killed worker is waited for KILL_WAIT seconds at most, out of the fault path's time: one
# stuck in the kernel (NVML in the driver) never dies, and is named in the drain instead.
# spank/build.py hands these names to the C glue.
WORKER_DEADLINE_TIMEOUTS = 4
WORKER_DEADLINE_MARGIN = 5.0
FAULT_TIMEOUTS = 3
KILL_WAIT = 2.0
# A worker's own waits end this much before the deadline, so it says what it waited for.
DEADLINE_SLACK = 1.0


def worker_deadline(config: PluginConfig) -> float:
    """Seconds a prolog's or epilog's worker may run before the C glue kills it."""
    return WORKER_DEADLINE_TIMEOUTS * config.timeout + WORKER_DEADLINE_MARGIN


def wait_limit(config: PluginConfig) -> float:
    """Seconds a task or an epilog waits for a worker: its deadline, then the handling of
    its failure (the C glue's gs_wait_limit uses the same constants)."""
    return worker_deadline(config) + FAULT_TIMEOUTS * config.timeout + WORKER_DEADLINE_MARGIN


def wait_for_epilogs(config: PluginConfig, gpus: "Sequence[str]" = ()) -> None:
    """Wait until the epilogs that began before this prolog on the job's GPUs (Slurm's
    indices) have finished, so that a GPU's daemon of the job before is stopped before this
    job's starts. Epilog workers hold their GPUs' barrier locks shared from before their
    epilog returned to Slurm; epilogs of other GPUs are not waited for."""
    names = [EPILOGS_LOCK] + [GPU_EPILOGS_LOCK.format(int(gpu)) for gpu in gpus
                              if gpu.isdigit()]
    limit = time_left(worker_deadline(config) - DEADLINE_SLACK)
    deadline = time.monotonic() + limit
    for name in names:
        try:
            fd = os.open(os.path.join(config.state_dir, name),
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        log.error("an earlier job's epilog on this node still runs after "
                                  "%.3g s; setting up this job anyway", limit)
                        return
                    time.sleep(0.001)
        finally:
            os.close(fd)  # releases the lock at once


def mps_devices(record: JobRecord, devices: "Sequence[ResolvedDevice]") -> list[MpsDevice]:
    """The job's GPUs or MIG slices as the MPS daemon addresses them (by UUID)."""
    if not devices:
        raise NodeError(f"job {record.job_id}: Slurm gave GPU {','.join(record.slurm_gpus)} "
                        "but NVML resolved none of them; check gres.conf against "
                        "`gpushare inventory`", drain=True)
    return [MpsDevice(uuid=d.uuid, gpu_index=d.gpu_index, memory_total=d.memory_total,
                      label=f"{'MIG slice' if d.is_mig else 'GPU'} {d.slurm_index}",
                      device_files=tuple(d.device_files))
            for d in devices]


def describe(record_env: Mapping[str, str], job_id: "int | str") -> str:
    """One line a user reads in the job's output (``job_id`` may be a join ticket's mark)."""
    parts = [f"CUDA_VISIBLE_DEVICES={record_env.get('CUDA_VISIBLE_DEVICES', '')}"]
    if SHARE_ENV in record_env:
        parts.append(f"{record_env[SHARE_ENV]}% of the GPU's SMs")
    if "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in record_env:
        parts.append(f"pinned memory {record_env['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT']}")
    if "CUDA_MPS_PIPE_DIRECTORY" in record_env:
        parts.append(f"MPS pipe {record_env['CUDA_MPS_PIPE_DIRECTORY']}")
    return f"gpushare: job {job_id}: " + ", ".join(parts)


def epilog(config: PluginConfig, job_id: int, phases: Optional[Phases] = None) -> None:
    """Run at job end on each node; idempotent (twice, or without a prolog, is fine).

    A daemon that cannot be stopped is a NodeError naming the GPU and daemon: Slurm then
    drains the node. The job's record and tasks' file go whatever stops the release (the
    error is still raised, a node fault): left, they would outlive the job, and the next
    prolog's reap drops the daemon reference of a job without a record. The MPS record
    keeps the failure. ``phases`` is told where the time went.
    """
    phases = phases or Phases()
    store = JobStore(config.state_dir)
    try:
        # The lease names the job's daemon: only its record is read (a node may have dozens).
        record = store.read(job_id)
        hint = str(record.mps.get("key", "")) if record and record.mps else None
    except Exception as err:  # only a shortcut: any doubt means looking everywhere
        log.warning("job record unreadable (%s); looking for the job in every MPS record", err)
        hint = None
    phases.done("record")
    doing("leaving or stopping the MPS daemon")
    try:
        stopped = MpsManager(config).release(job_id, hint=hint)
    except MpsError as err:
        _remove_after_failure(store, job_id)
        raise NodeError(str(err), drain=True, brief=err.brief) from None
    except Exception:
        _remove_after_failure(store, job_id)
        raise
    phases.done("mps")
    removed = store.remove(job_id)
    phases.done("remove")
    log.debug("record %s, daemons stopped: %s",
              "removed" if removed else "absent", ", ".join(stopped) or "none")


def _remove_after_failure(store: JobStore, job_id: int) -> None:
    """The job's record and tasks' file, removed after its epilog failed; a removal that
    fails too is logged, so that the epilog's own error is the one reported."""
    try:
        store.remove(job_id)
    except OSError as err:
        log.error("cannot remove job %d's record after its epilog failed: %s", job_id, err)


# How often a prolog asks slurmctld which jobs still run on its node (one squeue). A lost
# epilog is rare; its job's share is given back within this time, or at once by
# `gpushare mps --reap`.
SLURM_CHECK_INTERVAL = 300.0
SLURM_CHECK_TIMEOUT = 2.0  # seconds squeue may take before the prolog goes on without it
_SLURM_CHECKED = "slurm-checked"  # its mtime: when this node last asked


def lost_jobs(config: PluginConfig, store: JobStore, node: str, exclude: "Iterable[int]" = (),
              force: bool = False, squeue: Optional[str] = None) -> set[int]:
    """Jobs with a gpushare record on this node that slurmctld no longer runs here: their
    epilog will never come (slurmd was killed between the job's end and its epilog), or
    could not undo them (a plugstack line or state directory it refused). A job with only
    its tasks' file or lock (``JobStore.leftover_ids``: its prolog failed before its
    record, or it shares nothing) counts too: nothing else would ever remove them.

    The records are listed before slurmctld is asked, so a job starting meanwhile is never
    taken for a lost one. Nothing is lost when slurmctld cannot answer. Without ``force``
    slurmctld is asked at most once per SLURM_CHECK_INTERVAL per node.
    """
    recorded = (set(store.job_ids()) | set(store.leftover_ids())) - set(exclude)
    if not recorded:
        # No other job here, so none is lost: as good as slurmctld's answer, and the date
        # the tickets this prolog leaves need (gpushare.node.ticket).
        _check_due(config.state_dir)
        return set()
    if not (force or _check_due(config.state_dir)):
        return set()
    from gpushare.node import slurm_jobs  # only when asking: most prologs do not

    # Bounded well below timeout=: a prolog must not wait long on a slow slurmctld for an
    # answer that only tidies up; the next interval asks again.
    running = slurm_jobs.jobs_on_node(node, time_left(min(config.timeout, SLURM_CHECK_TIMEOUT)),
                                      squeue or slurm_jobs.SQUEUE)
    if running is None:
        log.warning("cannot ask slurmctld which jobs run on %s (squeue failed): jobs whose "
                    "epilog was lost stay counted until it answers", node)
        return set()
    lost = recorded - running
    for job_id in sorted(lost):
        log.info("job %d has a gpushare record on %s but slurmctld no longer runs it here "
                 "(its epilog was lost): reaping it", job_id, node)
    return lost


def _check_due(state_dir: str) -> bool:
    """True (and the time noted) when this node last asked slurmctld long enough ago."""
    path = os.path.join(state_dir, _SLURM_CHECKED)
    try:
        if time.time() - os.lstat(path).st_mtime < SLURM_CHECK_INTERVAL:
            return False
    except FileNotFoundError:
        pass
    # The state directory is root's (JobStore checked it); O_NOFOLLOW refuses a link.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.utime(fd)
    finally:
        os.close(fd)
    return True


def _alive(store: JobStore, lost: "Collection[int]" = ()) -> Callable[[int], bool]:
    """Whether a job still runs here: its record outlives its epilog, unless slurmctld says
    the job is gone (``lost``). Only the record's presence is asked: each prolog asks it
    for every job on the node."""
    return lambda job_id: job_id not in lost and store.exists(job_id)


def _forget(store: JobStore, lost: "Iterable[int]") -> None:
    """Remove what a lost job's epilog would have: its record and its prolog's lock file."""
    for job_id in lost:
        store.remove(job_id)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(store.path(job_id, LOCK_SUFFIX))


def reap_mps(config: PluginConfig, node: str) -> tuple[list[str], set[int]]:
    """Do now what the node's next shared job's prolog does first: drop MPS references of
    jobs without a record or that slurmctld no longer runs on ``node``, and stop the
    daemons left without jobs (``gpushare mps --reap``); also stop MPS processes whose
    daemon directory has lost its record.

    Returns the keys of the daemons stopped and the lost jobs forgotten; MpsError names
    any daemon that cannot be stopped.
    """
    store = JobStore(config.state_dir)
    lost = lost_jobs(config, store, node, force=True)
    stopped = MpsManager(config).reap_stale(_alive(store, lost), strays=True)
    _forget(store, lost)
    return stopped, lost


def node_name(env: Mapping[str, str]) -> str:
    return env.get("SLURMD_NODENAME") or os.uname().nodename
