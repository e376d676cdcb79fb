# SPDX-License-Identifier: GPL-2.0-or-later
"""Parity of the rules the C glue and the Python core both keep (docs/architecture.md,
"Rules written in both C and Python"): the same vectors go to both sides, fixed ones and
ones hypothesis draws, and any difference fails. The C side is tests/c/parity.c, built
with ASan and UBSan, answering one request a line."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from typing import Iterator, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.node import ticket
from gpushare.node.config import ConfigError, expand_path, plugin_arg_values
from gpushare.node.devices import uuid_list
from gpushare.node.mps.procscan import ProcScan
from gpushare.node.request import parse_share
from gpushare.node.state import ENV_NAME, JobRecord

C_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "c")
_spec = importlib.util.spec_from_file_location("gpushare_ctests",
                                               os.path.join(C_DIR, "ctests.py"))
assert _spec is not None and _spec.loader is not None
ctests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ctests)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="needs a C compiler (make deps installs gcc)")
EXAMPLES = 300


class CSide:
    """tests/c/parity.c, running: ``ask(op, argument)`` is its answer."""

    def __init__(self, path: str) -> None:
        self.process = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=ctests.sanitizer_env(), text=True)

    def ask(self, op: str, argument: bytes) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{op} {argument.hex()}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"the C side ended (a sanitizer report?) on {op} {argument!r}"
        return answer.rstrip("\n")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


def text_of(hex_answer: str) -> Optional[str]:
    """A hex answer as text: None for "-", "" for "="."""
    if hex_answer == "-":
        return None
    return "" if hex_answer == "=" else bytes.fromhex(hex_answer).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def c_side(tmp_path_factory) -> Iterator[CSide]:
    out = str(tmp_path_factory.mktemp("parity") / "parity")
    source = os.path.join(C_DIR, "parity.c")
    ctests._compile(ctests.c_compiler(), [source, *ctests.links(source)], out, [])
    side = CSide(out)
    yield side
    side.close()


# ---- file stamp: gs_stamp and gpushare.node.ticket.stamp ---------------------------------

def test_a_file_is_stamped_alike(c_side, tmp_path):
    paths = [str(tmp_path), "/", "/proc/version", "/dev/null"]
    for size in (0, 1, 4096, 1 << 20):
        path = tmp_path / f"f{size}"
        path.write_bytes(b"x" * size)
        os.utime(path, ns=(1, 1699999000123456789 + size))
        paths.append(str(path))
    for path in paths:
        assert text_of(c_side.ask("stamp", path.encode())) == ticket.stamp(os.stat(path)), path
    assert c_side.ask("stamp", str(tmp_path / "absent").encode()) == "-"


# ---- a process's start time: gs_parse_proc_start and ProcScan.start_time ----------------

def python_start(text: bytes) -> Optional[str]:
    scan = ProcScan("/nonexistent", "/nonexistent", "/nonexistent")
    scan.read = lambda pid, name: text  # type: ignore[method-assign]
    return scan.start_time(1234)


def test_live_processes_start_alike(c_side):
    pids = [name for name in os.listdir("/proc") if name.isdigit()][:200]
    compared = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                text = handle.read()
        except OSError:
            continue  # gone meanwhile
        if text.rsplit(b")", 1)[-1].split()[:1] in ([b"Z"], [b"X"]):
            continue  # the zombie difference is its own test below
        assert text_of(c_side.ask("proc_start", text)) == python_start(text), text
        compared += 1
    assert compared > 3


names = st.text(st.characters(blacklist_characters="\0", max_codepoint=0x7F), max_size=16)
numbers = st.integers(min_value=0, max_value=2**63 - 1).map(str)


@settings(max_examples=EXAMPLES, deadline=None)
@given(name=names, state=st.sampled_from("RSDTtIWP"), fields=st.lists(numbers, min_size=0,
                                                                       max_size=50))
def test_stat_lines_start_alike(c_side, name, state, fields):
    text = f"4242 ({name}) {state} {' '.join(fields)}\n".encode()
    assert text_of(c_side.ask("proc_start", text)) == python_start(text)


@pytest.mark.parametrize("state", ["Z", "X"])
def test_a_zombie_has_no_start_time_on_either_side(c_side, state):
    text = (f"4242 (daemon) {state} 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 20 0 1 0 987654 "
            "1064960 172\n").encode()
    assert c_side.ask("proc_start", text) == "-"
    assert python_start(text) is None


# ---- the tasks' environment file: gs_env_file_apply and JobRecord.to_env_file -----------

def record(env: dict[str, str], error: str = "") -> JobRecord:
    return JobRecord(job_id=7, uid=1001, gid=1001, node="n1", mode="shared", share_percent=25,
                     env=env, error=error, created=1.0)


def what_python_means(env: dict[str, str], show: str, error: str) -> tuple[str, ...]:
    """What the file is meant to do: rc, #show=, #error=, the variables set, in order."""
    one_line = " ".join
    if error:
        return ("-1", "-", one_line(error.split()), "=")
    sets = "".join(f"{key}={one_line(value.split())}\n" for key, value in sorted(env.items())
                   if ENV_NAME.match(key))
    return ("0", one_line(show.split()) if show else "-", "-", sets or "=")


