# SPDX-License-Identifier: GPL-2.0-or-later
"""The other Slurm releases, for `make test`: cached Debian roots and runs inside them.

gpushare is tested on three Slurm releases: Debian 12's 22.05, Debian 13's 24.11 and Debian
forky's 26.05. The machine's own runs here; each other one runs in a Debian root of its
release, built here with debootstrap from the Debian mirror apt already uses. A root is cached
under ``/var/cache/gpushare-test/<codename>/root`` and rebuilt when it is missing or when its
recipe (release, mirror, packages) changes.

Each run gets its own mount and pid namespaces and a throw-away overlay over the cached root,
so nothing it does reaches the cache, another run, or processes and cgroups outside it: the
overlay has no cgroup hierarchy and the run sees only its own processes. The working tree is
mounted at ``/src/gpushare``; a release's plugin build and virtual environment live in
``build/release-<codename>/`` and are mounted over ``build/`` and ``.venv`` there. Each root's
beds have ports of their own, so every suite runs at once: they wait on Slurm far more than
they compute.

    python3 tests/release_root.py ensure [--release R]     build the cached roots when needed
    python3 tests/release_root.py run --release R -- CMD   run CMD in a fresh overlay of R
    python3 tests/release_root.py suite [--release R]      a root's build and whole suite
    python3 tests/release_root.py make-test PY             every suite at once (lint, unit
                                                           tests under 3.9, this machine's,
                                                           each root's); one line per suite
    python3 tests/release_root.py quick PY                 lint, unit and smoke tests at once
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("GPUSHARE_RELEASE_CACHE", "/var/cache/gpushare-test")
INSIDE = "/src/gpushare"
# The Slurm release each Debian release ships; gpushare is tested on all of them: the
# machine's own, the others each in a root of its own.
SLURM_OF = {"bookworm": "22.05", "trixie": "24.11", "forky": "26.05"}
# Ports of each root's beds (the network is shared with this machine and the other roots; a
# suite uses its base up to about +360, and the sanitized bed its own base).
BED_PORT = {"bookworm": 18500, "trixie": 19000, "forky": 19500}
SANITIZED_PORT_OFFSET = 420
# Moves every root's beds to other ports, so that a second run (a subset while `make test`
# runs, say) shares no port with the first: GPUSHARE_ROOT_PORT_SHIFT=3000.
PORT_SHIFT_VARIABLE = "GPUSHARE_ROOT_PORT_SHIFT"


def port_shift() -> int:
    text = os.environ.get(PORT_SHIFT_VARIABLE, "0")
    if not text.isdigit() or int(text) > 20000:
        raise SystemExit(f"release_root: {PORT_SHIFT_VARIABLE}={text!r} must be a number of "
                         "ports from 0 to 20000")
    return int(text)
# debootstrap has no script of its own for a release newer than it: that of sid fits.
DEBOOTSTRAP_SCRIPT_FALLBACK = "sid"
# Everything the build, the suite and the RPM test need in the root (slurmbed.APT_PACKAGES,
# plus the tools `make build venv` and scripts/build_rpm.sh use).
PACKAGES = (
    "slurmctld", "slurmd", "slurm-client", "munge", "libslurm-dev", "slurm-wlm-basic-plugins",
    "python3-cffi", "python3-dev", "python3-setuptools", "python3-jinja2", "python3-yaml",
    "python3-pip", "python3-venv", "python3-rpm", "lua5.1", "gcc", "libc6-dev", "make", "rpm",
    "ca-certificates", "procps",
    # the AdminComment test's accounting (scripts/slurmdbd_bed.py)
    "slurmdbd", "mariadb-server",
)
TEST_USERS = ("gpushare-u1", "gpushare-u2")
RECIPE_VERSION = "3"  # bump when the build steps below change


class RootError(RuntimeError):
    """The other release's root could not be built or used."""


@dataclass(frozen=True)
class Mirror:
    """Where this machine's apt gets Debian and its security updates."""

    main: str
    security: str


