"""Measuring one command as its own process tree: wall time, peak tree RSS, CPU seconds,
the CPU other processes used meanwhile and the bytes under its output folder (peak and at exit); waiting for the machine to go quiet; warming the
page cache; reading back what a measured command logged (bench/.out/logs/NAME.out|err)."""

import itertools
import json
import os
import resource
import subprocess
import threading
import time

import psutil
from workspace import OUT

# RSS sampling period: short enough to catch a pass's peak, cheap for the sampler
SAMPLE_SECONDS = 0.05
DISK_EVERY = 10  # the output folder's bytes are summed every DISK_EVERY-th RSS sample (0.5 s)


class Measurement:
    """One command's figures: ``cpu`` is ``user + system`` CPU seconds of its process tree."""

    def __init__(
        self,
        returncode,
        wall,
        peak_rss,
        peak_procs,
        cpu_times,
        others,
        peak_disk=None,
        end_disk=None,
    ):
        self.returncode, self.wall, self.peak_rss, self.peak_procs = (
            returncode,
            wall,
            peak_rss,
            peak_procs,
        )
        self.user, self.system = cpu_times
        self.cpu, self.others = self.user + self.system, others
        self.peak_disk, self.end_disk = peak_disk, end_disk


def busy_seconds():
    """CPU seconds the whole machine has been busy (all cores)."""
    t = psutil.cpu_times()
    return (
        sum(t)
        - t.idle
        - getattr(t, "iowait", 0.0)
        - getattr(t, "guest", 0.0)
        - getattr(t, "guest_nice", 0.0)
    )


def children_cpu_times():
    """(user, system) CPU seconds of this process's reaped descendants."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def wait_for_idle(max_wait, threshold=0.25):
    """Wait (up to ``max_wait`` s) until other processes use under ``threshold`` of a core
    over one second; returns (seconds waited, their last measured use in cores)."""
    started = time.perf_counter()
    while True:
        before = busy_seconds()
        time.sleep(1.0)
        used = busy_seconds() - before
        if used < threshold or time.perf_counter() - started >= max_wait:
            return time.perf_counter() - started, used


def tree_rss(proc, cpu_seen=None):
    """(RSS summed over ``proc`` and its descendants, their number); with ``cpu_seen``, also
    records each one's (user, system) CPU seconds so far under its pid."""
    try:
        procs = [proc] + proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0, 0
    total, alive = 0, 0
    for p in procs:
        try:
            with p.oneshot():
                total += p.memory_info().rss
                if cpu_seen is not None:
                    times = p.cpu_times()
                    cpu_seen[p.pid] = (times.user, times.system)
            alive += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return total, alive


def tree_bytes(directory):
    """Bytes of the files under ``directory`` (0 if it does not exist)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def measure(cmd, name, timeout, disk_dir=None):
    """Run ``cmd`` (stdout/stderr to bench/.out/logs/NAME.*); wall time and peak tree RSS; with
    ``disk_dir``, also the peak (sampled every 0.5 s) and final bytes of the files under it."""
    logs = os.path.join(OUT, "logs")
    os.makedirs(logs, exist_ok=True)
    cwd = os.path.join(OUT, "cwd")
    os.makedirs(cwd, exist_ok=True)
    os.sync()
    with (
        open(os.path.join(logs, f"{name}.out"), "wb") as out,
        open(os.path.join(logs, f"{name}.err"), "wb") as err,
    ):
        peak, cpu_seen = [0, 0, 0], {}
        stop = threading.Event()
        cpu_before, busy_before = children_cpu_times(), busy_seconds()
        started = time.perf_counter()
        proc = psutil.Popen(cmd, stdout=out, stderr=err, cwd=cwd)

        def sample():
            for tick in itertools.count():
                rss, count = tree_rss(proc, cpu_seen)
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], count)
                if disk_dir and tick % DISK_EVERY == 0:
                    peak[2] = max(peak[2], tree_bytes(disk_dir))
                if stop.wait(SAMPLE_SECONDS):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            returncode = proc.wait(timeout=timeout)
        except psutil.TimeoutExpired:
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
            returncode = "timeout"
        wall = time.perf_counter() - started
        reaped = [after - before for after, before in zip(children_cpu_times(), cpu_before)]
        busy = busy_seconds() - busy_before
        stop.set()
        sampler.join()
    # getrusage counts only descendants reaped all the way up; a tree that leaves daemons to die
    # unreaped (Ray's raylet and workers) is counted from the samples of each process's CPU instead
    seen = [sum(times[i] for times in cpu_seen.values()) for i in (0, 1)]
    cpu_times = reaped if sum(reaped) >= sum(seen) else seen
    others = max(0.0, busy - sum(cpu_times)) / (wall * (os.cpu_count() or 1))
    end_disk = tree_bytes(disk_dir) if disk_dir else None
    return Measurement(
        returncode,
        wall,
        peak[0],
        peak[1],
        cpu_times,
        others,
        max(peak[2], end_disk) if disk_dir else None,
        end_disk,
    )


def warm(files):
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)


def measure_run(cmd, name, out, files, timeout=1800):
    """``measure`` a ``pileshuffle run`` writing under ``out`` on a warm page cache and a quiet
    machine; exits naming its log if it fails; ``out`` is removed before and after."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    warm(files)
    wait_for_idle(30)
    got = measure(cmd, name, timeout=timeout)
    if got.returncode != 0:
        raise SystemExit(
            f"{name}: pileshuffle run failed ({got.returncode}); see bench/.out/logs/{name}.err"
        )
    shutil.rmtree(out, ignore_errors=True)
    return got


def log_tail(name, lines=15):
    path = os.path.join(OUT, "logs", f"{name}.err")
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


def stdout_json(name):
    """The last JSON line a row printed (floor, beam-common), or {}."""
    try:
        with open(os.path.join(OUT, "logs", f"{name}.out"), errors="replace") as handle:
            for line in reversed(handle.read().splitlines()):
                if line.startswith("{"):
                    return json.loads(line)
    except (OSError, ValueError):
        pass
    return {}
