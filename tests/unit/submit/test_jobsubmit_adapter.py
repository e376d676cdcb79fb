# SPDX-License-Identifier: GPL-2.0-or-later
"""The job_submit/gpushare adapter reads what the placement rules need from the job_desc:
-w (req_nodes) and the 25.11 segment flags (bitflags) beside segment_size."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from gpushare.submit import jobsubmit_adapter as adapter
from luahook import HOOK

REPO_BUILD = HOOK.replace("job_submit.lua", "build.py")


class _FakeFFI:
    """cffi's two calls the adapter makes on a job_desc: NULL and string()."""

    NULL = None

    @staticmethod
    def string(value: bytes) -> bytes:
        return value


def _job_desc(**values: object) -> SimpleNamespace:
    fields: dict[str, object] = {name: None for name in adapter.STRING_FIELDS}
    fields.update({name: 0xFFFFFFFE for name in adapter.NUMBER_FIELDS})
    fields.update(spank_job_env=None, spank_job_env_size=0)
    fields.update(values)
    return SimpleNamespace(**fields)


@pytest.fixture
def fake_ffi(monkeypatch):
    monkeypatch.setattr(adapter, "_ffi", _FakeFFI())


def test_reads_nodelist_and_segment_flags(fake_ffi):
    job = _job_desc(req_nodes=b"blk[1-4]", bitflags=(1 << 43) | 1, segment_size=0xFFFE,
                    tres_per_node=b"gres/gpu:h100:1")
    fields = adapter.read_fields(job)
    assert fields["req_nodes"] == "blk[1-4]"
    assert fields["bitflags"] == (1 << 43) | 1
    assert fields["segment_size"] == 0xFFFE
    assert fields["tres_per_node"] == "gres/gpu:h100:1"
    adapter.write_fields(job, {"segment_size": 2})
    assert job.segment_size == 2
    with pytest.raises(ValueError, match="may not change bitflags"):
        adapter.write_fields(job, {"bitflags": 0})
    with pytest.raises(ValueError, match="may not change req_nodes"):
        adapter.write_fields(job, {"req_nodes": "x"})


def test_the_plugin_struct_has_them_on_every_release():
    """submit_hooks/build.py, run by the system python3 with its cffi as make build does."""
    probe = ("import importlib.util as u; s = u.spec_from_file_location('hb', "
             f"{REPO_BUILD!r}); b = u.module_from_spec(s); s.loader.exec_module(b); "
             "print(*[all(f in b.cdef_for(v) for f in ('char *req_nodes;', "
             "'uint64_t bitflags;')) for v in (0x160508, 0x180B05, 0x190B00, 0x1A0505)])")
    done = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True, text=True,
                          check=False)
    assert done.stdout.split() == ["True"] * 4, done.stderr
