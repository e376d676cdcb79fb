# SPDX-License-Identifier: GPL-2.0-or-later
"""What the test beds read of processes and sockets through /proc, as root sees them."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def terminate(pid: int, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, grace):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 5)


def ended(pid: int) -> bool:
    """Whether ``pid`` has ended: no such process, a zombie (Z), or one being reaped (X)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ended(pid):
            return True
        time.sleep(0.05)
    return False


def ancestors(pid: int) -> set[int]:
    """``pid`` and every process above it."""
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line or environment names ``text`` (our root)."""
    found = []
    needle = text.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for source in ("cmdline", "environ"):
            try:
                with open(f"/proc/{entry}/{source}", "rb") as handle:
                    if needle in handle.read():
                        found.append(int(entry))
                        break
            except OSError:
                continue
    return found


def unix_listening(path: str) -> bool:
    """Whether a Unix socket listens at ``path`` (/proc/net/unix: __SO_ACCEPTCON, 0x10000,
    in its flags). A socket file exists from its bind; a client that connects before the
    listen is refused, so "the server is there" is this, not the file."""
    with open("/proc/net/unix") as handle:
        next(handle)
        for line in handle:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == str(path) and int(fields[3], 16) & 0x10000:
                return True
    return False
