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
from typing import Any, Sequence

__all__ = ["Accounting", "AccountingError"]

APT_PACKAGES = ("slurmdbd", "mariadb-server")
# Where the release's own slurmdbd runs against its own MariaDB. Debian 13's slurmdbd 24.11
# (and forky's 26.05) stops at its start against its MariaDB 11.8.9: the client library
# fails Slurm's own first query, `select @var := concat('');` in
# _check_mysql_concat_is_sane, with error 5027 ("Number of columns in result (=1) set
# exceeds maximum allowed number of columns (=0)"), with Debian's server defaults or
# --no-defaults, and with the server's session tracking off. So there the packages are not
# installed and the AdminComment test skips.
RELEASES = ("bookworm",)
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
             "--innodb-lock-wait-timeout=900"],
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
        proc = subprocess.Popen(["slurmdbd", "-D"], env=env, stdout=log, stderr=log,
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
