# SPDX-License-Identifier: GPL-2.0-or-later
"""The plugin's cffi and host calls as gpushare.node.spank_adapter uses them, for unit tests."""


class FakeFfi:
    NULL = None

    @staticmethod
    def new(_ctype):
        return [0]

    @staticmethod
    def string(value):
        return value


class FakeHost:
    """The plugin's struct gs_host as the adapter calls it."""

    sp = object()

    def __init__(self, job_id: int, options: dict[str, str]) -> None:
        self.job_id, self.options, self.lines = job_id, options, []

    def job_ids(self, _sp, job_id, uid, gid):
        job_id[0], uid[0], gid[0] = self.job_id, 1000, 1000
        return 0

    def getopt(self, _sp, name):
        value = self.options.get(name.decode())
        return None if value is None else value.encode()

    def log(self, level, text):
        self.lines.append(text.decode())
