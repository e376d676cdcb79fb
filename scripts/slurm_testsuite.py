#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0-or-later
"""Slurm's own regression tests as a transparency check for gpushare.

Runs a chosen set of Slurm's GRES/MPS/SPANK expect tests and ATF (pytest) items, taken from
the testsuite of the Slurm release installed here, twice on a private 4-node cluster:
without gpushare (A) and with gpushare's SPANK plugin and submit hook loaded (B). Then
prints an A/B table and exits 1 when B differs from A in a way the allow-list below does
not explain (2: the check itself could not run).

    scripts/slurm_testsuite.py --source DIR_OR_GIT_MIRROR_OR_TARBALL [--side A|B|both]
    scripts/slurm_testsuite.py compare A.json B.json   # the table from two saved runs

``--source`` is a Slurm git repository (bare mirrors too), an unpacked source tree or a
source tarball; without it the tag is cloned from GitHub when this machine reaches it.
docs/transparency.md says what the check proves and shows a measured table.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from typing import Mapping, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GITHUB = "https://github.com/SchedMD/slurm.git"
TEST_USER = "gpushare-u1"  # the project's test user (created by the bed when missing)
EXTRA_PACKAGES = ("expect", "python3-pytest", "python3-py", "python3-pexpect", "bc", "git",
                  "libslurm-dev", "gcc", "libc6-dev")
RESULTS = ("PASS", "FAIL", "SKIP", "ERROR", "TIMEOUT")


# ---- what runs -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Item:
    """One expect test or pytest file, on one GRES layout, run as root or the test user."""

    name: str  # expect: test39.5; python: path under testsuite/python
    layout: str  # "nvidia": gres on simulated /dev/nvidia0; "tty0": Slurm's own MPS form
    user: str = "root"  # "root" or "test" (a normal user's MPS jobs, as a site's)
    seconds: int = 300  # limit

    @property
    def kind(self) -> str:
        return "python" if self.name.endswith(".py") else "expect"

    @property
    def key(self) -> str:
        """The row name: the test, and the layout when it is not the main one."""
        return self.name if self.layout == "nvidia" else f"{self.name}@{self.layout}"


# About 8 minutes per side on 2 cores. Every test here is in 22.05.8's testsuite.
ITEMS: tuple[Item, ...] = (
    # GPU GRES (cons_tres): whole GPUs; gpushare verifies every device at job start.
    Item("test1.62", "nvidia"), Item("test39.1", "nvidia"), Item("test39.2", "nvidia"),
    Item("test39.3", "nvidia"), Item("test39.4", "nvidia"), Item("test39.5", "nvidia"),
    Item("test39.7", "nvidia"), Item("test39.13", "nvidia"), Item("test39.22", "nvidia"),
    Item("test39.23", "nvidia"), Item("test2.12", "nvidia"),
    # MPS: run as a normal user, so that in B gpushare starts (stand-in) MPS daemons.
    Item("test40.1", "nvidia", "test"), Item("test40.2", "nvidia", "test"),
    Item("test40.6", "nvidia", "test"),
    # Prolog/Epilog environment of gpu and mps jobs (rewrites slurm.conf: root).
    Item("test31.3", "nvidia"),
    # SPANK: each adds its own plugin next to gpushare's in plugstack.conf (root).
    Item("test7.11", "nvidia"), Item("test7.21", "nvidia"), Item("test7.24", "nvidia"),
    # Slurm's ATF MPS tests demand gres.conf exactly "Name=gpu File=/dev/tty0" and
    # "Name=mps Count=100": a device that is no NVIDIA GPU.
    Item("test1.62", "tty0"), Item("test39.7", "tty0"),
    # They run as root: as another user the ATF wants sudo for its own checks.
    Item("tests/commands/sbatch/test_invalid_mps_options.py", "tty0"),
    Item("tests/features/gres/test_mps_options.py", "tty0"),
    Item("tests/commands/srun/test_env_variables.py", "tty0"),
)

# Differences between A and B that are gpushare's documented behaviour: a pattern of row
# names (fnmatch) -> (B's result, the reason). A row is allowed only with that B result.
# None now: root's shared jobs get a daemon of root's own (test31.3's mps subtest runs as in
# A), and the ATF's MPS jobs on /dev/tty0, no NVIDIA GPU, are left to Slurm.
ALLOWED: dict[str, tuple[str, str]] = {}


# ---- results and their comparison (pure; unit-tested) ----------------------------------

@dataclasses.dataclass
class Outcome:
    """What one test gave on one side."""

    result: str  # one of RESULTS
    failed: list[str] = dataclasses.field(default_factory=list)  # failed subtests/items
    reason: str = ""  # why it failed or skipped, as the test said
    seconds: float = 0.0
    drains: list[str] = dataclasses.field(default_factory=list)  # nodes drained meanwhile

    def signature(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """What must be equal in A and B: the result, the failed parts, any drain."""
        return self.result, tuple(sorted(self.failed)), tuple(sorted(self.drains))


_HEADER = re.compile(r"^(SUCCESS|FAILURE|SKIPPED)\s+:\s+(\S+)\s*$", re.MULTILINE)
_SUBTEST_FAILED = re.compile(r"^\s*Subtest\s+(\d+)\s+failed\s*(?::\s*(.*))?$", re.MULTILINE)
_TESTPROCS_FAILED = re.compile(r"Testprocs failed\s*:.*List:\s*(\S+)")
_INCOMPLETE = re.compile(r"(?:Subtests|Testprocs) total\s*:\s*\d+\s+INCOMPLETE:\s*(.*)")
# Job ids, pids, ports: they differ between runs.
_NOISE = re.compile(r"\b\d{3,}\b|(?<=slurm-)\d+|(?<=[Jj]ob )\d+|(?<=[Jj]ob_id=)\d+")


def _normalise(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return " ".join(_NOISE.sub("N", text).split())


def parse_expect_log(text: str, test: str) -> Outcome:
    """The outcome an expect test printed at its end (its last summary wins)."""
    found = [m for m in _HEADER.finditer(text) if m.group(2) == test]
    if not found:
        return Outcome("ERROR", reason="no SUCCESS/FAILURE/SKIPPED line for " + test)
    last = found[-1]
    result = {"SUCCESS": "PASS", "FAILURE": "FAIL", "SKIPPED": "SKIP"}[last.group(1)]
    tail = text[last.start():]
    failed = sorted({f"subtest {m.group(1)}: {_normalise(m.group(2) or '')}".rstrip(": ")
                     for m in _SUBTEST_FAILED.finditer(tail)})
    procs = _TESTPROCS_FAILED.search(tail)
    if procs:
        failed += [f"testproc {p}" for p in procs.group(1).split(",") if p]
    reason = ""
    incomplete = _INCOMPLETE.search(tail)
    if incomplete:
        reason = _normalise(incomplete.group(1))
    elif result != "PASS":
        reason = _last_complaint(text[:last.start()])
    return Outcome(result, failed, reason)


def _gpushare_line(text: str) -> str:
    """The first thing gpushare told the test (a refusal, a failed prolog), if anything."""
    match = re.search(r"(gpushare: [^\n]*)", text)
    return _normalise(match.group(1))[:200] if match else ""


def _last_complaint(text: str) -> str:
    """The last fatal/error/warning line an expect test logged, for the reason column."""
    for line in reversed(text.splitlines()):
        if re.search(r"\b(Fatal|FATAL|Error|ERROR|WARNING|Warning)\b", line):
            return _normalise(re.sub(r"^\[[^]]*\]\s*", "", line))[:200]
    return ""


def parse_junit(text: str, prefix: str) -> dict[str, Outcome]:
    """One Outcome per test function of a pytest junit XML report."""
    outcomes: dict[str, Outcome] = {}
    root = ET.fromstring(text)
    for case in root.iter("testcase"):
        name = f"{prefix}::{case.get('name', '?')}"
        seconds = float(case.get("time", "0") or 0)
        result, reason = "PASS", ""
        for tag, value in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "SKIP")):
            node = case.find(tag)
            if node is not None:
                result = value
                reason = _normalise(node.get("message", "") or (node.text or ""))[:200]
                break
        outcomes[name] = Outcome(result, [], reason, seconds)
    return outcomes


@dataclasses.dataclass
class Row:
    test: str
    a: str
    b: str
    verdict: str  # same | differs | allowed | missing
    note: str = ""


def compare(a: Mapping[str, Outcome], b: Mapping[str, Outcome],
            allowed: Mapping[str, tuple[str, str]] = ALLOWED) -> list[Row]:
    """One row per test of either side, in A's order, then B's extra tests."""
    rows = []
    for test in list(a) + [t for t in b if t not in a]:
        left, right = a.get(test), b.get(test)
        if left is None or right is None:
            rows.append(Row(test, left.result if left else "-", right.result if right else "-",
                            "missing", "ran on one side only"))
            continue
        if left.signature() == right.signature():
            rows.append(Row(test, left.result, right.result, "same", _same_note(left)))
            continue
        note = _difference(left, right)
        allow = next((v for k, v in allowed.items() if fnmatch.fnmatchcase(test, k)), None)
        if allow is not None and allow[0] == right.result:
            rows.append(Row(test, left.result, right.result, "allowed", allow[1]))
        else:
            rows.append(Row(test, left.result, right.result, "differs", note))
    return rows


def _same_note(outcome: Outcome) -> str:
    if outcome.result == "PASS":
        return ""
    parts = [outcome.reason] if outcome.reason else []
    if outcome.failed:
        parts.append(f"{len(outcome.failed)} failed part(s), the same in both")
    return "; ".join(parts)


def _difference(a: Outcome, b: Outcome) -> str:
    parts = []
    only_b = sorted(set(b.failed) - set(a.failed))
    only_a = sorted(set(a.failed) - set(b.failed))
    if only_b:
        parts.append("failed only in B: " + " | ".join(only_b[:3])
                     + (f" (+{len(only_b) - 3})" if len(only_b) > 3 else ""))
    if only_a:
        parts.append("failed only in A: " + " | ".join(only_a[:3])
                     + (f" (+{len(only_a) - 3})" if len(only_a) > 3 else ""))
    if a.drains != b.drains:
        parts.append("drained: A " + (", ".join(a.drains) or "none") + "; B "
                     + (", ".join(b.drains) or "none"))
    if b.result != "PASS" and b.reason:
        parts.append("B: " + b.reason)
    return "; ".join(parts) or "results differ"


def plugin_activity(debug_lines: Sequence[str]) -> str:
    """What gpushare's core did in B, from its debug log: proof that it was not idle."""
    jobs = {m.group(1) for m in (re.search(r" py job=(\d+) ", line) for line in debug_lines)
            if m}
    shared = {m.group(1) for m in (re.search(r" py job=(\d+) info (?:shared|private) MPS, ",
                                             line) for line in debug_lines) if m}
    return (f"its core ran for {len(jobs)} job(s) and gave {len(shared)} of them an MPS "
            "daemon")


