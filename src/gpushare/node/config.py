# SPDX-License-Identifier: GPL-2.0-or-later
"""Plugin arguments from the plugstack.conf line: one declarative table, parsed once, validated.

The same table is compiled into the C glue at build time (``spank/build.py``) so that the
glue can reject an unknown key, and find ``state_dir``/``debug_log``, without starting Python.
"""

import os
import re
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional

from gpushare.common import units

__all__ = ["ARG_SPECS", "PLUGIN_LIBRARY", "ConfigError", "PluginConfig", "beside_slurm_conf",
           "expand_path", "mps_space_limits", "parse_plugin_args", "plugin_arg_values",
           "plugstack_args", "plugstack_line"]

PLUGIN_LIBRARY = "spank_gpushare.so"


class ConfigError(ValueError):
    """A plugstack argument is unknown or has a bad value; the message says what is accepted."""


_PATTERN_RE = re.compile(r"%(.?)")
_NODE_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}\Z")


def _abs_path(value: str) -> str:
    if not value.startswith("/") or "\0" in value:
        raise ValueError("an absolute path")
    for match in _PATTERN_RE.finditer(value):
        if match.group(1) not in ("n", "h", "%"):
            raise ValueError("an absolute path; only %n (node name), %h (host name) and %% "
                             "may follow %")
    return os.path.normpath(value)


def expand_path(value: str, node: str) -> str:
    """A path argument for ``node``: ``%n`` its Slurm node name, ``%h`` the short host name.

    Several slurmd on one host (``slurmd -N``) need a state directory each; the C glue
    expands the same way. ValueError when the name could escape the directory it is put in.
    """
    if "%" not in value:
        return value

    def one(match: "re.Match[str]") -> str:
        code = match.group(1)
        if code == "%":
            return "%"
        name = node if code == "n" else os.uname().nodename.split(".")[0]
        if not _NODE_NAME_RE.match(name):
            raise ValueError(f"node name {name!r} is not a plain host name")
        return name

    return _PATTERN_RE.sub(one, value)


def _optional_abs_path(value: str) -> str:
    return "" if value in ("", "none") else _abs_path(value)


