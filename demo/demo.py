# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare demo: a local Slurm with simulated GPUs doing the product's main job.

Five nodes rendered from tests/plans/bed.yaml (n1-n4: 8 simulated H100 each in two NVLink
domains; n5: an A100 MIG node split between Slurm and Kubernetes), gpushare's SPANK plugin
and job_submit.lua installed, and users who type ordinary flags. Everything is stopped at
the end. Run with ``make demo``: it runs the `gpushare` command `make venv` installs on PATH,
as users and administrators do. GPUSHARE_DEMO_PORT=N moves its ports (from 17500), its root
(/tmp/gpushare-demo) to /tmp/gpushare-demo-N and its nodes n1.. to dNn1.., so that two demos
can run at once (Slurm names cgroups after nodes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import slurmbed  # noqa: E402

ALICE, BOB = slurmbed.TEST_USERS
PORT = 17500  # the first of the demo's ports (GPUSHARE_DEMO_PORT moves them)
PREFIX = "n"  # its nodes' names: n1..n5, or d<port>n1.. where GPUSHARE_DEMO_PORT moves it
summary: list[tuple[str, str, str]] = []


def say(title: str) -> None:
    print(f"\n== {title}")


def show(text: str, indent: str = "   ") -> None:
    for line in text.strip().splitlines():
        print(indent + line)


def record(what: str, ok: bool, detail: str) -> None:
    summary.append((what, "ok" if ok else "FAILED", detail))


def demo_root(port: int) -> str:
    """The demo's root: its own for each port, so that two demos never share one."""
    return "/tmp/gpushare-demo" if port == PORT else f"/tmp/gpushare-demo-{port}"


def node_prefix(port: int) -> str:
    """Its nodes' names: their own for each port, since slurmd names its cgroups after
    its node (two demos' jobs would share them)."""
    return "n" if port == PORT else f"d{port}n"


def node(number: int) -> str:
    """The name of the bed plan's node n<number> in this demo."""
    return f"{PREFIX}{number}"


def daemons(bed: slurmbed.SlurmBed, node: str) -> list[dict]:
    """The MPS daemons gpushare runs on ``node`` right now, as `gpushare mps --json` shows
    them (each with its jobs and their shares). This bed runs several slurmd on one host:
    --node names the one whose state to read."""
    result = bed.run(["gpushare", "mps", "--node", node, "--json"], check=False)
    try:
        return json.loads(result.stdout)["daemons"]
    except (ValueError, KeyError):
        raise RuntimeError(f"gpushare mps --node {node} --json exited {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()}") from None


def submit(bed: slurmbed.SlurmBed, user: str, args: list[str], script: str) -> tuple[int, str]:
    path = os.path.join(bed.out_dir, f"demo-{time.monotonic_ns()}.sh")
    with open(path, "w") as handle:
        handle.write("#!/bin/bash\n" + script + "\n")
    os.chmod(path, 0o755)
    result = bed.run(["sbatch", "--parsable", f"--output={bed.out_dir}/%j.out", *args, path],
                     user=user, check=False)
    if result.returncode != 0:
        return 0, result.stderr.strip()
    job_id = int(result.stdout.strip().split(";")[0])
    return job_id, result.stderr.strip()


def wait_array(bed: slurmbed.SlurmBed, job_id: int, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = bed.run(["squeue", "-h", "-j", str(job_id)], check=False).stdout.strip()
        if not out:
            break
        time.sleep(0.3)
    out = bed.run(["scontrol", "show", "job", "-o", str(job_id)], check=False).stdout
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line]


ENV_SCRIPT = ("echo node=$SLURMD_NODENAME gpu=$CUDA_VISIBLE_DEVICES "
              "sms=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "
              "pipe=$CUDA_MPS_PIPE_DIRECTORY; sleep 4")


def wait_running(bed: slurmbed.SlurmBed, job_id: int, count: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    running = 0
    while time.monotonic() < deadline:
        out = bed.run(["squeue", "-h", "-t", "R", "-j", str(job_id), "-o", "%i"],
                      check=False).stdout
        running = len(out.split())
        if running >= count:
            break
        time.sleep(0.2)
    return running


def task_line(text: str) -> str:
    """The part of a task's output a reader needs: GPU, share, memory cap, daemon."""
    env = dict(re.findall(r"(\w+)=(\S*)", text.splitlines()[-1]))
    uuid = re.search(r"(GPU-[0-9a-f]{8})", env.get("pipe", ""))
    return (f"{env.get('node')} GPU {uuid.group(1) if uuid else '?'}.. "
            f"CUDA_VISIBLE_DEVICES={env.get('gpu')} SMs={env.get('sms')}% "
            f"pinned={env.get('mem')}")


def demo_job_array(bed: slurmbed.SlurmBed) -> None:
    say("A researcher's inference job array: --array=1-8 --gpu-share=25 (a quarter GPU each)")
    job_id, msg = submit(bed, ALICE, ["--array=1-8", "--gpu-share=25", "-w", node(1)], ENV_SCRIPT)
    show(f"$ sbatch --array=1-8 --gpu-share=25 embed.sh\n{msg}\nSubmitted batch job {job_id}")
    together = wait_running(bed, job_id, 8)
    deadline = time.monotonic() + 10  # RUNNING is set before every prolog has finished
    while time.monotonic() < deadline:
        running = [d for d in daemons(bed, node(1)) if d.get("status") == "running"]
        if len(running) >= 2 and sum(len(d["jobs"]) for d in running) >= together:
            break
        time.sleep(0.2)
    show(f"{together} tasks running at once on {node(1)}, served by {len(running)} MPS daemon(s): "
         + ", ".join(f"{d['key'][:21]}.. ({len(d['jobs'])} jobs)" for d in running))
    tasks = wait_array(bed, job_id)
    outputs = []
    for task in sorted(tasks, key=lambda t: int(t.get("ArrayTaskId", 0))):
        with open(os.path.join(bed.out_dir, f"{task['JobId']}.out")) as handle:
            outputs.append(handle.read())
    show("\n".join(f"task {i}: {task_line(text)}" for i, text in enumerate(outputs, 1)))
    asked = bed.run(["srun", "-w", node(1), "--gpu-share=25", "gpushare", "job"], user=ALICE,
                    check=False)
    said = (asked.stdout + asked.stderr).strip()
    show("the tasks' own output is untouched; inside a job, `gpushare job` says what it got:\n"
         f"$ srun -w {node(1)} --gpu-share=25 gpushare job\n" + said)
    ok = len(tasks) == 8 and all(t.get("JobState") == "COMPLETED" for t in tasks)
    record("job array sharing GPUs through MPS", ok and together == 8 and len(running) == 2,
           f"8 tasks at once on 2 GPUs, {len(running)} daemons")
    record("`gpushare job` (on PATH) run by the user", asked.returncode == 0,
           said.splitlines()[0] if said else f"exit {asked.returncode}")
    time.sleep(1)
    left = daemons(bed, node(1))
    show(f"after the array: {len(left)} daemon(s) left")
    record("daemons stopped when the last job ends", not left, f"{len(left)} left")


def demo_two_users(bed: slurmbed.SlurmBed) -> None:
    say("Two users on the same GPU never share a daemon")
    a, _ = submit(bed, ALICE, ["--gres=mps:50", "-w", node(2)], ENV_SCRIPT)
    b, _ = submit(bed, BOB, ["--gres=mps:50", "-w", node(2)], ENV_SCRIPT)
    deadline = time.monotonic() + 30  # both prologs start their daemon, one after the other
    while time.monotonic() < deadline:
        running = [d for d in daemons(bed, node(2)) if d.get("status") == "running"]
        if len(running) == 2:
            break
        time.sleep(0.2)
    # This bed runs several slurmd on one host: --node names the one whose state to read.
    listing = bed.run(["gpushare", "mps", "--node", node(2)], check=False)
    show(f"$ gpushare mps --node {node(2)}      # as root\n"
         + (listing.stdout + listing.stderr).strip())
    bed.wait_job(a)
    bed.wait_job(b)
    outs = [bed.output(a).strip(), bed.output(b).strip()]
    show("\n".join(outs))
    uids = {d.get("uid") for d in running}
    listed = len(re.findall(r"\srunning\s", listing.stdout))
    record("two users, two daemons, both run", len(uids) == 2 and listed == 2,
           f"{len(running)} daemons, {listed} running in gpushare mps")


def demo_mig(bed: slurmbed.SlurmBed) -> None:
    say("A MIG slice by the name Slurm's autodetect would use: --gres=gpu:nvidia_a100_1g.10gb:1")
    job_id, msg = submit(bed, ALICE, ["--gres=gpu:nvidia_a100_1g.10gb:1"],
                         "echo node=$SLURMD_NODENAME CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES")
    show(msg)
    info = bed.wait_job(job_id)
    show(f"TresPerNode={info.get('TresPerNode')} state={info.get('JobState')}")
    show(bed.output(job_id))
    record("MIG request normalised, verified, run", info.get("JobState") == "COMPLETED",
           info.get("TresPerNode", ""))


def demo_multinode(bed: slurmbed.SlurmBed) -> None:
    say("Multi-node training: -N2 --gres=gpu:8 stays inside one NVLink domain")
    job_id, msg = submit(bed, ALICE, ["-N2", "--gres=gpu:8"], "srun hostname >/dev/null")
    show(msg)
    info = bed.wait_job(job_id)
    nodes = info.get("NodeList", "")
    show(f"Switches={info.get('Switches')} NodeList={nodes} state={info.get('JobState')}")
    inside = nodes in (f"{PREFIX}[1-2]", f"{PREFIX}[3-4]")
    record("2-node job inside one NVLink domain", inside, nodes)


def demo_rejection(bed: slurmbed.SlurmBed) -> None:
    say("An impossible request is refused at submit time, saying what to type")
    for args in (["--gres=mps:150"], ["--gres=gpu:2g.20gb:1"]):
        job_id, msg = submit(bed, ALICE, args, "true")
        show(f"$ sbatch {' '.join(args)} job.sh\n{msg}")
        record(f"{args[0]} rejected with a reason", job_id == 0 and "gpushare:" in msg,
               msg.splitlines()[0][:70] if msg else "")


def demo_mismatch(bed: slurmbed.SlurmBed) -> None:
    say("A slice that is not what Slurm believes: the prolog stops the job, the node drains")
    profile = bed.path("nodes", f"{node(5)}.json")
    backup = profile + ".orig"
    shutil.copy2(profile, backup)
    with open(profile) as handle:
        data = json.load(handle)
    gpu0 = data["gpus"][0]
    gpu0["mig_devices"][0]["profile"] = "2g.20gb"
    gpu0["mig_devices"][0].pop("name", None)
    with open(profile, "w") as handle:
        json.dump(data, handle)
    try:
        job_id, _ = submit(bed, ALICE, ["--gres=gpu:1g.10gb:7", "-w", node(5)], "echo ran")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "DRAIN" not in bed.node_state(node(5))["State"]:
            time.sleep(0.3)
        state = bed.node_state(node(5))
        show(f"{node(5)}: State={state.get('State')}\n    Reason={state.get('Reason')}")
        out = os.path.join(bed.out_dir, f"{job_id}.out")
        ran = os.path.exists(out) and "ran" in bed.output(job_id)
        record("mismatched slice stopped, node drained with reason",
               "DRAIN" in state["State"] and state.get("Reason", "").startswith("gpushare")
               and not ran, state.get("Reason", "")[:60])
        bed.run(["scancel", str(job_id)], check=False)
    finally:
        shutil.move(backup, profile)
        bed.resume(node(5))


def main() -> int:
    if os.geteuid() != 0:
        print("make demo runs as root (it starts a local Slurm)")
        return 1
    lua = os.path.join(HERE, "..", "submit_hooks", "job_submit.lua")
    global PREFIX
    # Its own ports, root and node names, unless GPUSHARE_DEMO_PORT moves them (another Slurm
    # on this host, another demo).
    port = int(os.environ.get("GPUSHARE_DEMO_PORT", str(PORT)))
    PREFIX = node_prefix(port)
    if shutil.which("gpushare") is None:
        print("make demo runs the gpushare command on PATH: install it with make venv")
        return 1
    root = demo_root(port)
    try:
        bed = slurmbed.plan_bed(root=root, port_base=port, job_submit="lua", job_submit_lua=lua,
                                node_prefix="" if PREFIX == "n" else PREFIX)
        print("Starting a local Slurm: munge, slurmctld and 5 slurmd with simulated GPUs "
              "(gres.conf, topology.conf and submit facts rendered from tests/plans/bed.yaml)")
        with bed:
            show(bed.run(["sinfo", "-N", "-o", "%N %G %t"]).stdout)
            for step in (demo_job_array, demo_two_users, demo_mig, demo_multinode,
                         demo_rejection, demo_mismatch):
                try:
                    step(bed)
                except Exception as err:  # the demo goes on and reports the failure
                    record(step.__name__, False, str(err)[:70])
    finally:
        if PREFIX != "n":  # plan_bed's copy of the plan with the nodes renamed
            with contextlib.suppress(FileNotFoundError):
                os.unlink(root + ".plan.yaml")
    say("Summary")
    width = max(len(what) for what, _, _ in summary)
    for what, status, detail in summary:
        print(f"   {what:<{width}}  {status:<6}  {textwrap.shorten(detail, 60)}")
    failed = [s for s in summary if s[1] != "ok"]
    print(f"\n{len(summary) - len(failed)} of {len(summary)} demonstrations as expected; "
          "the local Slurm is stopped.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