def host_codename() -> str:
    with open("/etc/os-release") as handle:
        for line in handle:
            key, _, value = line.strip().partition("=")
            if key == "VERSION_CODENAME":
                return value.strip('"')
    raise RootError("/etc/os-release names no VERSION_CODENAME: not a Debian release")


def other_codenames(host: str) -> list[str]:
    """The releases tested in roots: every one but the machine's own."""
    if host not in SLURM_OF:
        raise RootError(f"this machine runs Debian {host!r}; gpushare tests its Slurm releases "
                        f"on {', '.join(sorted(SLURM_OF))} only")
    return [codename for codename in SLURM_OF if codename != host]


def host_mirror(codename: str) -> Mirror:
    """The mirrors apt uses for ``codename`` and its security suite (``apt-cache policy``)."""
    policy = subprocess.run(["apt-cache", "policy"], capture_output=True, text=True,
                            check=True).stdout
    main = security = ""
    for match in re.finditer(r"^\s*\d+\s+(\S+)\s+(\S+)/main\s", policy, re.MULTILINE):
        uri, suite = match.group(1), match.group(2)
        if suite == codename and not main:
            main = uri
        elif suite == f"{codename}-security" and not security:
            security = uri
    if not main:
        raise RootError(f"apt knows no mirror for {codename}/main (see `apt-cache policy`); "
                        "add one to /etc/apt/sources.list.d and run apt-get update")
    if not security:
        security = main.rstrip("/") + "-security" if main.rstrip("/").endswith("/debian") \
            else main
    return Mirror(main=main.rstrip("/"), security=security.rstrip("/"))


def recipe(codename: str, mirror: Mirror) -> str:
    return "\n".join((RECIPE_VERSION, codename, mirror.main, mirror.security, *PACKAGES))


def cache_dir(codename: str) -> str:
    return os.path.join(CACHE, codename)


def root_of(codename: str) -> str:
    return os.path.join(cache_dir(codename), "root")


