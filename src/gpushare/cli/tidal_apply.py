# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal --apply``: one run at a time; what an earlier run left is settled first,
then the round's moves are carried out and reported."""

from __future__ import annotations

import argparse
import datetime
import os
from typing import Any

from gpushare.cli import fail
from gpushare.cli.relayout_apply import restart_command, slurm_version

__all__ = ["apply", "metrics", "register_options"]


HOLDERS_GROUP = "which pods hold a device (gpushare tidal holders, on the node)"


def register_options(parser: argparse.ArgumentParser) -> None:
    ctl = parser.add_argument_group("moving devices (gpushare tidal --apply, on the controller)")
    ctl.add_argument("--apply", action="store_true",
                     help="carry the moves out (default: say what would move)")
    ctl.add_argument("--state-dir", metavar="DIR",
                     help="where tidal-state.json (what is lent now) and its journal lie, "
                     "beside relayout-state.json, whose run lock both commands take (default: "
                     "the plan's directory)")
    ctl.add_argument("--metrics", action="store_true",
                     help="print what --apply has done, from the state file, in Prometheus' "
                     "text format (GPU-hours lent each way, reclaims and their seconds, moves "
                     "refused by reason, devices lent now) for node_exporter's textfile "
                     "collector")
    ctl.add_argument("--kubeconfig", metavar="FILE",
                     help="credentials for the API server (default $KUBECONFIG, else the "
                     "in-cluster service account)")
    ctl.add_argument("--fence", choices=("dra", "node"), default="dra",
                     help="how new pods are kept off a device: a DeviceTaintRule per device "
                     "(dra, the default: the NVIDIA DRA driver) or a taint on the whole node "
                     "(node: the device plugin)")
    ctl.add_argument("--dra-driver", default="gpu.nvidia.com", metavar="NAME",
                     help="the DRA driver publishing the GPUs (default %(default)s)")
    ctl.add_argument("--dra-api-version", default="v1", metavar="VERSION",
                     help="resource.k8s.io version the cluster serves DeviceTaintRules at "
                     "(default v1; v1beta2 or v1alpha3 on older clusters)")
    ctl.add_argument("--dra-device", default="gpu-{gpu}", metavar="TEMPLATE",
                     help="the driver's name of a whole GPU; {node}, {gpu} filled in "
                     "(default %(default)s)")
    ctl.add_argument("--dra-slice-device", default="gpu-{gpu}-mig-{slice}", metavar="TEMPLATE",
                     help="the driver's name of a MIG slice; {slice} is its position in the "
                     "plan, from 0 (default %(default)s)")
    ctl.add_argument("--dra-gpu-class", default="gpu.nvidia.com", metavar="NAME",
                     help="the DeviceClass an unallocated ResourceClaim names to wait for a "
                     "whole GPU (default %(default)s)")
    ctl.add_argument("--dra-mig-class", default="mig.nvidia.com", metavar="NAME",
                     help="and for a MIG slice (default %(default)s)")
    ctl.add_argument("--holders-command", metavar="CMD",
                     default="ssh {node} gpushare tidal holders --devices {devices}",
                     help="runs `gpushare tidal holders` as root on the node; {node} and "
                     "{devices} (each of the node's devices asked about) are filled in, or, "
                     "for one run per device, {gpu}, {slice}, {profile} and {dra} instead of "
                     "{devices} (default: %(default)s)")
    ctl.add_argument("--slurm-conf", metavar="FILE",
                     help="the slurm.conf holding the nodes' NodeName lines, whose Gres= is "
                     "set (default $SLURM_CONF, else /etc/slurm/slurm.conf)")
    ctl.add_argument("--cluster-gres-conf", metavar="FILE",
                     help="the gres.conf every node shares, rendered again from the plan "
                     "with what is lent before `scontrol reconfigure`")
    ctl.add_argument("--node-gres-command", metavar="CMD",
                     help="where each node has a gres.conf of its own: renders it on the "
                     "node, from the plan and tidal-state.json beside it, before the "
                     "reconfigure; {node} is filled in, e.g. 'ssh {node} gpushare render "
                     "gres --plan /etc/gpushare/plan.yaml --node {node} --source nvml "
                     "--output /etc/slurm/gres.conf' (give this or --cluster-gres-conf)")
    ctl.add_argument("--release-timeout", type=float, default=600.0, metavar="SECONDS",
                     help="how long a lend waits for the home side to let go of a device "
                     "before it is undone (default 600)")
    ctl.add_argument("--drain-timeout", type=float, default=5400.0, metavar="SECONDS",
                     help="how long to wait for a drained Slurm node's jobs to end (default "
                     "5400)")
    ctl.add_argument("--slurmctld-restart", metavar="CMD",
                     help="restarts slurmctld after a node's GPU count changed, for Slurm "
                     "before 23.11, whose `scontrol reconfigure` keeps it; default there: "
                     "'systemctl restart slurmctld' (run on the controller host), 'none' to "
                     "never restart (the node then stays drained)")
    ctl.add_argument("--settle-timeout", type=float, default=120.0, metavar="SECONDS",
                     help="how long slurmctld may take to show the new GRES (default 120)")
    ctl.add_argument("--scontrol", default="/usr/bin/scontrol", metavar="PATH",
                     help="absolute path of scontrol (default %(default)s)")
    ctl.add_argument("--squeue", default="/usr/bin/squeue", metavar="PATH",
                     help="absolute path of squeue, which lists the jobs waiting for a GPU "
                     "(default %(default)s)")
    ctl.add_argument("--sinfo", default="/usr/bin/sinfo", metavar="PATH",
                     help="absolute path of sinfo, which maps partitions to nodes (default "
                     "%(default)s)")
    node = parser.add_argument_group(HOLDERS_GROUP)
    node.add_argument("--gpu", type=int, metavar="N", help="NVML index of the GPU")
    node.add_argument("--devices", metavar="GPU:SLICE:PROFILE:DRA,...",
                      help="several devices at once (what the controller sends), answered a "
                      "line each")
    node.add_argument("--slice", type=int, default=-1, metavar="K",
                      help="the slice's position in the plan, from 0 (default -1: the GPU)")
    node.add_argument("--profile", default="-", metavar="P", help="the slice's MIG profile")
    node.add_argument("--dra", default="-", metavar="DRIVER/POOL/DEVICE",
                      help="the device as DRA names it ('-': not a DRA device)")
    node.add_argument("--socket", metavar="PATH",
                      default="/var/lib/kubelet/pod-resources/kubelet.sock",
                      help="the kubelet's PodResources socket (default %(default)s)")
    node.add_argument("--source", default="nvml", metavar="nvml|sim:PATH",
                      help="where NVML is (default nvml, the node's driver)")


