# SPDX-License-Identifier: GPL-2.0-or-later
"""Parity of the rules the C glue and the Python core both keep that touch the filesystem
(docs/architecture.md, "Rules written in both C and Python"): both sides get the same
directory trees, files and shares, and any difference in verdict (accepted or refused)
or in what is left on disk fails. The C side is tests/c/parity_fs.c, built with ASan and
UBSan, answering one request a line as tests/c/parity.c does. The owner matrices chown to
nobody, so they need root (CI runs as root)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from typing import Callable, Iterator, NamedTuple, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_c_parity import C_DIR, EXAMPLES, CSide, ctests, text_of

from gpushare.common import safefs
from gpushare.node.mps.errors import MpsError
from gpushare.node.mps.limits import limits_for
from gpushare.node.mps.lock import locked
from gpushare.node.mps.record import MODES, MpsDevice, RecordStore, daemon_key

pytestmark = pytest.mark.skipif(ctests.shutil.which("cc") is None
                                and ctests.shutil.which("gcc") is None,
                                reason="needs a C compiler (make deps installs gcc)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to nobody: needs root")
NOBODY = 65534


@pytest.fixture(scope="module")
def c_side(tmp_path_factory) -> Iterator[CSide]:
    out = str(tmp_path_factory.mktemp("parity_fs") / "parity_fs")
    source = os.path.join(C_DIR, "parity_fs.c")
    ctests._compile(ctests.c_compiler(), [source, *ctests.links(source)], out, [])
    side = CSide(out)
    yield side
    side.close()


class Verdict(NamedTuple):
    rc: int
    errno: int
    error: Optional[str]  # what C logged (slurm_error)


def ask(c_side: CSide, op: str, *fields: str) -> Verdict:
    rc, err, error = c_side.ask(op, "\t".join(fields).encode()).split(" ")
    return Verdict(int(rc), int(err), text_of(error))


@pytest.fixture
def root_dir(tmp_path) -> str:
    """A directory root could keep state in: root's (as every directory above it is when
    the tests run as root), not writable by others."""
    os.chmod(tmp_path, 0o755)
    return str(tmp_path)


def snapshot(top: str, rename: Callable[[str], str] = lambda name: name
             ) -> dict[str, tuple[object, ...]]:
    """Everything below ``top``, never following a link: relative path -> kind, owner,
    group, mode and content (a file's bytes, a link's target). ``rename`` maps each name
    (a side's own temporary file's name to one both share)."""
    found: dict[str, tuple[object, ...]] = {}

    def walk(path: str, rel: str) -> None:
        for name in sorted(os.listdir(path)):
            full, shown = os.path.join(path, name), os.path.join(rel, rename(name))
            st_ = os.lstat(full)
            content: object = None
            if stat.S_ISREG(st_.st_mode):
                with open(full, "rb") as handle:
                    content = handle.read()
            elif stat.S_ISLNK(st_.st_mode):
                content = os.readlink(full)
            found[shown] = (stat.S_IFMT(st_.st_mode), st_.st_uid, st_.st_gid,
                            stat.S_IMODE(st_.st_mode), content)
            if stat.S_ISDIR(st_.st_mode):
                walk(full, shown)

    walk(top, "")
    return found


# ---- caps are the largest share: gs_drop_reference and limits_for -----------------------

def store_with(mps_dir: str, mode: str, shares: dict[str, int], memory: list[int],
               mem_limit: str) -> tuple[RecordStore, int, str]:
    """A daemon's record and jobs as the Python writes them (as root: RecordStore checks
    that root made ``<key>.jobs``); the store, its directory's descriptor and the key."""
    os.makedirs(mps_dir, mode=0o755, exist_ok=True)
    devices = tuple(MpsDevice(f"GPU-{i}", i, total) for i, total in enumerate(memory or [0]))
    key = daemon_key(mode, 1001, int(next(iter(shares))), devices)
    store = RecordStore(mps_dir, mps_dir)
    rec = store.new(key, mode, 1001, 1001, devices)
    rec.jobs = dict(shares)
    rec.caps = limits_for(mode, list(shares.values()), memory, mem_limit)
    mps_fd = os.open(mps_dir, os.O_RDONLY | os.O_DIRECTORY)
    store.write(mps_fd, rec)
    return store, mps_fd, key


