"""The loader bench's parent side of a row: start the row in a child process (``loader.py
--row``), sample the RSS of its process tree, and read back the one JSON line it prints."""

import json
import os
import subprocess
import tempfile
import threading

from loader_rows import TOUCH_MB
from workspace import HERE, MB, PY, REPO, log

SAMPLE_SECONDS = 0.02  # RSS sampling period: rows last well under a second at --quick
ENTRY = os.path.join(HERE, "loader.py")  # the CLI whose hidden --row runs one row in the child


def child_env():
    """The environment of a child: the checkout importable first, TensorFlow's C++ logs quiet."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def tree_rss(proc):
    """{pid: RSS} of the process and its descendants (DataLoader workers)."""
    import psutil

    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return {}
    sizes = {}
    for p in procs:
        try:
            sizes[p.pid] = p.memory_info().rss
        except psutil.Error:
            pass
    return sizes


def add_touch_option(parser, default=TOUCH_MB):
    """``--touch-mb`` (``measure_row``'s ``touch_mb``) on a bench CLI's ``parser``."""
    parser.add_argument(
        "--touch-mb",
        type=int,
        default=default,
        help=f"each row's process first touches and frees this much fresh memory, untimed "
        f"(default {default}; 0: none; see loader_rows.touch_memory)",
    )


def measure_row(name, kind, mix, data, timeout, touch_mb=TOUCH_MB):
    """One run of a row: its result dict, with ``ok`` False and an ``error`` when it failed or
    delivered a wrong number of records. ``touch_mb``: the row's process first touches and frees
    that much fresh memory, untimed (``loader_rows.touch_memory``). RSS is sampled from the
    start of the timed span (the row's process creates the file ``mark`` there)."""
    with tempfile.TemporaryDirectory() as scratch:
        return _measure_row(
            name, kind, mix, data, timeout, touch_mb, os.path.join(scratch, "timed")
        )


def _measure_row(name, kind, mix, data, timeout, touch_mb, mark):
    import psutil

    # warm page cache, untimed
    subprocess.run(["cat", *data["files"]], stdout=subprocess.DEVNULL, check=True)
    cmd = [
        PY,
        ENTRY,
        "--row",
        kind,
        "--mix",
        str(mix or 1),
        "--data",
        json.dumps(data),
        "--touch-mb",
        str(touch_mb),
        "--mark",
        mark,
    ]
    peak, own = [0, 0], {}  # [tree's sum, largest process]; pid -> that process's peak
    stop = threading.Event()
    proc = psutil.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=child_env()
    )

    def sample():
        while not stop.is_set():
            if not os.path.exists(mark):  # not timed yet: building the row, touching memory
                stop.wait(SAMPLE_SECONDS / 4)
                continue
            sizes = tree_rss(proc)
            peak[0], peak[1] = max(peak[0], sum(sizes.values())), max([peak[1], *sizes.values()])
            for pid, rss in sizes.items():
                own[pid] = max(own.get(pid, 0), rss)
            stop.wait(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for child in proc.children(recursive=True):
            child.kill()
        proc.kill()
        out, err = proc.communicate()
    stop.set()
    sampler.join()
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-12:])
        log(f"[{name}] failed (exit {proc.returncode}):\n{tail}")
        return {
            "name": name,
            "ok": False,
            "error": tail.splitlines()[-1] if tail else f"exit {proc.returncode}",
        }
    result = json.loads(lines[-1])
    row = {
        "name": name,
        "kind": kind,
        "mix": mix,
        "format": data["format"],
        "ok": result["records"] == data["records"],
        "records": result["records"],
        "seconds": result["seconds"],
        "cpu_seconds": result["cpu_seconds"],
        "records_per_s": result["records"] / result["seconds"],
        "mb_per_s": data["bytes"] / MB / result["seconds"],
        "peak_rss": peak[0],
        "peak_rss_process": peak[1],
        "rss_before": result["rss_before"],
        "peak_rss_main": own.get(proc.pid, 0),
        "peak_rss_worker": max((v for pid, v in own.items() if pid != proc.pid), default=0),
    }
    if not row["ok"]:
        row["error"] = f"delivered {result['records']} records, expected {data['records']}"
    log(
        f"[{name}] {row['seconds']:.2f} s, {row['mb_per_s']:,.0f} MB/s, peak RSS {peak[0] / MB:,.0f} MB"
        + ("" if row["ok"] else f" ({row['error']})")
    )
    return row
