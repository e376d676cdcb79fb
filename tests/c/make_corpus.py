# SPDX-License-Identifier: GPL-2.0-or-later
"""The fuzzers' seed corpus (tests/c/corpus/<parser>/): what the Python core really renders
for the C glue to parse, plus the nastiest inputs each parser must refuse without harm.

    python3 tests/c/make_corpus.py            write tests/c/corpus
    python3 tests/c/make_corpus.py --check    exit 1 when it differs from what is committed

The rendered files go through the same functions a prolog uses (``gpushare.node.ticket``,
``JobRecord.to_env_file``, ``gpushare.node.request.task_environment`` and ``describe``), with
fixed inputs so that the corpus changes only when a format does; tests/unit/test_c_fuzz.py
runs ``--check``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))

from gpushare.node import ticket  # noqa: E402
from gpushare.node.job import describe  # noqa: E402
from gpushare.node.prefork import LOG, PID, REFUSED, RESULT, frame  # noqa: E402
from gpushare.node.request import task_environment  # noqa: E402
from gpushare.node.state import JobRecord  # noqa: E402

CORPUS = os.path.join(HERE, "corpus")
ENV = {"SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "3",
       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "SLURM_CONF": "/etc/slurm/slurm.conf",
       "SLURMD_NODENAME": "n1"}
ARGS = ["pythonpath=/usr/lib64/gpushare/python", "state_dir=/run/gpushare/%n",
        "verify_reuse=60", "show=yes"]
HUGE = 70 * 1024  # past the largest ticket and environment file the C glue reads


def _record(mode: str = "shared", share: int = 25, gpus: tuple[str, ...] = ("3",),
            error: str = "") -> JobRecord:
    """A job record as a prolog leaves it: its lease and its tasks' environment."""
    uuids = [f"GPU-{index}a2b-0000-1111-2222-33334444{int(index):04d}" for index in gpus]
    record = JobRecord(job_id=4711, uid=1001, gid=1001, node="n1", mode=mode,
                       share_percent=share, slurm_gpus=list(gpus), visible_devices=list(gpus),
                       devices=[{"uuid": uuid, "index": int(index), "name": "NVIDIA H100"}
                                for uuid, index in zip(uuids, gpus)],
                       error=error, created=1700000000.5)
    key = f"u1001-{uuids[0]}" if mode == "shared" else "j4711"
    pipe = f"/run/gpushare/n1/mps/{key}/pipe"
    record.mps = {"job_id": 4711, "key": key, "mode": mode, "uid": 1001, "gid": 1001,
                  "pipe_dir": pipe, "log_dir": pipe[:-4] + "log", "share_percent": share,
                  "daemon_pid": 4242,
                  "env": {"CUDA_MPS_PIPE_DIRECTORY": pipe,
                          "CUDA_MPS_LOG_DIRECTORY": pipe[:-4] + "log"}}
    record.env = task_environment(record)
    return record


def _join_ticket(record: JobRecord, show: bool = True, files: Optional[list[str]] = None,
                 env: Optional[dict[str, str]] = None) -> bytes:
    return ticket.render(
        key=str(record.mps["key"] if record.mps else ""), until=1700000060.25,
        uid=record.uid, gid=record.gid, share=record.share_percent, args=ARGS,
        env=env or ENV, options={"gpu-share": str(record.share_percent)},
        files=files if files is not None else [
            "file 2049 131075 412 1699999000123456789 /etc/slurm/gres.conf",
            "nofile /etc/gpushare/plan.yaml",
            "file 25 17 0 1700000000000000000 /run/gpushare/n1/slurm-checked"],
        daemon="4242 987654", record_stamp="25 1201 811 1700000001000000000", record=record,
        show=describe(record.env, ticket.JOB_ID_MARK) if show else "")


def rendered() -> dict[str, dict[str, bytes]]:
    """Each parser's inputs as the Python core writes them."""
    shared, two = _record(), _record(share=50, gpus=("0", "1"))
    private = _record(mode="private", share=100, gpus=("0", "1", "2", "3"))
    refused = _record(error="--gpu-share=150: a share is a whole percent\nfrom 1 to 100")
    tickets = {
        "rendered-join": _join_ticket(shared),
        "rendered-join-no-show": _join_ticket(shared, show=False),
        "rendered-join-two-gpus": _join_ticket(two, env={**ENV, "SLURM_JOB_GPUS": "0,1"}),
        "rendered-join-no-files": _join_ticket(shared, files=[]),
    }
    env_files = {
        "rendered-shared": shared.to_env_file(describe(shared.env, 4711)),
        "rendered-shared-no-show": shared.to_env_file(),
        "rendered-private": private.to_env_file(describe(private.env, 4711)),
        "rendered-error": refused.to_env_file(),
        "rendered-ticket-section": tickets["rendered-join"].decode().split("\n--env\n")[1],
    }
    answer = frame(PID, b"4242") + frame(LOG, bytes([6]) + b"cb=task_init gpus=0") + \
        frame(RESULT, b"0")
    return {"ticket": tickets,
            "envfile": {name: text.encode() for name, text in env_files.items()},
            "share": {"rendered-25": b"25\n", "rendered-100": b"100\n"},
            "prefork": {"rendered-answer": answer,
                        "rendered-refusal": frame(REFUSED, b"code differs"),
                        "rendered-failed": frame(PID, b"4242") + frame(RESULT, b"1")}}