def python_leaves_alone(mode: str, shares: dict[str, int], job: str, memory: list[int],
                        mem_limit: str) -> bool:
    """Whether the job's leaving changes nothing but its reference (Manager._drop_jobs):
    other jobs stay and their caps (limits_for) are the daemon's caps now."""
    others = [share for name, share in shares.items() if name != job]
    return bool(others) and (limits_for(mode, others, memory, mem_limit)
                             == limits_for(mode, list(shares.values()), memory, mem_limit))


def c_drop(c_side: CSide, mps_dir: str, key: str, job: str) -> tuple[str, int, str]:
    found, share, why = c_side.ask("drop", f"{mps_dir}\t{key}\t{job}".encode()).split(" ")
    return found, int(share), why


job_ids = st.integers(min_value=1, max_value=99999999).map(str)
memories = st.lists(st.sampled_from([0, 1 << 20, 3 << 29, 16 << 30, 80 << 30, 81559388160]),
                    max_size=3)
mem_limits = st.sampled_from(["off", "proportional", "4G", "100M"])


@settings(max_examples=EXAMPLES, deadline=None)
@given(shares=st.dictionaries(job_ids, st.integers(min_value=1, max_value=100), min_size=1,
                              max_size=8),
       pick=st.integers(min_value=0), mode=st.sampled_from(MODES), memory=memories,
       mem_limit=mem_limits)
@needs_root
def test_a_job_leaves_in_c_exactly_when_python_keeps_the_caps(c_side, tmp_path_factory,
                                                              shares, pick, mode, memory,
                                                              mem_limit):
    job = sorted(shares)[pick % len(shares)]
    mps_dir = str(tmp_path_factory.mktemp("mps"))
    store, mps_fd, key = store_with(mps_dir, mode, shares, memory, mem_limit)
    try:
        found, share, why = c_drop(c_side, mps_dir, key, job)
        alone = python_leaves_alone(mode, shares, job, memory, mem_limit)
        assert found == key
        assert (share != 0) == alone, (why, shares, job)
        if alone:
            assert share == shares[job]
        left = {name: share for name, share in shares.items() if not alone or name != job}
        assert store.read_jobs(mps_fd, key) == left
        rec = store.read(mps_fd, key)
        assert rec is not None and rec.jobs == left
    finally:
        os.close(mps_fd)


@needs_root
def test_the_reasons_c_leaves_a_job_to_the_worker(c_side, tmp_path):
    """One vector per verdict: the reasons are what Python's rule would do otherwise."""
    cases = [({"1": 50}, "1", "last-job"),
             ({"1": 50, "2": 25}, "1", "largest-share"),
             ({"1": 50, "2": 50}, "1", "dropped"),
             ({"1": 25, "2": 50, "3": 10}, "1", "dropped")]
    for i, (shares, job, want) in enumerate(cases):
        mps_dir = str(tmp_path / f"mps{i}")
        _, mps_fd, key = store_with(mps_dir, "shared", shares, [80 << 30], "proportional")
        os.close(mps_fd)
        assert c_drop(c_side, mps_dir, key, job)[2] == want, shares
        assert python_leaves_alone("shared", shares, job, [80 << 30], "proportional") == (
            want == "dropped")


def spoil(jobs_dir: str, how: str) -> None:
    path = os.path.join(jobs_dir, "3")
    if how == "text":
        with open(path, "w") as handle:
            handle.write("lots\n")
    elif how == "zero":
        with open(path, "w") as handle:
            handle.write("0\n")
    elif how == "symlink":
        os.symlink(os.path.join(jobs_dir, "1"), path)
    elif how == "name":
        with open(os.path.join(jobs_dir, "stray"), "w") as handle:
            handle.write("50\n")
    elif how == "fifo":
        os.mkfifo(path, 0o600)


