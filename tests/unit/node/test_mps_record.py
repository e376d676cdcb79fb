# SPDX-License-Identifier: GPL-2.0-or-later
"""The daemon record: records on disk from earlier releases are read, bad ones refused."""

import copy
import json
import os

import pytest

from gpushare.node.mps import RECORD_VERSION, DaemonRecord, Limits, MpsDevice, MpsError, RecordStore

KEY = "u1001-GPU-11111111-2222-3333-4444-555555555555"
GPU0 = MpsDevice("GPU-11111111-2222-3333-4444-555555555555", 0, 80 << 30, "GPU 0")

# A shared daemon's record exactly as gpushare wrote it before the record had a class: two
# jobs of uid 1001 on GPU 0, caps told to the running daemon.
WRITTEN_BEFORE = """{
 "caps": {
  "mem": {
   "0": "44G"
  },
  "percent": 55
 },
 "daemon_pid": 4242,
 "devices": [
  {
   "index": 0,
   "label": "GPU 0",
   "memory_total": 85899345920,
   "uuid": "GPU-11111111-2222-3333-4444-555555555555"
  }
 ],
 "dirs_made": true,
 "gid": 1001,
 "jobs": {
  "7": {
   "share_percent": 25
  },
  "8": {
   "share_percent": 30
  }
 },
 "key": "u1001-GPU-11111111-2222-3333-4444-555555555555",
 "log_dir": "/run/gpushare/mps/u1001-GPU-11111111-2222-3333-4444-555555555555/log",
 "mode": "shared",
 "pipe_dir": "/run/gpushare/mps/u1001-GPU-11111111-2222-3333-4444-555555555555/pipe",
 "started_at": 1764500000.25,
 "uid": 1001,
 "version": 1
}"""


def test_a_record_as_written_before_is_read_whole():
    rec = DaemonRecord.from_json(json.loads(WRITTEN_BEFORE), KEY)
    assert (rec.key, rec.mode, rec.uid, rec.gid) == (KEY, "shared", 1001, 1001)
    assert rec.devices == (GPU0,)
    assert rec.pipe_dir == f"/run/gpushare/mps/{KEY}/pipe"
    assert rec.log_dir == f"/run/gpushare/mps/{KEY}/log"
    assert (rec.daemon_pid, rec.started_at) == (4242, 1764500000.25)
    assert rec.jobs == {"7": 25, "8": 30}
    assert rec.caps == Limits(55, (("0", "44G"),))
    assert rec.dirs_made is True and rec.stop_failed is None
    assert rec.describe() == (f"MPS control daemon {KEY} (pid 4242, pipe dir "
                              f"/run/gpushare/mps/{KEY}/pipe) on GPU 0 ({GPU0.uuid})")


def test_a_record_written_again_keeps_every_field_but_its_jobs():
    before = json.loads(WRITTEN_BEFORE)
    after = DaemonRecord.from_json(before, KEY).to_json()
    assert after["version"] == RECORD_VERSION == 2
    # Every field as it was, and the one written only after a failed stop now always; the
    # jobs are files beside the record from version 2 on (RecordStore).
    jobs = {job: info["share_percent"] for job, info in before.pop("jobs").items()}
    assert after == {**before, "version": 2, "stop_failed": None}
    assert DaemonRecord.from_json(after, KEY, jobs).to_json() == after
    assert DaemonRecord.from_json(after, KEY, jobs).jobs == {"7": 25, "8": 30}


def test_fields_an_earlier_record_may_lack_take_their_defaults():
    old = json.loads(WRITTEN_BEFORE)
    del old["dirs_made"]  # records before the field existed, or after an undone start
    old["caps"] = None  # a daemon not told its caps yet
    old["daemon_pid"] = old["started_at"] = None
    rec = DaemonRecord.from_json(old, KEY)
    assert (rec.dirs_made, rec.caps, rec.daemon_pid, rec.started_at) == (False, None, None,
                                                                         None)
    assert rec.describe().startswith(f"MPS control daemon {KEY} (pid unknown,")
    failed = {**json.loads(WRITTEN_BEFORE), "stop_failed": "cannot stop it"}
    assert DaemonRecord.from_json(failed, KEY).stop_failed == "cannot stop it"


