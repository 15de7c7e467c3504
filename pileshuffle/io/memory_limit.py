"""How much memory this process may still take, and where that figure comes from: the host's
``MemAvailable`` (/proc/meminfo), or less where a memory cgroup limits the process (Docker's
``--memory``, Kubernetes' limits, a systemd slice). Beam-free: the command line reads it before
Beam's import (``pile_bound``).

Inside a container /proc/meminfo is the host's: a default run in an 800 MB cgroup once read
14.2 GB there, kept its pass-1 runs in memory and was killed by the kernel (exit 137, no message).
So the process's own cgroup is found from /proc/self/cgroup (v1: the ``N:memory:/path`` line, v2:
``0::/path``) under its mount in /proc/self/mountinfo, and it and each ancestor up to the mount
that sets a limit (v1 ``memory.limit_in_bytes``, v2 ``memory.max``) gives a headroom: the limit
less the usage (``memory.usage_in_bytes``, ``memory.current``), page cache the kernel can
reclaim (``memory.stat``'s inactive files) counted as free. The least headroom and the host's
available memory: the smaller is the answer, with its source.
"""

import dataclasses
import os
import re

__all__ = [
    "Memory",
    "NO_LIMIT",
    "HOST",
    "UNKNOWN",
    "available_memory",
    "cgroup_memory",
    "host_available",
]

NO_LIMIT = 1 << 62  # a limit this large is none: cgroup v1 writes 9223372036854771712, v2 "max"
HOST = "host /proc/meminfo"
UNKNOWN = "unknown"  # neither /proc/meminfo nor a cgroup limit could be read (not Linux)

_V1 = {
    "version": "v1",
    "limit": "memory.limit_in_bytes",
    "usage": "memory.usage_in_bytes",
    "reclaimable": ("total_inactive_file", "inactive_file"),
    "default_mount": "/sys/fs/cgroup/memory",
}
_V2 = {
    "version": "v2",
    "limit": "memory.max",
    "usage": "memory.current",
    "reclaimable": ("inactive_file",),
    "default_mount": "/sys/fs/cgroup",
}


@dataclasses.dataclass(frozen=True)
class Memory:
    """``available``: bytes this process may still take (None: unknown); ``source``: where that
    came from (``HOST``, ``"cgroup v1 limit"``, ``"cgroup v2 limit"``, ``UNKNOWN``); ``limit``
    and ``usage``: the limiting cgroup's (usage less reclaimable page cache), else None."""

    available: int
    source: str
    limit: int = None
    usage: int = None

    def __str__(self) -> str:
        """E.g. ``0.49 GB available: cgroup v1 limit``."""
        if self.available is None:
            return "no memory figure (no cgroup limit, no /proc/meminfo)"
        return f"{self.available / 1e9:,.2f} GB available: {self.source}"


def available_memory(root: str = "/") -> Memory:
    """What this process may still take: the least of the host's available memory and its
    cgroups' headroom (``cgroup_memory``). ``root``: where /proc and /sys are (tests)."""
    host, cgroup = host_available(root), cgroup_memory(root)
    if cgroup is not None and (host is None or cgroup.available < host):
        return cgroup
    return Memory(host, HOST if host is not None else UNKNOWN)


def host_available(root: str = "/") -> int:
    """The host's ``MemAvailable`` in bytes, or None where it cannot be read."""
    try:
        with open(os.path.join(root, "proc/meminfo")) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_memory(root: str = "/") -> Memory:
    """The least headroom (limit - usage + reclaimable page cache, at least 0) of this process's
    memory cgroup and its ancestors up to the hierarchy's mount, or None where none sets a limit
    (or there is no memory cgroup)."""
    found = _own_cgroup(root)
    if found is None:
        return None
    kind, directory, top = found
    tightest = None
    while True:
        level = _level(kind, directory)
        if level is not None and (tightest is None or level.available < tightest.available):
            tightest = level
        if len(directory) <= len(top):
            return tightest
        directory = os.path.dirname(directory)


def _level(kind: dict, directory: str) -> Memory:
    """One cgroup's limit, usage and headroom, or None where it sets no limit."""
    limit = _number(os.path.join(directory, kind["limit"]))
    if limit is None:
        return None
    usage = (_number(os.path.join(directory, kind["usage"])) or 0) - _reclaimable(kind, directory)
    return Memory(max(0, limit - usage), f"cgroup {kind['version']} limit", limit, max(0, usage))


def _number(path: str) -> int:
    """A cgroup file's number; None for "max", the v1 no-limit value, or a file not there."""
    try:
        with open(path) as handle:
            text = handle.read().strip()
        value = int(text)
    except (OSError, ValueError):
        return None
    return value if value < NO_LIMIT else None


def _reclaimable(kind: dict, directory: str) -> int:
    """Page cache the kernel can drop before it kills (``memory.stat``'s inactive files; v1's
    hierarchical total when there is one), 0 where it cannot be read."""
    try:
        with open(os.path.join(directory, "memory.stat")) as handle:
            stat = dict(line.split()[:2] for line in handle if len(line.split()) >= 2)
        return next(int(stat[name]) for name in kind["reclaimable"] if name in stat)
    except (OSError, ValueError, StopIteration):
        return 0


def _own_cgroup(root: str) -> tuple:
    """``(v1 or v2 file names, this process's memory cgroup directory, the hierarchy's mount
    directory)``, or None without a memory cgroup. The memory controller's v1 line wins over
    v2's (a hybrid host mounts an empty v2 hierarchy beside v1's controllers)."""
    paths = _cgroup_paths(root)
    kind = _V1 if "v1" in paths else _V2 if "v2" in paths else None
    if kind is None:
        return None
    mount_root, mount = _mount(root, kind)
    path, top = paths[kind["version"]], os.path.normpath(os.path.join(root, mount.lstrip("/")))
    inside = ""  # a path outside the mount (cgroup namespaces) is the mount's own cgroup
    if mount_root == "/" or path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
        inside = path[len(mount_root.rstrip("/")) :]
    directory = os.path.normpath(os.path.join(top, inside.lstrip("/")))
    while not os.path.isdir(directory) and len(directory) > len(top):
        directory = os.path.dirname(directory)
    return kind, directory, top


def _cgroup_paths(root: str) -> dict:
    """This process's cgroup paths from /proc/self/cgroup: ``{"v1": the memory controller's,
    "v2": the unified hierarchy's}``, either absent."""
    paths = {}
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as handle:
            for line in handle:
                hierarchy, controllers, path = (line.rstrip("\n").split(":", 2) + ["", ""])[:3]
                if "memory" in controllers.split(","):
                    paths["v1"] = path
                elif hierarchy == "0" and controllers == "":
                    paths["v2"] = path
    except OSError:
        pass
    return paths


def _mount(root: str, kind: dict) -> tuple:
    """``(cgroup path at the mount point, mount point)`` of the hierarchy with the memory
    controller (v1) or of cgroup2 (v2), from /proc/self/mountinfo; the usual place without one."""
    try:
        with open(os.path.join(root, "proc/self/mountinfo")) as handle:
            for line in handle:
                fields, _, tail = line.partition(" - ")
                fields, tail = fields.split(), tail.split()
                if len(fields) < 5 or len(tail) < 3:
                    continue
                fstype, options = tail[0], tail[2].split(",")
                if (kind is _V1 and fstype == "cgroup" and "memory" in options) or (
                    kind is _V2 and fstype == "cgroup2"
                ):
                    return _unescape(fields[3]), _unescape(fields[4])
    except OSError:
        pass
    return "/", kind["default_mount"]


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)