@contextlib.contextmanager
def locked(codename: str, exclusive: bool) -> Iterator[None]:
    """Builders hold the root's lock alone; runs share it, so no rebuild pulls it away."""
    os.makedirs(CACHE, mode=0o755, exist_ok=True)
    with open(os.path.join(CACHE, f"{codename}.lock"), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stamp(codename: str) -> str:
    return os.path.join(cache_dir(codename), "recipe.sha256")


def is_current(codename: str, wanted: str) -> bool:
    digest = hashlib.sha256(wanted.encode()).hexdigest()
    try:
        with open(_stamp(codename)) as handle:
            have = handle.read().strip()
    except FileNotFoundError:
        return False
    return have == digest and os.path.isfile(os.path.join(root_of(codename), "usr/sbin/slurmd"))


def _run(argv: Sequence[str], log: Optional[str] = None, **kwargs: object) -> None:
    """Run a build step; on failure show its output and say which step failed."""
    result = subprocess.run(list(argv), capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if log is not None:
        with open(log, "a") as handle:
            handle.write(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        raise RootError(f"`{' '.join(argv)}` exited {result.returncode}:\n"
                        f"{(result.stdout + result.stderr)[-4000:]}")


APT_LOCK_WAIT_S = 600  # how long a host apt-get waits for another one's dpkg lock


def build_root(codename: str, mirror: Mirror, wanted: str) -> None:
    """debootstrap the release, then its Slurm and build tools; replaces the cached root."""
    if shutil.which("debootstrap") is None:
        # Waits for dpkg's lock: `make test` builds the Debian package at the same time, and
        # its apt-get may hold the lock while it installs the build tools.
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
              "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}", "debootstrap"],
             env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    top = cache_dir(codename)
    os.makedirs(top, mode=0o755, exist_ok=True)
    new = os.path.join(top, "root.new")
    log = os.path.join(top, "build.log")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(log)
    shutil.rmtree(new, ignore_errors=True)
    started = time.monotonic()
    print(f"release_root: building a Debian {codename} root from {mirror.main} in {new}",
          flush=True)
    argv = ["debootstrap", "--variant=minbase", codename, new, mirror.main]
    if not os.path.exists(os.path.join("/usr/share/debootstrap/scripts", codename)):
        argv.append(os.path.join("/usr/share/debootstrap/scripts", DEBOOTSTRAP_SCRIPT_FALLBACK))
    _run(argv, log)
    with open(os.path.join(new, "etc/apt/sources.list"), "w") as handle:
        handle.write(f"deb {mirror.main} {codename} main\n"
                     f"deb {mirror.main} {codename}-updates main\n"
                     f"deb {mirror.security} {codename}-security main\n")
    # The mirror may serve a snapshot of a release whose Release files carry a Valid-Until
    # (testing's, forky's) that has passed; the packages are no less what that release ships.
    with open(os.path.join(new, "etc/apt/apt.conf.d/99gpushare-test"), "w") as handle:
        handle.write('Acquire::Check-Valid-Until "false";\n')
    # Daemons are started by the tests, never by package scripts.
    with open(os.path.join(new, "usr/sbin/policy-rc.d"), "w") as handle:
        handle.write("#!/bin/sh\nexit 101\n")
    os.chmod(os.path.join(new, "usr/sbin/policy-rc.d"), 0o755)
    _copy_host_files(new)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LANG": "C.UTF-8", "HOME": "/root"}
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy"):
        if var in os.environ:
            env[var] = os.environ[var]
    with _mounted_for_build(new):
        _run(["chroot", new, "apt-get", "update", "-qq"], log, env=env)
        _run(["chroot", new, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
              *PACKAGES], log, env=env)
        _run(["chroot", new, "update-ca-certificates"], log, env=env)
        for user in TEST_USERS:
            _run(["chroot", new, "useradd", "--create-home", "--shell", "/bin/bash", user],
                 log, env=env)
        _run(["chroot", new, "apt-get", "clean"], log, env=env)
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import slurmdbd_bed

    # the client library the release's slurmdbd needs, where its own fails (see there)
    slurmdbd_bed.fetch_client_library(mirror.main, root=new)
    old = os.path.join(top, "root.old")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(root_of(codename)):
        os.rename(root_of(codename), old)
    os.rename(new, root_of(codename))
    shutil.rmtree(old, ignore_errors=True)
    with open(_stamp(codename), "w") as handle:
        handle.write(hashlib.sha256(wanted.encode()).hexdigest() + "\n")
    print(f"release_root: {codename} root ready in {time.monotonic() - started:.0f}s", flush=True)


def _copy_host_files(root: str) -> None:
    """Name resolution and the certificate authorities (a TLS proxy's) this machine trusts."""
    for name in ("/etc/hosts", "/etc/resolv.conf"):
        if os.path.exists(name):
            shutil.copyfile(name, os.path.join(root, name.lstrip("/")))
    local_ca = "/usr/local/share/ca-certificates"
    if os.path.isdir(local_ca):
        dest = os.path.join(root, local_ca.lstrip("/"))
        os.makedirs(dest, exist_ok=True)
        for entry in os.listdir(local_ca):
            if entry.endswith(".crt"):
                shutil.copyfile(os.path.join(local_ca, entry), os.path.join(dest, entry))


@contextlib.contextmanager
def _mounted_for_build(root: str) -> Iterator[None]:
    """/proc and /dev for package scripts; unmounted again even when a step fails."""
    mounts = []
    try:
        for source, target, args in (("proc", "proc", ["-t", "proc"]),
                                     ("/dev", "dev", ["--rbind"])):
            path = os.path.join(root, target)
            _run(["mount", *args, source, path])
            mounts.append(path)
            if target == "dev":
                _run(["mount", "--make-rslave", path])
        yield
    finally:
        for path in reversed(mounts):
            subprocess.run(["umount", "-R", path], check=False)


def ensure(codename: str) -> str:
    """The cached root of ``codename``, built first when missing or out of date."""
    mirror = host_mirror(host_codename())
    wanted = recipe(codename, mirror)
    if is_current(codename, wanted):
        return root_of(codename)
    with locked(codename, exclusive=True):
        if not is_current(codename, wanted):
            build_root(codename, mirror, wanted)
    return root_of(codename)


# ---- runs ---------------------------------------------------------------------------------

# Runs as root in a new mount and pid namespace (unshare): the overlay, the working tree and
# the release's own build/ and .venv, /proc of the new pid namespace, /sys without cgroups.
INNER = r"""
set -euo pipefail
lower=$1 scratch=$2 repo=$3 builddir=$4 venvdir=$5; shift 5
merged=$scratch/merged
mkdir -p "$scratch/upper" "$scratch/work" "$merged"
layers="lowerdir=$lower,upperdir=$scratch/upper,workdir=$scratch/work"
mount -t overlay overlay -o "$layers" "$merged"
mount -t proc proc "$merged/proc"
mount --rbind /sys "$merged/sys"
umount -R "$merged/sys/fs/cgroup" 2>/dev/null || true
mount --rbind /dev "$merged/dev"
mount -t tmpfs -o mode=1777 tmpfs "$merged/dev/shm"
mkdir -p "$merged/src/gpushare"
mount --bind "$repo" "$merged/src/gpushare"
mount --bind "$builddir" "$merged/src/gpushare/build"
mkdir -p "$merged/src/gpushare/.venv"
mount --bind "$venvdir" "$merged/src/gpushare/.venv"
for f in /etc/hosts /etc/resolv.conf /etc/pip.conf; do
    if [ -f "$f" ]; then cp "$f" "$merged$f"; fi
done
if [ -f /root/.config/pip/pip.conf ]; then
    mkdir -p "$merged/root/.config/pip" && cp /root/.config/pip/pip.conf "$merged/root/.config/pip/"
fi
exec chroot "$merged" "$@"
"""


def run_inside(codename: str, argv: Sequence[str], env: Optional[dict[str, str]] = None,
               repo: str = REPO) -> int:
    """Run ``argv`` (in /src/gpushare) in a fresh overlay of the cached root; its exit status."""
    lower = ensure(codename)
    state = os.path.join(repo, "build", f"release-{codename}")
    builddir, venvdir = os.path.join(state, "build"), os.path.join(state, "venv")
    for path in (builddir, venvdir):
        os.makedirs(path, exist_ok=True)
    os.makedirs(os.path.join(repo, "build"), exist_ok=True)
    inner_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "HOME": "/root", "LANG": "C.UTF-8", "TERM": os.environ.get("TERM", "dumb")}
    for key, value in os.environ.items():
        if key.startswith("PIP_") or key.lower() in ("http_proxy", "https_proxy", "no_proxy"):
            inner_env[key] = value
    inner_env.update(env or {})
    command = ["env", "-i", *(f"{k}={v}" for k, v in inner_env.items()),
               "bash", "-c", 'cd "$0" && exec "$@"', INSIDE, *argv]
    with locked(codename, exclusive=False):
        scratch = tempfile.mkdtemp(prefix=f"gpushare-release-{codename}-", dir="/var/tmp")
        try:
            return subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
                 "--kill-child=SIGKILL",
                 "bash", "-c", INNER, "inner", lower, scratch, repo, builddir, venvdir,
                 *command]).returncode
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def suite_inside(codename: str, pytest_args: Sequence[str]) -> int:
    """A release's `make build venv`, then the whole suite against its Slurm, in its root."""
    # Builds take turns (flock on the working tree): each root's `pip install -e` writes the
    # same egg-info into the shared tree.
    script = (
        "set -o pipefail; flock /src/gpushare make -s build venv >/tmp/build.log 2>&1 || "
        "{ cat /tmp/build.log; echo 'release_root: make build venv failed'; exit 2; }; "
        # Not exec'd: this bash stays the namespace's init and reaps the daemons and steps
        # the tests orphan, as the machine's init would (pytest as pid 1 reaps none).
        '.venv/bin/python -m pytest -p no:cacheprovider "$@"; exit $?'
    )
    port = BED_PORT[codename] + port_shift()
    env = {"GPUSHARE_BED_ROOT": f"/tmp/gpushare-bed-{codename}",
           "GPUSHARE_BED_PORT": str(port), "GPUSHARE_BED_CGROUP": "no",
           "GPUSHARE_SANITIZED_BED_PORT": str(port + SANITIZED_PORT_OFFSET)}
    # What replays or lengthens a run (tests/slurm/test_soak.py) goes in with it.
    env.update({name: value for name, value in os.environ.items()
                if name in ("GPUSHARE_SOAK_SEED", "GPUSHARE_SOAK_JOBS", "HYPOTHESIS_PROFILE")})
    return run_inside(codename, ["bash", "-c", script, "suite", *pytest_args], env=env)


