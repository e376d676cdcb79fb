# SPDX-License-Identifier: GPL-2.0-or-later
"""This node's GPU sharing in Prometheus' text exposition format (``gpushare metrics``).

Two sources, both read without taking a lock a prolog waits on:

* the node's state as ``gpushare mps`` sees it (``gpushare.admin.mps_report``): per GPU or MIG
  slice the MPS daemons, their users, the jobs sharing it with the sum of their shares,
  each daemon's caps; per node the daemons by status and the job records by mode;
* the counters the plugin keeps (``gpushare.node.counters``): prologs and epilogs by result,
  refusals and drains by reason, daemon starts, stop failures, timeouts, reaps, and the
  prolog and epilog time histograms.

Every per-device series carries ``node``, ``gpu`` (NVML index of the GPU), ``uuid``,
``mig_profile`` ("" for a whole GPU) and ``owner`` (from the ownership plan; "unknown"
without one). Label values are bounded: devices, users with daemons on the node, and the
fixed reason sets of ``gpushare.node.counters``; never job ids here. The per-job GPU use
(``gpushare.admin.metrics_usage``) is labelled by job, bounded by the jobs running now.
"""

from __future__ import annotations

import math
import os
from typing import Callable, NamedTuple, Optional, Sequence

from gpushare.admin.mps_report import DaemonView
from gpushare.node import counters
from gpushare.node.config import PluginConfig, parse_size

__all__ = ["Family", "collect", "render", "write_textfile"]

PREFIX = "gpushare_"
DAEMON_STATUSES = ("running", "changing", "not running", "stop failed", "unknown",
                   "untracked", "no record", "unreadable")
JOB_MODES = ("shared", "private", "error")


class Sample(NamedTuple):
    suffix: str  # "" or _bucket/_sum/_count
    labels: tuple[tuple[str, str], ...]
    value: float


class Family(NamedTuple):
    """One metric: name (with gpushare_), type, help text and its samples."""

    name: str
    type: str  # counter | gauge | histogram
    help: str
    samples: list[Sample]


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1 << 53 else repr(
        float(value))


def render(families: Sequence[Family]) -> str:
    """The text exposition format 0.0.4 (what node_exporter's textfile collector reads)."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels)
            name = family.name + sample.suffix
            lines.append(f"{name}{{{labels}}} {_number(sample.value)}" if labels
                         else f"{name} {_number(sample.value)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ counters

_COUNTERS = (
    # (family name, counter name in the file, label, its values, help)
    ("prologs_total", "prologs_total", "result", counters.RESULTS,
     "job_prolog runs of the plugin since boot, by result (refused: the request was "
     "refused and the job's tasks fail; failed: the node is drained)"),
    ("epilogs_total", "epilogs_total", "result", counters.RESULTS,
     "job_epilog runs of the plugin since boot, by result (failed: the node is drained)"),
    ("refusals_total", "refusals_total", "reason", counters.REFUSAL_REASONS,
     "Sharing requests refused at job start since boot, by reason"),
    ("drains_total", "drains_total", "reason", counters.DRAIN_REASONS,
     "Failed prologs and epilogs since boot, each of which drains the node, by reason"),
    ("mps_daemon_starts_total", "mps_daemon_starts", "", (),
     "MPS control daemons started since boot"),
    ("mps_stop_failures_total", "mps_stop_failures", "", (),
     "MPS control daemons that could not be stopped since boot"),
    ("mps_reaped_references_total", "mps_reaped_references", "", (),
     "MPS daemon references of jobs gone without an epilog, dropped since boot"),
    ("timeouts_total", "timeouts_total", "what", counters.TIMEOUTS,
     "Time limits hit since boot: an MPS lock, an external command, a daemon that did not "
     "start or did not quit"),
)


def counter_families(values: dict[str, int], node: str) -> list[Family]:
    """The plugin's counters (``counters.read``), with every known label value present."""
    families = []
    for name, key, label, known, text in _COUNTERS:
        samples = []
        if label:
            found = {k.split(":", 1)[1] for k in values if k.startswith(key + ":")}
            for value in [*known, *sorted(found - set(known))]:
                samples.append(Sample("", (("node", node), (label, value)),
                                      values.get(f"{key}:{value}", 0)))
        else:
            samples.append(Sample("", (("node", node),), values.get(key, 0)))
        families.append(Family(PREFIX + name, "counter", text, samples))
    for kind in counters.CALLBACKS:
        samples = []
        cumulative = 0
        for i, bound in enumerate(counters.BUCKETS):
            cumulative += values.get(f"{kind}_duration_bucket:{i}", 0)
            samples.append(Sample("_bucket", (("node", node), ("le", _number(bound))),
                                  cumulative))
        total = values.get(f"{kind}_duration_count", 0)
        samples.append(Sample("_bucket", (("node", node), ("le", "+Inf")), total))
        samples.append(Sample("_sum", (("node", node),),
                              values.get(f"{kind}_duration_sum_us", 0) / 1e6))
        samples.append(Sample("_count", (("node", node),), total))
        families.append(Family(f"{PREFIX}{kind}_duration_seconds", "histogram",
                               f"Time the plugin's job_{kind} took in gpushare's core",
                               samples))
    return families


