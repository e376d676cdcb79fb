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
    # The test and lint tools, pinned so that every machine runs the same checks: the newest
    # releases that still install on Python 3.9 (`make unit39` installs this extra there too).
    extras_require={
        "test": ["pytest==8.4.2", "hypothesis==6.141.1", "lupa==2.8", "ruff==0.17.6",
                 "mypy==1.19.1", "types-PyYAML==6.0.12.20250915",
                 "prometheus_client==0.21.1", "kubernetes==35.0.0", "grpcio==1.80.1",
                 "protobuf==6.33.6"],
        # `gpushare tidal`'s Kubernetes side: the API server's client on the controller, the
        # kubelet's PodResources API (gRPC) on the nodes. Nothing else imports them.
        "tidal": ["kubernetes>=22.6", "grpcio>=1.51", "protobuf>=3.20"],
    },
    entry_points={"console_scripts": ["gpushare=gpushare.cli:main"]},
)
