# SPDX-License-Identifier: GPL-2.0-or-later
"""The Debian package: built by `make deb` with debhelper, lintian-clean, and complete:
installed with apt on this machine (Debian 12, or the Debian 13 root of
tests/release_root.py), its own plugins in Debian's Slurm plugin directory, its Python, its
job_submit plugin and its command run a real Slurm's shared and multi-node jobs, with
nothing taken from the repository; then purged, leaving nothing behind.

Installing touches this machine's /usr and /etc: like every test that starts Slurm, this one
runs under the shared lock, and it purges the package again (also when a test fails)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest

import gpushare
import slurmbed

pytestmark = pytest.mark.slurm

USER = slurmbed.TEST_USERS[0]
BUILD_DEB = os.path.join(slurmbed.REPO, "scripts", "build_deb.sh")
# A bed beside the session one: its own root, ports (+80) and node names (cgroups).
ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed") + "-deb"
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200")) + 80
PREFIX = "deb"
PACKAGE = "gpushare"
PYTHONDIR = "/usr/share/gpushare/python"
CONFFILE = "/etc/slurm/plugstack.conf.d/gpushare.conf"
PLUGINS = ("spank_gpushare.so", "spank_gpushare_core.so", "job_submit_gpushare.so")
# Appended to dpkg-buildflags' CFLAGS and LDFLAGS for the test build, so the packaged plugins
# show that both reached the compiler and the linker: -frecord-gcc-switches leaves a
# .GCC.command.line section, -z origin the ORIGIN dynamic flag.
CFLAGS_PROBE = "-frecord-gcc-switches"
LDFLAGS_PROBE = "-Wl,-z,origin"
# Directories only the package puts files in: empty or gone after the purge.
OWN_DIRS = ("/usr/share/gpushare", "/usr/share/doc/gpushare")


def multiarch() -> str:
    return subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True,
                          text=True, check=True).stdout.strip()


def plugin_dir() -> str:
    """Debian's Slurm plugin directory: where slurm-wlm-basic-plugins puts Slurm's own."""
    return f"/usr/lib/{multiarch()}/slurm-wlm"


def rpm_units() -> list[str]:
    """The systemd units the RPM ships too (packaging/*.service, *.timer, *.mount, *.slice)."""
    return sorted(name for name in os.listdir(os.path.join(slurmbed.REPO, "packaging"))
                  if name.endswith((".service", ".timer", ".mount", ".slice")))


def installed_slurm_version() -> tuple[int, int, int]:
    with open("/usr/include/slurm/slurm_version.h") as handle:
        number = int(re.search(r"#define SLURM_VERSION_NUMBER (0x[0-9a-fA-F]+)",
                               handle.read()).group(1), 16)
    return number >> 16 & 255, number >> 8 & 255, number & 255


def dpkg_buildflag(name: str) -> str:
    return subprocess.run(["dpkg-buildflags", "--get", name], capture_output=True, text=True,
                          check=True).stdout.strip()


def is_installed() -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", PACKAGE],
                            capture_output=True, text=True)
    return result.returncode == 0 and result.stdout.strip() not in ("", "un")


def apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    # Waits for dpkg's lock rather than failing when another apt-get holds it.
    return subprocess.run(["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def own_files() -> list[str]:
    """Files left in the package's own directories."""
    return [os.path.join(top, name) for own in OWN_DIRS
            for top, _dirs, names in os.walk(own) for name in names]


@pytest.fixture(scope="module")
def built():
    """`scripts/build_deb.sh --lint` with probe flags: the .deb and the script's result."""
    if os.geteuid() != 0:
        pytest.skip("building, installing and the local Slurm need root")
    slurmbed.finish_interrupted_dpkg()
    env = dict(os.environ, DEB_CFLAGS_APPEND=CFLAGS_PROBE, DEB_LDFLAGS_APPEND=LDFLAGS_PROBE)
    result = subprocess.run([BUILD_DEB, "--lint"], capture_output=True, text=True, timeout=900,
                            env=env)
    debs = [line for line in result.stdout.splitlines() if line.endswith(".deb")]
    assert len(debs) == 1 and os.path.exists(debs[0]), result.stdout + result.stderr
    return debs[0], result


def deb_field(deb: str, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", deb, field], capture_output=True, text=True,
                          check=True).stdout.strip()


def deb_files(deb: str) -> list[str]:
    listing = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True,
                             check=True).stdout
    return [line.split(None, 5)[5].lstrip(".") for line in listing.splitlines()]


def test_lintian_reports_no_error_or_warning(built):
    _deb, result = built
    assert result.returncode == 0, result.stdout + result.stderr
    tags = [line for line in result.stdout.splitlines() if re.match(r"[EW]: ", line)]
    assert tags == [], result.stdout


def test_package_holds_the_product_and_no_test_parts(built):
    files = deb_files(built[0])
    plugins = plugin_dir()
    for wanted in (f"{plugins}/spank_gpushare.so", f"{plugins}/spank_gpushare_core.so",
                   f"{plugins}/job_submit_gpushare.so", "/usr/bin/gpushare",
                   "/usr/bin/gpushare-check", f"{PYTHONDIR}/gpushare/node/job.py",
                   f"{PYTHONDIR}/gpushare/admin/templates/gres.conf.j2",
                   f"{PYTHONDIR}/pynvml.py", f"{PYTHONDIR}/hostlist.py",
                   "/usr/share/gpushare/job_submit.lua", "/usr/share/man/man1/gpushare.1.gz",
                   "/usr/share/doc/gpushare/admin.md", CONFFILE):
        assert wanted in files, wanted
    units = {os.path.basename(f): os.path.dirname(f) for f in files
             if os.path.basename(f) in rpm_units()}
    assert sorted(units) == rpm_units(), units
    assert set(units.values()) <= {"/lib/systemd/system", "/usr/lib/systemd/system"}, units
    assert not [f for f in files if "/profiles" in f or "mps_standin" in f
                or "nvidia-cuda-mps-control" in f or f.endswith(".pyc")], files
    conffiles = subprocess.run(["dpkg-deb", "--info", built[0], "conffiles"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert conffiles == [CONFFILE]


def test_package_depends_on_the_slurm_release_and_debian_python(built):
    major, minor, _micro = installed_slurm_version()
    depends = [d.strip() for d in deb_field(built[0], "Depends").split(",")]
    assert f"slurm-wlm-basic-plugins (>= {major}.{minor:02d})" in depends, depends
    assert f"slurm-wlm-basic-plugins (<< {major}.{minor + 1:02d}~)" in depends, depends
    for name in ("python3-cffi-backend", "python3-jinja2", "python3-yaml"):
        assert name in depends, (name, depends)
    # The embedded interpreter's library, found by dpkg-shlibdeps.
    assert any(d.startswith("libpython3.") for d in depends), depends


def test_version_names_the_slurm_release(built):
    """Packages for two Slurm releases never share a version."""
    major, minor, _micro = installed_slurm_version()
    version = f"{gpushare.__version__}-1+slurm{major}.{minor:02d}"
    assert deb_field(built[0], "Version") == version
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert os.path.basename(built[0]) == f"gpushare_{version}_{arch}.deb"


def test_packaged_plugins_are_hardened_and_built_with_dpkg_buildflags(built, tmp_path):
    subprocess.run(["dpkg-deb", "-x", built[0], str(tmp_path)], check=True)
    for name in PLUGINS:
        plugin = os.path.join(str(tmp_path), plugin_dir().lstrip("/"), name)
        dynamic, _headers = slurmbed.assert_hardened(plugin)
        assert re.search(r"\(FLAGS_1\)\s.*\bNOW\b", dynamic), (name, dynamic)
        # dpkg-buildflags' LDFLAGS reached the linker, its CFLAGS the compiler.
        assert re.search(r"\(FLAGS\)\s.*\bORIGIN\b", dynamic), (name, dynamic)
        switches = slurmbed.readelf("-p", ".GCC.command.line", plugin)
        assert "-fstack-protector-strong" in switches, (name, switches)
        recorded = switches.split()
        for flag in dpkg_buildflag("CFLAGS").split():
            # Build-directory maps differ per build; gcc records a flag with its default
            # value spelt out (-fcf-protection as -fcf-protection=full).
            if flag.startswith(("-O", "-f", "-m", "-g")) and "=/" not in flag:
                assert flag in recorded or any(r.startswith(flag + "=") for r in recorded), \
                    (name, flag, switches)


@pytest.fixture(scope="module")
def installed(built):
    """The package installed with apt-get on this machine; purged again at the end."""
    if is_installed():
        purged = apt_get("purge", PACKAGE)
        assert purged.returncode == 0, \
            f"purging an earlier gpushare install failed: {purged.stdout}{purged.stderr}"
    leftover = own_files()
    assert not leftover, f"files of an earlier gpushare install: {leftover}"
    result = apt_get("install", "--no-install-recommends", os.path.abspath(built[0]))
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield built[0]
    finally:
        if is_installed():
            apt_get("purge", PACKAGE)


def test_installed_core_is_root_owned_and_byte_compiled(installed):
    """What the plugin's own check accepts: root's files, writable by no one else; the
    bytecode py3compile wrote at install among them."""
    cached = glob.glob(f"{PYTHONDIR}/gpushare/node/__pycache__/job.*.pyc")
    assert cached, os.listdir(f"{PYTHONDIR}/gpushare/node")
    for top, dirs, names in os.walk(PYTHONDIR):
        for entry in [top, *(os.path.join(top, n) for n in dirs + names)]:
            status = os.lstat(entry)
            assert status.st_uid == 0 and not status.st_mode & 0o022, entry


def test_units_are_installed_disabled(installed):
    listed = subprocess.run(["dpkg", "-L", PACKAGE], capture_output=True, text=True,
                            check=True).stdout.split()
    units = sorted(os.path.basename(f) for f in listed if os.path.basename(f) in rpm_units()
                   and os.path.isfile(f))
    assert units == rpm_units(), listed
    enabled = [link for unit in units
               for link in glob.glob(f"/etc/systemd/system/**/{unit}", recursive=True)]
    assert enabled == []


def test_installed_command_runs_from_the_installed_core(installed):
    result = subprocess.run(["/usr/bin/gpushare", "--help"], capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "render" in result.stdout and "check" in result.stdout
    probe = subprocess.run(["/usr/bin/gpushare", "render", "gres", "--plan", slurmbed.BED_PLAN],
                           capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin"})
    assert probe.returncode == 0, probe.stderr
    assert "Name=gpu" in probe.stdout and "Type=1g.10gb" in probe.stdout


def conffile_line() -> str:
    with open(CONFFILE) as handle:
        lines = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    assert len(lines) == 1, lines
    return lines[0]


def test_conffile_names_the_installed_plugin_and_core(installed):
    assert conffile_line() == (f"required {plugin_dir()}/spank_gpushare.so "
                               f"pythonpath={PYTHONDIR}")
    with open(os.path.join(plugin_dir(), "job_submit_gpushare.so"), "rb") as handle:
        assert f"PYTHONPATH = ['{PYTHONDIR}']".encode() in handle.read()


def test_example_plan_is_for_the_packaged_slurm(installed):
    """Rendered from the example as it is, the facts speak this Slurm's request syntax."""
    import yaml

    major, minor, _micro = installed_slurm_version()
    with open("/usr/share/gpushare/examples/plan.example.yaml") as handle:
        plan = yaml.safe_load(handle)
    assert plan["slurm"]["version"] == f"{major}.{minor:02d}"


@pytest.fixture(scope="module")
def deb_bed(installed):
    """A bed whose plugstack line is the installed conffile's with the bed's own arguments,
    and whose slurmctld loads JobSubmitPlugins=gpushare from Debian's default PluginDir."""
    bed = slurmbed.plan_bed(root=ROOT, port_base=PORT, node_prefix=PREFIX, job_submit="gpushare")
    args = {k: v for k, v in bed.default_plugin_args().items() if k != "pythonpath"}
    bed.plugstack = f"{conffile_line()} {' '.join(f'{k}={v}' for k, v in args.items())}\n"
    bed.start()
    try:
        # The repository's build, copied by the bed, must play no part.
        shutil.rmtree(bed.path("lib"))
        yield bed
    finally:
        bed.stop()


def debug_lines_for(bed, job_id: int) -> list[str]:
    return [line for line in bed.debug_lines() if f" job={job_id} " in line]


def test_installed_plugin_runs_a_shared_job(deb_bed):
    """The packaged core sets up and undoes a shared job; by default (prefork=yes) the
    first worker leaves the node a prefork server of the package's code, which sets up the
    next job."""
    command = ["srun", "--gres=mps:25", "bash", "-c",
               "echo JOB=$SLURM_JOB_ID NODE=$SLURMD_NODENAME "
               "PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE PIPE=$CUDA_MPS_PIPE_DIRECTORY"]
    result = deb_bed.run(command, user=USER)
    values = dict(re.findall(r"(\w+)=(\S*)", result.stdout))
    assert values["PCT"] == "25", result.stdout
    assert values["PIPE"].startswith(deb_bed.state_dir), result.stdout
    # The worker's last word is logged when it ends, which may be after the task ran.
    job_id = int(values["JOB"])
    for callback in ("job_prolog", "job_epilog"):
        slurmbed.wait_until(f"job {job_id}: {callback} done", lambda cb=callback: any(
            slurmbed.worker_ended(line, cb) for line in debug_lines_for(deb_bed, job_id)), 120)
    node = values["NODE"]
    slurmbed.wait_until(f"{node}'s prefork server", lambda: deb_bed.prefork_serving(node), 60)
    again = dict(re.findall(r"(\w+)=(\S*)", deb_bed.run(
        [command[0], "-w", node, *command[1:]], user=USER).stdout))
    assert again["PCT"] == "25", again
    slurmbed.wait_until(f"job {again['JOB']}: set up by the server", lambda: any(
        "cb=job_prolog prefork rc=0" in line
        for line in debug_lines_for(deb_bed, int(again["JOB"]))), 120)


def test_installed_hook_keeps_a_multi_node_job_in_one_domain(deb_bed):
    result = deb_bed.run(["srun", "-N2", "--gres=gpu:1", "bash", "-c",
                          "echo NODE=$SLURMD_NODENAME JOB=$SLURM_JOB_ID"], user=USER)
    found = re.findall(r"NODE=(\S+) JOB=(\d+)", result.stdout)
    nodes = {node for node, _job in found}
    assert nodes in ({f"{PREFIX}1", f"{PREFIX}2"}, {f"{PREFIX}3", f"{PREFIX}4"}), result.stdout
    info = deb_bed.job(int(found[0][1]))
    assert info.get("Switches", "").startswith("1@"), info


def test_slurmd_logs_the_packaged_gpushare(deb_bed):
    major, minor, micro = installed_slurm_version()
    line = f"gpushare {gpushare.__version__} loaded (built for Slurm {major}.{minor:02d}.{micro})"
    for node in deb_bed.nodes:
        with open(deb_bed.path("log", f"slurmd-{node.name}.log"), errors="replace") as handle:
            found = [text for text in handle if "gpushare" in text and " loaded (" in text]
        assert len(found) == 1 and found[0].rstrip().endswith(line), (node.name, found)


def bed_args_line(bed, **changed: str) -> str:
    """The installed plugin's line with the bed's own arguments, without pythonpath= (the
    package's default) unless ``changed`` gives one."""
    args = {k: v for k, v in bed.default_plugin_args().items() if k != "pythonpath"}
    args.update(changed)
    return (f"required {plugin_dir()}/spank_gpushare.so "
            f"{' '.join(f'{k}={v}' for k, v in args.items())}\n")


def drain_reason(bed, node: str) -> str:
    """The node's whole drain reason (sinfo's: it holds ``=`` signs whole)."""
    return bed.run(["sinfo", "-h", "-N", "-n", node, "-o", "%E"]).stdout.strip()


@pytest.fixture
def own_line(deb_bed):
    """The test writes its own plugstack line; the conffile's is put back after it, with
    every node resumed and the test's jobs gone."""
    saved = deb_bed.plugstack
    yield deb_bed
    deb_bed.write_plugstack(saved)
    deb_bed.run(["scancel", "--quiet", "-u", USER], check=False)
    slurmbed.wait_until("the test's jobs gone", lambda: not deb_bed.run(
        ["squeue", "-h", "-o", "%i"], check=False).stdout.split(), 120)
    deb_bed.resume(*(node.name for node in deb_bed.nodes))


def test_a_line_without_pythonpath_takes_the_packages_own(own_line):
    """A site that copied the line and dropped pythonpath=: the packaged plugin takes its
    own install directory, checks it as a given one, and a GPU job runs."""
    bed = own_line
    bed.write_plugstack(bed_args_line(bed))
    node = f"{PREFIX}4"
    result = bed.run(["srun", "--gres=gpu:1", "-w", node, "-c1", "bash", "-c",
                      "echo JOB=$SLURM_JOB_ID"], user=USER, check=False)
    assert result.returncode == 0, (result.stdout, result.stderr)
    job_id = int(re.search(r"JOB=(\d+)", result.stdout).group(1))
    slurmbed.wait_until(f"job {job_id}: its prolog's Python ran", lambda: any(
        slurmbed.worker_ended(line, "job_prolog") for line in debug_lines_for(bed, job_id)), 120)
    assert "DRAIN" not in bed.node_state(node)["State"], bed.node_state(node)


def test_a_pythonpath_without_the_core_drains_and_requeues(own_line):
    """pythonpath= names a root's directory without gpushare: the node's fault. The node is
    drained naming the setting and the path, the batch job requeued held as Slurm holds a
    job whose prolog failed; one that asked --no-requeue is not requeued, and says why."""
    bed = own_line
    empty = os.path.join(ROOT, "no-gpushare-here")
    os.makedirs(empty, mode=0o755, exist_ok=True)
    bed.write_plugstack(bed_args_line(bed, pythonpath=empty))
    node = f"{PREFIX}4"
    job_id = bed.sbatch("echo RAN", "--gres=gpu:1", "-w", node, "-c1", user=USER)
    slurmbed.wait_until(f"{node} drained",
                        lambda: "DRAIN" in bed.node_state(node)["State"], 120)
    assert drain_reason(bed, node) == f"gpushare: cannot import its core from pythonpath={empty}"
    bed.wait_requeued_held(job_id)
    assert "RAN" not in bed.output(job_id, "")

    bed.resume(node)
    job_id = bed.sbatch("echo RAN", "--gres=gpu:1", "-w", node, "-c1", "--no-requeue",
                        user=USER)
    info = bed.wait_job(job_id, timeout=120)
    assert info["JobState"] != "COMPLETED" and info.get("Restarts") == "0", info
    assert "DRAIN" in bed.node_state(node)["State"], bed.node_state(node)
    output = bed.output(job_id)
    assert "RAN" not in output, output
    assert (f"could not set up this job on node {node}: gpushare cannot import its core from "
            f"pythonpath={empty}. The node was drained; submit the job again") in output, output


def test_remove_keeps_the_edited_conffile_and_purge_leaves_nothing(installed, deb_bed):
    """Last: remove, then purge, while the bed still runs."""
    listed = subprocess.run(["dpkg", "-L", PACKAGE], capture_output=True, text=True,
                            check=True).stdout.split()
    packaged = [path for path in listed if os.path.isfile(path)]
    with open(CONFFILE, "a") as handle:
        handle.write("# a site's edit\n")
    removed = apt_get("remove", PACKAGE)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    with open(CONFFILE) as handle:
        assert "# a site's edit" in handle.read()
    purged = apt_get("purge", PACKAGE)
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert not is_installed()
    still = subprocess.run(["dpkg", "-L", PACKAGE], capture_output=True, text=True)
    assert still.returncode != 0 and not still.stdout.strip(), still.stdout
    assert [path for path in packaged if os.path.lexists(path)] == []
    assert own_files() == [] and not os.path.exists(PYTHONDIR)
    assert not os.path.exists(CONFFILE)
    assert not glob.glob(f"{plugin_dir()}/*gpushare*")
    assert not glob.glob("/var/lib/systemd/deb-systemd-helper-enabled/**/gpushare*",
                         recursive=True)
