# SPDX-License-Identifier: GPL-2.0-or-later
"""Every example in etc/ runs as shipped, against a real local Slurm.

For each ownership plan ``etc/*plan*.yaml`` a bed is started with every node of the plan
(``slurmd -N``), each node's NVML simulated from the plan itself (``gpushare simulate``),
gres.conf, topology.conf and the submit facts written by ``gpushare render``, slurm.conf
holding the lines of ``etc/slurm.conf.example`` (the Python submit hook, the health check),
and plugstack.conf being ``etc/plugstack.conf.example``, which includes ``etc/gpushare.conf``
with the plan's arguments and ``plan=``, as docs/admin.md says; the keys that
``gpushare render slurm-conf`` prints replace the example's (``TopologyPlugin=topology/block``
for a plan of NVLink blocks). Only the installation paths are moved into the bed, and a
plan's ``slurm.version`` is set to the running release, as a site sets it to its own (a plan
that needs a newer release than the running one is skipped). ``SwitchType=switch/nvidia_imex``
stays out: it needs NVIDIA's IMEX driver (``nvidia-caps-imex-channels``), which the bed has
not; the bed makes the channel device that plugin would make for each job, where the
plugstack line's ``imex_channels=`` looks. A normal user then runs a job on each device the
plan gives Slurm (whole GPUs, MPS shares, every MIG slice, those of a GPU split with
Kubernetes included) and one on two nodes of an NVLink domain; each job must complete on the
devices it asked for, and no node may be drained.

The bed uses ``GPUSHARE_BED_PORT`` + 140 up (one port per node) and the root
``/tmp/gsbed-ex-<that port>``; its node names are the plans', so its cgroups never meet
the other beds'.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any

import pytest
from tests.slurm.test_check import CGROUP2_MOUNTINFO

import slurmbed

pytestmark = pytest.mark.slurm

PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200")) + 140
# Short, and named after the ports (which are this bed's alone): an MPS control socket is
# <root>/state/<node>/mps/u<uid>-<GPU UUID>/pipe/control, and the stand-in's daemon cannot
# listen on a socket path of 107 bytes or more.
ROOT = f"/tmp/gsbed-ex-{PORT}"
ETC = os.path.join(slurmbed.REPO, "etc")
PLANS = sorted(glob.glob(os.path.join(ETC, "*plan*.yaml")))
SLURM_PLUGINS = "/usr/lib/x86_64-linux-gnu/slurm-wlm"
USER = slurmbed.TEST_USERS[0]
SCRIPT = ('echo "JOB_GPUS=${SLURM_JOB_GPUS-}"; echo "UUIDS=${GPUSHARE_GPU_UUIDS-}"; '
          'echo "PCT=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-}"; sleep {sleep}')


def gpushare(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.path.join(slurmbed.REPO, "src"))
    result = subprocess.run([sys.executable, "-m", "gpushare.cli", *args], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, f"gpushare {' '.join(args)}: {result.stderr}"
    return result.stdout


def installed(bed: slurmbed.SlurmBed, text: str) -> str:
    """The shipped text with the installation's paths moved into the bed, nothing else."""
    moves = (
        ("/dev/nvidia-caps-imex-channels", bed.path("dev", "nvidia-caps-imex-channels")),
        ("/etc/slurm/", bed.path("etc") + "/"),
        ("/etc/gpushare/plan.yaml", bed.path("etc", "plan.yaml")),
        ("/usr/lib64/slurm/", bed.path("lib") + "/"),
        ("/usr/lib64/gpushare/python", bed.path("lib", "python")),
        ("/usr/bin/gpushare-check", bed.path("bin", "gpushare-check")),
    )
    for old, new in moves:
        text = text.replace(old, new)
    return text


def conf_lines(path: str) -> list[str]:
    with open(path) as handle:
        return [line.strip() for line in handle if line.strip() and not line.startswith("#")]


def plugin_args(line: str) -> list[str]:
    """The key=value arguments of a plugstack line (after the plugin's path)."""
    words = shlex.split(line)
    return words[2:]


