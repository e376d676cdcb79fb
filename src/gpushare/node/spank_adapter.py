# SPDX-License-Identifier: GPL-2.0-or-later
"""Thin adapters from the SPANK callbacks (C glue) to the core in ``gpushare.node.job``.

``bind`` is called once per process by the embedded init code with cffi's ``ffi``/``lib``;
``dispatch`` gets the callback's name and the host calls the plugin lends (struct
gs_host), runs the core and turns the outcome into a SPANK return code. The configuration
is parsed once per process.
"""

from __future__ import annotations

import time

_IMPORTS_BEGAN = time.monotonic()  # first: this module's imports are the worker's imports

import gc  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

from gpushare.common import log as gslog  # noqa: E402
from gpushare.node import counters, job  # noqa: E402
from gpushare.node import phases as deadline  # noqa: E402
from gpushare.node.config import ConfigError, PluginConfig, parse_plugin_args  # noqa: E402
from gpushare.node.phases import Phases  # noqa: E402
from gpushare.node.request import JobRequest  # noqa: E402
from gpushare.node.state import ENV_SUFFIX, LOCK_SUFFIX, JobStore  # noqa: E402

_IMPORT_SECONDS: Optional[float] = time.monotonic() - _IMPORTS_BEGAN  # given to one callback

logger = gslog.get_logger("gpushare.spank")

_ffi: Any = None
_host: Any = None  # the plugin's struct gs_host of the callback running now
_config: Optional[PluginConfig] = None


def bind(ffi: Any, lib: Any) -> None:
    """Called once per process by the embedded init code."""
    global _ffi
    _ffi = ffi
    gslog.install(_to_slurm)


def _to_slurm(level: int, text: str) -> None:
    """Log through the plugin (slurm_error & co.), while a callback runs."""
    if _host is not None:
        _host.log(level, text.encode("utf-8", "replace"))


class Spank:
    """The SPANK handle of one callback, with the few calls the core needs."""

    def __init__(self, host: Any) -> None:
        self.host = host

    def ids(self) -> tuple[int, int, int]:
        job_id, uid, gid = (_ffi.new("uint32_t *") for _ in range(3))
        if self.host.job_ids(self.host.sp, job_id, uid, gid) != 0:
            raise RuntimeError("spank_get_item(S_JOB_ID/UID/GID) failed")
        return int(job_id[0]), int(uid[0]), int(gid[0])

    def option(self, name: str) -> Optional[str]:
        value = self.host.getopt(self.host.sp, name.encode())
        return None if value == _ffi.NULL else _ffi.string(value).decode("utf-8", "replace")


class SnapshotSpank(Spank):
    """A worker's SPANK handle as its C glue read it, for a callback run in a child of
    the prefork server (``gpushare.node.prefork``), where no handle is."""

    def __init__(self, host: Any, ids: tuple[int, int, int], options: dict[str, str]) -> None:
        super().__init__(host)
        self._ids = ids
        self._options = options

    def ids(self) -> tuple[int, int, int]:
        return self._ids

    def option(self, name: str) -> Optional[str]:
        return self._options.get(name)


def configure(args: list[str]) -> PluginConfig:
    global _config
    if _config is None:
        parsed = parse_plugin_args(args)  # its ConfigError names the argument already
        try:
            _config = parsed.for_node(job.node_name(os.environ))
        except ValueError as err:
            raise ConfigError(f"plugstack path arguments: {err}") from None
        gslog.install(_to_slurm, _config.debug_log)
    return _config


def _phases() -> Phases:
    """A timer for this callback; the first of the process also reports the imports."""
    global _IMPORT_SECONDS
    phases, _IMPORT_SECONDS = Phases(_IMPORT_SECONDS), None
    return phases


def host_seconds_left(host: Any, bound: float) -> float:
    """Seconds until the deadline at which the C glue kills this process (struct gs_host's
    ``deadline``, on time.monotonic's clock), or ``bound`` when it set none: the one
    deadline every wait of this callback takes its time from."""
    at = float(getattr(host, "deadline", 0.0) or 0.0)
    return bound if at <= 0 else max(0.0, at - time.monotonic())


def _start(config: PluginConfig, job_id: int, host: Any) -> None:
    """This worker's deadline, and the job's lock file to say what it does."""
    deadline.start(host_seconds_left(host, job.worker_deadline(config)) - job.DEADLINE_SLACK,
                   JobStore(config.state_dir).path(job_id, LOCK_SUFFIX))