@needs_root
@pytest.mark.parametrize("how", ["text", "zero", "symlink", "name", "fifo"])
def test_a_jobs_directory_python_did_not_write_is_left_to_the_worker(c_side, tmp_path, how):
    """C is the stricter reader: anything in ``<key>.jobs/`` not as RecordStore writes it
    leaves the job to the worker, and nothing is unlinked."""
    mps_dir = str(tmp_path / "mps")
    _, mps_fd, key = store_with(mps_dir, "shared", {"1": 25, "2": 50}, [], "off")
    try:
        assert python_leaves_alone("shared", {"1": 25, "2": 50}, "1", [], "off")
        spoil(os.path.join(mps_dir, key + ".jobs"), how)
        before = snapshot(mps_dir)
        assert c_drop(c_side, mps_dir, key, "1")[1:] == (0, "last-job")
        after = snapshot(mps_dir)
        assert after.pop(key + ".lock")[:4] == (stat.S_IFREG, os.geteuid(), os.getegid(),
                                                0o600)
        assert after == before
    finally:
        os.close(mps_fd)


@needs_root
def test_a_share_file_root_does_not_own_is_left_to_the_worker(c_side, tmp_path):
    mps_dir = str(tmp_path / "mps")
    _, mps_fd, key = store_with(mps_dir, "shared", {"1": 25, "2": 50}, [], "off")
    os.close(mps_fd)
    os.chown(os.path.join(mps_dir, key + ".jobs", "2"), NOBODY, NOBODY)
    assert c_drop(c_side, mps_dir, key, "1")[1:] == (0, "last-job")
    assert sorted(os.listdir(os.path.join(mps_dir, key + ".jobs"))) == ["1", "2"]


# ---- the daemon's lock and record names: gs_lock_daemon, gpushare.node.mps.lock/record --

@contextlib.contextmanager
def c_lock(c_side: CSide, mps_dir: str, key: str) -> Iterator[int]:
    """Daemon ``key``'s lock as the C takes it, held in the C process; -1 when not taken."""
    fd = int(c_side.ask("lock", f"{mps_dir}\t{key}".encode()))
    try:
        yield fd
    finally:
        if fd >= 0:
            assert c_side.ask("unlock", str(fd).encode()) == "0"


@needs_root
def test_c_and_python_take_the_same_lock(c_side, tmp_path):
    mps_dir = str(tmp_path / "mps")
    store, mps_fd, key = store_with(mps_dir, "shared", {"7": 25, "8": 25}, [], "off")
    path = os.path.join(mps_dir, key + ".lock")
    c_side.ask("timeout", b"0")
    try:
        with c_lock(c_side, mps_dir, key) as fd:
            assert fd >= 0
            with pytest.raises(MpsError, match="still held"), locked(mps_fd, key, path, 0):
                pass
        with locked(mps_fd, key, path, timeout=0) as lock:
            with c_lock(c_side, mps_dir, key) as fd:
                assert fd == -1
            assert c_drop(c_side, mps_dir, key, "7")[1:] == (0, "lock")
            lock.remove = True  # as the daemon's last job does: the name goes with it
        assert not os.path.exists(path)
        with c_lock(c_side, mps_dir, key) as fd:  # a fresh file under the same name
            assert fd >= 0
            assert os.listdir(mps_dir).count(key + ".lock") == 1
            with pytest.raises(MpsError, match="still held"), locked(mps_fd, key, path, 0):
                pass
        assert store.keys(mps_fd) == [key]  # record, jobs and lock: one daemon's names
    finally:
        c_side.ask("timeout", b"30")
        os.close(mps_fd)


@needs_root
def test_c_finds_the_record_python_writes_by_its_name(c_side, tmp_path):
    mps_dir = str(tmp_path / "mps")
    store, mps_fd, key = store_with(mps_dir, "shared", {"7": 25, "8": 25}, [], "off")
    try:
        assert sorted(os.listdir(mps_dir)) == [key + ".jobs", key + ".json"]
        safefs.remove_file_at(mps_fd, key + ".json")
        assert store.read(mps_fd, key) is None
        assert c_drop(c_side, mps_dir, key, "7") == (key, 0, "no-record")
        assert store.read_jobs(mps_fd, key) == {"7": 25, "8": 25}
    finally:
        os.close(mps_fd)


# ---- atomic writes: gs_write_mode_at and safefs.write_file_atomic_at ---------------------

OUTSIDE = "outside"  # a file beside the directory written to, which no write may change


