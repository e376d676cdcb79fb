# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare metrics: the plugin's counters, the node's state in Prometheus' text format (read
back with prometheus_client's parser), the atomic textfile, and the Grafana dashboard."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families
from spank_fakes import FakeFfi, FakeHost

from gpushare.admin import metrics
from gpushare.admin.metrics_usage import usage_families
from gpushare.cli import main as cli_main
from gpushare.common import log as gslog
from gpushare.node import counters, job, spank_adapter
from gpushare.node.config import PluginConfig
from gpushare.node.mps import Limits, MpsDevice, RecordStore
from gpushare.node.state import JobRecord, JobStore

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DASHBOARD = os.path.join(REPO, "etc", "grafana", "gpushare.json")
GPU0 = MpsDevice("GPU-11111111-2222-3333-4444-555555555555", 0, 80 << 30, "GPU 0")
GPU1 = MpsDevice("GPU-66666666-7777-8888-9999-000000000000", 1, 80 << 30, "GPU 1")
MIG = MpsDevice("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 2, 10 << 30, "MIG slice 3")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory is root's")


def parse(text: str) -> dict[str, object]:
    """Families by name, as Prometheus' own client library reads the text."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families, name: str, **labels: str) -> float:
    family = families[re.sub(r"_(total|bucket|sum|count)$", "", name)]
    found = [s.value for s in family.samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, family.samples)
    return found[0]


@pytest.fixture
def state_dir(tmp_path):
    os.chmod(tmp_path, 0o755)
    return str(tmp_path / "state")


# ------------------------------------------------------------------------------ counters


def test_counts_outside_a_callback_are_ignored(state_dir):
    counters.note("mps_daemon_starts")
    assert counters.count("job_prolog", 0, PluginConfig(state_dir=state_dir)) == 0
    assert not os.path.exists(state_dir)


@needs_root
def test_a_callback_counts_result_duration_and_notes(state_dir):
    config = PluginConfig(state_dir=state_dir)
    counters.begin()
    counters.note("mps_daemon_starts")
    counters.timed_out("lock")
    assert counters.count("job_prolog", 0, config) == 0
    counters.begin()
    counters.refused("--gpu-share=abc is invalid: give a whole percent of one GPU from 1")
    counters.count("job_prolog", 0, config)
    counters.begin()
    counters.failed("job_epilog", "cannot stop MPS control daemon u1-GPU-1 ...")
    assert counters.count("job_epilog", -1, config) == -1
    values = counters.read(state_dir)
    assert values["prologs_total:ok"] == 1 and values["prologs_total:refused"] == 1
    assert values["epilogs_total:failed"] == 1 and values["drains_total:mps_stop"] == 1
    assert values["refusals_total:invalid_share"] == 1
    assert values["mps_daemon_starts"] == 1 and values["timeouts_total:lock"] == 1
    assert values["prolog_duration_count"] == 2 and values["epilog_duration_count"] == 1
    assert sum(v for k, v in values.items() if k.startswith("prolog_duration_bucket:")) == 2
    # Nothing noted after a callback's end is kept for the next one.
    counters.note("mps_stop_failures")
    assert "mps_stop_failures" not in counters.read(state_dir)
    info = os.stat(os.path.join(state_dir, counters.FILE))
    assert info.st_uid == 0 and info.st_mode & 0o777 == 0o600  # root's alone


def _count_many(state_dir: str, times: int) -> None:
    config = PluginConfig(state_dir=state_dir)
    for _ in range(times):
        counters.begin()
        counters.note("mps_reaped_references")
        counters.count("job_epilog", 0, config)


@needs_root
def test_concurrent_callbacks_lose_no_count(state_dir):
    """Prologs and epilogs of many jobs end at once: every one is counted."""
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_count_many, args=(state_dir, 150)) for _ in range(4)]
    for worker in workers:
        worker.start()
    seen = []
    while any(worker.is_alive() for worker in workers):
        seen.append(counters.read(state_dir).get("epilogs_total:ok", 0))  # never torn
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    values = counters.read(state_dir)
    assert values["epilogs_total:ok"] == values["mps_reaped_references"] == 600
    assert values["epilog_duration_count"] == 600
    assert seen == sorted(seen)


@needs_root
def test_callbacks_the_c_glue_finished_are_folded_into_the_counters(state_dir):
    """The C glue notes each prolog or epilog it finishes itself as a line "<callback>
    <microseconds>" in counters.fast; read() counts them at once, the next callback's count
    folds them in. A line it cannot read is left out, and so is an earlier release's
    "note <counter>" line."""
    counters.begin()
    counters.count("job_epilog", 0, PluginConfig(state_dir=state_dir))
    worker_us = counters.read(state_dir)["epilog_duration_sum_us"]
    fast = os.path.join(state_dir, counters.FAST_FILE)
    with open(fast, "w") as handle:
        handle.write("epilog 180\nepilog 250\nprolog 900\nnote mps_daemon_starts\n"
                     "epilog 7000\nepilog x\nnote prologs_total:ok\n")
    values = counters.read(state_dir)
    assert values.get("mps_daemon_starts", 0) == 0 and values["prologs_total:ok"] == 1
    assert values["epilogs_total:ok"] == values["epilog_duration_count"] == 4
    assert (values["epilog_duration_bucket:0"], values["epilog_duration_bucket:1"]) == (3, 1)
    assert os.path.exists(fast)  # read() only looks
    assert values["prologs_total:ok"] == values["prolog_duration_bucket:0"] == 1
    assert values["prolog_duration_sum_us"] == 900
    counters.begin()
    counters.count("job_prolog", 0, PluginConfig(state_dir=state_dir))
    assert not os.path.exists(fast)
    after = counters.read(state_dir)
    assert after["epilogs_total:ok"] == 4 and after["prologs_total:ok"] == 2
    assert after.get("mps_daemon_starts", 0) == 0
    assert after["epilog_duration_sum_us"] == values["epilog_duration_sum_us"] == (
        worker_us + 180 + 250 + 7000)


@needs_root
def test_a_damaged_counter_file_starts_over(state_dir):
    os.makedirs(state_dir)
    with open(os.path.join(state_dir, counters.FILE), "w") as handle:
        handle.write('{"version": 1, "counters": {"prologs_total:ok": 4')
    assert counters.read(state_dir) == {}
    counters.begin()
    counters.count("job_prolog", 0, PluginConfig(state_dir=state_dir))
    assert counters.read(state_dir)["prologs_total:ok"] == 1


def test_every_refusal_of_the_core_has_its_reason():
    """The UserErrors job.plan_job raises, each mapped to its own bounded reason."""
    cases = {
        "invalid_share": job.JobRequest(1, 1000, 1000, "n1", gpu_share="abc",
                                        env={"SLURM_JOB_GPUS": "0"}),
        "private_with_share": job.JobRequest(1, 1000, 1000, "n1", gpu_share="20",
                                             private_mps=True, env={"SLURM_JOB_GPUS": "0"}),
        "private_without_gpu": job.JobRequest(1, 1000, 1000, "n1", private_mps=True),
        "share_without_gpu": job.JobRequest(1, 1000, 1000, "n1", gpu_share="20"),
        "share_on_several_gpus": job.JobRequest(1, 1000, 1000, "n1", gpu_share="20",
                                                env={"SLURM_JOB_GPUS": "0,1"}),
        "share_with_whole_gpus": job.JobRequest(1, 1000, 1000, "n1", gpu_share="20",
                                                env={"SLURM_JOB_GPUS": "0"}),
        "share_mismatch": job.JobRequest(1, 1000, 1000, "n1", gpu_share="20", env={
            "SLURM_JOB_GPUS": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}),
    }
    for reason, request in cases.items():
        with pytest.raises(job.UserError) as err:
            job.plan_job(request)
        assert counters.refusal_reason(str(err.value)) == reason, err.value
    # MpsUserError: what the job's user did to their own daemon (userdirs.check_control_at)
    tampered = ("MPS control daemon k: /run/gpushare/mps/k/pipe/control is a FIFO, not the "
                "daemon's socket; the job's user put it there. Stop what runs ...")
    assert counters.refusal_reason(tampered) == "user_daemon"
    assert set(cases) | {"user_daemon", "other"} == set(counters.REFUSAL_REASONS)


def test_drain_reasons_of_the_core_messages():
    record = JobRecord(job_id=7, uid=1000, gid=1000, node="n1", mode="shared",
                       share_percent=20, slurm_gpus=["0"])
    with pytest.raises(job.NodeError) as err:
        job.mps_devices(record, [])
    assert counters.failure_reason("job_prolog", str(err.value)) == "no_device"
    request = job.JobRequest(7, 1000, 1000, "n1", gpu_share="20", env={"SLURM_JOB_GPUS": "0"})
    config = PluginConfig(inventory="sim:/nonexistent/profile.json")
    with pytest.raises(job.NodeError) as err:
        job.verify_devices(config, request)
    assert counters.failure_reason("job_prolog", str(err.value)) == "verify_error"
    assert counters.failure_reason("job_prolog", "MPS for job 7: lock held") == "mps_start"
    assert counters.failure_reason("job_prolog", "GPU 0 is a 1g.10gb slice") == "device_check"
    assert counters.failure_reason("job_epilog", "cannot stop MPS daemon") == "mps_stop"
    assert counters.failure_reason("job_prolog", "") == "internal"


@pytest.fixture
def adapter(monkeypatch):
    monkeypatch.setattr(spank_adapter, "_ffi", FakeFfi)
    monkeypatch.setattr(spank_adapter, "_config", None)
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", job.SHARE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    yield spank_adapter
    gslog.uninstall()


@needs_root
def test_the_plugin_callbacks_count_what_they_did(adapter, state_dir, monkeypatch):
    """Through the adapter the plugin calls: the counts are what ran."""
    args = [f"state_dir={state_dir}", "inventory=sim:/nonexistent/%n.json", "show=no"]
    assert adapter.dispatch("job_prolog", FakeHost(1, {}), args) == 0  # nothing to share
    assert adapter.dispatch("job_prolog", FakeHost(2, {"gpu-share": "30"}), args) == 0
    monkeypatch.setenv("SLURM_JOB_GPUS", "0")
    monkeypatch.setattr(spank_adapter, "_drain", lambda reason, config: None)
    assert adapter.dispatch("job_prolog", FakeHost(3, {"gpu-share": "30"}), args) == -1
    for job_id in (1, 2, 3):
        assert adapter.dispatch("job_epilog", FakeHost(job_id, {}), args) == 0
    monkeypatch.setattr(spank_adapter, "_config", None)
    assert adapter.dispatch("job_epilog", FakeHost(4, {}), [*args, "bogus=1"]) == -1
    families = parse(metrics.render(metrics.counter_families(counters.read(state_dir), "n1")))
    assert value(families, "gpushare_prologs_total", result="ok") == 1
    assert value(families, "gpushare_prologs_total", result="refused") == 1
    assert value(families, "gpushare_prologs_total", result="failed") == 1
    assert value(families, "gpushare_refusals_total", reason="share_without_gpu") == 1
    assert value(families, "gpushare_drains_total", reason="verify_error") == 1
    # A plugstack line that cannot be parsed names no state directory: nothing counted.
    assert value(families, "gpushare_epilogs_total", result="failed") == 0
    assert value(families, "gpushare_epilogs_total", result="ok") == 3
    assert value(families, "gpushare_prolog_duration_seconds_count", node="n1") == 3
    assert value(families, "gpushare_prolog_duration_seconds_bucket", le="+Inf") == 3
    assert 0 < value(families, "gpushare_prolog_duration_seconds_sum") < 30


# ------------------------------------------------------------------------------ state


def write_daemon(config: PluginConfig, uid: int, devices, jobs: dict[int, int],
                 mode: str = "shared", caps=None) -> str:
    """A daemon record as MpsManager writes it (no daemon runs: processes are not checked)."""
    store = RecordStore(config.daemons_dir, config.mps_dir)
    key = f"u{uid}-{devices[0].uuid}" if mode == "shared" else f"job{next(iter(jobs))}"
    rec = store.new(key, mode, uid, uid, tuple(devices))
    rec.jobs = {str(j): share for j, share in jobs.items()}
    rec.caps = None if caps is None else Limits(caps["percent"], tuple(caps["mem"].items()))
    rec.daemon_pid, rec.started_at = 4242, 1700000000.0
    with store.dir_fd() as mps_fd:
        store.write(mps_fd, rec)
    return key


def write_job(config: PluginConfig, job_id: int, uid: int, mode: str, share: int,
              devices, profile: str = "") -> None:
    JobStore(config.state_dir).write(JobRecord(
        job_id=job_id, uid=uid, gid=uid, node="n1", mode=mode, share_percent=share,
        slurm_gpus=[str(d.gpu_index) for d in devices],
        devices=[{"uuid": d.uuid, "gpu_index": d.gpu_index, "profile": profile} for d in devices]))


@pytest.fixture
def busy_node(state_dir):
    """GPU 0 shared by two users (3 jobs), a MIG slice by one, GPU 1 private; counted."""
    config = PluginConfig(state_dir=state_dir)
    write_daemon(config, 61001, [GPU0], {11: 25, 12: 25},
                 caps={"percent": 50, "mem": {"0": "40G"}})
    write_daemon(config, 61002, [GPU0], {13: 30}, caps={"percent": 30, "mem": {"0": "24G"}})
    write_daemon(config, 61001, [MIG], {14: 50}, caps={"percent": 50, "mem": {"0": "5G"}})
    write_daemon(config, 61003, [GPU1], {15: 100}, mode="private",
                 caps={"percent": 100, "mem": {}})
    for job_id, uid, share in ((11, 61001, 25), (12, 61001, 25), (13, 61002, 30)):
        write_job(config, job_id, uid, "shared", share, [GPU0])
    write_job(config, 14, 61001, "shared", 50, [MIG], profile="1g.10gb")
    write_job(config, 15, 61003, "private", 100, [GPU1])
    write_job(config, 16, 61004, "error", 0, [])
    for reason in ("share_without_gpu", "share_without_gpu", "invalid_share"):
        counters.begin()
        counters.note(counters.series("refusals_total", reason))
        counters.count("job_prolog", 0, config)
    counters.begin()
    counters.note("mps_daemon_starts")
    counters.count("job_prolog", 0, config)
    return config


@needs_root
def test_metrics_of_a_busy_node(busy_node):
    families_list, problem = metrics.collect(busy_node, "n1", check_processes=False)
    assert problem is None
    families = parse(metrics.render(families_list))
    gpu0 = {"node": "n1", "gpu": "0", "uuid": GPU0.uuid, "mig_profile": "", "owner": "unknown"}
    assert value(families, "gpushare_gpu_mps_daemons", **gpu0) == 2
    assert value(families, "gpushare_gpu_jobs", **gpu0) == 3
    assert value(families, "gpushare_gpu_share_ratio", **gpu0) == pytest.approx(0.8)
    mig = {"uuid": MIG.uuid, "gpu": "2", "mig_profile": "1g.10gb"}
    assert value(families, "gpushare_gpu_share_ratio", **mig) == pytest.approx(0.5)
    assert value(families, "gpushare_gpu_share_ratio", uuid=GPU1.uuid) == 1
    assert value(families, "gpushare_mps_daemon_jobs", uuid=GPU0.uuid, user="61001") == 2
    assert value(families, "gpushare_mps_daemon_thread_limit_ratio", uuid=GPU0.uuid,
                 user="61002") == pytest.approx(0.3)
    assert value(families, "gpushare_mps_daemon_pinned_memory_limit_bytes", uuid=GPU0.uuid,
                 user="61001") == 40 << 30
    assert value(families, "gpushare_mps_daemon_start_time_seconds", uuid=MIG.uuid) == 1.7e9
    assert families["gpushare_mps_daemon_up"].samples == []  # processes not checked
    assert value(families, "gpushare_mps_daemons", status="unknown") == 4
    assert value(families, "gpushare_mps_daemons", status="running") == 0
    assert value(families, "gpushare_jobs", mode="shared") == 4
    assert value(families, "gpushare_jobs", mode="private") == 1
    assert value(families, "gpushare_jobs", mode="error") == 1
    assert value(families, "gpushare_state_readable") == 1
    assert value(families, "gpushare_refusals_total", reason="share_without_gpu") == 2
    assert value(families, "gpushare_refusals_total", reason="invalid_share") == 1
    assert value(families, "gpushare_prologs_total", result="refused") == 3
    assert value(families, "gpushare_prologs_total", result="ok") == 1
    assert value(families, "gpushare_mps_daemon_starts_total") == 1
    assert families["gpushare_prologs"].type == "counter"
    assert families["gpushare_prolog_duration_seconds"].type == "histogram"
    # Bounded labels: no job id anywhere.
    for family in families.values():
        for sample in family.samples:
            assert not {"job", "job_id", "jobid"} & set(sample.labels), sample


@needs_root
def test_owner_comes_from_the_plan(busy_node, tmp_path):
    plan = os.path.join(REPO, "tests", "plans", "bed.yaml")
    families = parse(metrics.render(metrics.collect(busy_node._replace(plan=plan), "n5",
                                                    check_processes=False)[0]))
    # n5 in the bed plan: GPU 0 Slurm's, GPU 1 Kubernetes', GPU 2 Slurm's (whole).
    assert value(families, "gpushare_gpu_jobs", uuid=GPU0.uuid)
    owners = {s.labels["uuid"]: s.labels["owner"]
              for s in families["gpushare_gpu_jobs"].samples}
    assert owners == {GPU0.uuid: "slurm", GPU1.uuid: "kubernetes", MIG.uuid: "unknown"}


@needs_root
def test_an_empty_node_still_exposes_every_counter(state_dir):
    families = parse(metrics.render(metrics.collect(PluginConfig(state_dir=state_dir), "n1",
                                                    check_processes=True)[0]))
    assert value(families, "gpushare_prologs_total", result="ok") == 0
    assert value(families, "gpushare_prolog_duration_seconds_count") == 0
    assert families["gpushare_gpu_jobs"].samples == []
    assert value(families, "gpushare_state_readable") == 1


@needs_root
def test_unreadable_state_is_a_metric_not_a_crash(state_dir):
    os.makedirs(state_dir)
    os.chmod(state_dir, 0o777)  # refused: writable by others
    families_list, problem = metrics.collect(PluginConfig(state_dir=state_dir), "n1", True)
    assert problem and "writable by group or others" in problem
    assert value(parse(metrics.render(families_list)), "gpushare_state_readable") == 0


def test_label_values_and_help_are_escaped():
    family = metrics.Family("gpushare_x", "gauge", 'a \\ b\nc', [
        metrics.Sample("", (("user", 'we"ird\\\nname'),), 1.5)])
    (parsed,) = text_string_to_metric_families(metrics.render([family]))
    assert parsed.documentation == "a \\ b\nc"
    assert parsed.samples[0].labels == {"user": 'we"ird\\\nname'}
    assert parsed.samples[0].value == 1.5


# ------------------------------------------------------------------------------ textfile


@needs_root
def test_textfile_is_replaced_whole(tmp_path):
    os.chmod(tmp_path, 0o755)
    path = str(tmp_path / "gpushare.prom")
    texts = [f"# one\ngpushare_x {i}\n" + "x" * (i * 997 % 20000) for i in range(300)]
    read = []
    done = threading.Event()

    def reader():
        while not done.is_set():
            try:
                with open(path) as handle:
                    read.append(handle.read())
            except FileNotFoundError:
                pass

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for text in texts:
            metrics.write_textfile(path, text)
    finally:
        done.set()
        thread.join()
    assert read and set(read) <= set(texts)  # never a half-written file
    assert os.listdir(tmp_path) == ["gpushare.prom"]  # no temporary left behind
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_textfile_must_be_an_absolute_prom_file(tmp_path):
    with pytest.raises(ValueError, match=r"\*\.prom"):
        metrics.write_textfile(str(tmp_path / "gpushare.txt"), "")
    with pytest.raises(ValueError, match="absolute"):
        metrics.write_textfile("gpushare.prom", "")


@needs_root
def test_textfile_directory_writable_by_users_is_refused(tmp_path):
    unsafe = tmp_path / "textfiles"
    unsafe.mkdir(mode=0o777)
    os.chmod(unsafe, 0o777)
    os.chmod(tmp_path, 0o755)
    with pytest.raises(OSError, match="writable by group or others"):
        metrics.write_textfile(str(unsafe / "gpushare.prom"), "x\n")


@needs_root
def test_cli_prints_and_writes_the_textfile(busy_node, tmp_path, capsys):
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text(f"required /x/spank_gpushare.so state_dir={busy_node.state_dir}\n")
    assert cli_main(["metrics", "--plugstack", str(plugstack), "--node", "n9"]) == 0
    printed = parse(capsys.readouterr().out)
    assert value(printed, "gpushare_gpu_jobs", node="n9", uuid=GPU0.uuid) == 3
    out = tmp_path / "collector"
    out.mkdir()
    os.chmod(tmp_path, 0o755)
    target = out / "gpushare.prom"
    assert cli_main(["metrics", "--plugstack", str(plugstack), "--node", "n9",
                     "--textfile", str(target)]) == 0
    written = parse(target.read_text())
    assert value(written, "gpushare_prologs_total", result="refused") == 3
    assert cli_main(["metrics", "--plugstack", str(plugstack),
                     "--textfile", str(tmp_path / "nowhere" / "gpushare.prom")]) == 2
    assert (f"cannot write {tmp_path}/nowhere/gpushare.prom: its directory {tmp_path}/nowhere "
            "does not exist; create it") in capsys.readouterr().err


# ------------------------------------------------------------------------------ dashboard


def _expressions(node) -> list[str]:
    found = []
    if isinstance(node, dict) and node.get("type") == "datasource":
        return found  # a variable choosing the data source: its query is its type
    if isinstance(node, dict):
        for key, item in node.items():
            if key in ("expr", "query") and isinstance(item, str):
                found.append(item)
            elif key == "query" and isinstance(item, dict) and isinstance(item.get("query"),
                                                                            str):
                found.append(item["query"])
            else:
                found += _expressions(item)
    elif isinstance(node, list):
        for item in node:
            found += _expressions(item)
    return found


def exposed_names(families) -> set[str]:
    names = set()
    for family in families:
        names.add(family.name)
        if family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    return names


@needs_root
def test_dashboard_names_only_metrics_that_exist(busy_node):
    with open(DASHBOARD) as handle:
        dashboard = json.load(handle)
    assert dashboard["title"] and dashboard["panels"]
    names = exposed_names(metrics.collect(busy_node, "n1", check_processes=False)[0])
    names |= exposed_names(usage_families({}, None, "n1", 0.0))  # gpushare metrics adds them
    expressions = _expressions(dashboard)
    assert len(expressions) >= 8, expressions
    used = set()
    for expr in expressions:
        mentioned = set(re.findall(r"\bgpushare_[a-z_]+\b", expr))
        assert mentioned, f"no gpushare metric in {expr!r}"
        assert mentioned <= names, f"{expr!r} names {sorted(mentioned - names)}"
        # Any other series selector (name{...} or name[...]) would be a metric we do not make.
        others = {m for m in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]", expr)
                  if not m.startswith("gpushare_") and m not in ("by", "without", "on",
                                                                 "ignoring")}
        assert not others, f"{expr!r} names metrics gpushare does not expose: {others}"
        used |= mentioned
    for wanted in ("gpushare_gpu_share_ratio", "gpushare_refusals_total",
                   "gpushare_drains_total", "gpushare_prolog_duration_seconds_bucket",
                   "gpushare_job_sm_percent", "gpushare_job_dram_bw_share_percent"):
        assert wanted in used, wanted
    assert any(name.startswith("gpushare_mps_daemon") for name in used)


def test_the_dashboard_check_can_fail():
    names = {"gpushare_gpu_jobs"}
    bad = 'sum(rate(gpushare_prologs_total[5m])) + up{job="x"}'
    assert not set(re.findall(r"\bgpushare_[a-z_]+\b", bad)) <= names
    assert re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]", bad)[-1] == "up"