# ------------------------------------------------------------------------------ state


class DeviceInfo(NamedTuple):
    gpu: int
    mig_profile: str
    owner: str


def _owners(config: PluginConfig, node: str) -> Callable[[int, str], str]:
    """``owner(gpu index, MIG profile)`` from the plan ("unknown" without a usable one)."""
    if not config.plan:
        return lambda _gpu, _profile: "unknown"
    from gpushare.node.ownership import OwnersError, node_owners, owner_of

    try:
        planned = node_owners(config.plan, node, config.state_dir)
    except OwnersError:
        return lambda _gpu, _profile: "unknown"
    if planned is None:
        return lambda _gpu, _profile: "unknown"
    return lambda gpu, profile: owner_of(planned, gpu, profile) or "unknown"


def _device_profiles(config: PluginConfig) -> tuple[dict[str, str], dict[str, int]]:
    """MIG profile by device UUID from the job records, and the records' count by mode."""
    from gpushare.node.state import JobStore, StateError

    store = JobStore(config.state_dir)
    profiles: dict[str, str] = {}
    modes = dict.fromkeys(JOB_MODES, 0)
    for job_id in store.job_ids():
        try:
            record = store.read(job_id)
        except (StateError, OSError, TypeError, ValueError):
            continue
        if record is None:
            continue
        modes[record.mode] = modes.get(record.mode, 0) + 1
        for device in record.devices:
            if device.get("uuid"):
                profiles[str(device["uuid"])] = str(device.get("profile") or "")
    return profiles, modes


