# SPDX-License-Identifier: GPL-2.0-or-later
"""Hypothesis strategies for job_desc fields as slurmctld hands them to job_submit.

Shared by the fuzz test, the Lua/Python agreement test and bench/fuzz_submit.py. The
strings stay ASCII (what slurmctld passes through from sbatch) but otherwise roam: every
syntax, field, GRES name, type spelling, count form, and plenty of junk.
"""

from __future__ import annotations

from hypothesis import strategies as st

NO_VAL = 0xFFFFFFFE

TYPES = st.sampled_from([
    "h100", "H100", "a100", "l40s", "nvidia_h100_80gb_hbm3", "1g.10gb", "3G.40GB",
    "nvidia_a100_1g.10gb", "nvidia_h100_80gb_hbm3_3g.40gb", "2g.20gb", "1g.10gb+me",
    "1c.3g.40gb", "a100_h100", "v100", "", "x:y", "g.10gb", "1g.gb", "1g.10g", "3g",
]) | st.text("abcdefgh0123456789_.+-:GB", max_size=12)
COUNTS = st.sampled_from(["1", "2", "8", "0", "50", "100", "150", "1000", "1500", "1k",
                          "2M", "4294967293", "4294967294", "99999999999", "", "x", "-1"]) \
    | st.integers(0, 3000).map(str)
NAMES = st.sampled_from(["gpu", "gpu", "gpu", "mps", "mps", "shard", "nic", "cpu", "9x", ""])


@st.composite
def gres_item(draw, prefix: str, eq: bool) -> str:
    name = draw(NAMES)
    if name == "cpu":
        return f"cpu={draw(COUNTS)}"
    parts = [name]
    if draw(st.booleans()):
        parts.append(draw(TYPES))
    text = draw(st.sampled_from([prefix, prefix, "", "gres:", "gres/"])) + ":".join(parts)
    if draw(st.integers(0, 5)):
        text += ("=" if eq else ":") + draw(COUNTS)
    return text


@st.composite
def tres_field(draw, eq_allowed: bool = False) -> str | None:
    if draw(st.integers(0, 2)) == 0:
        return None
    prefix = draw(st.sampled_from(["gres:", "gres/"]))
    eq = eq_allowed and prefix == "gres/" and draw(st.booleans())
    items = draw(st.lists(gres_item(prefix, eq), min_size=1, max_size=3))
    return ",".join(items)


NUMBERS = st.sampled_from([None, NO_VAL, 0xFFFE]) | st.integers(0, 12)
WAITS = st.sampled_from([None, NO_VAL, 0, 60, 300, 3600, 7200, 90000])
USERS = st.sampled_from([None, 0, 0, 1000, NO_VAL])  # 0: root
SHARES = st.sampled_from(["25", "100", "101", "150", "0", "abc", "", "007", "1000000"]) \
    | st.integers(1, 300).map(str)


@st.composite
def job_desc(draw) -> dict:
    job: dict = {}
    for field in ("tres_per_node", "tres_per_job", "tres_per_socket"):
        value = draw(tres_field())
        if value is not None:
            job[field] = value
    value = draw(tres_field(eq_allowed=True))
    if value is not None:
        job["tres_per_task"] = value
    for field, strategy in (("min_nodes", NUMBERS), ("max_nodes", NUMBERS),
                            ("num_tasks", NUMBERS), ("req_switch", NUMBERS),
                            ("wait4switch", WAITS), ("user_id", USERS)):
        value = draw(strategy)
        if value is not None:
            job[field] = value
    env = []
    if draw(st.booleans()):
        env.append(f"_SLURM_SPANK_OPTION_gpushare_gpu_share={draw(SHARES)}")
    if draw(st.integers(0, 3)) == 0:
        mps = draw(st.sampled_from(["", "yes", "no", "maybe"]))
        env.append(f"_SLURM_SPANK_OPTION_gpushare_gpu_mps={mps}")
    if draw(st.booleans()):
        env.append("_SLURM_SPANK_OPTION_pyxis_container_image=img")
    if env:
        job["spank_job_env"] = draw(st.permutations(env))
    if draw(st.booleans()):
        job["array_inx"] = draw(st.sampled_from(["1-10", "0-999%100", "5"]))
    if draw(st.booleans()):  # --constraint, which an untyped GPU may get a feature added to
        job["features"] = draw(st.sampled_from(["", "ib", "ib|eth", "[rack1|rack2]",
                                                "gpushare_whole", "ib&gpushare_whole"]))
    return job