def _choice(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return value

    check.__doc__ = "one of " + ", ".join(choices)
    return check


def parse_size(value: str) -> int:
    """Parse ``16G``/``512M``/``1048576`` into bytes."""
    size = units.parse_count(value.strip(), "KMGT")
    if not size:
        raise ValueError("a positive size such as 512M or 16G")
    return size


def _mem_limit(value: str) -> str:
    if value in ("proportional", "off"):
        return value
    parse_size(value)
    return value.upper()


def _inventory(value: str) -> str:
    if value == "nvml":
        return value
    if value.startswith("sim:"):
        return "sim:" + _abs_path(value[4:])
    raise ValueError("nvml, or sim:<absolute path of a simulated node profile>")


def _timeout(value: str) -> str:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 600:
        raise ValueError("a number of seconds between 0.1 and 600")
    return value


def _cgroup(value: str) -> str:
    if value in ("auto", "systemd", "none"):
        return value
    return _abs_path(value)


# The smallest per-daemon space: a daemon's sockets, pid file and first log lines.
_SPACE_MIN = (1 << 20, 64)


def _space(value: str) -> str:
    """``shared`` or ``SIZE,INODES``: the tmpfs each daemon's directories get."""
    if value == "shared":
        return value
    size, sep, inodes = value.partition(",")
    try:
        nbytes = parse_size(size) if sep else 0
    except ValueError:
        nbytes = 0
    if (not inodes.isdigit() or nbytes < _SPACE_MIN[0] or int(inodes) < _SPACE_MIN[1]
            or nbytes > 1 << 40 or int(inodes) > 1 << 24):
        raise ValueError("shared, or SIZE,INODES such as 16M,4096 (at least 1M and 64 "
                         "inodes)")
    return f"{size.strip().upper()},{int(inodes)}"


def mps_space_limits(value: str) -> "Optional[tuple[int, int]]":
    """The size in bytes and inodes of each daemon's own tmpfs; None for ``shared``."""
    if value == "shared":
        return None
    size, _, inodes = value.partition(",")
    return parse_size(size), int(inodes)


def _number_between(low: float, high: float, what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            number = float(value)
        except ValueError:
            number = low - 1
        if not low <= number <= high:
            raise ValueError(what)
        return value

    return check


def _reuse(value: str) -> str:
    if not value.isdigit() or int(value) > 300:
        raise ValueError("a whole number of seconds from 0 to 300")
    return value


class ArgSpec(NamedTuple):
    """One plugstack key: its default, a validator, and what it is for."""

    key: str
    default: str
    check: Callable[[str], str]
    accepts: str
    help: str
    # What the plugin takes without the argument, where its build decides (else default).
    built_default: str = ""


ARG_SPECS: tuple[ArgSpec, ...] = (
    ArgSpec("pythonpath", "", _optional_abs_path, "an absolute directory or none",
            "directory holding the gpushare package and what it imports; everything below "
            "it must be root's and writable by no one else. A core that cannot be imported "
            "from it drains the node and requeues the batch job",
            "the package's own directory: /usr/lib64/gpushare/python (RPM), "
            "/usr/share/gpushare/python (.deb); none for a plugin built by `make build`"),
    ArgSpec("state_dir", "/run/gpushare", _abs_path, "an absolute path",
            "root-owned node-local state: per-job records, MPS reference counts"),
    ArgSpec("mps_control", "/usr/bin/nvidia-cuda-mps-control", _abs_path, "an absolute path",
            "the nvidia-cuda-mps-control binary (must be root-owned, not writable by others)"),
    ArgSpec("mps_cgroup", "auto", _cgroup, "auto, systemd, none or an absolute directory",
            "where the users' MPS daemons run, one cgroup each, for the admin to cap "
            "(systemd: a scope each in gpushare.slice; a directory: a cgroup v2 "
            "directory whose children they get; auto: systemd where systemd runs the "
            "node, else gpushare-mps at the top of the cgroup v2 hierarchy; none: they "
            "stay in the cgroup the prolog runs in)"),
    ArgSpec("mps_space", "16M,4096", _space, "SIZE,INODES or shared",
            "each MPS daemon's pipe and log directories on a tmpfs of their own, this big, "
            "mounted by root on its directory, so a user who fills theirs fails only their "
            "own jobs; shared: all daemons' directories share <state_dir>/mps (a site "
            "whose job_container/tmpfs runs without Shared=yes)"),
    ArgSpec("mem_limit", "proportional", _mem_limit, "proportional, off, or a size like 16G",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for shared jobs"),
    ArgSpec("verify", "strict", _choice("strict", "warn", "off"), "strict, warn or off",
            "MIG/GPU verification at job start: fail the job and drain, only log, or skip"),
    ArgSpec("inventory", "nvml", _inventory, "nvml or sim:<path>",
            "where GPU facts come from: NVML, or a simulated node profile (tests, demo)"),
    ArgSpec("plan", "", _optional_abs_path, "an absolute path or none",
            "the ownership plan (who owns which GPU or MIG slice)"),
    ArgSpec("timeout", "10", _timeout, "seconds between 0.1 and 600",
            "limit for every external command the plugin runs"),
    ArgSpec("debug_log", "", _optional_abs_path, "an absolute path or none",
            "append one line per plugin decision to this root-owned file (for debugging)"),
    ArgSpec("imex_channels", "", _optional_abs_path, "an absolute directory or none",
            "with SwitchType=switch/nvidia_imex: where every GPU task must find its job's "
            "IMEX channel device (/dev/nvidia-caps-imex-channels); a task without one fails "
            "with a message"),
    ArgSpec("verify_reuse", "60", _reuse, "seconds from 0 to 300",
            "how long what NVML said about the node's GPU layout stands for the shared jobs "
            "that follow, with gres.conf, the plan and the plugstack line unchanged: their "
            "checks reuse it (and a clean check of the same devices) instead of asking "
            "NVML, and a job of the same user, GPU and share joining a running daemon is set "
            "up by the plugin without Python; 0: every job asks NVML and is set up by a "
            "worker"),
    ArgSpec("prefork", "yes", _choice("yes", "no"), "yes or no",
            "keep one root process per node with the core imported (started by the first "
            "job worker that needs it, ended after 10 idle minutes or when gpushare's files "
            "change), and fork each job's worker from it instead of starting Python: a "
            "first shared job on a GPU waits tens of ms less; needs pythonpath="),
    ArgSpec("show", "no", _choice("yes", "no"), "yes or no",
            "also print one gpushare: line into the first task's stderr saying what the job "
            "got (it changes the job's own output; `gpushare job` and slurmd's log tell it "
            "without)"),
    ArgSpec("usage_interval", "10", _number_between(1, 3600, "seconds between 1 and 3600"),
            "seconds between 1 and 3600",
            "how often `gpushare usage --loop` samples what each job uses of its GPUs"),
    ArgSpec("hog_bw_pct", "80", _number_between(1, 100, "a percentage between 1 and 100"),
            "a percentage between 1 and 100",
            "DRAM bandwidth use (GPM, % of peak) of a shared GPU or MIG slice above which "
            "the job with the largest share is named as its bandwidth hog"),
    ArgSpec("hog_seconds", "60", _number_between(0, 86400, "seconds between 0 and 86400"),
            "seconds between 0 and 86400",
            "how long the bandwidth use must stay above hog_bw_pct before a hog is named"),
    ArgSpec("dcgm_mapping_dir", "", _optional_abs_path, "an absolute directory or none",
            "keep dcgm-exporter's --hpc-job-mapping-dir files here: one per GPU (and MIG "
            "GPU instance) listing the jobs that run there, shared jobs included"),
    ArgSpec("dcgm_mapping_names", "index", _choice("index", "uuid"), "index or uuid",
            "name the mapping files by NVML index (0, 0-<GI id>) or by device UUID "
            "(nodes whose gres.conf has Flags=env_uuid)"),
)

_SPECS_BY_KEY = {spec.key: spec for spec in ARG_SPECS}
_PATH_KEYS = ("pythonpath", "state_dir", "mps_control", "inventory", "plan", "debug_log",
              "imex_channels", "mps_cgroup", "dcgm_mapping_dir")


class PluginConfig(NamedTuple):
    """Validated plugin configuration, one attribute per plugstack key.

    A NamedTuple, as the other records read by every prolog and epilog: importing
    ``dataclasses`` (and ``inspect`` with it) would cost each of them about 5 ms of CPU.
    """

    pythonpath: str = ""
    state_dir: str = "/run/gpushare"
    mps_control: str = "/usr/bin/nvidia-cuda-mps-control"
    mps_cgroup: str = "auto"
    mps_space: str = "16M,4096"
    mem_limit: str = "proportional"
    verify: str = "strict"
    inventory: str = "nvml"
    plan: str = ""
    timeout: float = 10.0
    debug_log: str = ""
    imex_channels: str = ""
    verify_reuse: float = 60.0
    prefork: bool = True
    show: bool = False
    usage_interval: float = 10.0
    hog_bw_pct: float = 80.0
    hog_seconds: float = 60.0
    dcgm_mapping_dir: str = ""
    dcgm_mapping_names: str = "index"
    args: tuple[str, ...] = ()  # the line's arguments as given: join tickets compare them

    def for_node(self, node: str) -> "PluginConfig":
        """The configuration with ``%n``/``%h`` in its paths expanded for ``node``."""
        expanded: dict[str, Any] = {
            key: (expand_path(getattr(self, key), node) if key != "inventory"
                  else "sim:" + expand_path(self.inventory[4:], node))
            for key in _PATH_KEYS
            if key != "inventory" or self.inventory.startswith("sim:")}
        return self._replace(**expanded)

    @property
    def mps_dir(self) -> str:
        """The users' MPS directories (each daemon's pipe and log directory is its user's):
        a site mounts a small file system of their own here (docs/admin.md, "Space")."""
        return os.path.join(self.state_dir, "mps")

    @property
    def daemons_dir(self) -> str:
        """Root's daemon records, locks, job references and join tickets: on the file
        system of ``state_dir=``, so a user who fills ``mps_dir`` cannot stop root's writes."""
        return os.path.join(self.state_dir, "daemons")


def plugin_arg_values(args: Iterable[str]) -> dict[str, str]:
    """Every key's validated value as plugstack.conf text (defaults filled in).

    Raises ConfigError reporting every problem at once, each naming its key.
    """
    values: dict[str, str] = {spec.key: spec.default for spec in ARG_SPECS}
    problems: list[str] = []
    seen: set[str] = set()
    for token in args:
        key, sep, value = token.partition("=")
        spec = _SPECS_BY_KEY.get(key)
        if not sep or spec is None:
            problems.append(
                f"unknown plugstack argument {token!r}; accepted keys: "
                + ", ".join(s.key + "=" for s in ARG_SPECS)
            )
            continue
        if key in seen:
            problems.append(f"plugstack argument {key}= given twice")
            continue
        seen.add(key)
        try:
            values[key] = spec.check(value)
        except ValueError as err:
            problems.append(f"plugstack argument {key}={value!r} is invalid: expected {err}")
    if problems:
        raise ConfigError("; ".join(problems))
    return values


def parse_plugin_args(args: Iterable[str]) -> PluginConfig:
    """Parse ``key=value`` tokens into the configuration (ConfigError as above)."""
    args = list(args)
    values = plugin_arg_values(args)
    return PluginConfig(
        pythonpath=values["pythonpath"],
        state_dir=values["state_dir"],
        mps_control=values["mps_control"],
        mps_cgroup=values["mps_cgroup"],
        mps_space=values["mps_space"],
        mem_limit=values["mem_limit"],
        verify=values["verify"],
        inventory=values["inventory"],
        plan=values["plan"],
        timeout=float(values["timeout"]),
        debug_log=values["debug_log"],
        imex_channels=values["imex_channels"],
        verify_reuse=float(values["verify_reuse"]),
        prefork=values["prefork"] == "yes",
        show=values["show"] == "yes",
        usage_interval=float(values["usage_interval"]),
        hog_bw_pct=float(values["hog_bw_pct"]),
        hog_seconds=float(values["hog_seconds"]),
        dcgm_mapping_dir=values["dcgm_mapping_dir"],
        dcgm_mapping_names=values["dcgm_mapping_names"],
        args=tuple(args),
    )


def beside_slurm_conf(env: Mapping[str, str], name: str) -> str:
    """Where Slurm looks for ``name`` (plugstack.conf, gres.conf) by default: beside
    slurm.conf, which ``SLURM_CONF`` names (slurmd passes it to the prolog too)."""
    slurm_conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    return os.path.join(os.path.dirname(slurm_conf), name)


def plugstack_args(path: str) -> Optional[list[str]]:
    """The arguments of the line that loads gpushare in plugstack.conf; None without one
    (``plugstack_line``)."""
    found = plugstack_line(path)
    return None if found is None else found[1]


def plugstack_line(path: str, _depth: int = 0) -> Optional[tuple[str, list[str]]]:
    """The file holding the line that loads gpushare in plugstack.conf, and the line's
    arguments; None without one.

    Follows ``include`` lines (glob patterns, relative to the including file) as Slurm
    does, so node tools use the plugin's own settings and can say where they are. Raises
    ConfigError when a file cannot be read.
    """
    import glob

    if _depth > 8:
        raise ConfigError(f"{path}: include nested more than 8 deep")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    for line in lines:
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "include":
            pattern = os.path.join(os.path.dirname(path), " ".join(words[1:]))
            for included in sorted(glob.glob(pattern)):
                found = plugstack_line(included, _depth + 1)
                if found is not None:
                    return found
        elif (len(words) >= 2 and words[0] in ("required", "optional")
              and os.path.basename(words[1]) == PLUGIN_LIBRARY):
            return path, words[2:]
    return None