def for_running_release(plan_path: str) -> str:
    """The plan with its ``slurm.version`` set to the running Slurm's release, as a site
    sets it (a copy beside the bed's root), or the plan itself when it names none or that
    one. Skips a plan that needs a newer Slurm than the running one."""
    from gpushare.admin.plan import load_plan, release_tuple

    plan = load_plan(plan_path)
    running = slurmbed.slurm_release()
    if (plan.slurm.topology == "block" or plan.slurm.imex) and running < (24, 5):
        pytest.skip(f"{os.path.basename(plan_path)} needs Slurm 24.05 or later "
                    f"(topology/block, switch/nvidia_imex); this is {running[0]}.{running[1]:02d}")
    if not plan.slurm.version_given or release_tuple(plan.slurm.version) == running:
        return plan_path
    with open(plan_path) as handle:
        text = handle.read()
    release = f"{running[0]}.{running[1]:02d}"
    moved, count = re.subn(r'(?m)^(  version: )"[0-9.]+"', rf'\g<1>"{release}"', text, count=1)
    assert count == 1, f"{plan_path}: no slurm.version line to set"
    copy = f"{ROOT}.{os.path.basename(plan_path)}"
    with open(copy, "w") as handle:
        handle.write(moved)
    return copy


def slurm_conf_lines(bed: slurmbed.SlurmBed, plan_path: str) -> list[str]:
    """slurm.conf.example's lines, each key ``gpushare render slurm-conf`` prints replaced by
    its line (SwitchType=switch/nvidia_imex left out: see the module doc), paths moved."""
    rendered = {line.split("=", 1)[0]: line for line in
                gpushare("render", "slurm-conf", "--plan", plan_path).splitlines()
                if line.strip() and not line.startswith("#")}
    rendered.pop("SwitchType", None)
    lines = []
    for line in conf_lines(os.path.join(ETC, "slurm.conf.example")):
        lines.append(installed(bed, rendered.pop(line.split("=", 1)[0], line)))
    return lines + list(rendered.values())