def verdict_exit(rows: Sequence[Row]) -> int:
    """0 when every row is the same or allowed, else 1."""
    return 1 if any(r.verdict in ("differs", "missing") for r in rows) else 0


def format_table(rows: Sequence[Row]) -> str:
    """A Markdown table (readable as plain text too) and a one-line summary."""
    lines = ["| test | A (without gpushare) | B (with gpushare) | A/B | note |",
             "|---|---|---|---|---|"]
    for r in rows:
        note = r.note.replace("|", "/")
        lines.append(f"| {r.test} | {r.a} | {r.b} | {r.verdict} | {note} |")
    counts = {v: sum(1 for r in rows if r.verdict == v)
              for v in ("same", "allowed", "differs", "missing")}
    lines.append("")
    lines.append(f"{len(rows)} tests: {counts['same']} same, {counts['allowed']} allowed "
                 f"difference(s), {counts['differs']} unexplained difference(s), "
                 f"{counts['missing']} on one side only")
    return "\n".join(lines)


def outcomes_to_json(outcomes: Mapping[str, Outcome]) -> str:
    return json.dumps({k: dataclasses.asdict(v) for k, v in outcomes.items()}, indent=1)


def outcomes_from_json(text: str) -> dict[str, Outcome]:
    return {k: Outcome(**v) for k, v in json.loads(text).items()}