# ---- make test ----------------------------------------------------------------------------

def slurm_release(root: str = "/") -> str:
    """The Slurm release whose headers are installed under ``root`` (e.g. 24.11.5)."""
    path = os.path.join(root, "usr/include/slurm/slurm_version.h")
    try:
        with open(path) as handle:
            number = int(re.search(r"#define SLURM_VERSION_NUMBER (0x[0-9a-fA-F]+)",
                                   handle.read()).group(1), 16)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return "?"
    return f"{number >> 16 & 255}.{number >> 8 & 255:02d}.{number & 255}"


SUMMARY = re.compile(r"\b(passed|failed|error|errors|skipped|no tests ran)\b.* in [\d.]+s")
LOGS = os.path.join(REPO, "build", "test-logs")


@dataclass
class Suite:
    """One release's suite, run in the background with its output in a log of its own."""

    name: str
    argv: list[str]
    log: str
    started: float = 0.0
    process: Optional[subprocess.Popen[bytes]] = None
    rc: Optional[int] = None
    seconds: float = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)

    def poll(self) -> bool:
        """True once the suite has ended (its status and time are then set)."""
        if self.rc is None and self.process is not None and self.process.poll() is not None:
            self.rc, self.seconds = self.process.returncode, time.monotonic() - self.started
        return self.rc is not None

    def summary(self) -> str:
        """pytest's last summary line in the log."""
        last = ""
        with open(self.log, errors="replace") as handle:
            for line in handle:
                stripped = line.strip().strip("=").strip()
                if SUMMARY.search(stripped):
                    last = stripped
        return last or "no pytest summary"


