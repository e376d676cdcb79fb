# SPDX-License-Identifier: GPL-2.0-or-later
"""Every limit MPS puts on a job and on a daemon, computed in one place (``limits_for``).

A client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` can only lower its daemon's value, so a
job's environment carries the job's share, and the daemon's default caps a client that
unsets it. Both limits hold per client, not per daemon. A shared daemon serves several jobs
of one user with possibly different shares; its cap is the largest of them: each job still
gets its own share, and a client that drops its setting gets no more than the largest share
its user holds on that device (a sum would hand it the other jobs' shares too). A job
joining with a share no larger than that changes nothing on the daemon. A private daemon
serves one job over whole GPUs: its own defaults are the job's limits, and the job's
environment carries none. The pinned device memory limit follows the share (plugstack
``mem_limit=``: proportional to the share, a fixed size, or off); a private daemon has
none.

Pure: no file, process or clock is looked at here.
"""

from typing import Optional, Sequence

from gpushare.node.config import parse_size

THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_MEM_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
_MIB = 1 << 20
_GIB = 1 << 30


class Limits:
    """The limits of one job or one daemon, in the units MPS takes them.

    Treated as a value (compared, never changed); a plain class, as a NamedTuple costs
    every prolog and epilog its definition.
    """

    __slots__ = ("mem", "percent")

    def __init__(self, percent: int, mem: tuple[tuple[str, str], ...] = ()) -> None:
        # Active thread percentage: a client's own, or a daemon's default.
        self.percent = percent
        # Pinned device memory: (device number, size), devices in the order the daemon
        # numbers them (from 0); a device without a limit is left out.
        self.mem = mem

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Limits) and self.percent == other.percent
                and self.mem == other.mem)

    def __hash__(self) -> int:
        return hash((self.percent, self.mem))

    def __repr__(self) -> str:
        return f"Limits(percent={self.percent}, mem={self.mem})"

    def env(self, mode: str) -> dict[str, str]:
        """The variables a client of a ``mode`` daemon gets for these limits."""
        if mode != "shared":
            return {}
        env = {THREAD_PERCENTAGE_ENV: str(self.percent)}
        if self.mem:
            env[PINNED_MEM_ENV] = ",".join(f"{i}={size}" for i, size in self.mem)
        return env

    def to_json(self) -> dict[str, object]:
        return {"percent": self.percent, "mem": dict(self.mem)}


def format_size(size: int) -> str:
    """MPS size syntax: whole GiB as ``<n>G``, otherwise ``<n>M`` (rounded down, >= 1M)."""
    if size >= _GIB and size % _GIB == 0:
        return f"{size // _GIB}G"
    return f"{max(1, size // _MIB)}M"


def pinned_mem(memory_total: int, percent: int, setting: str) -> Optional[int]:
    """The pinned device memory limit in bytes for ``percent`` of a device; None: no limit.

    ``setting`` is plugstack's ``mem_limit=``; a fixed size is capped at the device's
    memory, and a proportional limit needs the device's memory (unknown: no limit).
    """
    if setting == "off":
        return None
    if setting == "proportional":
        if memory_total <= 0:
            return None
        return max(_MIB, int(memory_total * percent / 100) // _MIB * _MIB)
    size = parse_size(setting)
    return min(size, memory_total) if memory_total > 0 else size


def limits_for(mode: str, shares: Sequence[int], memory: Sequence[int] = (),
               mem_limit: str = "off") -> Limits:
    """The limits for the jobs of one daemon: ``shares`` (percent) are one job's share, or
    the shares of every job a daemon serves; ``memory`` is the total memory of each of the
    daemon's devices in the order it numbers them (0 where unknown); ``mem_limit`` is
    plugstack's setting."""
    percent = min(100, max(shares, default=0))
    if mode == "private":
        return Limits(percent)
    mem = []
    for i, total in enumerate(memory):
        size = pinned_mem(total, percent, mem_limit)
        if size is not None:
            mem.append((str(i), format_size(size)))
    return Limits(percent, tuple(mem))
