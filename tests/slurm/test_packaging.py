# SPDX-License-Identifier: GPL-2.0-or-later
"""`make build`'s plugins: spank/build.py and submit_hooks/build.py harden both plugins and
add the distribution's CPPFLAGS, CFLAGS and LDFLAGS from the environment, once each, for
the plain C plugin and the cffi-built ones alike (the RPM's case is in test_rpm.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

import slurmbed

SYSTEM_PYTHON = "/usr/bin/python3"
# Visible in the result: -frecord-gcc-switches leaves a .GCC.command.line section, -z origin
# the ORIGIN dynamic flag; the CPPFLAGS FORTIFY level replaces the built-in one.
PROBE_ENV = {"CPPFLAGS": "-D_FORTIFY_SOURCE=3", "CFLAGS": "-O2 -frecord-gcc-switches",
             "LDFLAGS": "-Wl,-z,origin"}


def unusable_reason() -> str:
    if not os.path.exists("/usr/include/slurm/slurm_version.h"):
        return "needs the Slurm headers (libslurm-dev)"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import cffi"], capture_output=True)
    if probe.returncode != 0:
        return "needs the system python3 with cffi (python3-cffi)"
    return ""


pytestmark = pytest.mark.skipif(bool(unusable_reason()), reason=unusable_reason())


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """Both build scripts run as `make build` and the spec run them, with probe flags."""
    out = tmp_path_factory.mktemp("plugins")
    env = dict(os.environ, **PROBE_ENV)
    results = [
        subprocess.run([SYSTEM_PYTHON, os.path.join(slurmbed.REPO, "spank", "build.py"),
                        "--out", str(out / "spank_gpushare.so")],
                       env=env, capture_output=True, text=True, timeout=300),
        subprocess.run([SYSTEM_PYTHON, os.path.join(slurmbed.REPO, "submit_hooks", "build.py"),
                        "--out", str(out / "job_submit_gpushare.so")],
                       env=env, capture_output=True, text=True, timeout=300),
    ]
    for result in results:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "warning" not in result.stderr, result.stderr
    return [str(out / name) for name in
            ("spank_gpushare.so", "spank_gpushare_core.so", "job_submit_gpushare.so")]


def test_plugins_are_hardened(plugins):
    for plugin in plugins:
        slurmbed.assert_hardened(plugin)


def test_environment_flags_reach_compiler_and_linker_once(plugins):
    for plugin in plugins:
        assert re.search(r"\(FLAGS\)\s.*\bORIGIN\b", slurmbed.readelf("-d", plugin)), plugin
        switches = slurmbed.readelf("-p", ".GCC.command.line", plugin)
        assert "-fstack-protector-strong" in switches, (plugin, switches)


def build_flags(env: dict[str, str]) -> dict[str, list[str]]:
    """The plugins' flags and constants (spank/embed/embedbuild.py, which both build scripts
    use), from the system python3 that runs them."""
    code = ("import importlib.util as u, json, sys; "
            "s = u.spec_from_file_location('embedbuild', sys.argv[1]); "
            "build = u.module_from_spec(s); s.loader.exec_module(build); "
            "c, ld = build.build_flags(); print(json.dumps({'c': c, 'ld': ld, "
            "'hc': build.HARDENING_CFLAGS, 'hf': build.HARDENING_FORTIFY, "
            "'hld': build.HARDENING_LDFLAGS}))")
    helper = os.path.join(slurmbed.REPO, "spank", "embed", "embedbuild.py")
    result = subprocess.run([SYSTEM_PYTHON, "-c", code, helper],
                            env=env, capture_output=True, text=True, check=True, timeout=60)
    return json.loads(result.stdout)


def test_hardening_comes_first_so_the_distribution_flags_win():
    """The order is hardening, then CPPFLAGS, CFLAGS and LDFLAGS as given; a FORTIFY level of
    the distribution's replaces the default one."""
    bare = {k: v for k, v in os.environ.items() if k not in PROBE_ENV}
    flags = build_flags(dict(bare, **PROBE_ENV))
    assert flags["c"] == [*flags["hc"], "-D_FORTIFY_SOURCE=3", "-O2", "-frecord-gcc-switches"]
    assert flags["ld"] == [*flags["hld"], "-Wl,-z,origin"]
    assert "-Wl,-z,now" in flags["hld"] and "-fstack-protector-strong" in flags["hc"]
    flags = build_flags(bare)
    assert flags["c"] == [*flags["hc"], *flags["hf"]]
    assert flags["hf"][-1] == "-D_FORTIFY_SOURCE=2"
    assert flags["ld"] == flags["hld"]
