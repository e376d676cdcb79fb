# SPDX-License-Identifier: GPL-2.0-or-later
"""Run submit_hooks/job_submit.lua in-process (lupa) the way slurmctld's job_submit/lua does.

A fake ``slurm`` table records ``log_user``/``log_info``/``log_error``; job_desc is a plain Lua
table, with ``spank_job_env`` indexed from 0 as slurmctld pushes it. The result of a call is
shaped like ``Decision.to_dict()`` so both implementations can be compared field by field.
"""

from __future__ import annotations

import os
from typing import Any

try:  # Lua 5.1 is what slurmctld embeds on Debian/RHEL; fall back to lupa's default.
    import lupa.lua51 as lupa_runtime
except ImportError:  # pragma: no cover - depends on the lupa build
    import lupa as lupa_runtime

HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "submit_hooks",
                    "job_submit.lua")

_FAKE_SLURM = """
slurm = {SUCCESS = 0, ERROR = -1, FAILURE = -1}
gpushare_test_log = {user = {}, info = {}, error = {}}
local function recorder(kind)
   return function(fmt, ...)
      local list = gpushare_test_log[kind]
      list[#list + 1] = string.format(fmt, ...)
   end
end
slurm.log_user = recorder("user")
slurm.log_info = recorder("info")
slurm.log_error = recorder("error")
"""

JOB_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket",
              "min_nodes", "max_nodes", "num_tasks", "req_switch", "wait4switch", "features")
SUBMIT_UID = 1000  # slurmctld's submit_uid; the rules read job_desc.user_id, never this


class LuaHook:
    """One loaded job_submit.lua with its facts file, as slurmctld would hold it."""

    def __init__(self, facts_path: str, hook_path: str = HOOK, runtime: Any = None) -> None:
        self.lua = (runtime or lupa_runtime).LuaRuntime(unpack_returned_tuples=True)
        self.lua.execute(_FAKE_SLURM)
        old = os.environ.get("GPUSHARE_FACTS")
        os.environ["GPUSHARE_FACTS"] = facts_path
        try:
            with open(hook_path, encoding="utf-8") as handle:
                self.lua.execute(handle.read())
        finally:
            if old is None:
                del os.environ["GPUSHARE_FACTS"]
            else:
                os.environ["GPUSHARE_FACTS"] = old
        self._submit = self.lua.globals().slurm_job_submit
        self._modify = self.lua.globals().slurm_job_modify

    def log(self, kind: str) -> list[str]:
        entries = self.lua.globals().gpushare_test_log[kind]
        return [entries[i] for i in range(1, len(entries) + 1)]

    def _reset_log(self) -> None:
        self.lua.execute("gpushare_test_log = {user = {}, info = {}, error = {}}")

    def job_table(self, job: dict[str, Any]) -> Any:
        table = self.lua.table()
        for key, value in job.items():
            if key == "spank_job_env" and isinstance(value, (list, tuple)):
                env = self.lua.table()
                for index, entry in enumerate(value):
                    env[index] = entry
                table[key] = env
            elif key == "spank_job_env" and isinstance(value, dict):
                table[key] = self.lua.table_from(value)
            elif value is not None:
                table[key] = value
        return table

    def submit(self, job: dict[str, Any], modify: bool = False) -> dict[str, Any]:
        """Call slurm_job_submit (or _modify) and report what it did to the job."""
        self._reset_log()
        table = self.job_table(job)
        before = {key: table[key] for key in JOB_FIELDS}
        rc = self._modify(table, None, None, 0) if modify else self._submit(table, None, SUBMIT_UID)
        changes = {}
        for key in JOB_FIELDS:
            after = table[key]
            if after != before[key]:
                changes[key] = _plain(after)
        messages = self.log("user")
        rc = int(rc)
        reject = None
        if rc != 0:
            reject = {"code": rc, "text": messages[0] if messages else ""}
        return {"changes": changes, "messages": messages, "reject": reject, "rc": rc}


def _plain(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


VECTORS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "vectors")


def facts_path(name: str) -> str:
    return os.path.join(VECTORS_DIR, "facts", f"{name}.json")


def load_vectors(directory: str = VECTORS_DIR) -> list[dict[str, Any]]:
    """Every conformance vector in ``directory``, each with its facts name, entry, expected
    decision and the Slurm release its slurmctld runs (None where the vector names none)."""
    import glob
    import json

    vectors = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path, encoding="utf-8") as handle:
            group = json.load(handle)
        for vector in group["vectors"]:
            expect = vector["expect"]
            if "reject" in expect:
                expected = {"changes": {}, "messages": [expect["reject"]],
                            "reject": {"code": 2072, "text": expect["reject"]}}
            else:
                message = expect["message"]
                expected = {"changes": expect["changes"],
                            "messages": [message] if message else [], "reject": None}
            vectors.append({
                "id": f"{os.path.basename(path)[:-5]}: {vector['name']}",
                "facts": vector.get("facts", group["facts"]),
                "release": vector.get("release", group.get("release")),
                "entry": vector.get("entry", "submit"),
                "job": vector["job"],
                "expected": expected,
            })
    return vectors