def example_bed(plan_path: str) -> slurmbed.SlurmBed:
    """The bed for one example plan, configured from etc/ as shipped (see the module doc)."""
    plan_path = for_running_release(plan_path)
    bed = slurmbed.plan_bed(root=ROOT, port_base=PORT, plan_path=plan_path, simulate=True)
    dev = bed.path("dev")
    # What a site renders from the plan, with the CLI the docs show.
    bed.gres_conf = gpushare("render", "gres", "--plan", plan_path, "--device-root", dev)
    bed.topology_conf = gpushare("render", "topology", "--plan", plan_path)
    bed.facts_json = gpushare("render", "facts", "--plan", plan_path)
    rendered = [line for line in gpushare("render", "plugstack", "--plan", plan_path)
                .splitlines() if line.startswith("required ")]
    assert len(rendered) == 1, rendered
    conf = slurm_conf_lines(bed, plan_path)
    bed.example_conf = conf  # type: ignore[attr-defined]
    bed.extra_conf = "\n".join(conf) + f"\nPluginDir={SLURM_PLUGINS}:{bed.path('jobsubmit')}"
    with open(os.path.join(ETC, "plugstack.conf.example")) as handle:
        bed.plugstack = installed(bed, handle.read())
    # gpushare.conf as shipped, then the plan's arguments, then what only a bed needs
    # (simulated NVML, the MPS stand-in, a state directory per slurmd, the plan's path).
    (shipped,) = [line for line in conf_lines(os.path.join(ETC, "gpushare.conf"))]
    line = installed(bed, shipped)
    keys = {arg.split("=", 1)[0] for arg in plugin_args(line)}
    for arg in plugin_args(installed(bed, rendered[0])):
        if arg.split("=", 1)[0] not in keys:
            line += " " + arg
            keys.add(arg.split("=", 1)[0])
    for key, value in bed.default_plugin_args().items():
        if key not in keys:
            line += f" {key}={value}"
    prepare = bed.prepare

    def prepare_as_shipped() -> None:
        prepare()
        if "imex_channels=" in line:
            # What switch/nvidia_imex makes for a job: a channel device (major of
            # nvidia-caps-imex-channels), which every GPU task must find.
            channels = bed.path("dev", "nvidia-caps-imex-channels")
            assert f"imex_channels={channels}" in line, line
            os.makedirs(channels)
            os.mknod(os.path.join(channels, "channel0"), 0o666 | 0o020000, os.makedev(234, 0))
        os.makedirs(bed.path("etc", "plugstack.conf.d"))
        with open(bed.path("etc", "plugstack.conf.d", "gpushare.conf"), "w") as handle:
            handle.write(line + "\n")
        # JobSubmitPlugins=gpushare: the Python hook, compiled against the bed's core.
        slurmbed.build_python_hook(bed)
        # HealthCheckProgram: the RPM's gpushare-check (gpushare check --drain), with the
        # bed's plan, gres.conf and simulated NVML, a kernel.yama.ptrace_scope of 1 and cgroup
        # v2 as docs/admin.md sets them (this host's kernel may have no Yama, a release root
        # no cgroup v2); each run leaves its exit status.
        yama = bed.path("proc", "sys", "kernel", "yama")
        os.makedirs(yama, exist_ok=True)
        with open(os.path.join(yama, "ptrace_scope"), "w") as handle:
            handle.write("1\n")
        os.makedirs(bed.path("proc", "self"), exist_ok=True)
        with open(bed.path("proc", "self", "mountinfo"), "w") as handle:
            handle.write(CGROUP2_MOUNTINFO)  # a cgroup for each daemon (docs/admin.md)
        check = bed.path("bin", "gpushare-check")
        command = (f'import sys; sys.path.insert(0, "{bed.path("lib", "python")}"); '
                   "from gpushare.cli import main; sys.exit(main())")
        with open(check, "w") as handle:
            handle.write(
                "#!/bin/sh\n"
                f"export SLURM_CONF={bed.conf}\n"
                f"/usr/bin/python3 -I -c '{command}' check --drain "
                f"--plan {bed.path('etc', 'plan.yaml')} --gres-conf {bed.path('etc', 'gres.conf')}"
                f" --device-root {dev} --source sim:{bed.path('nodes')}/$SLURMD_NODENAME.json"
                f" --proc-root {bed.path('proc')}"
                f" >> {bed.path('log', 'health')}-$SLURMD_NODENAME.log 2>&1\n"
                "rc=$?\n"
                f"echo \"rc=$rc\" >> {bed.path('log', 'health')}-$SLURMD_NODENAME.log\n"
                "exit $rc\n")
        os.chmod(check, 0o755)

    bed.prepare = prepare_as_shipped  # type: ignore[method-assign]
    return bed


@pytest.fixture(scope="module", params=PLANS, ids=os.path.basename)
def example(request):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    if not os.path.exists(os.path.join(slurmbed.BUILD, "spank_gpushare.so")):
        subprocess.run(["make", "-C", slurmbed.REPO, "build"], check=True)
    from gpushare.admin.plan import load_plan

    bed = example_bed(request.param)
    started = time.monotonic()
    bed.start()
    print(f"{os.path.basename(request.param)}: {len(bed.nodes)} nodes idle after "
          f"{time.monotonic() - started:.1f} s")
    try:
        yield bed, load_plan(bed.plan_source)
    finally:
        bed.stop()


# ---- helpers -------------------------------------------------------------------------------


def profile(bed: slurmbed.SlurmBed, node: str) -> dict[str, Any]:
    with open(bed.path("nodes", f"{node}.json")) as handle:
        return json.load(handle)


def health_log(bed: slurmbed.SlurmBed, node: str) -> str:
    try:
        with open(bed.path("log", f"health-{node}.log")) as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def job_devices(bed: slurmbed.SlurmBed, node: str, job_id: int) -> list[Any]:
    """The gres.conf devices Slurm gave the job (SLURM_JOB_GPUS are their indices)."""
    from gpushare.gpu.gresconf import load_gres_conf

    text = bed.output(job_id)
    match = re.search(r"^JOB_GPUS=(.*)$", text, re.MULTILINE)
    assert match and match.group(1), text
    devices = load_gres_conf(bed.path("etc", "gres.conf")).devices(node)
    return [devices[int(index)] for index in match.group(1).split(",")]