def state_families(views: Sequence[DaemonView], profiles: dict[str, str],
                   modes: dict[str, int], owner: Callable[[int, str], str], node: str,
                   readable: bool = True) -> list[Family]:
    """Gauges of the node's daemons and jobs, per device, per daemon and per node."""
    devices: dict[str, DeviceInfo] = {}
    per_device: dict[str, list[float]] = {}  # uuid -> [daemons, jobs, share sum]
    daemon_samples: dict[str, list[Sample]] = {
        "up": [], "jobs": [], "thread_limit_ratio": [], "pinned_memory_limit_bytes": [],
        "start_time_seconds": []}
    for view in views:
        if view.uid is None:
            continue  # no record: counted by status below
        job_share = sum(share for _job, share in view.jobs)
        limits = dict(view.mem_limits)
        for i, uuid in enumerate(view.device_uuids):
            gpu = view.gpu_indexes[i] if i < len(view.gpu_indexes) else -1
            profile = profiles.get(uuid, "")
            info = devices.setdefault(uuid, DeviceInfo(gpu, profile, owner(gpu, profile)))
            counts = per_device.setdefault(uuid, [0, 0, 0.0])
            counts[0] += 1
            counts[1] += len(view.jobs)
            # A private daemon's jobs hold its GPUs whole.
            counts[2] += (100 * len(view.jobs) if view.mode == "private" else job_share) / 100
            labels = (*_device_labels(node, uuid, info), ("user", view.user),
                      ("mode", view.mode))
            if view.status in ("running", "not running"):
                daemon_samples["up"].append(Sample("", labels, view.status == "running"))
            daemon_samples["jobs"].append(Sample("", labels, len(view.jobs)))
            if view.cap_percent is not None:
                daemon_samples["thread_limit_ratio"].append(
                    Sample("", labels, view.cap_percent / 100))
            if str(i) in limits:
                daemon_samples["pinned_memory_limit_bytes"].append(
                    Sample("", labels, _size(limits[str(i)])))
            if view.started_at:
                daemon_samples["start_time_seconds"].append(
                    Sample("", labels, float(view.started_at)))
    families = []
    device_help = (
        ("mps_daemons", "MPS control daemons gpushare runs on this GPU or MIG slice (one per "
         "user, or per job with --gpu-mps)"),
        ("jobs", "Jobs sharing this GPU or MIG slice through gpushare's MPS daemons"),
        ("share_ratio", "Sum of the shares of the jobs on this GPU or MIG slice (1: the "
         "whole device is granted)"),
    )
    for column, (name, text) in enumerate(device_help):
        families.append(Family(f"{PREFIX}gpu_{name}", "gauge", text, [
            Sample("", _device_labels(node, uuid, devices[uuid]), per_device[uuid][column])
            for uuid in sorted(devices, key=lambda u: (devices[u].gpu, u))]))
    daemon_help = {
        "up": "Whether the MPS control daemon runs (1) or is gone (0); absent while it "
              "changes or when not run as root",
        "jobs": "Jobs using this MPS control daemon",
        "thread_limit_ratio": "The daemon's default active thread percentage / 100: the "
                              "largest of its jobs' shares",
        "pinned_memory_limit_bytes": "The daemon's default pinned device memory limit on "
                                     "this device",
        "start_time_seconds": "When the MPS control daemon was started (Unix time)",
    }
    for key, text in daemon_help.items():
        families.append(Family(f"{PREFIX}mps_daemon_{key}", "gauge", text,
                               daemon_samples[key]))
    by_status = dict.fromkeys(DAEMON_STATUSES, 0)
    for view in views:
        by_status[view.status] = by_status.get(view.status, 0) + 1
    families.append(Family(f"{PREFIX}mps_daemons", "gauge",
                           "MPS daemon keys in the node's state directory, by status "
                           "(as gpushare mps shows them)",
                           [Sample("", (("node", node), ("status", status)), count)
                            for status, count in by_status.items()]))
    families.append(Family(f"{PREFIX}mps_daemon_problems", "gauge",
                           "MPS daemons that need an administrator (gpushare mps says what "
                           "to do)",
                           [Sample("", (("node", node),),
                                   sum(1 for view in views if view.problems))]))
    families.append(Family(f"{PREFIX}jobs", "gauge",
                           "Jobs with a gpushare record on this node, by mode (error: a "
                           "refused request)",
                           [Sample("", (("node", node), ("mode", mode)), count)
                            for mode, count in modes.items()]))
    families.append(Family(f"{PREFIX}state_readable", "gauge",
                           "Whether gpushare metrics could read the node's state directory",
                           [Sample("", (("node", node),), 1 if readable else 0)]))
    return families


def _device_labels(node: str, uuid: str, info: DeviceInfo) -> tuple[tuple[str, str], ...]:
    return (("node", node), ("gpu", str(info.gpu)), ("uuid", uuid),
            ("mig_profile", info.mig_profile), ("owner", info.owner))


