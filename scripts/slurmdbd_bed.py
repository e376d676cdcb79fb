# SPDX-License-Identifier: GPL-2.0-or-later
"""Slurm accounting for a test bed: a private MariaDB and slurmdbd, on the bed's own ports.

A bed has no accounting by default (slurmctld runs alone). What goes through slurmdbd (a
job's AdminComment after its end, ``sacct``) needs both daemons; this module starts them in
the bed's root, registers the cluster and the test users, and stops them again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from slurmbed import debian_codename as codename

__all__ = ["Accounting", "AccountingError", "accounting_for"]

APT_PACKAGES = ("slurmdbd", "mariadb-server")
# Debian 13's slurmdbd 24.11 (and forky's 26.05) stops at its start against its own
# MariaDB 11.8.9 with that release's client library, libmariadb3 11.8.9: the library fails
# Slurm's own first query, `select @var := concat('');` in _check_mysql_concat_is_sane,
# with error 5027 ("Number of columns in result (=1) set exceeds maximum allowed number of
# columns (=0)"), with Debian's server defaults or --no-defaults, and with the server's
# session tracking off. The same slurmdbd starts and runs against the same server with
# Debian 12's libmariadb3 (10.11). So on those releases the bed's slurmdbd, and only it,
# loads Debian 12's client library, fetched once (apt-get download, into a directory of
# its own: nothing is installed) into CLIENT_DIR: the release roots of `make test` get it
# with the packages (tests/release_root.py). A Debian 13 machine's own `make deps` installs
# neither, and there the AdminComment test skips.
RELEASES = ("bookworm",)  # where `make deps` installs APT_PACKAGES on the machine itself
CLIENT_FROM = {"trixie": "bookworm", "forky": "bookworm"}
CLIENT_PACKAGE = "libmariadb3"
CLIENT_DIR = "/var/cache/gpushare-test/libmariadb-bookworm"
DB_USER = "slurm"
DB_PASS = "gsbed"  # a throwaway database on 127.0.0.1, gone with the bed


class AccountingError(RuntimeError):
    """The accounting daemons did not come up."""


@dataclass
class Accounting:
    """MariaDB and slurmdbd for one bed: ``db_port`` and ``dbd_port`` are the bed's."""

    root: str  # a directory of its own inside the bed's root
    db_port: int
    dbd_port: int
    munge_socket: str
    _pids: dict[str, int] = field(default_factory=dict, repr=False)

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def slurm_conf_lines(self) -> list[str]:
        """What slurm.conf says instead of accounting_storage/none."""
        return ["AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={self.dbd_port}",
                # The munge socket for slurmdbd's connections (AuthInfo is not used there).
                f"AccountingStoragePass={self.munge_socket}"]

    def write_dbd_conf(self, etc: str) -> None:
        """slurmdbd.conf beside slurm.conf (slurmdbd finds it there), 0600 as it requires."""
        text = "\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost", "DbdAddr=127.0.0.1", f"DbdPort={self.dbd_port}",
            "SlurmUser=root", "DebugLevel=info",
            f"LogFile={self.path('slurmdbd.log')}", f"PidFile={self.path('slurmdbd.pid')}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={self.db_port}", f"StorageUser={DB_USER}", f"StoragePass={DB_PASS}",
            "StorageLoc=gsbed_acct"]) + "\n"
        path = os.path.join(etc, "slurmdbd.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chown(path, 0, 0)
        os.chmod(path, 0o600)

    def start_database(self) -> None:
        """A fresh MariaDB datadir, its server on 127.0.0.1:db_port, the slurm DB user."""
        data = self.path("db")
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data, mode=0o755)
        for top in (self.root, data):
            os.chmod(top, 0o755)
        shutil.chown(data, "mysql", "mysql")
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}",
                        "--user=mysql", "--skip-test-db",
                        "--auth-root-authentication-method=socket"],
                       check=True, timeout=120, stdout=subprocess.DEVNULL)
        log = open(self.path("mariadbd.log"), "ab")  # noqa: SIM115 (the daemon keeps it)
        proc = subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={data}", "--user=mysql",
             f"--socket={self.path('db', 'db.sock')}", f"--port={self.db_port}",
             "--bind-address=127.0.0.1", f"--pid-file={self.path('db', 'mariadbd.pid')}",
             "--innodb-buffer-pool-size=32M", "--skip-log-bin",
             "--innodb-lock-wait-timeout=900",
             # MariaDB 11.6+ (Debian 13's 11.8): slurmdbd does not support it (it says
             # so at its start); `loose-`: a 10.11 server without the option ignores it
             "--loose-innodb-snapshot-isolation=OFF"],
            stdout=log, stderr=log, start_new_session=True)
        log.close()
        self._pids["mariadbd"] = proc.pid
        self._wait("MariaDB answering", lambda: subprocess.run(
            ["mariadb-admin", f"--socket={self.path('db', 'db.sock')}", "ping"],
            capture_output=True, timeout=10).returncode == 0, proc)
        self.sql(f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}'; "
                 f"GRANT ALL ON *.* TO '{DB_USER}'@'127.0.0.1'; FLUSH PRIVILEGES;")

    def sql(self, statement: str) -> str:
        result = subprocess.run(["mariadb", f"--socket={self.path('db', 'db.sock')}", "-u", "root",
                                 "-N", "-e", statement],
                                capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise AccountingError(f"mariadb: {result.stderr.strip()}")
        return result.stdout

    def start_dbd(self, env: dict[str, str]) -> None:
        """slurmdbd, in the foreground of its own process (-D), until sacctmgr reaches it."""
        log = open(self.path("slurmdbd.out"), "ab")  # noqa: SIM115
        library = client_library()
        dbd_env = dict(env, LD_LIBRARY_PATH=library) if library else env
        proc = subprocess.Popen(["slurmdbd", "-D"], env=dbd_env, stdout=log, stderr=log,
                                start_new_session=True)
        log.close()
        self._pids["slurmdbd"] = proc.pid
        last: list[str] = []

        def answers() -> bool:
            done = subprocess.run(["sacctmgr", "-n", "-P", "show", "cluster"], env=env,
                                  capture_output=True, text=True, timeout=20)
            last[:] = [done.stdout + done.stderr]
            return done.returncode == 0
        try:
            self._wait("slurmdbd answering", answers, proc, timeout=30)
        except AccountingError as err:
            raise AccountingError(f"{err}\nsacctmgr: {last}") from None

    def register(self, env: dict[str, str], cluster: str, users: Sequence[str]) -> None:
        """The cluster, an account and each user, so that their jobs have associations."""
        def sacctmgr(*args: str) -> None:
            result = subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True,
                                    text=True, timeout=60)
            if result.returncode != 0 and "Nothing new added" not in result.stdout:
                raise AccountingError(f"sacctmgr {' '.join(args)}: "
                                      f"{result.stdout}{result.stderr}")
        sacctmgr("add", "cluster", cluster)
        sacctmgr("add", "account", "gsbed", f"cluster={cluster}")
        for user in ("root", *users):
            sacctmgr("add", "user", user, "account=gsbed", f"cluster={cluster}")
        sacctmgr("modify", "user", "root", "set", "adminlevel=Admin")

    def stop_dbd(self) -> None:
        pid = self._pids.pop("slurmdbd", None)
        if pid:
            _terminate(pid)

    def stop(self) -> None:
        """slurmdbd first (it flushes to the database), then MariaDB."""
        self.stop_dbd()
        pid = self._pids.pop("mariadbd", None)
        if pid:
            _terminate(pid, grace=30.0)

    def logs(self) -> str:
        out = []
        for name in ("slurmdbd.log", "slurmdbd.out", "mariadbd.log"):
            with contextlib.suppress(OSError), open(self.path(name), errors="replace") as f:
                out.append(f"== {name}\n" + "".join(f.readlines()[-30:]))
        return "\n".join(out)

    def _wait(self, what: str, check: Any, proc: subprocess.Popen[bytes],
              timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AccountingError(f"{what}: exited {proc.returncode}\n{self.logs()}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                if check():
                    return
            time.sleep(0.2)
        raise AccountingError(f"{what}: not after {timeout:.0f}s\n{self.logs()}")


@contextlib.contextmanager
def accounting_for(bed: Any, db_port: int, dbd_port: int, settle: Callable[[], None],
                   users: Sequence[str] = ()) -> Iterator[Accounting]:
    """MariaDB and slurmdbd for ``bed`` (a ``slurmbed.SlurmBed``), slurmctld restarted to
    use them (``settle`` waits until the bed is back in service), the cluster and ``users``
    registered; after, slurm.conf as it was, slurmctld restarted and both daemons stopped.
    Their logs are printed when the set-up or the block fails."""
    started = time.monotonic()
    acct = Accounting(root=bed.path("acct"), db_port=db_port, dbd_port=dbd_port,
                      munge_socket=bed.path("munge", "munge.socket"))
    with open(bed.conf) as f:
        original = f.read()
    try:
        os.makedirs(acct.root, exist_ok=True)
        acct.write_dbd_conf(os.path.dirname(bed.conf))
        acct.start_database()
        # sacctmgr reads slurm.conf too; slurmctld keeps its old one until its restart.
        with open(bed.conf, "w") as f:
            f.write(original.replace("AccountingStorageType=accounting_storage/none",
                                     "\n".join(acct.slurm_conf_lines())))
        acct.start_dbd(bed.env)
        acct.register(bed.env, bed.cluster, list(users))
        # The cluster's id in StateSaveLocation is the one slurmctld made up without
        # slurmdbd; 26.05's slurmctld refuses to start when slurmdbd gave another.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bed.path("spool", "ctld", "clustername"))
        bed.restart_slurmctld()
        settle()
        print(f"accounting bed set up in {time.monotonic() - started:.1f}s")
        yield acct
    except BaseException:
        print(acct.logs())
        with contextlib.suppress(OSError), open(bed.path("log", "slurmctld.log")) as log:
            print("== slurmctld.log\n" + "".join(log.readlines()[-40:]))
        raise
    finally:
        with open(bed.conf, "w") as f:
            f.write(original)
        bed.restart_slurmctld()
        acct.stop()
        settle()


def _terminate(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after grace; reaps the child."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 15)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _unpacked_library(target: str) -> str:
    """The directory below ``target`` holding libmariadb.so.3 ("" for none)."""
    for top, _dirs, files in os.walk(target):
        if "libmariadb.so.3" in files:
            return top
    return ""


def client_library() -> str:
    """The directory of the client library this release's slurmdbd loads instead of its
    own ("" where it loads its own); AccountingError when it was not fetched."""
    if codename() not in CLIENT_FROM:
        return ""
    found = _unpacked_library(CLIENT_DIR)
    if not found:
        raise AccountingError(f"{CLIENT_DIR} holds no libmariadb.so.3 (the release roots of "
                              "`make test` get it: tests/release_root.py)")
    return found


def unusable_reason() -> str:
    """Why accounting cannot run here ("" when it can)."""
    missing = [name for name in ("mariadbd", "mariadb-install-db", "slurmdbd")
               if not shutil.which(name)]
    if missing:
        return (f"accounting needs the {' and '.join(APT_PACKAGES)} packages "
                f"({', '.join(missing)} missing)")
    try:
        client_library()
    except AccountingError as err:
        return str(err)
    return ""


def fetch_client_library(mirror: str, root: str = "/") -> None:
    """Debian 12's libmariadb3 unpacked into CLIENT_DIR below ``root``, when the release at
    ``root`` needs it (CLIENT_FROM) and it is not there yet. apt works in a directory of its
    own (its own source list, lists and cache): this machine's apt sources, lists and
    installed packages stay as they are."""
    release = CLIENT_FROM.get(codename(root))
    target = os.path.join(root, CLIENT_DIR.lstrip("/"))
    if release is None or _unpacked_library(target):
        return
    work = target + ".apt"
    shutil.rmtree(work, ignore_errors=True)
    for sub in ("lists/partial", "cache/archives/partial", "parts", "prefs"):
        os.makedirs(os.path.join(work, sub), exist_ok=True)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    signed = f"[signed-by={keyring}] " if os.path.exists(keyring) else ""
    with open(os.path.join(work, "sources.list"), "w") as handle:
        handle.write(f"deb {signed}{mirror} {release} main\n")
    options = [f"-o=Dir::Etc::SourceList={work}/sources.list",
               f"-o=Dir::Etc::SourceParts={work}/parts",
               f"-o=Dir::Etc::PreferencesParts={work}/prefs",
               f"-o=Dir::State::Lists={work}/lists", f"-o=Dir::Cache={work}/cache",
               "-o=Dir::State::status=/dev/null", "-o=APT::Get::List-Cleanup=0",
               "-o=APT::Sandbox::User=root"]
    subprocess.run(["apt-get", *options, "update", "-qq"], check=True)
    subprocess.run(["apt-get", *options, "download", "-qq", CLIENT_PACKAGE], check=True,
                   cwd=work)
    debs = [name for name in os.listdir(work) if name.endswith(".deb")]
    if len(debs) != 1:
        raise AccountingError(f"apt-get download {CLIENT_PACKAGE} from {release} gave {debs}")
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", os.path.join(work, debs[0]), target], check=True)
    shutil.rmtree(work, ignore_errors=True)
