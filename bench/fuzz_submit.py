# SPDX-License-Identifier: GPL-2.0-or-later
"""Run >= 10^5 generated job_descs through the Python submit rules and count what happened;
compare a sample with job_submit.lua (in-process). Prints a table; exit 1 on any failure.

    python3 bench/fuzz_submit.py [--examples 100000] [--lua-every 50]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts")]

from hypothesis import HealthCheck, given, settings  # noqa: E402

from gpushare.submit.facts import load_facts  # noqa: E402
from gpushare.submit.rules import apply  # noqa: E402
from luahook import LuaHook, facts_path  # noqa: E402
from submit_strategies import job_desc  # noqa: E402

FACTS_NAMES = ("h100-2205", "a100-2311")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--lua-every", type=int, default=50,
                        help="compare every Nth job with job_submit.lua")
    args = parser.parse_args()
    facts = {name: load_facts(facts_path(name)) for name in FACTS_NAMES}
    hooks = {name: LuaHook(facts_path(name)) for name in FACTS_NAMES}
    counts: collections.Counter = collections.Counter()
    failures: list[str] = []

    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(job=job_desc())
    def run(job):
        counts["generated"] += 1
        for name in FACTS_NAMES:
            try:
                decision = apply(job, facts[name])
            except Exception:
                counts["unhandled exceptions"] += 1
                failures.append(f"{job!r}\n{traceback.format_exc()}")
                continue
            counts["rejected" if decision.reject else
                   "rewritten" if decision.changes else "untouched"] += 1
            if counts["generated"] % args.lua_every == 0:
                counts["compared with Lua"] += 1
                lua = hooks[name].submit(job)
                lua.pop("rc")
                if lua != decision.to_dict():
                    counts["Lua differs"] += 1
                    failures.append(f"{name}: {job!r}\npython {decision.to_dict()}\nlua {lua}")

    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    print(f"{'what':<24}{'count':>10}")
    for key in ("generated", "untouched", "rewritten", "rejected", "unhandled exceptions",
                "compared with Lua", "Lua differs"):
        print(f"{key:<24}{counts[key]:>10}")
    print(f"({len(FACTS_NAMES)} fact sets per job, {elapsed:.1f} s)")
    for failure in failures[:5]:
        print("\n" + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
