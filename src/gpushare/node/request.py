# SPDX-License-Identifier: GPL-2.0-or-later
"""What one job asks of its node and what its tasks get: the request as Slurm hands it over,
the share and mode decided from it (``plan_job``), and the tasks' environment.

Everything here is pure: the values the user typed are checked again on the node (they
are the user's), and a request that cannot be honoured is a ``UserError``, which fails
the job and never drains the node.
"""

from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Sequence

from gpushare.node.mps.limits import limits_for
from gpushare.node.state import JobRecord

if TYPE_CHECKING:
    from gpushare.node.devices import ResolvedDevice

__all__ = ["SHARE_ENV", "JobRequest", "UserError", "parse_share", "plan_job", "share_matches",
           "task_environment", "uses_sharing"]

SHARE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


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