def test_a_devices_files_are_kept_for_its_daemons_next_scope():
    """What the daemon's scope may open (DeviceAllow=) survives a slurmd restart, so a
    daemon started again from its record gets the same devices; paths only."""
    mig = MpsDevice("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 2, 10 << 30, "MIG slice 0",
                    ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap21",
                     "/dev/nvidia-caps/nvidia-cap22"))
    assert MpsDevice.from_record(mig.to_record()) == mig
    for bad in ("/dev/nvidia2", ["nvidia2"], [2]):
        with pytest.raises(ValueError, match="device_files is not a list of paths"):
            MpsDevice.from_record({**mig.to_record(), "device_files": bad})


def test_a_private_record():
    data = {"version": 1, "key": "job77", "mode": "private", "uid": 1001, "gid": 1001,
            "devices": [GPU0.to_record()], "pipe_dir": "/p", "log_dir": "/l",
            "daemon_pid": 4243, "started_at": 1.5, "jobs": {"77": {"share_percent": 100}},
            "caps": {"percent": 100, "mem": {}}, "dirs_made": True}
    rec = DaemonRecord.from_json(data, "job77")
    assert (rec.mode, rec.jobs, rec.caps) == ("private", {"77": 100}, Limits(100))


def _broken(**changes):
    data = json.loads(WRITTEN_BEFORE)
    for path, value in changes.items():
        where = data
        *parents, last = path.split("__")
        for name in parents:
            where = where[name]
        where[last] = value
    return data


@pytest.mark.parametrize("data, words", [
    (_broken(version=3), "unknown version or key"),
    (_broken(version=None), "unknown version or key"),
    (_broken(key="u1001-other"), "unknown version or key"),
    (_broken(mode="exclusive"), "mode 'exclusive' is unknown"),
    (_broken(uid="1001"), "uid is not a whole number"),
    (_broken(uid=True), "uid is not a whole number"),
    (_broken(daemon_pid=4242.5), "daemon_pid is not a whole number"),
    (_broken(devices={"uuid": "x"}), "devices is not a list"),
    (_broken(jobs=[7, 8]), "jobs is not an object"),
    (_broken(jobs__7__share_percent="25"), "share_percent is not a whole number"),
    (_broken(caps__mem=["44G"]), "caps is not"),
    (_broken(caps__mem__x="1G"), "caps is not"),
    (_broken(started_at="yesterday"), "started_at is not a time"),
    (_broken(stop_failed=1), "stop_failed is not text"),
    (_broken(pipe_dir=None), "pipe_dir is not text"),
    ([1, 2], "not a JSON object"),
])
def test_a_record_that_is_not_one_is_refused_naming_the_field(data, words):
    with pytest.raises(ValueError, match=words):
        DaemonRecord.from_json(copy.deepcopy(data), KEY)


