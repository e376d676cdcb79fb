# SPDX-License-Identifier: GPL-2.0-or-later
"""The RPM: built by `make rpm`, lint-clean, and complete: installed into a scratch root, its
own plugin, Python, submit hook and command run a real Slurm's shared, MIG and multi-node
jobs, with nothing taken from the repository. Its Release: names the Slurm release, its
plugins are hardened and built with the distribution's flags, and slurmd logs its version."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

import gpushare
import slurmbed

pytestmark = pytest.mark.slurm

USER = slurmbed.TEST_USERS[0]
BUILD_RPM = os.path.join(slurmbed.REPO, "scripts", "build_rpm.sh")
# A bed beside the session one: its own root, ports (+70) and node names (cgroups).
ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed") + "-rpm"
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200")) + 70
PREFIX = "rpm"
PYTHONDIR = "usr/lib64/gpushare/python"
PLUGINS = ("spank_gpushare.so", "spank_gpushare_core.so", "job_submit_gpushare.so")
# Added to the distribution's %{optflags} and %{build_ldflags} for the test build, so the
# packaged plugins show that both reached the compiler and the linker: -frecord-gcc-switches
# leaves a .GCC.command.line section, -z origin the ORIGIN dynamic flag.
OPTFLAGS_PROBE = "-frecord-gcc-switches"
LDFLAGS_PROBE = "-Wl,-z,origin"


def rpm_eval(macro: str) -> str:
    return subprocess.run(["rpm", "--eval", macro], capture_output=True, text=True,
                          check=True).stdout.strip()


def installed_slurm_version() -> tuple[int, int, int]:
    with open("/usr/include/slurm/slurm_version.h") as handle:
        number = int(re.search(r"#define SLURM_VERSION_NUMBER (0x[0-9a-fA-F]+)",
                               handle.read()).group(1), 16)
    return number >> 16 & 255, number >> 8 & 255, number & 255


@pytest.fixture(scope="module")
def built():
    """`scripts/build_rpm.sh --lint`: the RPM and rpmlint's report on it and the spec."""
    if os.geteuid() != 0:
        pytest.skip("installing Debian packages and the local Slurm need root")
    if not shutil.which("rpmbuild"):
        subprocess.run(["make", "-C", slurmbed.REPO, "deps"], check=True)
    optflags = f"{rpm_eval('%{optflags}')} {OPTFLAGS_PROBE}"
    ldflags = f"{rpm_eval('%{?build_ldflags}')} {LDFLAGS_PROBE}".strip()
    result = subprocess.run([BUILD_RPM, "--lint", "--define", f"optflags {optflags}",
                             "--define", f"build_ldflags {ldflags}"],
                            capture_output=True, text=True, timeout=600)
    rpms = [line for line in result.stdout.splitlines() if line.endswith(".rpm")]
    assert len(rpms) == 1 and os.path.exists(rpms[0]), result.stdout + result.stderr
    return rpms[0], result


@pytest.fixture(scope="module")
def installed(built):
    """The RPM installed with rpm --root into a scratch root readable by the job's user."""
    scratch = ROOT + "-install"
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch, mode=0o755)
    os.chmod(scratch, 0o755)
    try:
        subprocess.run(["rpm", "--root", scratch, "--initdb"], check=True)
        subprocess.run(["rpm", "--root", scratch, "-i", "--nodeps", built[0]], check=True,
                       capture_output=True)
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def rpm_query(rpm: str, *what: str) -> list[str]:
    result = subprocess.run(["rpm", "-qp", *what, rpm], capture_output=True, text=True,
                            check=True)
    return result.stdout.splitlines()


def test_rpmlint_reports_nothing_unexplained(built):
    _rpm, result = built
    assert result.returncode == 0, result.stdout + result.stderr
    summary = re.search(r"(\d+) errors, (\d+) warnings", result.stdout)
    assert summary, result.stdout
    assert summary.groups() == ("0", "0"), result.stdout


def test_package_holds_the_product_and_no_test_parts(built):
    files = rpm_query(built[0], "-l")
    for wanted in ("/usr/lib64/slurm/spank_gpushare.so", "/usr/lib64/slurm/spank_gpushare_core.so",
                   "/usr/lib64/slurm/job_submit_gpushare.so",
                   "/usr/bin/gpushare", "/usr/bin/gpushare-check",
                   "/usr/lib64/gpushare/python/gpushare/node/job.py",
                   "/usr/lib64/gpushare/python/gpushare/admin/templates/gres.conf.j2",
                   "/usr/lib64/gpushare/python/pynvml.py", "/usr/lib64/gpushare/python/hostlist.py",
                   "/usr/share/gpushare/job_submit.lua",
                   "/etc/slurm/plugstack.conf.d/gpushare.conf"):
        assert wanted in files, wanted
    assert not [f for f in files if "/profiles" in f or "mps_standin" in f
                or "nvidia-cuda-mps-control" in f], files
    config = rpm_query(built[0], "-c")
    assert config == ["/etc/slurm/plugstack.conf.d/gpushare.conf"]
    noreplace = rpm_query(built[0], "--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]")
    assert "/etc/slurm/plugstack.conf.d/gpushare.conf cn" in noreplace


