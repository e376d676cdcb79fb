# SPDX-License-Identifier: GPL-2.0-or-later
"""Thin adapter from the ``job_submit/gpushare`` C plugin to ``gpushare.submit.hook``.

It copies the job_desc fields the rules read into a dict, runs the rules, and writes the
changed fields back (strings through slurmctld's own allocator, via the C glue).
"""

from __future__ import annotations

from typing import Any

from gpushare.common import log as gslog
from gpushare.submit import hook as submit_hook
from gpushare.submit.facts import facts_path

# features: --constraint; req_nodes: -w, read so that no --segment is added to it
STRING_FIELDS = ("tres_per_job", "tres_per_node", "tres_per_socket", "tres_per_task",
                 "features", "array_inx", "req_nodes")
# bitflags: --spread-segments and --consolidate-segments from Slurm 25.11
NUMBER_FIELDS = ("min_nodes", "max_nodes", "num_tasks", "req_switch", "wait4switch", "user_id",
                 "bitflags")
# Only in the job_desc of Slurm 24.11 and later (--segment, topology/block).
OPTIONAL_FIELDS = ("segment_size",)
WRITABLE = set(STRING_FIELDS[:5]) | {"req_switch", "wait4switch", "segment_size"}

_ffi: Any = None
_lib: Any = None

INIT, SUBMIT, MODIFY, RELOAD = 0, 1, 2, 3


def bind(ffi: Any, lib: Any) -> None:
    global _ffi, _lib
    _ffi, _lib = ffi, lib
    gslog.install(lambda level, text: lib.gs_log(level, text.encode("utf-8", "replace")))


def slurm_version_number() -> int | None:
    """SLURM_VERSION_NUMBER of the Slurm the plugin was built against (and so runs in)."""
    return int(_lib.SLURM_VERSION_NUMBER) if hasattr(_lib, "SLURM_VERSION_NUMBER") else None


def read_fields(job_desc: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in STRING_FIELDS:
        value = getattr(job_desc, name)
        fields[name] = None if value == _ffi.NULL else _ffi.string(value).decode("utf-8",
                                                                                  "replace")
    for name in NUMBER_FIELDS:
        fields[name] = int(getattr(job_desc, name))
    for name in OPTIONAL_FIELDS:
        if hasattr(job_desc, name):
            fields[name] = int(getattr(job_desc, name))
    env = job_desc.spank_job_env
    count = int(job_desc.spank_job_env_size) if env != _ffi.NULL else 0
    fields["spank_job_env"] = [_ffi.string(env[i]).decode("utf-8", "replace")
                               for i in range(count) if env[i] != _ffi.NULL]
    return fields


def write_fields(job_desc: Any, changes: dict[str, Any]) -> None:
    for name, value in changes.items():
        if name not in WRITABLE:
            raise ValueError(f"the rules may not change {name}")
        if name in OPTIONAL_FIELDS and not hasattr(job_desc, name):
            raise ValueError(f"this Slurm's job_desc has no {name}")
        if name in STRING_FIELDS:
            encoded = _ffi.NULL if value is None else str(value).encode()
            _lib.gs_replace_str(_ffi.addressof(job_desc, name), encoded)
        else:
            setattr(job_desc, name, int(value))


def call(what: int, job_desc_ptr: Any, uid: int, err_msg: Any) -> int:
    """One plugin call: init (load facts), reload (slurm.conf re-read), job_submit or
    job_modify."""
    if what == INIT:
        return submit_hook.init(facts_path(), slurm_version_number())
    if what == RELOAD:
        return submit_hook.reload()
    job_desc = _ffi.cast("job_desc_msg_t *", job_desc_ptr)
    fields = read_fields(job_desc)
    rules = submit_hook.job_submit if what == SUBMIT else submit_hook.job_modify
    rc, changes, message = rules(fields, int(uid))
    if rc == submit_hook.SLURM_SUCCESS and changes:
        write_fields(job_desc, changes)
    if message:
        _lib.gs_set_err_msg(err_msg, message.encode("utf-8", "replace"))
    return rc