def obstacle(directory: str, name: str, kind: str) -> None:
    """What is at ``name`` before the write."""
    path = os.path.join(directory, name)
    outside = os.path.join(os.path.dirname(directory), OUTSIDE)
    if kind == "file":
        with open(path, "wb") as handle:
            handle.write(b"old and longer than the new text\n")
        os.chmod(path, 0o666)
    elif kind == "hardlink":
        os.link(outside, path)
    elif kind == "symlink":
        os.symlink(os.path.join("..", OUTSIDE), path)  # relative: both sides' trees compare
    elif kind == "dangling":
        os.symlink("nowhere", path)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "full dir":
        os.mkdir(path)
        with open(os.path.join(path, "x"), "w"):
            pass


KINDS = ["file", "hardlink", "symlink", "dangling", "fifo", "dir", "full dir"]


class Write(NamedTuple):
    ok: bool
    tree: dict[str, tuple[object, ...]]  # the parent directory after the write


def prepared(top: str, target: Optional[str], temp: Optional[str], temp_name: str) -> str:
    """top/dir with obstacles at the target name and at this side's temporary name."""
    os.makedirs(top)
    with open(os.path.join(top, OUTSIDE), "wb") as handle:
        handle.write(b"not to be touched\n")
    directory = os.path.join(top, "dir")
    os.mkdir(directory, 0o755)
    if target:
        obstacle(directory, "rec.json", target)
    if temp:
        obstacle(directory, temp_name, temp)
    return directory


def c_write(c_side: CSide, top: str, target: Optional[str], temp: Optional[str], mode: int,
            text: bytes, no_replace: bool = False) -> Write:
    temp_name = f".rec.json.{c_side.process.pid}.c.tmp"
    directory = prepared(top, target, temp, temp_name)
    answer = ask(c_side, "write", directory, "rec.json", f"{mode:o}", str(int(no_replace)),
                 text.decode())
    return Write(answer.rc == 0, snapshot(top, lambda name: "TEMP" if name == temp_name
                                          else name))


def python_write(top: str, target: Optional[str], temp: Optional[str], mode: int,
                 text: bytes, exact: bool) -> Write:
    temp_name = f".rec.json.{os.getpid()}.tmp"
    directory = prepared(top, target, temp, temp_name)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    mask = os.umask(0o022)
    try:
        safefs.write_file_atomic_at(fd, "rec.json", text, mode, exact_mode=exact)
        ok = True
    except OSError:
        ok = False
    finally:
        os.umask(mask)
        os.close(fd)
    return Write(ok, snapshot(top, lambda name: "TEMP" if name == temp_name else name))


@pytest.mark.parametrize("temp", [None, "file", "symlink", "fifo", "dir"])
@pytest.mark.parametrize("target", [None, *KINDS])
def test_an_atomic_write_does_the_same_in_c_and_python(c_side, tmp_path, target, temp):
    text = b'{"job": 7}\n'
    for mode, exact in ((0o600, False), (0o644, False), (0o640, True), (0o600, True)):
        case = f"{target}-{temp}-{mode:o}-{exact}"
        c = c_write(c_side, str(tmp_path / "c" / case), target, temp, mode, text)
        py = python_write(str(tmp_path / "py" / case), target, temp, mode, text, exact)
        assert c == py, case
        assert c.tree[OUTSIDE][4] == b"not to be touched\n"
        refused = target in ("dir", "full dir") or temp == "dir"
        assert c.ok == (not refused), case
        if c.ok:
            assert c.tree["dir/rec.json"] == (stat.S_IFREG, os.geteuid(), os.getegid(), mode,
                                              text)
            assert "dir/TEMP" not in c.tree  # no temporary left, whatever was there


@pytest.mark.parametrize("target", KINDS)
def test_a_write_that_must_not_replace_keeps_what_is_there(c_side, tmp_path, target):
    """The join's reference (gs_write_at with no_replace): a name that exists stays as it
    is, as RecordStore writes a job's share only when the job has none (a share never
    changes while the job runs); a name that does not is written as Python writes it."""
    top = str(tmp_path / "c")
    before = snapshot(os.path.dirname(prepared(top + "-before", target, None, "-")))
    after = c_write(c_side, top, target, None, 0o600, b"25\n", no_replace=True)
    assert not after.ok
    assert after.tree == before
    fresh = c_write(c_side, str(tmp_path / "fresh"), None, None, 0o600, b"25\n", True)
    assert fresh == python_write(str(tmp_path / "py"), None, None, 0o600, b"25\n", False)
    assert fresh.ok


