"""The machine and software a bench run measured on: a dict for results.json and the lines
that head the report."""

import datetime
import os
import platform
import shutil
import subprocess

import psutil
from workspace import GB, HERE, REPO


def package_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "not installed"


def git_revision():
    try:
        head = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--", "pileshuffle"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return head + (" (pileshuffle/ modified)" if dirty else "")
    except Exception:
        return "unknown"


def source_digest():
    """sha1 over pileshuffle/*.py as measured (the checkout may hold uncommitted changes)."""
    import hashlib

    digest = hashlib.sha1()
    root = os.path.join(REPO, "pileshuffle")
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()[:12]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine():
    memory = psutil.virtual_memory()
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_total_gib": round(memory.total / 2**30, 1),
        "memory_available_gib": round(memory.available / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "apache_beam": package_version("apache-beam"),
        "pyarrow": package_version("pyarrow"),
        "numpy": package_version("numpy"),
        "google_crc32c": package_version("google-crc32c"),
        "pileshuffle_git": git_revision(),
        "pileshuffle_source_sha1": source_digest(),
        "disk_free_gb": round(shutil.disk_usage(HERE).free / GB, 1),
    }


def machine_lines(m):
    return [
        f"machine: {m['nproc']} cores ({m['cpu']}), {m['memory_total_gib']} GiB RAM ({m['memory_available_gib']} GiB available), "
        f"kernel {m['kernel']}, load average at start {' '.join(map(str, m['load_average_at_start']))}",
        f"software: Python {m['python']}, apache-beam {m['apache_beam']}, pyarrow {m['pyarrow']}, numpy {m['numpy']}, "
        f"google-crc32c {m['google_crc32c']}; pileshuffle at git {m['pileshuffle_git']}, "
        f"sources sha1 {m['pileshuffle_source_sha1']}",
        f"date: {m['date']}; disk free {m['disk_free_gb']} GB",
        "page cache: NOT dropped (no privileges assumed); every row's input is read once with `cat` (untimed) right "
        "before the row, so all rows read from a warm cache; `sync` (untimed) before each row flushes the previous row's writes.",
    ]