def _size(text: str) -> float:
    try:
        return float(parse_size(text))
    except ValueError:
        return math.nan


def collect(config: PluginConfig, node: str, check_processes: bool) -> tuple[
        list[Family], Optional[str]]:
    """Every family for this node, and why the state could not be read (None when it was).

    ``check_processes`` (root only) tells running daemons from gone ones through /proc.
    """
    from gpushare.admin.mps_report import inspect_daemons
    from gpushare.node.mps import MpsError
    from gpushare.node.state import StateError

    problem = None
    views: list[DaemonView] = []
    profiles: dict[str, str] = {}
    modes = dict.fromkeys(JOB_MODES, 0)
    try:
        views = inspect_daemons(config, check_processes=check_processes)
        profiles, modes = _device_profiles(config)
    except (MpsError, StateError, OSError) as err:
        problem = f"cannot read the state in {config.state_dir}: {err}"
    try:
        values = counters.read(config.state_dir)
    except (OSError, ValueError) as err:
        values = {}
        problem = problem or f"cannot read the counters in {config.state_dir}: {err}"
    families = state_families(views, profiles, modes, _owners(config, node), node,
                              readable=problem is None)
    return families + counter_families(values, node), problem


def write_textfile(path: str, text: str) -> None:
    """Replace ``path`` atomically (node_exporter never reads half a file).

    The temporary file is ``.<name>.<pid>.tmp`` in the same directory, which the textfile
    collector ignores (it reads ``*.prom``). As root, every directory on the way must be
    root-owned and not writable by others, so no user can redirect the write.
    """
    from gpushare.common import safefs

    if not os.path.isabs(path):
        raise ValueError(f"{path}: give the textfile as an absolute path")
    directory, name = os.path.split(os.path.normpath(path))
    if not name.endswith(".prom"):
        raise ValueError(f"{path}: node_exporter's textfile collector reads only *.prom "
                         "files; name it e.g. gpushare.prom")
    if os.geteuid() == 0:
        dir_fd = safefs.open_root_dir(directory, create=False)
    else:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        safefs.write_file_atomic_at(dir_fd, name, text.encode(), 0o644)
    finally:
        os.close(dir_fd)


# ------------------------------------------------------------------------------ relayout


RELAYOUT_RESULTS = ("applied", "restored")


def relayout_families(state: object) -> list[Family]:
    """``gpushare relayout --apply``'s record (its state file, on the controller): rounds that
    chose a change, GPUs changed or laid back after a failed step, nodes left drained, and
    each changed GPU's layout and when it changed."""
    from gpushare.admin.relayout.state import AppliedState

    assert isinstance(state, AppliedState)
    counts = state.counters
    families = [
        Family(PREFIX + "relayout_decisions_total", "counter",
               "Rounds of gpushare relayout --apply that chose at least one change",
               [Sample("", (), counts.get("decisions", 0))]),
        Family(PREFIX + "relayout_changes_total", "counter",
               "GPUs a relayout changed (applied) or whose node's step failed and laid the "
               "old layout back (restored)",
               [Sample("", (("result", result),), counts.get(result, 0))
                for result in RELAYOUT_RESULTS]),
        Family(PREFIX + "relayout_failures_total", "counter",
               "Nodes a relayout left drained for an administrator (the cause is the drain "
               "reason)", [Sample("", (), counts.get("failed", 0))]),
    ]
    layouts, times = [], []
    for (node, index), entry in sorted(state.gpus.items()):
        labels = (("node", node), ("gpu", str(index)))
        layouts.append(Sample("", (*labels, ("layout", entry.layout)), 1))
        times.append(Sample("", labels, entry.at))
    families.append(Family(PREFIX + "relayout_gpu_layout_info", "gauge",
                           "The layout a relayout last applied to a GPU", layouts))
    families.append(Family(PREFIX + "relayout_gpu_changed_timestamp_seconds", "gauge",
                           "When a relayout last changed a GPU (Unix time)", times))
    return families