# ---- the Slurm release and its testsuite -------------------------------------------------

def installed_version() -> str:
    """22.05.8 from ``slurmctld -V`` (``slurm-wlm 22.05.8`` on Debian, ``slurm 22.05.8``)."""
    out = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    if not match:
        raise SystemExit(f"cannot read the Slurm version from `slurmctld -V`: {out.strip()!r}")
    return match.group(0)


def release_tag(version: str) -> str:
    """SchedMD's tag of a release: 22.05.8 -> slurm-22-05-8-1."""
    major, minor, micro = version.split(".")
    return f"slurm-{int(major):02d}-{int(minor):02d}-{int(micro)}-1"


class SourceError(RuntimeError):
    pass


def extract_testsuite(source: Optional[str], tag: str, version: str, dest: str) -> str:
    """Put ``testsuite/`` of Slurm ``tag`` under ``dest``; return a note on where it came from."""
    os.makedirs(dest, exist_ok=True)
    if source is None:
        probe = subprocess.run(["git", "ls-remote", "--tags", GITHUB, tag], capture_output=True,
                               text=True, timeout=60)
        if probe.returncode != 0 or tag not in probe.stdout:
            raise SourceError(f"cannot reach {GITHUB} (or it has no tag {tag}); pass "
                              "--source with a Slurm git mirror, source tree or tarball")
        clone = os.path.join(dest, "slurm.git")
        subprocess.run(["git", "clone", "--quiet", "--bare", "--depth", "1", "--branch", tag,
                        GITHUB, clone], check=True)
        source = clone
    source = os.path.abspath(source)
    if os.path.isdir(source) and _is_git(source):
        commit = subprocess.run(["git", "-C", source, "rev-parse", "--verify", "--quiet",
                                 f"{tag}^{{commit}}"], capture_output=True, text=True)
        if commit.returncode != 0:
            raise SourceError(f"{source} has no tag {tag} (the installed Slurm is {version})")
        archive = subprocess.Popen(["git", "-C", source, "archive", tag, "testsuite"],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SourceError(f"git archive {tag} testsuite failed in {source}")
        return f"{source} at {tag} ({commit.stdout.strip()})"
    if os.path.isdir(source):
        if not os.path.isdir(os.path.join(source, "testsuite", "expect")):
            raise SourceError(f"{source} holds no testsuite/expect: give Slurm's source tree")
        _check_meta(os.path.join(source, "META"), version)
        shutil.copytree(os.path.join(source, "testsuite"), os.path.join(dest, "testsuite"))
        return f"{source} (source tree)"
    if os.path.isfile(source) and tarfile.is_tarfile(source):
        # slurm-22.05.8.tar.bz2 holds slurm-22.05.8/testsuite/...: take that directory only.
        with tarfile.open(source) as tar:
            wanted = []
            for member in tar.getmembers():
                top_dir, _, rest = member.name.partition("/")
                if not re.search(rf"(?<![\d.]){re.escape(version)}(?![\d.])", top_dir):
                    raise SourceError(f"{source}: {top_dir}/ is not Slurm {version}, the "
                                      "installed release")
                if ".." in rest.split("/") or not rest.startswith("testsuite/"):
                    continue
                if member.isreg() or member.isdir():
                    member.name = rest
                    wanted.append(member)
            if not wanted:
                raise SourceError(f"{source} holds no <top>/testsuite/")
            tar.extractall(dest, members=wanted)  # regular files and directories only
        return f"{source} (tarball)"
    raise SourceError(f"--source {source}: not a git repository, source tree or tarball")


def _is_git(path: str) -> bool:
    return subprocess.run(["git", "-C", path, "rev-parse", "--git-dir"],
                          capture_output=True).returncode == 0


def _check_meta(meta: str, version: str) -> None:
    if not os.path.exists(meta):
        return
    with open(meta) as handle:
        fields = dict(re.findall(r"^\s*(\w+):\s*(\S+)", handle.read(), re.MULTILINE))
    found = ".".join(fields.get(k, "?") for k in ("Major", "Minor", "Micro"))
    if [p.lstrip("0") for p in found.split(".")] != [p.lstrip("0") for p in version.split(".")]:
        raise SourceError(f"the source tree is Slurm {found}, the installed Slurm {version}")


# ---- the bed -----------------------------------------------------------------------------

def _bed_module():
    # The bed reads the installed release through the core (gpushare.admin.slurm_client).
    for path in (os.path.join(REPO, "src"), os.path.join(REPO, "scripts")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import slurmbed  # the project's local Slurm (scripts/slurmbed.py)
    return slurmbed


def make_bed(layout: str, side: str, root: str, port: int, prefix: str):
    """4 nodes, one GPU each (gpu:1,mps:100): Slurm's MPS tests' shape."""
    slurmbed = _bed_module()
    names = [f"{prefix}{i}" for i in range(1, 5)]
    profile = os.path.join(REPO, "src", "gpushare", "gpu", "profiles", "h100-8x-nvswitch.json")
    nodes = [slurmbed.Node(name=n, port=port + i, cpus=6, gres="gpu:1,mps:100",
                           profile=profile) for i, n in enumerate(names, start=1)]
    if layout == "tty0":
        gres = "AutoDetect=off\nName=gpu File=/dev/tty0\nName=mps Count=100\n"
    else:
        # mps without File=, as in Slurm's own form: Slurm then sets CUDA_VISIBLE_DEVICES
        # for mps jobs (with File= on the mps line 22.05 leaves it empty).
        gres = "AutoDetect=off\nName=gpu File=@ROOT@/dev/nvidia0\nName=mps Count=100\n"
    topology = (f"SwitchName=s0 Nodes={names[0]},{names[1]}\n"
                f"SwitchName=s1 Nodes={names[2]},{names[3]}\nSwitchName=top Switches=s[0-1]\n")
    kwargs: dict[str, object] = {}
    if side == "B":
        facts = {"version": 2, "gres_syntax": "22.05", "mps_units_per_gpu": 100,
                 "gpu_types": [], "mig_types": [], "types": {}, "domains": {},
                 "gpus_per_node": {n: 1 for n in names},
                 "policy": {"switch_wait_s": 300, "max_switch_wait_s": 3600,
                            "on_error": "accept", "untyped_gpu": "whole"}}
        from gpushare.submit.facts import facts_from_dict
        facts_from_dict(facts)  # the hook would ignore a bad file silently: refuse it here
        kwargs.update(job_submit="lua", facts_json=json.dumps(facts),
                      job_submit_lua=os.path.join(REPO, "submit_hooks", "job_submit.lua"))
    else:
        kwargs["plugstack"] = ""
    return _bed_class(slurmbed)(root=root, nodes=nodes, gres_conf=gres,
                                topology_conf=topology, cluster="slurmts", ctld_port=port,
                                cgroup=False, device_count=1, **kwargs)


def _bed_class(slurmbed):
    class TestsuiteBed(slurmbed.SlurmBed):
        """The project's bed with the GRES types Slurm's tests expect: with shard among
        them, Slurm 22.05 sets no CUDA_VISIBLE_DEVICES for mps jobs, and its MPS tests fail
        without any add-on."""

        def _write_configs(self) -> None:
            super()._write_configs()
            with open(self.conf) as handle:
                text = handle.read()
            if "\nGresTypes=gpu,mps,shard\n" not in text:
                raise RuntimeError(f"{self.conf}: no GresTypes=gpu,mps,shard line to replace")
            with open(self.conf, "w") as handle:
                handle.write(text.replace("\nGresTypes=gpu,mps,shard\n", "\nGresTypes=gpu,mps\n"))

    return TestsuiteBed


# ---- running -----------------------------------------------------------------------------

class Runner:
    def __init__(self, top: str, side: str, port: int, prefix: str, keep: bool) -> None:
        self.top = top
        self.side = side
        self.port = port
        self.prefix = prefix
        self.keep = keep
        self.results = os.path.join(top, "results", side)
        self.bed = None

    # testsuite copies: one root-owned (root's tests), one the test user owns (its tests
    # write their files beside themselves); root never runs code from the user's copy.
    def suite(self, user: str) -> str:
        return os.path.join(self.top, "suite-" + ("root" if user == "root" else "user"),
                            "testsuite")

    def env(self, user: str) -> dict[str, str]:
        suite = self.suite(user)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
               "SLURM_CONF": self.bed.conf, "SLURM_TESTSUITE_CONF": suite + "/testsuite.conf",
               "SLURM_LOCAL_GLOBALS_FILE": suite + "/expect/globals.local",
               "SLURM_TESTSUITE_CLEANUP_ON_FAILURE": "true"}
        env["HOME"] = "/root" if user == "root" else os.path.expanduser("~" + TEST_USER)
        return env

    def command(self, user: str, argv: list[str]) -> list[str]:
        if user == "root":
            return argv
        return ["runuser", "-u", TEST_USER, "--", *argv]

    def run_side(self, items: Sequence[Item]) -> dict[str, Outcome]:
        os.makedirs(self.results, exist_ok=True)
        outcomes: dict[str, Outcome] = {}
        for layout in dict.fromkeys(i.layout for i in items):
            self.bed = make_bed(layout, self.side, os.path.join(self.top, "bed"), self.port,
                                self.prefix)  # testsuite.conf names <top>/bed/etc
            self.bed.keep = self.keep
            print(f"[{self.side}] cluster up: layout {layout}, "
                  f"{'gpushare loaded' if self.side == 'B' else 'no gpushare'}", flush=True)
            self.bed.start()
            try:
                for item in (i for i in items if i.layout == layout):
                    outcomes.update(self.run_item(item))
                if self.side == "B":
                    print(f"[B] gpushare on layout {layout}: "
                          f"{plugin_activity(self.bed.debug_lines())}", flush=True)
            finally:
                self.bed.stop()
        return outcomes

    def run_item(self, item: Item) -> dict[str, Outcome]:
        self.settle()
        start = time.monotonic()
        print(f"[{self.side}] {item.key} ...", end=" ", flush=True)
        user = "root" if item.user == "root" else TEST_USER
        log_path = os.path.join(self.results, item.key.replace("/", "_") + ".log")
        if item.kind == "expect":
            cwd = self.suite(item.user) + "/expect"
            argv = ["timeout", str(item.seconds), "expect", item.name]
        else:
            cwd = self.suite(item.user) + "/python"
            junit = os.path.join(cwd, "junit.xml")
            if os.path.exists(junit):
                os.unlink(junit)
            argv = ["timeout", str(item.seconds), "/usr/bin/python3", "run-tests-python",
                    f"--junitxml={junit}", item.name]
        proc = subprocess.run(self.command(user, ["env", "-i", *(
            f"{k}={v}" for k, v in self.env(item.user).items()), *argv]), cwd=cwd,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        with open(log_path, "w") as handle:
            handle.write(proc.stdout)
        seconds = time.monotonic() - start
        if item.kind == "expect":
            found = {item.key: parse_expect_log(proc.stdout, item.name)}
        elif os.path.exists(junit):
            # The test user may own this directory: never follow a link planted there.
            fd = os.open(junit, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as handle:
                found = parse_junit(handle.read(), item.key)
        else:
            found = {item.key: Outcome("ERROR", reason=f"pytest wrote no report (rc "
                                                       f"{proc.returncode})")}
        said = _gpushare_line(proc.stdout)
        for outcome in found.values():
            if outcome.result != "PASS" and said and said not in outcome.reason:
                outcome.reason = f"{said}; {outcome.reason}" if outcome.reason else said
        if proc.returncode == 124:
            for outcome in found.values():
                outcome.result, outcome.reason = "TIMEOUT", f"over {item.seconds} s"
        drains = self.settle()
        for outcome in found.values():
            outcome.drains = drains
            if item.kind == "expect":
                outcome.seconds = round(seconds, 1)
        print(", ".join(sorted({o.result for o in found.values()})) + f" ({seconds:.0f} s)"
              + (f" drained: {drains}" if drains else ""), flush=True)
        return found

    def settle(self, timeout: float = 120.0) -> list[str]:
        """Cancel what a test left, note drained nodes and resume them, wait until idle."""
        bed = self.bed
        bed.run(["scancel", "--quiet", "--full", "-u", "root"], check=False)
        bed.run(["scancel", "--quiet", "-u", TEST_USER], check=False)
        drains: set[str] = set()
        deadline = time.monotonic() + timeout
        while True:
            reasons = bed.run(["sinfo", "-h", "-R", "-N", "-o", "%N|%E"], check=False).stdout
            for line in reasons.splitlines():
                node, _, reason = line.partition("|")
                if node.strip():
                    drains.add(f"{node.strip()}: {_normalise(reason)}")
                    bed.resume(node.strip())
            jobs = bed.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
            states = bed.run(["sinfo", "-h", "-N", "-o", "%t"], check=False).stdout.split()
            if not jobs and states and all(s == "idle" for s in states):
                return sorted(drains)
            if time.monotonic() > deadline:
                print(f"[{self.side}] warning: cluster not idle after {timeout:.0f} s "
                      f"(jobs {jobs}, nodes {states})", flush=True)
                return sorted(drains)
            time.sleep(0.5)


def prepare_suites(top: str, source: Optional[str], tag: str, version: str) -> str:
    """Two copies of the testsuite plus the shims Debian's installed Slurm needs."""
    os.makedirs(top, mode=0o755, exist_ok=True)
    info = os.lstat(top)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise SourceError(f"{top} must be a directory owned by root and writable only by it; "
                          "remove it or choose another --root")
    slurmbed = _bed_module()
    slurmbed.ensure_packages((*slurmbed.APT_PACKAGES, *EXTRA_PACKAGES))
    user = slurmbed.ensure_user(TEST_USER)
    shutil.rmtree(os.path.join(top, "suite-root"), ignore_errors=True)
    shutil.rmtree(os.path.join(top, "suite-user"), ignore_errors=True)
    os.makedirs(os.path.join(top, "bin"), exist_ok=True)
    note = extract_testsuite(source, tag, version, os.path.join(top, "suite-root"))
    shutil.copytree(os.path.join(top, "suite-root"), os.path.join(top, "suite-user"),
                    symlinks=True)
    # Debian's `scontrol -V` says "slurm-wlm 22.05.8"; the SPANK tests parse "slurm X.Y".
    shim = os.path.join(top, "bin", "scontrol")
    with open(shim, "w") as handle:
        handle.write('#!/bin/sh\ncase "$1" in -V|--version) /usr/bin/scontrol "$@" | '
                     "sed 's/^slurm-wlm /slurm /'; exit 0;; esac\nexec /usr/bin/scontrol \"$@\"\n")
    os.chmod(shim, 0o755)
    for name in ("suite-root", "suite-user"):
        base = os.path.join(top, name)
        os.makedirs(os.path.join(base, "build"), exist_ok=True)
        with open(os.path.join(base, "build", "config.h"), "w") as handle:
            handle.write("#define HAVE_LUA 1\n")  # no HAVE_NVML: NVML tests skip
        with open(os.path.join(base, "testsuite", "expect", "globals.local"), "w") as handle:
            handle.write(f"set testsuite_colorize false\nset scontrol \"{shim}\"\n")
        # Written before the test user owns its copy: root never writes into it after.
        with open(os.path.join(base, "testsuite", "testsuite.conf"), "w") as handle:
            handle.write(f"SlurmSourceDir={base}\nSlurmBuildDir={base}/build\n"
                         f"SlurmInstallDir=/usr\nSlurmConfigDir={top}/bed/etc\n")
    for dirpath, _dirs, files in os.walk(os.path.join(top, "suite-user")):
        for entry in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
            os.lchown(entry, user.pw_uid, user.pw_gid)
    return note


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("run this as root: it starts a private Slurm cluster (slurmctld, 4 slurmd, "
              "munged) and runs Slurm's tests as root and as a test user", file=sys.stderr)
        return 2
    version = installed_version()
    tag = args.tag or release_tag(version)
    items = [i for i in ITEMS if not args.only or i.name in args.only or i.key in args.only]
    if not items:
        print(f"--only {' '.join(args.only)} names no test of the list", file=sys.stderr)
        return 2
    try:
        note = prepare_suites(args.root, args.source, tag, version)
    except (SourceError, subprocess.CalledProcessError) as err:
        print(f"cannot prepare Slurm's testsuite: {err}", file=sys.stderr)
        return 2
    print(f"Slurm {version}: testsuite from {note}", flush=True)
    sides = ("A", "B") if args.side == "both" else (args.side,)
    outcomes = {}
    for side in sides:
        start = time.monotonic()
        outcomes[side] = Runner(args.root, side, args.port, args.prefix, args.keep).run_side(
            items)
        path = os.path.join(args.root, "results", f"{side}.json")
        with open(path, "w") as handle:
            handle.write(outcomes_to_json(outcomes[side]))
        print(f"[{side}] {len(outcomes[side])} results in {time.monotonic() - start:.0f} s: "
              f"{path}", flush=True)
    if len(sides) == 1:
        return 0
    rows = compare(outcomes["A"], outcomes["B"])
    print()
    print(format_table(rows))
    return verdict_exit(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    cmp_parser = sub.add_parser("compare", help="print the A/B table of two saved runs")
    cmp_parser.add_argument("a_json")
    cmp_parser.add_argument("b_json")
    parser.add_argument("--source", help="Slurm git repository or mirror, source tree or "
                        "tarball holding the installed release's tag")
    parser.add_argument("--tag", help="the tag to use (default: from `slurmctld -V`)")
    parser.add_argument("--side", choices=("A", "B", "both"), default="both")
    parser.add_argument("--only", nargs="+", default=[], help="run only these tests")
    parser.add_argument("--root", default="/tmp/gpushare-slurmts",
                        help="private directory for the testsuite, the cluster and results")
    parser.add_argument("--port", type=int, default=18400,
                        help="slurmctld's port; the nodes take the next four")
    parser.add_argument("--prefix", default="sts", help="node name prefix (sts1..sts4)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's files")
    args = parser.parse_args(argv)
    if args.command == "compare":
        with open(args.a_json) as a, open(args.b_json) as b:
            rows = compare(outcomes_from_json(a.read()), outcomes_from_json(b.read()))
        print(format_table(rows))
        return verdict_exit(rows)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