def run_jobs(bed: slurmbed.SlurmBed, requests: list[tuple[str, str]], sleep: int = 0
             ) -> list[int]:
    """Submit (node, gres) jobs as a normal user, all at once; each must complete."""
    script = SCRIPT.replace("{sleep}", str(sleep))
    jobs = [bed.sbatch(script, "-w", node, f"--gres={gres}", user=USER)
            for node, gres in requests]
    for job_id, (node, gres) in zip(jobs, requests):
        info = finished(bed, job_id)
        assert info["JobState"] == "COMPLETED", (
            f"{gres} on {node}: {info.get('JobState')} ({info.get('Reason')})\n"
            + "\n".join(line for line in bed.debug_lines() if f"job={job_id} " in line))
        assert info["NodeList"] == node, info
    return jobs


def finished(bed: slurmbed.SlurmBed, job_id: int, timeout: float = 120.0) -> dict[str, str]:
    """The job once it ended, or once Slurm gave up starting it (a failed prolog)."""
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = bed.job(job_id)
        if info.get("JobState") in slurmbed.TERMINAL_STATES or int(info.get("Restarts", 0)) \
                or "held" in info.get("Reason", "").lower():
            return info
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout:.0f} s")


def assert_no_node_drained(bed: slurmbed.SlurmBed) -> None:
    result = bed.run(["sinfo", "-h", "-N", "-o", "%N %t %E"])
    states = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert len(states) == len(bed.nodes)
    bad = [line for line in states.values() if line.split()[1] not in ("idle", "mix", "alloc")]
    assert not bad, bad


def first_nodes(plan: Any) -> list[tuple[Any, str]]:
    return [(group, group.nodes[0]) for group in plan.groups]


# ---- the configuration as shipped ----------------------------------------------------------


def test_slurm_conf_example_is_what_slurmctld_runs_with(example):
    bed, _plan = example
    config = {}
    for line in bed.run(["scontrol", "show", "config"]).stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    for line in bed.example_conf:
        key, value = (part.strip() for part in line.split("=", 1))
        shown = config[key]
        if key == "HealthCheckInterval":
            shown = shown.split()[0]  # "300 sec"
        assert shown == value, (key, shown, value)
    with open(bed.path("log", "slurmctld.log")) as handle:
        # A fresh bed has its own errors (no state to recover, no PMIx): only those about
        # what the example configures count.
        topics = re.compile(r"gpushare|job_submit|topolog|switch|gres|spank|plugstack|health|"
                            r"prolog|select|sched", re.IGNORECASE)
        errors = [line for line in handle if (" error: " in line or "fatal" in line)
                  and topics.search(line.replace(bed.root, "ROOT"))]
    assert not errors, errors


def test_every_node_passes_its_health_check(example):
    """slurmd runs HealthCheckProgram (gpushare check --drain) as it starts: all well."""
    bed, _plan = example
    deadline = time.monotonic() + 60
    missing = [node.name for node in bed.nodes]
    while missing and time.monotonic() < deadline:
        missing = [name for name in missing if "rc=" not in health_log(bed, name)]
        time.sleep(0.5)
    assert not missing, missing
    for node in bed.nodes:
        text = health_log(bed, node.name)
        assert "rc=0" in text and "all well" in text, (node.name, text)
    assert_no_node_drained(bed)


# ---- jobs on every device the plan gives Slurm ---------------------------------------------


def test_whole_gpus_run_where_the_plan_gives_them(example):
    bed, plan = example
    requests, wanted = [], []
    for group, node in first_nodes(plan):
        whole = [gpu.index for gpu in group.gpus if not gpu.mig and gpu.owner == "slurm"]
        if whole:
            requests.append((node, f"gpu:{group.model.gres_type}:{len(whole)}"))
            wanted.append((group, node, whole))
    if not requests:
        pytest.skip("the plan gives Slurm no whole GPU")
    for job_id, (group, node, whole) in zip(run_jobs(bed, requests), wanted):
        devices = job_devices(bed, node, job_id)
        assert {d.type for d in devices} == {group.model.gres_type}
        assert sorted(d.files[0] for d in devices) == sorted(
            bed.path("dev", f"nvidia{index}") for index in whole)
    assert_no_node_drained(bed)


