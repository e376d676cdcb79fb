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
from gpushare.node.config import ConfigError, PluginConfig, parse_plugin_args  # noqa: E402
from gpushare.node.phases import Phases  # noqa: E402

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


def configure(args: list[str]) -> PluginConfig:
    global _config
    if _config is None:
        try:
            _config = parse_plugin_args(args).for_node(job.node_name(os.environ))
        except ValueError as err:
            raise ConfigError(f"plugstack path arguments: {err}") from None
        gslog.install(_to_slurm, _config.debug_log)
    return _config


def _phases() -> Phases:
    """A timer for this callback; the first of the process also reports the imports."""
    global _IMPORT_SECONDS
    phases, _IMPORT_SECONDS = Phases(_IMPORT_SECONDS), None
    return phases


def job_prolog(spank: Spank, config: PluginConfig) -> int:
    phases = _phases()
    job_id, uid, gid = spank.ids()
    request = job.JobRequest(job_id=job_id, uid=uid, gid=gid, node=job.node_name(os.environ),
                             gpu_share=spank.option("gpu-share"),
                             private_mps=spank.option("gpu-mps") is not None,
                             env=dict(os.environ))
    job.prolog(config, request, phases)
    logger.debug("%s", phases.line())
    return 0


def job_epilog(spank: Spank, config: PluginConfig) -> int:
    phases = _phases()
    job_id, _uid, _gid = spank.ids()
    job.epilog(config, job_id, phases)
    logger.debug("%s", phases.line())
    return 0


CALLBACKS: dict[str, Callable[[Spank, PluginConfig], int]] = {
    "job_prolog": job_prolog,
    "job_epilog": job_epilog,
}


def dispatch(name: str, host: Any, args: list[str]) -> int:
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
        return counters.count(name, _dispatch(name, Spank(host), args), _config)
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
    except job.NodeError as err:
        logger.error("%s: %s", name, err)
        counters.failed(name, str(err))
        _failed(name, spank, config, err.brief, str(err))
        return -1
    except Exception as err:
        full = state_dir_full(config, err)
        if full:
            logger.error("%s: %s", name, full)
            counters.failed(name, full)
            _failed(name, spank, config, f"state_dir= full: {config.state_dir}", full)
            return -1
        logger.exception("%s: internal error", name)
        counters.failed(name, "")
        _failed(name, spank, config, f"internal error in {name}, see slurmd's log",
                "an internal error (slurmd's log has the details)")
        return -1
    finally:
        # No Python thread may outlive a callback: a thread holding the GIL across
        # slurmstepd's fork() hangs every task. Threads start through `threading`; when
        # nothing imported it, there is only this one.
        threading = sys.modules.get("threading")
        logger.debug("%s done, threads=%d", name, threading.active_count() if threading else 1)


def state_dir_full(config: PluginConfig, err: BaseException) -> str:
    """What to tell the admin and the job when ``err`` (or what caused it) says the state
    directory's file system is full or over quota; "" for any other error."""
    import errno

    seen: Optional[BaseException] = err
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in (
            errno.ENOSPC, errno.EDQUOT)):
        seen = seen.__cause__ or seen.__context__
    if not isinstance(seen, OSError):
        return ""
    err = seen
    where = f" ({err.filename})" if err.filename else ""
    return (f"no space left in state_dir= {config.state_dir}{where}: {err.strerror}; free "
            "it (`gpushare check` says what fills it; the users' MPS directories belong on "
            "a mount of their own, see docs/admin.md)")


def _failed(name: str, spank: Spank, config: Optional[PluginConfig], reason: str,
            detail: str) -> None:
    """What Slurm did for a failing prolog or epilog when it waited for them, gpushare now
    does: they run in a worker Slurm does not wait for. The node is drained with the cause,
    and a prolog leaves the job's tasks a record that fails them with it."""
    _drain(reason, config)
    if name != "job_prolog" or config is None:
        return
    try:
        job_id, uid, gid = spank.ids()
        job.record_failure(config, job_id, uid, gid, job.node_name(os.environ),
                           f"could not set up this job on node "
                           f"{job.node_name(os.environ)}: {detail}. The node was drained; "
                           "submit the job again")
    except Exception as err:  # the drain above is what matters; the tasks time out
        logger.error("cannot record the failure for the job's tasks: %s", err)


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
