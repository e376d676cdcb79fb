# SPDX-License-Identifier: GPL-2.0-or-later
"""MPS processes found through a fake /proc: by uid, pipe directory and the program the
kernel runs (``exe``), never by what argv claims."""

from gpushare.node.mps.procscan import ProcScan


def _fake_process(proc_root, pid, *, uid, environ, argv, exe, state="S"):
    base = proc_root / str(pid)
    base.mkdir()
    (base / "status").write_text(f"Name:\tx\nState:\t{state} (sleeping)\nUid:\t{uid}\t{uid}"
                                 f"\t{uid}\t{uid}\n")
    (base / "environ").write_bytes(b"\0".join(environ) + b"\0")
    (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    if exe:
        (base / "exe").symlink_to(exe)


def test_daemon_processes_are_matched_by_uid_pipe_dir_and_program_through_proc(tmp_path):
    """Every /proc file is read whole, however large (an environ over 1 MiB is cut there)."""
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    program = "/usr/bin/nvidia-cuda-mps-control"
    server = "/usr/bin/nvidia-cuda-mps-server"
    scan = ProcScan(str(proc_root), program, "/run/gpushare/mps")
    pipe_dir = "/run/gpushare/mps/k/pipe"
    pipe_var = b"CUDA_MPS_PIPE_DIRECTORY=/run/gpushare/mps/k/pipe"
    padding = [b"PAD%d=%s" % (i, b"x" * 1000) for i in range(300)]   # ~300 KiB before it
    _fake_process(proc_root, 10, uid=1234, environ=[*padding, pipe_var], argv=[program, "-d"],
                  exe=program)
    _fake_process(proc_root, 11, uid=1234, environ=[pipe_var], argv=[server], exe=server)
    _fake_process(proc_root, 12, uid=1235, environ=[pipe_var], argv=[program, "-d"],
                  exe=program)
    _fake_process(proc_root, 13, uid=1234, environ=[pipe_var], argv=["/bin/sleep", "60"],
                  exe="/bin/sleep")
    _fake_process(proc_root, 14, uid=1234, environ=[pipe_var], argv=[program], exe=program,
                  state="Z")
    _fake_process(proc_root, 15, uid=1234, environ=[b"X=" + b"y" * (1 << 20), pipe_var],
                  argv=[program, "-d"], exe=program)
    (proc_root / "self").mkdir()
    assert sorted(scan.leftovers(1234, pipe_dir)) == [10, 11]
    assert scan.is_ours(10, 1234, pipe_dir, daemon_only=True)
    assert not scan.is_ours(11, 1234, pipe_dir, daemon_only=True)
    assert not scan.alive(14) and not scan.alive(99)


def test_a_process_naming_the_program_in_its_argv_is_not_the_daemon(tmp_path):
    """``exec -a nvidia-cuda-mps-control`` (argv[0]) or a script given the program as its
    first argument (argv[1]) runs another program: the user's, never taken for the daemon,
    so root neither trusts its pid nor talks to it as the daemon."""
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    program = "/usr/bin/nvidia-cuda-mps-control"
    scan = ProcScan(str(proc_root), program, "/run/gpushare/mps")
    pipe_dir = "/run/gpushare/mps/k/pipe"
    pipe_var = b"CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir.encode()
    _fake_process(proc_root, 20, uid=1234, environ=[pipe_var], argv=[program, "-d"],
                  exe="/usr/bin/python3.11")
    _fake_process(proc_root, 21, uid=1234, environ=[pipe_var], argv=["/bin/sh", program],
                  exe="/usr/bin/dash")
    _fake_process(proc_root, 22, uid=1234, environ=[pipe_var], argv=[program, "-d"], exe="")
    _fake_process(proc_root, 23, uid=1234, environ=[pipe_var], argv=["x"], exe=program)
    assert scan.leftovers(1234, pipe_dir) == [23]
    assert scan.strays() == {"k": [23]}
    for pid in (20, 21, 22):
        assert not scan.is_ours(pid, 1234, pipe_dir, daemon_only=True)