def job_prolog(spank: Spank, config: PluginConfig) -> int:
    phases = _phases()
    job_id, uid, gid = spank.ids()
    _start(config, job_id, spank.host)
    request = JobRequest(job_id=job_id, uid=uid, gid=gid, node=job.node_name(os.environ),
                         gpu_share=spank.option("gpu-share"),
                         private_mps=spank.option("gpu-mps") is not None,
                         env=dict(os.environ))
    job.prolog(config, request, phases)
    logger.debug("%s", phases.line())
    return 0


def job_epilog(spank: Spank, config: PluginConfig) -> int:
    phases = _phases()
    job_id, _uid, _gid = spank.ids()
    _start(config, job_id, spank.host)
    job.epilog(config, job_id, phases)
    logger.debug("%s", phases.line())
    return 0


def worker_lost(callback: str, spank: Spank, config: PluginConfig) -> int:
    """The C glue killed ``callback``'s worker at its deadline, or found it killed
    (spank/gs_deadline.c), and wrote why into the job's lock file: a node fault. The node
    is drained with that cause; a prolog's batch job is requeued and its tasks told, as
    for any node fault, unless they already had their word (the worker hung after it) or
    the job's epilog has undone the job already (it removed the job's lock file, which the
    prolog made first): a record written then would outlive the job. Its commands (drain,
    the scheduler's parameters, requeue) take the time left of the supervisor's deadline."""
    fault_limit = job.FAULT_TIMEOUTS * config.timeout + job.WORKER_DEADLINE_MARGIN
    deadline.start(host_seconds_left(spank.host, fault_limit) - job.DEADLINE_SLACK)
    job_id = _job_id(spank)
    store = JobStore(config.state_dir)
    undone = False
    try:
        with open(store.path(job_id, LOCK_SUFFIX), "rb") as board:
            reason = board.read(deadline.BOARD_SIZE).decode("utf-8", "replace").strip()
    except FileNotFoundError:
        undone, reason = True, ""
    except OSError:
        reason = ""
    reason = reason or f"the {callback.replace('_', ' ')}'s worker was killed"
    if " timed out " in reason:
        counters.timed_out("worker")
    counters.failed(callback, reason)
    logger.error("%s: %s", callback, reason)
    if undone:
        logger.warning("%s: the job's epilog has undone the job already: no record for its "
                       "tasks, no requeue", callback)
    told = callback == "job_prolog" and _tasks_told(store, job_id)
    if told or undone:
        _drain(reason, config)
    else:
        _failed(callback, spank, config, reason, reason)
    return 0  # handled (counted as the callback's failure): the C glue does no more


def _tasks_told(store: JobStore, job_id: int) -> bool:
    """Whether the job's tasks already have their environment file without an error."""
    try:
        with open(store.path(job_id, ENV_SUFFIX), "rb") as env:
            return not env.read(64).startswith(b"#error=")
    except OSError:
        return False


CALLBACKS: dict[str, Callable[[Spank, PluginConfig], int]] = {
    "job_prolog": job_prolog,
    "job_epilog": job_epilog,
    "job_prolog_worker_lost": lambda spank, config: worker_lost("job_prolog", spank, config),
    "job_epilog_worker_lost": lambda spank, config: worker_lost("job_epilog", spank, config),
}


def run_prefork_request(request: Any, host: Any) -> int:
    """One callback a worker handed the prefork server (``gpushare.node.prefork.Request``),
    in the server's child: as ``dispatch`` runs it in a worker of its own, less the
    imports, which the server made once."""
    global _IMPORT_SECONDS
    _IMPORT_SECONDS = None
    spank = SnapshotSpank(host, (request.job_id, request.uid, request.gid), request.options)
    return dispatch(request.callback, host, request.args, spank)


def spawn_prefork(state_dir: str, code: str) -> None:
    """Fork the node's prefork server off this worker's interpreter (``prefork=yes``)."""
    from gpushare.node import prefork

    prefork.spawn(state_dir, code, run_prefork_request)


def dispatch(name: str, host: Any, args: list[str], spank: Optional[Spank] = None) -> int:
    """Run one callback; node problems and internal errors are logged and return -1.

    The cyclic garbage collector waits until the callback is done: a callback makes few
    cycles and lasts milliseconds (its process, the job's prolog or epilog, ends with it),
    while the collections its imports would trigger cost about a tenth of its time."""
    global _host
    _host = host
    collecting = gc.isenabled()
    gc.disable()
    counters.begin()
    try:
        return counters.count(name, _dispatch(name, spank or Spank(host), args), _config)
    finally:
        _host = None
        if collecting:
            gc.enable()