def test_package_requires_the_slurm_release_it_was_built_against(built):
    major, minor, _micro = installed_slurm_version()
    release = f"{major}.{minor:02d}"
    requires = rpm_query(built[0], "-R")
    assert f"(slurm >= {release} with slurm < {release}.999)" in requires, requires
    for name in ("python3", "python3-cffi", "python3-jinja2", "python3-pyyaml"):
        assert name in requires, (name, requires)


def test_release_names_the_slurm_release(built):
    """Packages for two Slurm releases never share a name-version-release."""
    major, minor, _micro = installed_slurm_version()
    nvr = rpm_query(built[0], "--qf", "%{NAME} %{VERSION} %{RELEASE}")
    assert nvr == [f"gpushare {gpushare.__version__} 1.slurm{major}.{minor:02d}"]
    assert os.path.basename(built[0]) == (f"gpushare-{gpushare.__version__}-"
                                          f"1.slurm{major}.{minor:02d}.x86_64.rpm")


def test_build_refuses_a_slurm_release_other_than_the_headers(built, tmp_path):
    """A --define naming another Slurm release would mislabel the plugins: refused."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(built[0])))
    shutil.copytree(os.path.join(top, "SOURCES"), tmp_path / "SOURCES")
    major, minor, _micro = installed_slurm_version()
    other = f"{(major << 16) + ((minor + 1) << 8):#x}"
    result = subprocess.run(["rpmbuild", "-bb", "--nodeps", "--define", f"_topdir {tmp_path}",
                             "--define", f"slurm_version_number {other}",
                             os.path.join(top, "SPECS", "gpushare.spec")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0, result.stdout
    assert (f"slurm_version_number {other} is not the installed Slurm headers'"
            in result.stderr), result.stderr
    assert not os.path.exists(tmp_path / "RPMS" / "x86_64"), os.listdir(tmp_path / "RPMS")


def test_packaged_plugins_are_hardened_and_built_with_the_distribution_flags(installed):
    for name in PLUGINS:
        plugin = os.path.join(installed, "usr/lib64/slurm", name)
        # Full RELRO: relocations done at load, then read-only.
        dynamic, _headers = slurmbed.assert_hardened(plugin)
        assert re.search(r"\(FLAGS_1\)\s.*\bNOW\b", dynamic), (name, dynamic)
        # %{build_ldflags} reached the linker, %{optflags} the compiler, with the hardening.
        assert re.search(r"\(FLAGS\)\s.*\bORIGIN\b", dynamic), (name, dynamic)
        switches = slurmbed.readelf("-p", ".GCC.command.line", plugin)
        assert "-fstack-protector-strong" in switches, (name, switches)
        for flag in rpm_eval("%{optflags}").split():
            if flag.startswith(("-O", "-f", "-m", "-g")):
                assert flag in switches.split(), (name, flag, switches)


def test_installed_plugin_names_the_installed_python(installed):
    plugin = os.path.join(installed, "usr/lib64/slurm/job_submit_gpushare.so")
    with open(plugin, "rb") as handle:
        assert b"PYTHONPATH = ['/usr/lib64/gpushare/python']" in handle.read()
    with open(os.path.join(installed, "etc/slurm/plugstack.conf.d/gpushare.conf")) as handle:
        lines = [line for line in handle if line.strip() and not line.startswith("#")]
    assert lines == ["required /usr/lib64/slurm/spank_gpushare.so "
                     "pythonpath=/usr/lib64/gpushare/python\n"]


def run_installed_command(installed: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed /usr/bin/gpushare at its real paths: /usr/lib64 replaced by the scratch
    root's in a private mount namespace (the loader's link kept), nothing else changed."""
    lib64 = os.path.join(installed, "usr", "lib64")
    for entry in os.listdir("/usr/lib64"):
        if not os.path.lexists(os.path.join(lib64, entry)):
            os.symlink(os.readlink(os.path.join("/usr/lib64", entry))
                       if os.path.islink(os.path.join("/usr/lib64", entry))
                       else os.path.join("/usr/lib64", entry), os.path.join(lib64, entry))
    script = 'mount --bind "$1" /usr/lib64 && shift && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           "sh", lib64, os.path.join(installed, "usr/bin/gpushare"), *args],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})


def test_installed_command_runs_from_the_installed_core(installed):
    result = run_installed_command(installed, "--help")
    assert result.returncode == 0, result.stderr
    assert "render" in result.stdout and "check" in result.stdout
    probe = run_installed_command(installed, "render", "gres", "--plan", slurmbed.BED_PLAN)
    assert probe.returncode == 0, probe.stderr
    assert "Name=gpu" in probe.stdout and "Type=1g.10gb" in probe.stdout