def test_an_untyped_whole_gpu_job_runs_where_slices_are_on_other_nodes(example):
    """An existing job script's --gres=gpu:4, on a cluster with whole GPUs of several types
    and Slurm's MIG slices on other nodes: the hook adds the whole nodes' feature (which
    `gpushare render slurm-conf` tells the site to give them) and the job runs on 4 whole
    GPUs of one of those nodes."""
    import hostlist

    bed, _plan = example
    facts = json.loads(bed.facts_json)
    if "plan.example.yaml" in bed.plan_source:
        assert facts.get("whole_gpu_feature") == "gpushare_whole", facts
    if not facts.get("whole_gpu_feature"):
        pytest.skip("no node feature keeps untyped GPU requests whole in this plan")
    feature = facts["whole_gpu_feature"]
    rendered = gpushare("render", "slurm-conf", "--plan", bed.plan_source)
    match = re.search(rf"^#   NodeName=(\S+) \.\.\. Features={feature}$", rendered, re.MULTILINE)
    assert match, rendered
    told = set(hostlist.expand_hostlist(match.group(1)))
    shown = bed.run(["sinfo", "-h", "-N", "-o", "%N %f"]).stdout.split("\n")
    have = {line.split()[0] for line in shown
            if line.strip() and feature in line.split()[1].split(",")}
    assert have == told
    job_id = bed.sbatch(SCRIPT.replace("{sleep}", "0"), "--gres=gpu:4", user=USER)
    info = finished(bed, job_id)
    assert info["JobState"] == "COMPLETED", info
    assert info["Features"] == feature and info["NodeList"] in told, info
    devices = job_devices(bed, info["NodeList"], job_id)
    assert len(devices) == 4 and {d.type for d in devices} <= set(facts["gpu_types"])
    assert_no_node_drained(bed)


def test_every_slurm_mig_slice_runs_mixed_gpus_included(example):
    """Slurm's slices of a GPU the plan splits with Kubernetes (owner mixed) run too."""
    from gpushare.admin.mig_profiles import caps_minors, gi_id_for_placement

    bed, plan = example
    requests, wanted = [], []
    for group, node in first_nodes(plan):
        slices: dict[str, list[tuple[int, int]]] = {}
        for gpu in group.gpus:
            for mig_slice in gpu.slices_of("slurm"):
                spec = group.model.profile(mig_slice.profile)
                gi = gi_id_for_placement(group.model, mig_slice.placement, spec.memory_slices)
                slices.setdefault(mig_slice.profile, []).append((gpu.index, gi))
        for name, where in slices.items():
            requests.append((node, f"gpu:{name}:{len(where)}"))
            wanted.append((node, name, where))
    if not requests:
        pytest.skip("the plan gives Slurm no MIG slice")
    for job_id, (node, name, where) in zip(run_jobs(bed, requests), wanted):
        devices = job_devices(bed, node, job_id)
        assert {d.type for d in devices} == {name}
        got = sorted(d.files[1] for d in devices)  # the GPU instance's capability file
        assert got == sorted(bed.path("dev", "nvidia-caps", f"nvidia-cap{caps_minors(g, gi)[0]}")
                             for g, gi in where)
        # The simulated NVML has a slice of that profile at each of them.
        gpus = profile(bed, node)["gpus"]
        for g, gi in where:
            assert any(m["gi_id"] == gi and m["profile"] == name
                       for m in gpus[g]["mig_devices"]), (node, g, gi)
    mixed = [gpu.index for group, _ in first_nodes(plan) for gpu in group.gpus
             if gpu.owner == "mixed" and gpu.slices_of("slurm")]
    if "plan.example.yaml" in bed.plan_source:
        assert mixed, "etc/plan.example.yaml splits a GPU between Slurm and Kubernetes"
    assert_no_node_drained(bed)