def what_c_does(c_side: CSide, text: str) -> tuple[str, ...]:
    rc, show, error, sets = c_side.ask("env_file", text.encode()).split(" ")
    return (rc, text_of(show) if show != "-" else "-", text_of(error) if error != "-" else "-",
            text_of(sets) or "=")


# Names without a newline: one that ends in one is tested on its own below.
env_names = st.one_of(st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,20}\Z"),
                      st.text(st.characters(blacklist_characters="\0\n", max_codepoint=0x7F),
                              min_size=1, max_size=8))
# What a file can hold: no NUL, no lone surrogate (the record could not be written at all).
env_values = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
                     max_size=40)


@settings(max_examples=EXAMPLES, deadline=None)
@given(env=st.dictionaries(env_names, env_values, max_size=8),
       show=st.one_of(st.just(""), env_values), error=st.one_of(st.just(""), env_values))
def test_an_env_file_does_in_c_what_python_wrote_it_for(c_side, env, show, error):
    text = record(env, error).to_env_file(show)
    assert what_c_does(c_side, text) == what_python_means(env, show, error), text


def test_a_name_ending_in_a_newline_sets_nothing(c_side):
    """state.ENV_NAME ends in $, which matches before a final newline, so such a name gets
    into the file; there it splits into lines that are no variable, and the C skips them."""
    text = record({"A\n": "x", "B": "1"}).to_env_file()
    assert what_c_does(c_side, text) == what_python_means({"B": "1"}, "", "")


@settings(max_examples=EXAMPLES, deadline=None)
@given(name=st.text(st.characters(blacklist_characters="\0\n", max_codepoint=0x7F),
                    max_size=130))
def test_a_variable_name_is_valid_alike(c_side, name):
    assert c_side.ask("env_name", name.encode()) == str(int(bool(ENV_NAME.match(name))))


# ---- share file: what RecordStore writes, gs_parse_share_text and RecordStore.read_jobs --

def python_share(text: bytes) -> Optional[int]:
    """RecordStore.read_jobs' reading of one job's file."""
    try:
        return int(text.decode().strip())
    except (UnicodeDecodeError, ValueError):
        return None


def test_every_share_python_writes_c_reads_back():
    side_text = {share: f"{share}\n".encode() for share in range(1, 101)}  # RecordStore
    for share, text in side_text.items():
        assert python_share(text) == share


def test_every_share_written_reads_the_same_in_c(c_side):
    for share in range(1, 101):
        assert c_side.ask("share", f"{share}\n".encode()) == str(share)


@settings(max_examples=EXAMPLES, deadline=None)
@given(text=st.one_of(st.from_regex(rb"\A[ +-]?[0-9]{1,4}\n?\n?\Z"),
                      st.binary(max_size=12).filter(lambda b: b"\0" not in b)))
def test_a_share_c_reads_python_reads_the_same(c_side, text):
    """C is the stricter reader: what it takes, Python takes as the same share."""
    answer = int(c_side.ask("share", text))
    if answer != -1:
        assert python_share(text) == answer


# ---- --gpu-share: gs_parse_percent (srun, the option) and request.parse_share (the node) -----

def python_percent(text: str) -> int:
    try:
        return parse_share(text)
    except Exception:
        return -1