def prefixed_plan(directory: str) -> str:
    """The bed plan with node names n1..n5 renamed rpm1..rpm5."""
    with open(slurmbed.BED_PLAN) as handle:
        text = re.sub(r"\bn(?=[\[\d])", PREFIX, handle.read())
    path = os.path.join(directory, "bed-rpm.yaml")
    with open(path, "w") as handle:
        handle.write(text)
    return path


@pytest.fixture(scope="module")
def rpm_bed(installed):
    plan = prefixed_plan(installed)
    bed = slurmbed.plan_bed(root=ROOT, port_base=PORT, plan_path=plan, job_submit="lua",
                            job_submit_lua=os.path.join(installed,
                                                        "usr/share/gpushare/job_submit.lua"))
    bed.plugin_args["pythonpath"] = os.path.join(installed, PYTHONDIR)
    args = " ".join(f"{k}={v}" for k, v in bed.default_plugin_args().items())
    bed.plugstack = (f"required {os.path.join(installed, 'usr/lib64/slurm/spank_gpushare.so')} "
                     f"{args}\n")
    bed.start()
    try:
        # The repository's build, copied by the bed, must play no part.
        shutil.rmtree(bed.path("lib"))
        yield bed
    finally:
        bed.stop()


def debug_lines_for(bed, job_id: int) -> list[str]:
    return [line for line in bed.debug_lines() if f" job={job_id} " in line]


def test_installed_plugin_runs_a_shared_job(rpm_bed):
    result = rpm_bed.run(["srun", "--gres=mps:25", "bash", "-c",
                          "echo JOB=$SLURM_JOB_ID PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
                          "PIPE=$CUDA_MPS_PIPE_DIRECTORY"], user=USER)
    values = dict(re.findall(r"(\w+)=(\S*)", result.stdout))
    assert values["PCT"] == "25", result.stdout
    assert values["PIPE"].startswith(rpm_bed.state_dir), result.stdout
    assert "gpushare:" not in result.stderr, result.stderr  # show=no: output untouched
    lines = debug_lines_for(rpm_bed, int(values["JOB"]))
    assert any(slurmbed.worker_ended(line, "job_prolog") for line in lines), lines


def test_installed_plugin_and_hook_run_a_mig_job(rpm_bed):
    job_id = rpm_bed.sbatch("echo CVD=$CUDA_VISIBLE_DEVICES", f"-w{PREFIX}5",
                            "--gres=gpu:1g.10gb:1", user=USER)
    info = rpm_bed.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", (info, rpm_bed.logs())
    assert "1g.10gb" in info.get("TresPerNode", ""), info
    assert re.search(r"CVD=\S+", rpm_bed.output(job_id)), rpm_bed.output(job_id)
    lines = debug_lines_for(rpm_bed, job_id)
    assert any("cb=job_prolog" in line for line in lines), lines


def test_installed_hook_keeps_a_multi_node_job_in_one_domain(rpm_bed):
    result = rpm_bed.run(["srun", "-N2", "--gres=gpu:1", "bash", "-c",
                          "echo NODE=$SLURMD_NODENAME JOB=$SLURM_JOB_ID"], user=USER)
    found = re.findall(r"NODE=(\S+) JOB=(\d+)", result.stdout)
    nodes = {node for node, _job in found}
    assert len(nodes) == 2, result.stdout
    domains = ({f"{PREFIX}1", f"{PREFIX}2"}, {f"{PREFIX}3", f"{PREFIX}4"})
    assert nodes in domains, nodes
    assert re.search(r"gpushare: .*--switches=1@", result.stderr), result.stderr
    info = rpm_bed.job(int(found[0][1]))
    assert info.get("Switches", "").startswith("1@"), info


def test_slurmd_logs_the_gpushare_version_once(rpm_bed):
    """Each slurmd names the gpushare it loaded, once (after the jobs above), and slurmctld
    does not."""
    major, minor, micro = installed_slurm_version()
    line = f"gpushare {gpushare.__version__} loaded (built for Slurm {major}.{minor:02d}.{micro})"
    logs = sorted(name for name in os.listdir(rpm_bed.path("log")) if name.startswith("slurmd-"))
    assert logs == sorted(f"slurmd-{node.name}.log" for node in rpm_bed.nodes), logs
    for name in logs:
        with open(rpm_bed.path("log", name), errors="replace") as handle:
            found = [text for text in handle if "gpushare" in text and " loaded (" in text]
        assert len(found) == 1 and found[0].rstrip().endswith(line), (name, found)
    with open(rpm_bed.path("log", "slurmctld.log"), errors="replace") as handle:
        assert line not in handle.read()
