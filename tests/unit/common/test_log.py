# SPDX-License-Identifier: GPL-2.0-or-later
"""The plugins' logging: into Slurm (through a sink) and the debug log, or to `logging`."""

import logging
import os

import pytest

from gpushare.common import log as gslog


@pytest.fixture
def sink():
    lines = []
    gslog.install(lambda level, text: lines.append((level, text)))
    gslog.set_job(0)
    yield lines
    gslog.uninstall()
    gslog.set_job(0)


def test_levels_map_onto_slurms_and_debug_stays_out_of_its_log(sink):
    logger = gslog.get_logger("gpushare.test")
    gslog.set_job(42)
    logger.debug("hidden %d", 1)
    logger.info("daemon %s up", "u1-GPU-0")
    logger.warning("slow")
    logger.error("broken")
    assert sink == [(gslog.LEVEL_INFO, "gpushare: job 42: daemon u1-GPU-0 up"),
                    (gslog.LEVEL_INFO, "warning: gpushare: job 42: slow"),
                    (gslog.LEVEL_ERROR, "gpushare: job 42: broken")]


def test_each_line_of_a_message_is_its_own_log_line(sink):
    gslog.get_logger("gpushare.test").error("first\nsecond")
    assert [text for _, text in sink] == ["gpushare: first", "gpushare: second"]


def test_exception_carries_the_traceback(sink):
    try:
        raise KeyError("gpu7")
    except KeyError:
        gslog.get_logger("gpushare.test").exception("prolog: internal error")
    texts = [text for _, text in sink]
    assert texts[0] == "gpushare: prolog: internal error"
    assert any("Traceback" in t for t in texts) and "KeyError: 'gpu7'" in texts[-1]


def test_a_bad_log_call_or_a_failing_sink_never_raises(tmp_path):
    calls = []

    def failing(level, text):
        calls.append(text)
        raise OSError("slurm log gone")

    gslog.install(failing, str(tmp_path / "debug.log"))
    try:
        gslog.get_logger("gpushare.test").info("%d jobs", "not a number")
    finally:
        gslog.uninstall()
    assert calls and "do not fit" in calls[0]
    assert "do not fit" in (tmp_path / "debug.log").read_text()


def test_debug_log_gets_every_level_with_pid_uid_and_job(sink, tmp_path):
    path = tmp_path / "debug.log"
    gslog.install(lambda level, text: None, str(path))
    gslog.set_job(9)
    gslog.get_logger("gpushare.test").debug("record %s", "absent")
    line = path.read_text()
    assert line.endswith(" py job=9 debug record absent\n")
    assert f"pid={os.getpid()} uid={os.getuid()}" in line


def test_debug_log_is_never_written_through_a_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("")
    os.symlink(target, tmp_path / "debug.log")
    gslog.install(lambda level, text: None, str(tmp_path / "debug.log"))
    try:
        gslog.get_logger("gpushare.test").info("x")
    finally:
        gslog.uninstall()
    assert target.read_text() == ""


def test_a_fifo_at_debug_log_neither_blocks_nor_is_written(tmp_path):
    """A FIFO there with no reader would hang the worker on open(); with a reader it would
    feed whoever reads. Neither: the line is dropped."""
    fifo = tmp_path / "debug.log"
    os.mkfifo(fifo)
    gslog.install(lambda level, text: None, str(fifo))
    try:
        gslog.get_logger("gpushare.test").info("x")  # returns: the open does not block
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            gslog.get_logger("gpushare.test").info("y")
            assert os.read(reader, 100) == b""  # nothing was written for the reader
        finally:
            os.close(reader)
    finally:
        gslog.uninstall()


def test_without_a_sink_messages_go_to_logging(caplog):
    with caplog.at_level(logging.DEBUG, logger="gpushare.test"):
        gslog.get_logger("gpushare.test").warning("daemon %d ignored quit", 7)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("gpushare.test", logging.WARNING, "daemon 7 ignored quit")]


@pytest.mark.skipif(os.geteuid() != 0, reason="only a file of root's is narrowed")
@pytest.mark.parametrize("before, after", [
    (None, 0o640),  # made by this line
    (0o644, 0o640),  # an earlier release's
    (0o666, 0o640),
    (0o600, 0o600),  # an admin's narrower choice stays
])
def test_debug_log_is_root_s_and_its_group_s_alone(tmp_path, before, after):
    """Its lines name users' jobs, GPUs and pids."""
    path = tmp_path / "debug.log"
    if before is not None:
        path.write_text("")
        os.chmod(path, before)
    gslog.install(lambda level, text: None, str(path))
    try:
        gslog.get_logger("gpushare.test").debug("job 7 on GPU 0")
    finally:
        gslog.uninstall()
    assert oct(os.stat(path).st_mode & 0o7777) == oct(after)
    assert "job 7 on GPU 0" in path.read_text()