ASCII_PERCENTS = st.text(st.sampled_from("0123456789 +-x.\t"), max_size=5)


@settings(max_examples=EXAMPLES, deadline=None)
@given(text=st.one_of(ASCII_PERCENTS, st.integers(-5, 205).map(str)))
def test_a_share_option_is_taken_alike(c_side, text):
    assert int(c_side.ask("percent", text.encode())) == python_percent(text), repr(text)


def test_only_ascii_digits_are_a_share(c_side):
    # Python's str.isdigit takes other scripts' digits; the C takes ASCII only
    for text in ("٣", "２５", "²"):
        assert c_side.ask("percent", text.encode()) == "-1"
        assert python_percent(text) == -1, text


def test_the_parity_vectors_reach_every_copy_the_docs_list():
    """Each row of the architecture's table of copies that is pure has a test above."""
    with open(os.path.join(C_DIR, "..", "..", "docs", "architecture.md")) as handle:
        doc = handle.read()
    for c_name in ("gs_stamp", "gs_parse_proc_start", "gs_env_file_apply",
                   "gs_parse_share_text", "gs_uuid_list"):
        assert re.search(rf"`{c_name}`", doc), c_name


# ---- a device list by UUID: gs_uuid_list (the task keeps it) and devices.uuid_list ------

SLURM_DEVICE_LISTS = [
    "0", "0,1", "3", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",  # 26.05 Flags=env_uuid
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,GPU-f9e8d7c6-b5a4-3210-fedc-ba9876543210",
    "MIG-5c5b9cc6-2b5e-5d3a-9c4d-0c2c7b1e2f10",  # a MIG slice's, from AutoDetect=nvml
    "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0",  # the same before driver 470
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,1", "", "GPU-", "GPU-a,", "gpu-a", " GPU-a",
    "NoDevFiles",  # what Slurm sets for a GRES without device files
]


@pytest.mark.parametrize("value", SLURM_DEVICE_LISTS)
def test_slurms_device_lists_are_told_apart_alike(c_side, value):
    assert c_side.ask("uuid_list", value.encode()) == str(int(uuid_list(value))), value


@settings(max_examples=EXAMPLES, deadline=None)
@given(value=st.lists(st.sampled_from(["GPU-", "MIG-", "GPU-a", "MIG-1/0", "0", "12", ",",
                                       "-", " ", "x"]), max_size=6).map("".join))
def test_a_device_list_names_uuids_alike(c_side, value):
    assert c_side.ask("uuid_list", value.encode()) == str(int(uuid_list(value))), value


# ---- plugstack path arguments: gs_copy_path (spank/gs_args.c) and gpushare.node.config --

def python_path(value: str, node: str) -> Optional[str]:
    """What the core makes of a path argument on ``node``: checked and normalised as a
    plugstack value, then %n and %h expanded (PluginConfig.for_node); None when refused,
    "" for none."""
    try:
        values = plugin_arg_values([f"debug_log={value}"])
    except ConfigError:
        return None
    if not values["debug_log"] or values["debug_log"] == "none":
        return ""
    try:
        return expand_path(values["debug_log"], node)
    except ValueError:
        return None


def c_path(c_side: CSide, value: str, node: str) -> Optional[str]:
    c_side.ask("node", node.encode())
    answer = text_of(c_side.ask("path", value.encode()))
    return os.path.normpath(answer) if answer else answer  # Python normalises the value


path_values = st.lists(st.sampled_from(["/", "a", ".", "%", "n", "h", "%n", "%h", "%%", "-"]),
                       max_size=10).map("".join)
node_names = st.one_of(st.sampled_from(["n1", "gpu-a.1", "_x"]),
                       st.text(st.sampled_from("ab1.-_/ %"), min_size=1, max_size=6))


@settings(max_examples=EXAMPLES, deadline=None)
@given(value=path_values, node=node_names)
def test_a_path_argument_expands_alike(c_side, value, node):
    assert c_path(c_side, value, node) == python_path(value, node), (value, node)


def test_a_node_name_ending_in_a_newline_is_refused_alike(c_side):
    assert c_path(c_side, "/run/%n", "n1\n") is None
    assert python_path("/run/%n", "n1\n") is None
