# SPDX-License-Identifier: GPL-2.0-or-later
"""Packaging for gpushare: the Python core, its templates and the `gpushare` CLI.

The SPANK plugin and the job_submit plugin are built separately (``spank/build.py``)
because they must be compiled by the distribution's own python3 and python3-cffi.
"""
from setuptools import find_packages, setup

setup(
    name="gpushare",
    version="0.1.0",
    description="Safe, automatic GPU sharing (MPS, MIG, NVLink placement) for Slurm",
    license="GPL-2.0-or-later",
    license_files=["LICENSE"],
    package_dir={"": "src"},
    packages=find_packages("src"),
    package_data={"gpushare": ["admin/templates/*.j2", "gpu/profiles/*.json", "py.typed"]},
    python_requires=">=3.9",
    install_requires=[
        "jinja2>=2.11",
        "PyYAML>=5.3",
        "nvidia-ml-py>=11.450",
        "python-hostlist>=1.21",
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "lupa>=2.0", "ruff>=0.4",
                 "prometheus_client==0.21.1"],
    },
    entry_points={"console_scripts": ["gpushare=gpushare.cli:main"]},
)