def nasty(base: dict[str, dict[str, bytes]]) -> dict[str, dict[str, bytes]]:
    """Inputs each parser must refuse (or take) without reading or writing out of bounds."""
    join = base["ticket"]["rendered-join"]
    head, record_env = join.split(b"\n--record\n", 1)
    env = base["envfile"]["rendered-shared"]
    common = {"nasty-empty": b"", "nasty-nul": b"\0", "nasty-newline": b"\n",
              "nasty-not-utf8": b"\xff\xfe\x80\n\xc3\x28", "nasty-long-line": b"7" * 4096}
    tickets = {
        **common,
        "nasty-huge-line": b"x" * HUGE,
        "nasty-header-only": b"gpushare-ticket 1\n",
        "nasty-header-no-newline": b"gpushare-ticket 1",
        "nasty-no-record": head + b"\n",
        "nasty-record-no-env": head + b"\n--record\n{}\n",
        "nasty-env-marker-only": head + b"\n--record\n--env\n",
        "nasty-word-no-value": b"gpushare-ticket 1\nkey\nshare 25\n",
        "nasty-repeated-keys": head.replace(b"\nshare 25", b"\nshare 25\nshare 0\nkey ..\n"
                                            b"key " + b"k" * 300) + b"\n--record\n" + record_env,
        "nasty-nul-inside": join.replace(b"share 25", b"share 2\x005"),
        "nasty-crlf": join.replace(b"\n", b"\r\n"),
        "nasty-huge-value": b"gpushare-ticket 1\nkey " + b"a" * HUGE + b"\n",
        "nasty-marks": head + b"\n--record\n" + (b"@GPUSHARE_JOB_ID@" * 500) + b"@@@@@"
                       + b"\n--env\n@GPUSHARE_JOB_ID" + b"@GPUSHARE_CREATED@" * 300 + b"@",
        "nasty-env-pairs": b"gpushare-ticket 1\nenv =\nenv X\nopt =\nopt\nnoopt \narg \n"
                           b"file 1 2 3\nfile 1 2 3 4 relative\nuid -1\ngid 99999999999999999"
                           b"999\nuntil nan\nuntil 1e999\ndaemon x\ndaemon 1\ndaemon 1 \n",
        "nasty-unknown-word": head + b"\nlater-word value\n--record\n" + record_env,
    }
    env_files = {
        **common,
        "nasty-huge-line": b"x" * HUGE,
        "nasty-no-final-newline": env.rstrip(b"\n"),
        "nasty-missing-equals": b"CUDA_VISIBLE_DEVICES\nGPUSHARE_GPUS=0\n",
        "nasty-empty-name": b"=value\n==\n",
        "nasty-bad-names": b"lower=1\n1ABC=2\nA-B=3\nA B=4\n" + b"N" * 200 + b"=5\nPATH=/x\n",
        "nasty-repeated-keys": b"A=1\nA=2\nA=\n#show=one\n#show=two\n",
        "nasty-error-and-show": b"#show=first\n#error=refused\nA=1\n",
        "nasty-error-empty": b"#error=\n",
        "nasty-comment-forms": b"#\n#=\n#show\n#error\n# error=x\n#other=1\n",
        "nasty-nul-value": b"A=1\0B=2\nC=\0\n",
        "nasty-huge-value": b"A=" + b"v" * HUGE + b"\n",
        "nasty-many-lines": b"A=1\n" * 20000,
        "nasty-crlf": env.replace(b"\n", b"\r\n"),
    }
    share = {**common, "nasty-zero": b"0\n", "nasty-101": b"101\n", "nasty-sign": b"-25\n",
             "nasty-plus": b"+25\n", "nasty-space": b" 25\n", "nasty-two-newlines": b"25\n\n",
             "nasty-trailing": b"25x\n", "nasty-long-digits": b"0" * 40 + b"25\n",
             "nasty-overflow": b"9" * 30 + b"\n", "nasty-percent": b"25%\n"}
    stat = b"4242 (nvidia-cuda-mps) S 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 20 0 1 0 987654 " \
           b"1064960 172 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 3 0 0 0 0 0\n"
    proc_stat = {
        **common,
        "typical": stat,
        "name-with-parens": stat.replace(b"(nvidia-cuda-mps)", b"(a) S 1 2 3 (b))"),
        "name-with-newline": stat.replace(b"(nvidia-cuda-mps)", b"(x\ny z)"),
        "zombie": stat.replace(b") S ", b") Z "),
        "dead": stat.replace(b") S ", b") X "),
        "short": b"4242 (x) S 1 2 3\n",
        "no-paren": stat.replace(b")", b""),
        "paren-last": b"4242 (x)",
        "huge-field": stat.replace(b" 987654 ", b" " + b"9" * 200 + b" "),
        "many-spaces": stat.replace(b" ", b"   "),
    }
    gpu_list = {**common, "one": b"3", "two": b"0,1", "max-index": b"99999",
                "index-too-big": b"100000", "sixty-four": ",".join(map(str, range(64))).encode(),
                "sixty-five": ",".join(map(str, range(65))).encode(), "empty-item": b"0,,1",
                "trailing-comma": b"0,", "leading-comma": b",0", "sign": b"-1", "space": b"0, 1",
                "range": b"0-3", "leading-zeros": b"007",
                # CUDA_VISIBLE_DEVICES by UUID (26.05 Flags=env_uuid, MIG), gs_uuid_list's
                "uuids": b"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,"
                         b"GPU-f9e8d7c6-b5a4-3210-fedc-ba9876543210",
                "mig-uuid": b"MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0",
                "uuid-then-index": b"GPU-a,1", "bare-prefix": b"GPU-"}
    percent = {**common, "25": b"25", "1": b"1", "100": b"100", "0": b"0", "101": b"101",
               "float": b"25.0", "sign": b"+25", "space": b" 25", "overflow": b"9" * 30}
    child = frame(PID, b"4242")
    prefork = {**common,
               "nasty-too-long": b"L\x00\x01\x00\x01" + b"x" * 70,  # 65537 > GS_FRAME_MAX
               "nasty-longest": frame(LOG, bytes([3]) + b"y" * 65535) + frame(RESULT, b"0"),
               "nasty-cut-header": child + b"R\x00\x00",
               "nasty-cut-payload": child + b"L\x00\x00\x00\x10short",
               "nasty-empty-log": child + frame(LOG, b"") + frame(RESULT, b"0"),
               "nasty-pid-one": frame(PID, b"1") + frame(RESULT, b"0"),
               "nasty-pid-wraps-to-one": frame(PID, b"4294967297") + frame(RESULT, b"0"),
               "nasty-pid-negative": frame(PID, b"-4242") + frame(RESULT, b"0"),
               "nasty-pid-huge": frame(PID, b"9" * 40) + frame(RESULT, b"0"),
               "nasty-pid-text": frame(PID, b"x42") + frame(RESULT, b"0"),
               "nasty-two-children": child + frame(PID, b"4343") + frame(RESULT, b"0"),
               "nasty-unknown-kind": child + frame(b"Z", b"?") + frame(RESULT, b"0"),
               "nasty-result-text": child + frame(RESULT, b"ok"),
               "nasty-result-overflow": child + frame(RESULT, b"9" * 30),
               "nasty-refused-after-child": child + frame(REFUSED, b"late"),
               "nasty-child-then-end": child,
               "nasty-nul-in-log": child + frame(LOG, b"\x06a\x00b") + frame(RESULT, b"0")}
    return {"ticket": tickets, "envfile": env_files, "share": share, "proc_stat": proc_stat,
            "gpu_list": gpu_list, "percent": percent, "prefork": prefork}


