# SPDX-License-Identifier: GPL-2.0-or-later
"""What gpushare does for one job on one node: prolog, task environment, epilog.

The SPANK adapter calls these with plain values; nothing here knows about cffi. Errors
are split by who must act:
  * ``NodeError``: the node is wrong (GPUs disagree with Slurm, a daemon cannot be
    stopped). The prolog/epilog fails and Slurm drains the node with the reason.
  * ``UserError``: the request is wrong. The prolog records it and succeeds (a node must
    not be drained for a user's typo); every task of the job then fails with the message.
"""

import fcntl
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional, Sequence

from gpushare.common.log import get_logger
from gpushare.node import counters, ticket
from gpushare.node.config import PluginConfig, beside_slurm_conf
from gpushare.node.mps import MpsDevice, MpsError, MpsManager, MpsUserError
from gpushare.node.phases import Phases, doing, time_left
from gpushare.node.reaper import SLURM_CHECK_INTERVAL, SLURM_CHECKED, alive, forget, lost_jobs
from gpushare.node.request import (
    SHARE_ENV,
    JobRequest,
    UserError,
    plan_job,
    task_environment,
    uses_sharing,
)
from gpushare.node.state import USAGE_DIR, JobRecord, JobStore

if TYPE_CHECKING:

    from gpushare.gpu.inventory import Inventory
    from gpushare.node import inventory_cache
    from gpushare.node.devices import ResolvedDevice
    from gpushare.node.verify import VerifyResult

    ResolvedDevices = list[ResolvedDevice]
else:
    ResolvedDevices = list  # a real annotation: a string one is compiled at every import

log = get_logger("gpushare.job")

class NodeError(RuntimeError):
    """The node cannot run the job correctly; Slurm should drain it.

    ``drain`` asks the caller to drain the node itself with this message as the reason, so
    the sysadmin reads gpushare's words in ``sinfo -R`` rather than Slurm's generic one.
    """

    def __init__(self, message: str, drain: bool = False, brief: str = "") -> None:
        super().__init__(message)
        self.drain = drain
        self.brief = brief or message  # the drain reason: the cause first, short


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
        manager.reap_stale(alive(store, lost))
        forget(store, lost)
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
    checked = os.path.join(config.state_dir, SLURM_CHECKED)
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
    _record_usage(config, job_id)
    phases.done("usage")
    log.debug("record %s, daemons stopped: %s",
              "removed" if removed else "absent", ", ".join(stopped) or "none")


def _record_usage(config: PluginConfig, job_id: int) -> None:
    """The job's GPU use into its AdminComment and slurmd's log, when the node's sampler
    kept figures for it (only then is anything imported or asked); never fails the
    epilog."""
    if not os.path.exists(os.path.join(config.state_dir, USAGE_DIR, f"{job_id}.json")):
        return
    try:
        from gpushare.node.usage.summary import record_end

        record_end(config.state_dir, job_id)
    except Exception as err:  # the job's end is recorded without it
        log.warning("job %d: its GPU use is not recorded: %s", job_id, err)


def _remove_after_failure(store: JobStore, job_id: int) -> None:
    """The job's record and tasks' file, removed after its epilog failed; a removal that
    fails too is logged, so that the epilog's own error is the one reported."""
    try:
        store.remove(job_id)
    except OSError as err:
        log.error("cannot remove job %d's record after its epilog failed: %s", job_id, err)


def node_name(env: Mapping[str, str]) -> str:
    return env.get("SLURMD_NODENAME") or os.uname().nodename