def test_mps_shares_run_on_every_shared_gpu(example):
    """One job per MPS GPU, all at once, each taking a whole GPU's units: each gets its own."""
    bed, plan = example
    requests, wanted = [], []
    for group, node in first_nodes(plan):
        shared = [gpu for gpu in group.gpus if gpu.mps and gpu.owner == "slurm"]
        if len({gpu.mps for gpu in shared}) == 1:
            requests += [(node, f"mps:{shared[0].mps}")] * len(shared)
            wanted.append((node, [gpu.index for gpu in shared]))
    if not requests:
        pytest.skip("the plan gives Slurm no MPS share")
    jobs = iter(run_jobs(bed, requests, sleep=4))
    for node, indices in wanted:
        uuids = []
        for _ in indices:
            text = bed.output(next(jobs))
            assert "PCT=100" in text, text
            uuids.append(re.search(r"^UUIDS=(.*)$", text, re.MULTILINE).group(1))
        gpus = profile(bed, node)["gpus"]
        assert sorted(uuids) == sorted(gpus[i]["uuid"] for i in indices), (node, uuids)
    assert_no_node_drained(bed)


def test_a_job_runs_on_every_node(example):
    """Every node of the plan starts a job on what it gives Slurm: no node drains."""
    from gpushare.admin.render import slurm_node_gres

    bed, plan = example
    requests = []
    for group in plan.groups:
        first = slurm_node_gres(group).split(",")[0]
        if not first:
            continue
        name, _, count = first.rpartition(":")
        requests += [(node, f"{name}:1" if name.startswith("gpu:") else f"{name}:{count}")
                     for node in group.nodes]
    run_jobs(bed, requests)
    assert_no_node_drained(bed)


def test_a_multi_node_job_stays_in_one_nvlink_domain(example):
    """Two nodes' whole GPUs, submitted as a user would: the hook keeps the job in one
    domain (--switches on a tree, --segment on blocks) and Slurm places it there."""
    bed, plan = example
    domains = {node: domain.name for domain in plan.domains for node in domain.nodes}
    for group in plan.groups:
        whole = [gpu for gpu in group.gpus if not gpu.mig and gpu.owner == "slurm"]
        in_domain = [n for n in group.nodes if n in domains]
        if whole and len(in_domain) >= 2:
            break
    else:
        pytest.skip("no node group with whole GPUs on two nodes of an NVLink domain")
    gres = f"gpu:{group.model.gres_type}:{len(whole)}"
    result = bed.run(["sbatch", "--parsable", "-N2", f"--gres={gres}", "--wrap", "true"],
                     user=USER)
    job_id = int(result.stdout.strip())
    flag = "--segment=2" if plan.slurm.topology == "block" else "--switches=1@"
    assert f"gpushare: {flag}" in result.stderr, result.stderr
    info = finished(bed, job_id)
    assert info["JobState"] == "COMPLETED", info
    nodes = bed.run(["scontrol", "show", "hostnames", info["NodeList"]]).stdout.split()
    assert len(nodes) == 2 and len({domains[n] for n in nodes}) == 1, info["NodeList"]
    assert_no_node_drained(bed)


def test_kubernetes_devices_cannot_be_had_from_slurm(example):
    from gpushare.admin.render import slurm_node_gres

    bed, plan = example
    tried = 0
    for group, node in first_nodes(plan):
        slurm_types = {entry.split(":")[1] for entry in slurm_node_gres(group).split(",")
                       if entry.startswith("gpu:")}
        kube = {s.profile for gpu in group.gpus for s in gpu.slices_of("kubernetes")}
        if any(not gpu.mig and gpu.owner == "kubernetes" for gpu in group.gpus):
            kube.add(group.model.gres_type)
        for gpu_type in sorted(kube - slurm_types):
            tried += 1
            result = bed.run(["sbatch", "-w", node, f"--gres=gpu:{gpu_type}:1", "--wrap",
                              "true"], user=USER, check=False)
            assert result.returncode != 0, (node, gpu_type, result.stdout)
            assert "Submitted batch job" not in result.stdout
    if not tried:
        pytest.skip("the plan gives Kubernetes nothing Slurm does not also have")
    assert bed.run(["squeue", "-h", "-u", USER]).stdout.strip() == ""
    assert_no_node_drained(bed)
