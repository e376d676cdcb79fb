# SPDX-License-Identifier: GPL-2.0-or-later
"""Build job_submit_gpushare.so: slurmctld's job_submit plugin running the Python rules.

    /usr/bin/python3 submit_hooks/build.py --pythonpath /usr/lib64/gpushare/python \
        --out build/job_submit_gpushare.so

``--pythonpath`` is where the gpushare package is installed; it is compiled in because a
job_submit plugin takes no arguments. The facts file is ``$GPUSHARE_FACTS`` or
``/etc/slurm/gpushare-facts.json``, the same as job_submit.lua's.
"""
from __future__ import annotations

import argparse
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_embedbuild():
    """spank/embed/embedbuild.py, by its path."""
    spec = importlib.util.spec_from_file_location(
        "embedbuild", os.path.join(HERE, "..", "spank", "embed", "embedbuild.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


embedbuild = _load_embedbuild()

CFFI_MODULE = "_gpushare_job_submit"
ADAPTER = "gpushare.submit.jobsubmit_adapter"  # the module every call goes to

SLURM_VERSION_H = "/usr/include/slurm/slurm_version.h"
CDEF = """
#define SLURM_VERSION_NUMBER ...
void gs_log(int level, const char *msg);
void gs_replace_str(char **field, const char *value);
void gs_set_err_msg(char **err_msg, const char *value);
typedef struct job_descriptor {
    char *array_inx;
    uint32_t num_tasks;
    char **spank_job_env;
    uint32_t spank_job_env_size;
    char *tres_per_job;
    char *tres_per_node;
    char *tres_per_socket;
    char *tres_per_task;
    char *features;
    uint32_t min_nodes;
    uint32_t max_nodes;
    uint32_t req_switch;
    uint32_t wait4switch;
    uint32_t user_id;
    char *req_nodes;
    uint64_t bitflags;
@SEGMENT@    ...;
} job_desc_msg_t;
"""
# 24.11 added --segment (topology/block): the job's segment_size, NO_VAL16 when unset.
SEGMENT_FIELD = "    uint16_t segment_size;\n"


def slurm_version_number(header: str = SLURM_VERSION_H) -> int:
    """SLURM_VERSION_NUMBER of the installed headers (0x180b05 for 24.11.5)."""
    with open(header) as handle:
        for line in handle:
            parts = line.split()
            if parts[:2] == ["#define", "SLURM_VERSION_NUMBER"]:
                return int(parts[2], 16)
    raise SystemExit(f"{header} has no SLURM_VERSION_NUMBER: install libslurm-dev")


def cdef_for(version_number: int) -> str:
    """The job_desc fields the rules read, as the installed Slurm's struct has them."""
    has_segment = version_number >= 0x180B00  # 24.11
    return CDEF.replace("@SEGMENT@", SEGMENT_FIELD if has_segment else "")

EMBEDDING_API = """
int gpushare_submit_alive(void);
int gpushare_submit_call(int what, void *job_desc, uint32_t uid, char **err_msg);
"""


def build(out: str, pythonpath: str) -> str:
    init_code = embedbuild.init_code(CFFI_MODULE, ADAPTER, os.path.join(HERE, "_embedded.py"),
                                     [pythonpath])
    defines = embedbuild.python_defines()
    defines["GS_PYTHONPATH"] = embedbuild.c_string(pythonpath)
    return embedbuild.compile_embedded(CFFI_MODULE, EMBEDDING_API,
                                       cdef_for(slurm_version_number()), init_code,
                                       os.path.join(HERE, "job_submit_gpushare.c"), defines,
                                       os.path.join(HERE, "exports.map"), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/job_submit_gpushare.so")
    parser.add_argument("--pythonpath", default="/usr/lib64/gpushare/python")
    opts = parser.parse_args()
    print(build(opts.out, opts.pythonpath))


if __name__ == "__main__":
    main()
