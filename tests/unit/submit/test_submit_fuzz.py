# SPDX-License-Identifier: GPL-2.0-or-later
"""Generated job_descs through the Python rules: never an unhandled exception, and every
result well formed (one gpushare line, a 2072 rejection naming a flag, or real changes)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from gpushare.submit.facts import load_facts
from gpushare.submit.gres import parse_field
from gpushare.submit.hook import job_submit
from gpushare.submit.rules import apply
from luahook import facts_path
from submit_strategies import job_desc

FACTS = [load_facts(facts_path(name)) for name in ("h100-2205", "a100-2311", "untyped-2205",
                                                   "split-mig-2205")]
EXAMPLES = int(os.environ.get("GPUSHARE_FUZZ_EXAMPLES", "2000"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=job_desc())
def test_rules_never_raise_and_results_are_well_formed(job):
    for facts in FACTS:
        decision = apply(job, facts)
        assert len(decision.messages) <= 1
        if decision.reject is not None:
            assert decision.reject.code == 2072
            assert decision.changes == {}
            assert decision.reject.flag.startswith(("--", "-N "))
            assert decision.messages == [decision.reject.text]
            continue
        # a message without changes only says why a multi-node job got no --switches
        assert bool(decision.messages) == bool(decision.changes) or (
            decision.messages[0].startswith("gpushare: no --switches: "))
        for field, value in decision.changes.items():
            assert job.get(field) != value
            if field.startswith("tres_per_"):
                # what the rules write must parse again and keep Slurm's prefix; items
                # passed through from the request unchanged are the request's own
                before = {it.raw for it in parse_field(job[field])} if job.get(field) else set()
                items = parse_field(value)
                assert all(it.prefix in ("gres:", "gres/") for it in items
                           if it.is_gres and it.raw not in before)


@settings(max_examples=max(EXAMPLES // 10, 50), deadline=None)
@given(job=job_desc())
def test_hook_entry_never_raises(job):
    rc, changes, message = job_submit(job, 1000)
    assert rc in (0, 2072)
    assert isinstance(changes, dict) and isinstance(message, str)