def _dispatch(name: str, spank: Spank, args: list[str]) -> int:
    try:
        config = configure(args)
    except ConfigError as err:
        logger.error("%s; fix the gpushare line in plugstack.conf", err)
        _failed(name, spank, None, "bad gpushare line in plugstack.conf",
                "the node's gpushare configuration is wrong")
        return -1
    callback = CALLBACKS.get(name)
    if callback is None:
        logger.error("no handler for SPANK callback %s", name)
        return -1
    gslog.set_job(_job_id(spank))
    try:
        return callback(spank, config)
    except Exception as err:
        return _sorted_failure(name, spank, config, err)
    finally:
        # No Python thread may outlive a callback: a thread holding the GIL across
        # slurmstepd's fork() hangs every task. Threads start through `threading`; when
        # nothing imported it, there is only this one.
        threading = sys.modules.get("threading")
        logger.debug("%s done, threads=%d", name, threading.active_count() if threading else 1)


def _sorted_failure(name: str, spank: Spank, config: PluginConfig,
                    err: Exception) -> int:
    """Do what the failure's cause calls for (``gpushare.node.faults``): a user's fault
    fails their job and leaves the node in service; a node's drains it and, for a prolog,
    requeues the job as Slurm would."""
    from gpushare.node import faults  # only on this rare path

    fault = faults.classify(name, err, config.state_dir)
    if fault.who == faults.USER:
        logger.warning("%s: the job's own doing, the node stays in service: %s", name,
                       fault.detail)
        counters.refused(fault.counted)
        if name == "job_prolog":
            _record(spank, config, f"this job cannot run on node "
                    f"{job.node_name(os.environ)}: {fault.detail}")
        return 0
    if fault.counted or isinstance(err, job.NodeError):
        logger.error("%s: %s", name, fault.detail)
    else:
        logger.exception("%s: %s", name, fault.brief)
    counters.failed(name, fault.counted)
    _failed(name, spank, config, fault.brief, fault.detail)
    return -1


def state_dir_full(config: PluginConfig, err: BaseException) -> str:
    """``gpushare.node.faults.state_dir_full`` for ``config``'s state directory."""
    from gpushare.node import faults

    return faults.state_dir_full(config.state_dir, err)


def _failed(name: str, spank: Spank, config: Optional[PluginConfig], reason: str,
            detail: str) -> None:
    """What Slurm did for a failing prolog or epilog when it waited for them, gpushare now
    does: they run in a worker Slurm does not wait for. The node is drained with the cause;
    a prolog's batch job is requeued as Slurm requeues one after a failing prolog (held
    unless ``nohold_on_prolog_fail``, never against ``--no-requeue`` or ``JobRequeue=0``),
    and its tasks get a record that fails them with the cause."""
    _drain(reason, config)
    if name != "job_prolog" or config is None:
        return
    node = job.node_name(os.environ)
    job_id = _job_id(spank)
    requeued, why = _requeue(job_id, config)
    if requeued == "held":
        then = (f"the job was requeued and held, as Slurm holds a job whose prolog failed: "
                f"`scontrol release {job_id}` runs it on another node")
    elif requeued:
        then = "the job was requeued to run on another node"
    else:
        logger.info("job %d not requeued: %s", job_id, why)
        then = "submit the job again"
    _record(spank, config, f"could not set up this job on node {node}: "
            f"{detail.removeprefix('gpushare: ')}. The node was drained; {then}")


def _record(spank: Spank, config: PluginConfig, message: str) -> None:
    """Leave the job's tasks a record that fails them with ``message``."""
    try:
        job_id, uid, gid = spank.ids()
        job.record_failure(config, job_id, uid, gid, job.node_name(os.environ), message)
    except Exception as err:  # the tasks time out waiting instead
        logger.error("cannot record the failure for the job's tasks: %s", err)


def _requeue(job_id: int, config: PluginConfig) -> tuple[str, Optional[str]]:
    """Requeue the job whose prolog failed here (``gpushare.node.drain.requeue_job``)."""
    from gpushare.node.drain import requeue_job  # only on this rare path

    if not job_id:
        return "", "no job id"
    return requeue_job(job_id, timeout=config.timeout)


def _drain(reason: str, config: Optional[PluginConfig]) -> None:
    """Drain this node with gpushare's reason, the cause first."""
    from gpushare.node.drain import drain_node, fit_reason  # only on this rare path

    timeout = config.timeout if config else PluginConfig().timeout
    failure = drain_node(job.node_name(os.environ), fit_reason(reason),
                         timeout=timeout)
    if failure:
        logger.error("could not drain the node: %s", failure)


def _job_id(spank: Spank) -> int:
    try:
        return spank.ids()[0]
    except RuntimeError:
        return 0