def host_suite(host_python: str, pytest_args: Sequence[str]) -> list[str]:
    """This machine's suite in pid and mount namespaces of its own: it sees and can signal only
    its own processes, never a root's (whose users have the same uids), and mounts it makes go
    with it. bash is the namespace's init and reaps the daemons the tests orphan, as the
    machine's init would."""
    return ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
            "--kill-child=SIGKILL", "--mount-proc", "bash", "-c", '"$@"; exit $?', "init",
            host_python, "-m", "pytest", *pytest_args]


def run_suites(suites: Sequence[Suite]) -> int:
    """Start every suite at once (they wait on Slurm far more than they compute), print each
    log whole as it ends, then one line per suite with its time; 0 only if all passed."""
    os.makedirs(LOGS, exist_ok=True)
    started = time.monotonic()
    for suite in suites:
        print(f"==== {suite.name}: started, log {os.path.relpath(suite.log, REPO)}", flush=True)
        suite.start()
    pending = list(suites)
    try:
        while pending:
            time.sleep(2)
            for suite in [s for s in pending if s.poll()]:
                pending.remove(suite)
                print(f"\n==== {suite.name}: ended after {suite.seconds:.0f}s", flush=True)
                with open(suite.log, errors="replace") as handle:
                    shutil.copyfileobj(handle, sys.stdout)
                sys.stdout.flush()
    finally:
        for suite in pending:
            if suite.process is not None:
                suite.process.kill()
    print()
    for suite in suites:
        verdict = "ok" if suite.rc == 0 else f"FAILED (exit {suite.rc})"
        print(f"{suite.name}: {verdict}: {suite.summary()} [{suite.seconds:.0f}s with setup]")
    print(f"all suites: {time.monotonic() - started:.0f}s", flush=True)
    return 0 if all(suite.rc == 0 for suite in suites) else 1