def _settings(args: argparse.Namespace, plan: Any, state_dir: str) -> Any:
    from gpushare.admin.relayout.menu import one_profile_per_node
    from gpushare.admin.relayout.remote import command_argv
    from gpushare.admin.relayout.settings import Settings
    from gpushare.admin.tidal.apply import (
        BATCH_PLACEHOLDER,
        HOLDERS_PLACEHOLDERS,
        TidalSettings,
    )

    if not args.cluster_gres_conf and not args.node_gres_command:
        raise ValueError("say where gres.conf is rendered with what is lent: "
                         "--cluster-gres-conf FILE (one file every node shares) or "
                         "--node-gres-command CMD (each node's own)")
    if args.cluster_gres_conf and not args.cluster_gres_conf.startswith("/"):
        raise ValueError("give --cluster-gres-conf as an absolute path")
    for option, value in (("--release-timeout", args.release_timeout),
                          ("--drain-timeout", args.drain_timeout),
                          ("--settle-timeout", args.settle_timeout)):
        if not 1 <= value <= 86400:
            raise ValueError(f"{option} must be between 1 and 86400 seconds")
    if BATCH_PLACEHOLDER in args.holders_command and any(
            f"{{{name}}}" in args.holders_command for name in ("gpu", "slice", "profile", "dra")):
        raise ValueError("--holders-command: give {devices} (every device of a node at once) "
                         "or {gpu}, {slice}, {profile} and {dra} (one device a run), not both")
    version = slurm_version(plan)
    restart = restart_command(args.slurmctld_restart, version)
    for option, template, names in (
            ("--holders-command", args.holders_command, HOLDERS_PLACEHOLDERS),
            ("--slurmctld-restart", restart, ("node",)),
            ("--node-gres-command", args.node_gres_command, ("node",))):
        try:
            if template or option == "--holders-command":
                command_argv(template, names)
        except ValueError as err:
            raise ValueError(f"{option}: {err}") from None
    slurm_conf = args.slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    relayout_state = os.path.join(state_dir, "relayout-state.json")
    slurm = Settings(slurm_conf=slurm_conf, cluster_gres_conf=args.cluster_gres_conf or "",
                     state_path=relayout_state, drain_timeout_s=args.drain_timeout,
                     settle_timeout_s=args.settle_timeout, slurmctld_restart=restart,
                     one_profile_per_node=one_profile_per_node(version))
    return TidalSettings(slurm=slurm, holders_command=args.holders_command,
                         release_timeout_s=args.release_timeout,
                         node_gres_command=args.node_gres_command or "")