# ---- state_dir= checks: gs_check_state_dir and safefs.open_root_dir ----------------------

MODES_TRIED = [0o755, 0o700, 0o750, 0o711, 0o775, 0o757, 0o777, 0o2755, 0o1755, 0o1775,
               0o1757, 0o1777, 0o3777]
OWNERS = [(0, 0), (0, NOBODY), (NOBODY, 0), (NOBODY, NOBODY)]


class Part(NamedTuple):
    """One path component: ``kind`` dir, file, fifo, link (to a good directory), dangling
    (a link to nothing) or missing."""

    kind: str = "dir"
    mode: int = 0o755
    owner: tuple[int, int] = (0, 0)


def build(top: str, parts: list[Part]) -> str:
    """top/a/b/c... as ``parts`` say, below a good ``top``; the path of the last."""
    os.makedirs(top, mode=0o755)
    spare = os.path.join(top, "spare")  # what a link points at: a good directory
    os.mkdir(spare, 0o755)
    path = top
    for i, part in enumerate(parts):
        path = os.path.join(path, "abcdefgh"[i])
        if part.kind == "missing":
            continue
        if part.kind == "dir":
            os.mkdir(path)
        elif part.kind == "file":
            open(path, "w").close()
        elif part.kind == "fifo":
            os.mkfifo(path)
        elif part.kind == "link":  # relative: both sides' trees compare
            os.symlink(os.path.relpath(spare, os.path.dirname(path)), path)
        elif part.kind == "dangling":
            os.symlink("nowhere", path)
        if part.kind in ("dir", "file", "fifo"):
            os.chown(path, *part.owner)
            os.chmod(path, part.mode)  # after chown, which clears set-id bits
    return path


def state_dir_cases() -> list[tuple[str, list[Part]]]:
    """Directory setups: each mode and owner at the state directory itself and above it,
    each kind of component that is not a directory, at either place; missing ones."""
    cases = []
    for mode in MODES_TRIED:
        for owner in OWNERS:
            bad = Part("dir", mode, owner)
            cases.append((f"leaf {owner} {mode:o}", [Part(), Part(), bad]))
            cases.append((f"middle {owner} {mode:o}", [Part(), bad, Part()]))
            cases.append((f"middle {owner} {mode:o} missing leaf",
                          [Part(), bad, Part("missing")]))
    for kind in ("file", "fifo", "link", "dangling", "missing"):
        cases.append((f"leaf {kind}", [Part(), Part(), Part(kind)]))
        cases.append((f"middle {kind}", [Part(), Part(kind), Part("missing")]))
    return cases


def python_state_dir(path: str, create: bool) -> str:
    try:
        os.close(safefs.open_root_dir(path, create=create))
    except FileNotFoundError:
        return "absent"
    except safefs.UnsafePathError:
        return "refused"
    return "ok"


def c_state_dir(c_side: CSide, path: str, create: bool) -> str:
    answer = ask(c_side, "state_dir", path, str(int(create)))
    if answer.rc == 0:
        return "ok"
    return "absent" if answer.errno == 2 and answer.error is None else "refused"


@needs_root
@pytest.mark.parametrize("create", [False, True])
def test_a_state_directory_is_taken_or_refused_alike(c_side, root_dir, create):
    seen = set()
    for name, parts in state_dir_cases():
        c_top, py_top = (os.path.join(root_dir, side, name.replace(" ", "_"))
                         for side in ("c", "py"))
        c_path, py_path = build(c_top, parts), build(py_top, parts)
        c = c_state_dir(c_side, c_path, create)
        py = python_state_dir(py_path, create)
        assert c == py, name
        assert snapshot(c_top) == snapshot(py_top), name  # what create made, alike
        seen.add(c)
    # the matrix reaches every verdict (with create, nothing stays absent)
    assert seen == ({"ok", "refused"} if create else {"ok", "absent", "refused"})


@needs_root
@pytest.mark.parametrize("mode", [0o1777, 0o1775, 0o1757, 0o3777])
def test_a_sticky_state_directory_writable_by_others_is_refused_by_both(c_side, root_dir,
                                                                       mode):
    path = build(os.path.join(root_dir, "c"), [Part(), Part("dir", mode)])
    assert c_state_dir(c_side, path, False) == "refused"
    with pytest.raises(safefs.UnsafePathError, match=r"writable by group or others.*sticky"):
        os.close(safefs.open_root_dir(path, create=False))
    # above the state directory, sticky is enough: nobody can replace root's entries
    below = os.path.join(path, "state")
    assert c_state_dir(c_side, below, True) == "ok"
    os.rmdir(below)
    os.close(safefs.open_root_dir(below))


