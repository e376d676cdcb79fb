# SPDX-License-Identifier: GPL-2.0-or-later
"""The Python job_submit entry that the ``job_submit/gpushare`` C plugin calls in slurmctld.

The C glue calls ``init(facts_path)`` once when slurmctld loads the plugin, ``reload()`` on
reconfigure, and ``job_submit``/``job_modify`` per request with the job_desc fields as a dict
(``spank_job_env`` as a list of ``NAME=value``). The facts are read only in ``init`` and
``reload``: a request costs no I/O.

Nothing here raises into slurmctld. An internal error is logged with its traceback and the
job is handled by the facts' ``policy.on_error``: accepted unchanged, or rejected with
``SLURM_ERROR``. Without loadable facts every job passes unchanged (logged at load).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from gpushare.common.log import get_logger
from gpushare.submit.base import Release
from gpushare.submit.facts import Facts, FactsError, load_facts
from gpushare.submit.rules import apply, apply_modify

__all__ = ["SLURM_ERROR", "SLURM_SUCCESS", "init", "job_modify", "job_submit", "reload"]

SLURM_SUCCESS = 0
SLURM_ERROR = -1
INTERNAL_ERROR_MESSAGE = ("gpushare: the GPU submit check failed; ask your administrator "
                          "(slurmctld log has the details)")

log = get_logger("gpushare.submit")

# slurmctld may call job_submit plugins from several RPC threads (23.02+): the facts are
# swapped whole under a lock and only read afterwards.
_lock = threading.Lock()
_facts_path: str | None = None
_facts: Facts | None = None
_running_syntax: str | None = None  # the GRES syntax of the slurmctld we run in
_running_release: str | None = None  # its release, "24.11.5"
_running_version: Release = None  # the same as (24, 11): what the rules compare


def syntax_of_version_number(number: int) -> str:
    """"22.05" (``gres:gpu:1``) before Slurm 23.11 (0x170b00), else "23.11" (``gres/``)."""
    return "22.05" if number < 0x170B00 else "23.11"


def init(facts_path: str, slurm_version_number: int | None = None) -> int:
    """Remember where the facts live and which Slurm runs us, and load the facts; always
    returns SLURM_SUCCESS."""
    global _facts_path, _running_syntax, _running_release, _running_version
    _facts_path = facts_path
    _running_syntax = _running_release = _running_version = None
    if slurm_version_number is not None:
        _running_syntax = syntax_of_version_number(slurm_version_number)
        number = slurm_version_number
        _running_release = f"{number >> 16 & 255}.{number >> 8 & 255:02d}.{number & 255}"
        _running_version = (number >> 16 & 255, number >> 8 & 255)
    return reload()


_SYNTAX_RELEASES = {"22.05": "before 23.11", "23.11": "23.11 or later"}
_SYNTAX_EXAMPLE = {"22.05": "gres:gpu:1", "23.11": "gres/gpu:1"}


def other_release(facts: Facts) -> str:
    """Why facts rendered for another Slurm than the one running us are refused ("" when
    they are this one's): their request strings are the other release's, which slurmctld
    rejects in every job the rules rewrite, and what else they say (topology/block, for
    one) may be beyond this release."""
    if _running_syntax is None or facts.gres_syntax == _running_syntax:
        return ""
    return (f"{_facts_path} was rendered for Slurm {_SYNTAX_RELEASES[facts.gres_syntax]} "
            f"(requests as {_SYNTAX_EXAMPLE[facts.gres_syntax]}), but this slurmctld is "
            f"Slurm {_running_release} (requests as {_SYNTAX_EXAMPLE[_running_syntax]}): "
            f"set slurm.version in the plan to this Slurm's release and render the facts "
            f"again (gpushare render facts), then scontrol reconfigure")


def reload() -> int:
    """Read the facts again (``scontrol reconfigure``); keep the old ones if the new are bad
    or were rendered for another Slurm release."""
    global _facts
    if _facts_path is None:
        log.error("submit hook: reload before init; jobs pass unchanged")
        return SLURM_SUCCESS
    kept = "keeping the facts loaded before" if _facts else "jobs pass unchanged"
    try:
        facts = load_facts(_facts_path)
    except FactsError as err:
        log.error("submit hook: %s; %s until it is fixed", err, kept)
        return SLURM_SUCCESS
    except Exception:  # never into slurmctld
        log.exception("submit hook: loading %s failed", _facts_path)
        return SLURM_SUCCESS
    refused = other_release(facts)
    if refused:
        log.error("submit hook: refusing the facts: %s; %s until then", refused, kept)
        return SLURM_SUCCESS
    with _lock:
        _facts = facts
    log.info("submit hook: loaded cluster facts from %s", _facts_path)
    return SLURM_SUCCESS


def current_facts() -> Facts | None:
    return _facts


def _run(rules: Any, fields: dict[str, Any], uid: int, what: str) -> tuple[int, dict, str]:
    facts = _facts
    if facts is None:
        return SLURM_SUCCESS, {}, ""
    try:
        decision = rules(fields, facts, release=_running_version)
        message = "\n".join(decision.messages)
        if decision.reject is not None:
            return decision.reject.code, {}, message
        return SLURM_SUCCESS, dict(decision.changes), message
    except Exception:
        with contextlib.suppress(Exception):  # nor may a broken log handler
            log.exception("submit hook: internal error in %s (uid %s); policy on_error=%s",
                          what, uid, facts.policy.on_error)
        if facts.policy.on_error == "reject":
            return SLURM_ERROR, {}, INTERNAL_ERROR_MESSAGE
        return SLURM_SUCCESS, {}, ""


def job_submit(fields: dict[str, Any], submit_uid: int) -> tuple[int, dict[str, Any], str]:
    """(rc, fields to set, message for the user) for one submission; never raises."""
    return _run(apply, fields, submit_uid, "job_submit")


def job_modify(fields: dict[str, Any], modify_uid: int) -> tuple[int, dict[str, Any], str]:
    """Same for a modification: GRES rules on the tres fields given; internal errors pass."""
    rc, changes, message = _run(apply_modify, fields, modify_uid, "job_modify")
    if rc == SLURM_ERROR:  # like the Lua hook: a failed check never blocks an update
        return SLURM_SUCCESS, {}, ""
    return rc, changes, message