def _waiting(args: argparse.Namespace, api: Any) -> Any:
    """What each home side waits for, read once per round: squeue and sinfo, the API
    server's pending pods (and, with the DRA fence, its ResourceClaims)."""
    from gpushare.admin.relayout.demand import partitions, pending
    from gpushare.admin.tidal.waiting import DraClasses, Waiting, read_kube_pending

    def queue() -> Any:
        return pending(args.squeue, 30.0, nodes_of=partitions(args.sinfo, 30.0))

    def pods() -> Any:
        return read_kube_pending(api, args.dra_api_version if args.fence == "dra" else None)

    return Waiting(queue, pods, DraClasses(args.dra_gpu_class, args.dra_mig_class))


def metrics(args: argparse.Namespace, plan: Any) -> int:
    from gpushare.admin.tidal.metrics import render_counters
    from gpushare.admin.tidal.state import STATE_NAME, StateError, load_state

    state_dir = os.path.abspath(args.state_dir or os.path.dirname(os.path.abspath(args.plan)))
    try:
        state = load_state(os.path.join(state_dir, STATE_NAME))
    except StateError as err:
        return fail("tidal", str(err))
    lent_now: dict[str, int] = {}
    for _, borrower in state.lent_to(plan):
        lent_now[borrower] = lent_now.get(borrower, 0) + 1
    print(render_counters(state.counters, lent_now), end="")
    return 0


def apply(args: argparse.Namespace, plan: Any, when: datetime.datetime,
          needs: dict[str, int]) -> int:
    """0: every move made (or none due), 1: a move was undone or left for the next run,
    2: nothing could start."""
    from gpushare.admin.plan.model import with_slurm_version
    from gpushare.admin.relayout.controller import Scontrol
    from gpushare.admin.relayout.journal import JournalError, LockBusy, run_lock
    from gpushare.admin.slurm_client import SlurmClientError
    from gpushare.admin.tidal.apply import Mover
    from gpushare.admin.tidal.journal import TidalJournal, load_journal
    from gpushare.admin.tidal.kube import KubeError, KubeFence, Settings, api_from_kubeconfig
    from gpushare.admin.tidal.reservation import Scontrol as ReservationsScontrol
    from gpushare.admin.tidal.round import run_round
    from gpushare.admin.tidal.state import STATE_NAME, StateError, load_state

    plan = with_slurm_version(plan, slurm_version(plan))  # gres.conf is rendered for it
    state_dir = os.path.abspath(args.state_dir or os.path.dirname(os.path.abspath(args.plan)))
    state_path = os.path.join(state_dir, STATE_NAME)
    try:
        settings = _settings(args, plan, state_dir)
        api = api_from_kubeconfig(args.kubeconfig or os.environ.get("KUBECONFIG"))
        kube = KubeFence(api,
                         Settings(mode=args.fence, driver=args.dra_driver,
                                  api_version=args.dra_api_version,
                                  device_name=args.dra_device,
                                  slice_name=args.dra_slice_device))
        slurm = Scontrol(args.scontrol)
        settings.slurm.configless = slurm.configless()
    except (ValueError, KubeError, SlurmClientError) as err:
        return fail("tidal", str(err))
    try:
        # relayout's lock: the two edit the same slurm.conf and gres.conf and drain the
        # same nodes, so only one of them runs at a time
        with run_lock(settings.slurm.state_path):
            state = load_state(state_path)
            state.check(plan)
            journal = load_journal(state_path) or TidalJournal(state_path + ".journal")
            mover = Mover(plan, slurm, kube, settings, state, journal,
                          reservations=ReservationsScontrol(args.scontrol))
            moved = run_round(mover, when, needs, _waiting(args, api))
    except LockBusy as err:
        return fail("tidal", str(err))
    except (JournalError, StateError) as err:
        return fail("tidal", f"{err}; nothing was changed")
    except (OSError, KubeError, SlurmClientError) as err:
        return fail("tidal", f"stopped: {err}; the journal beside {state_path} keeps any "
                    "move under way for the next run")
    for line in mover.log:
        print(line)
    print(f"{len(moved)} moved; {len(journal.open_moves)} left for the next run; "
          f"{len(state.lent)} lent now")
    return 1 if journal.open_moves else 0