def test_a_state_directory_a_user_owns_is_refused_alike(c_side, tmp_path):
    """Without root: whatever the tests make is not root's, so both refuse it."""
    path = str(tmp_path / "state")
    if os.geteuid() == 0:
        os.mkdir(path)
        os.chown(path, NOBODY, NOBODY)
    assert c_state_dir(c_side, path, False) == python_state_dir(path, False) == "refused"


# ---- code root loads is root's: gs_check_core (gs_check_parents) and check_root_owned_file

CORE_MODES = [0o644, 0o755, 0o600, 0o444, 0o664, 0o646, 0o666, 0o4755, 0o1644]


def core_cases() -> list[tuple[str, list[Part]]]:
    """The core library at top/a/b/c: each mode and owner of it, of its directory and of
    the one above; a link at each place; each other kind of file; missing."""
    cases = []
    for mode in CORE_MODES:
        for owner in OWNERS:
            cases.append((f"file {owner} {mode:o}", [Part(), Part(), Part("file", mode, owner)]))
    for mode in MODES_TRIED:
        for owner in OWNERS:
            bad = Part("dir", mode, owner)
            cases.append((f"dir {owner} {mode:o}", [Part(), bad, Part("file", 0o644)]))
            cases.append((f"top {owner} {mode:o}", [bad, Part(), Part("file", 0o644)]))
    for kind in ("dir", "fifo", "dangling", "missing"):
        cases.append((f"core {kind}", [Part(), Part(), Part(kind)]))
    cases.append(("dir missing", [Part(), Part("missing"), Part("missing")]))
    return cases


def python_core(path: str) -> bool:
    try:
        safefs.check_root_owned_file(path)
    except safefs.UnsafePathError:
        return False
    return True


def c_core(c_side: CSide, path: str) -> bool:
    return ask(c_side, "core", path).rc == 0


@needs_root
def test_the_code_root_loads_is_trusted_alike(c_side, root_dir):
    verdicts = set()
    for name, parts in core_cases():
        top = os.path.join(root_dir, name.replace(" ", "_"))
        path = build(top, parts)
        before = snapshot(top)
        verdict = c_core(c_side, path)
        assert verdict == python_core(path), name
        assert snapshot(top) == before, name  # a check changes nothing
        verdicts.add(verdict)
    assert verdicts == {True, False}


@needs_root
@pytest.mark.parametrize("where", ["file", "dir"])
@pytest.mark.parametrize("good", [True, False])
def test_a_link_is_judged_by_what_it_points_at_alike(c_side, root_dir, where, good):
    """Both sides check the real path: a link to the core, or to its directory, is as
    trusted as what it points at, wherever the link itself is."""
    real = build(os.path.join(root_dir, "real"),
                 [Part(), Part(), Part("file", 0o644 if good else 0o666)])
    links = os.path.join(root_dir, "links")
    os.mkdir(links, 0o755)
    if where == "file":
        path = os.path.join(links, "core.so")
        os.symlink(real, path)
    else:
        os.symlink(os.path.dirname(real), os.path.join(links, "lib"))
        path = os.path.join(links, "lib", os.path.basename(real))
    assert c_core(c_side, path) == python_core(path) == good


# ---- the architecture's table: each copy names a parity test that exists ----------------

def test_each_copy_the_docs_list_names_its_parity_test():
    import test_c_parity

    with open(os.path.join(C_DIR, "..", "..", "docs", "architecture.md")) as handle:
        doc = handle.read()
    table = doc[doc.index("| rule | C | Python | why C needs it | parity test |"):]
    rows = [line for line in table[:table.index("\n\n")].splitlines()[2:]]
    assert len(rows) >= 9
    for row in rows:
        named = re.findall(r"`(test_\w+)`", row.rstrip(" |").rsplit("|", 1)[-1])
        assert named, row
        for name in named:
            assert callable(getattr(test_c_parity, name, None) or globals().get(name)), name