def corpus() -> dict[str, dict[str, bytes]]:
    base = rendered()
    out = nasty(base)
    for parser, files in base.items():
        out[parser].update(files)
    return out


def write(top: str) -> None:
    for parser, files in corpus().items():
        os.makedirs(os.path.join(top, parser), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(top, parser, name), "wb") as handle:
                handle.write(data)


def differences(top: str = CORPUS) -> list[str]:
    """What differs between ``top`` and a corpus made now: one line per file."""
    with tempfile.TemporaryDirectory() as fresh:
        write(fresh)
        found = []
        for parser in sorted(set(os.listdir(fresh)) | set(os.listdir(top))):
            new = set(os.listdir(os.path.join(fresh, parser)))
            old = set(os.listdir(os.path.join(top, parser))) \
                if os.path.isdir(os.path.join(top, parser)) else set()
            found += [f"{parser}/{name}: not committed" for name in sorted(new - old)]
            found += [f"{parser}/{name}: no longer made" for name in sorted(old - new)]
            for name in sorted(new & old):
                with open(os.path.join(fresh, parser, name), "rb") as a, \
                        open(os.path.join(top, parser, name), "rb") as b:
                    if a.read() != b.read():
                        found.append(f"{parser}/{name}: differs")
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with tests/c/corpus instead of writing it")
    if parser.parse_args().check:
        found = differences()
        print("\n".join(found) or "corpus up to date")
        return 1 if found else 0
    write(CORPUS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