@pytest.mark.skipif(os.geteuid() != 0, reason="the record directory must be root's")
def test_the_store_reads_what_was_written_before_and_names_a_bad_file(tmp_path):
    os.chmod(tmp_path, 0o755)
    store = RecordStore(str(tmp_path / "daemons"), str(tmp_path / "mps"))
    with store.dir_fd() as mps_fd:
        (tmp_path / "daemons" / f"{KEY}.json").write_text(WRITTEN_BEFORE)
        rec = store.read(mps_fd, KEY)
        assert rec is not None and rec.jobs == {"7": 25, "8": 30}
        assert store.keys_of_job(mps_fd, 8) == [KEY] and store.holds(mps_fd, KEY, 7)
        store.write(mps_fd, rec)
        # Written back as version 2: the jobs become files of <key>.jobs/, root's alone.
        written = {**json.loads(WRITTEN_BEFORE), "version": 2, "stop_failed": None}
        del written["jobs"]
        assert json.loads((tmp_path / "daemons" / f"{KEY}.json").read_text()) == written
        jobs_dir = tmp_path / "daemons" / f"{KEY}.jobs"
        assert {p.name: p.read_text() for p in jobs_dir.iterdir()} == {"7": "25\n",
                                                                     "8": "30\n"}
        assert oct(jobs_dir.stat().st_mode & 0o777) == "0o700"
        assert store.read(mps_fd, KEY).jobs == {"7": 25, "8": 30}
        assert store.keys_of_job(mps_fd, 8) == [KEY] and store.keys(mps_fd) == [KEY]
        # A job gone from the record is gone from the directory; the record's removal
        # takes its jobs along.
        rec.jobs.pop("7")
        store.write(mps_fd, rec)
        assert [p.name for p in jobs_dir.iterdir()] == ["8"]
        assert not store.holds(mps_fd, KEY, 7) and store.holds(mps_fd, KEY, 8)
        store.remove(mps_fd, KEY)
        assert list((tmp_path / "daemons").iterdir()) == []
        (tmp_path / "daemons" / f"{KEY}.json").write_text(json.dumps(_broken(version=3)))
        with pytest.raises(MpsError, match=rf"MPS record {tmp_path}/daemons/{KEY}.json is "
                           r"unreadable \(unknown version or key\); stop any daemon"):
            store.read(mps_fd, KEY)
        assert store.peek(mps_fd, KEY) is None and store.read(mps_fd, "u1-none") is None


def test_a_daemons_removal_takes_its_join_tickets_and_an_earlier_releases_start_tickets(
        tmp_path):
    """Join tickets name their daemon and go with it; another daemon's stay. A start ticket
    an earlier release left (read by nothing now) goes whatever its text names."""
    os.chmod(tmp_path, 0o755)
    store = RecordStore(str(tmp_path / "daemons"), str(tmp_path / "daemons"))
    tickets = tmp_path / "daemons" / "tickets"
    with store.dir_fd() as mps_fd:
        store.write(mps_fd, DaemonRecord(KEY, "shared", 1001, 1001, (GPU0,), "/p", "/l"))
        for name, key in (("u1001.g0.s25", KEY), ("u1002.g0.s25", "u1002-other"),
                          ("start.g0.s25", "u1002-other")):
            store.write_ticket(mps_fd, name, f"gpushare-ticket 1\nkey {key}\n".encode())
        store.remove(mps_fd, KEY)
    assert sorted(p.name for p in tickets.iterdir()) == ["u1002.g0.s25"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the record directory must be root's")
def test_a_record_is_root_s_alone_also_one_an_earlier_release_wrote(tmp_path):
    """A record names its user's GPUs, jobs and daemon pid: 0600. One written 0644 before
    gets 0600 at its next write (a record is replaced whole)."""
    os.chmod(tmp_path, 0o755)
    store = RecordStore(str(tmp_path / "daemons"), str(tmp_path / "mps"))
    path = tmp_path / "daemons" / f"{KEY}.json"
    with store.dir_fd() as mps_fd:
        path.write_text(WRITTEN_BEFORE)
        os.chmod(path, 0o644)
        rec = store.read(mps_fd, KEY)
        store.write(mps_fd, rec)
        assert oct(path.stat().st_mode & 0o7777) == "0o600"
        store.write(mps_fd, DaemonRecord("u1002-GPU-1", "shared", 1002, 1002, (GPU0,), "/p",
                                         "/l", daemon_pid=4242, jobs={"9": 50}))
        assert oct((tmp_path / "daemons" / "u1002-GPU-1.json").stat().st_mode & 0o7777) == (
            "0o600")