def make_test(host_python: str, pytest_args: Sequence[str]) -> int:
    """Every suite at once: lint, the unit tests under Python 3.9 (where it is installed),
    this machine's whole suite, and each other release's in its root (built first where
    missing, while the others run)."""
    host = host_codename()
    me = os.path.abspath(__file__)
    suites = [Suite("lint", ["make", "-s", "-C", REPO, "lint"], os.path.join(LOGS, "lint.log"))]
    python39 = os.path.join(REPO, ".venv39", "bin", "python")
    if os.path.exists(python39):
        suites.append(Suite("unit tests (Python 3.9)",
                            [python39, "-m", "pytest", "tests/unit", "-q", "-p",
                             "no:cacheprovider"], os.path.join(LOGS, "unit39.log")))
    else:
        print("no Python 3.9 on this machine: unit tests under 3.9 skipped", flush=True)
    suites.append(Suite(f"Slurm {slurm_release()} (Debian {host}, this machine)",
                        host_suite(host_python, pytest_args), os.path.join(LOGS, f"{host}.log")))
    for other in other_codenames(host):
        suites.append(Suite(f"Slurm {SLURM_OF[other]} (Debian {other} root)",
                            [sys.executable, me, "suite", "--release", other, "--",
                             *pytest_args], os.path.join(LOGS, f"{other}.log")))
    return run_suites(suites)


def quick(host_python: str) -> int:
    """The edit loop: lint, the unit tests and the real-Slurm tests marked `smoke`, at once,
    on this machine's Slurm only."""
    return run_suites([
        Suite("lint", ["make", "-s", "-C", REPO, "lint"], os.path.join(LOGS, "lint.log")),
        Suite("unit tests", [host_python, "-m", "pytest", "tests/unit", "-q"],
              os.path.join(LOGS, "unit.log")),
        Suite(f"smoke on Slurm {slurm_release()} (this machine)",
              host_suite(host_python, ["tests/slurm", "-q", "-ra", "-m", "smoke"]),
              os.path.join(LOGS, "smoke.log")),
    ])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="release_root.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_release(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
        command.add_argument("--release", choices=sorted(SLURM_OF),
                             help="the Debian release whose root (default: every other one)")
        return command

    with_release(sub.add_parser("ensure", help="build the roots when missing or outdated"))
    run = with_release(sub.add_parser("run", help="run a command in a fresh overlay of a root"))
    run.add_argument("argv", nargs="+")
    suite = with_release(sub.add_parser(
        "suite", help="a root's build and pytest (args to pytest); roots one after another"))
    suite.add_argument("pytest_args", nargs="*")
    every = sub.add_parser("make-test", help="this machine's suite and every root's, at once")
    every.add_argument("host_python")
    every.add_argument("pytest_args", nargs="*")
    fast = sub.add_parser("quick", help="lint, unit tests and the smoke tests, at once")
    fast.add_argument("host_python")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("release_root: run as root (debootstrap, mounts, the test Slurm)", file=sys.stderr)
        return 1
    try:
        host = host_codename()
        others = other_codenames(host)
        if getattr(args, "release", None):
            if args.release == host:
                raise RootError(f"Debian {host} is this machine's own release: it has no root")
            others = [args.release]
        if args.command == "ensure":
            for other in others:
                print(ensure(other))
            return 0
        if args.command == "run":
            if len(others) != 1:
                raise RootError(f"which root? --release {' or '.join(others)}")
            return run_inside(others[0], args.argv)
        if args.command == "suite":
            worst = 0
            for other in others:
                worst = max(worst, suite_inside(other, args.pytest_args or ["tests", "-q", "-ra"]))
            return worst
        if args.command == "quick":
            return quick(args.host_python)
        return make_test(args.host_python, args.pytest_args or ["tests", "-q", "-ra"])
    except RootError as error:
        print(f"release_root: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
