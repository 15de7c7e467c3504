"""Budgets from the container (issue 55): ``--memory auto``, the pile bound and ``plan`` take
what this process may use from its memory cgroup (v1 or v2) where one limits it, not the host's
/proc/meminfo. ``memory_limit`` reads a tree laid out like / (its ``root``); the real test runs a
default ``pileshuffle run`` inside a memory cgroup made for it, which once killed it (exit 137)."""

import json
import os
import subprocess
import sys
import uuid

import pytest

from pileshuffle.commands import sample
from pileshuffle.io.memory_limit import (
    HOST,
    UNKNOWN,
    Memory,
    available_memory,
    cgroup_memory,
    host_available,
)
from pileshuffle.planning.pile_bound import PILE_BOOKKEEPING_BYTES, most_piles

GB, MiB = 10**9, 1 << 20
V1_NO_LIMIT = "9223372036854771712"  # what cgroup v1 writes for "no limit"
HOST_AVAILABLE = 20 * GB
V1_MOUNTS = "35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def lay_out(root, files: dict) -> str:
    """Real files under ``root`` (``{path below root: text}``) beside a /proc/meminfo of
    ``HOST_AVAILABLE``; returns ``root`` as a string for ``memory_limit``'s ``root``."""
    meminfo = f"MemTotal: 33554432 kB\nMemAvailable: {HOST_AVAILABLE // 1024} kB\n"
    for path, text in {"proc/meminfo": meminfo, **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return str(root)


def v1_cgroup(path: str, limit: str, usage: int, inactive: int = 0) -> dict:
    """The v1 memory files of cgroup ``path`` (below the memory mount)."""
    where = f"sys/fs/cgroup/memory{path}".rstrip("/")
    return {
        f"{where}/memory.limit_in_bytes": f"{limit}\n",
        f"{where}/memory.usage_in_bytes": f"{usage}\n",
        f"{where}/memory.stat": f"cache 5\ninactive_file 1\ntotal_inactive_file {inactive}\n",
    }


def v2_cgroup(path: str, limit: str, current: int, inactive: int = 0) -> dict:
    """The v2 memory files of cgroup ``path`` (below the cgroup2 mount)."""
    where = f"sys/fs/cgroup{path}".rstrip("/")
    return {
        f"{where}/memory.max": f"{limit}\n",
        f"{where}/memory.current": f"{current}\n",
        f"{where}/memory.stat": f"anon 7\nfile 9\ninactive_file {inactive}\n",
    }


def v2_process(path: str) -> dict:
    """/proc/self/cgroup and mountinfo of a process in v2 cgroup ``path``."""
    return {"proc/self/cgroup": f"0::{path}\n", "proc/self/mountinfo": V2_MOUNTS}


def test_v2_limit_less_usage_with_inactive_page_cache_counted_free(tmp_path):
    root = lay_out(
        tmp_path,
        {
            **v2_process("/kubepods/pod1/ctr"),
            **v2_cgroup("/kubepods/pod1/ctr", "838860800", 3 * 10**8, 10**8),
            **v2_cgroup("/kubepods/pod1", "max", 300_000_000),
        },
    )
    expected = Memory(838_860_800 - 200_000_000, "cgroup v2 limit", 838_860_800, 200_000_000)
    assert cgroup_memory(root) == available_memory(root) == expected
    assert str(expected) == "0.64 GB available: cgroup v2 limit"


def test_v2_max_everywhere_is_no_limit_and_the_hosts_memory_counts(tmp_path):
    root = lay_out(
        tmp_path,
        {
            **v2_process("/user.slice/session-1.scope"),
            **v2_cgroup("/user.slice/session-1.scope", "max", 10**9),
            **v2_cgroup("/user.slice", "max", 3 * 10**9),
        },
    )
    assert cgroup_memory(root) is None
    assert available_memory(root) == Memory(HOST_AVAILABLE, HOST)


def test_an_ancestors_limit_binds_when_it_leaves_less(tmp_path):
    """A pod's limit, set one level up, with its other containers' usage in it."""
    root = lay_out(
        tmp_path,
        {
            **v2_process("/kubepods/pod1/ctr"),
            **v2_cgroup("/kubepods/pod1/ctr", "2000000000", 100_000_000),
            **v2_cgroup("/kubepods/pod1", "1000000000", 900_000_000, 50_000_000),
            **v2_cgroup("/kubepods", "max", 5 * 10**9),
        },
    )
    expected = Memory(150_000_000, "cgroup v2 limit", 1_000_000_000, 850_000_000)
    assert available_memory(root) == expected


def test_v1_no_limit_value_is_none_and_a_parents_limit_is_found(tmp_path):
    """A hybrid host: v1's memory line wins over the v2 hierarchy (which has no controller)."""
    root = lay_out(
        tmp_path,
        {
            "proc/self/cgroup": "9:pids:/\n4:memory:/docker/abc\n0::/\n",
            "proc/self/mountinfo": V1_MOUNTS.format(root="/") + V2_MOUNTS,
            **v1_cgroup("/docker/abc", V1_NO_LIMIT, 400_000_000, 30_000_000),
            **v1_cgroup("/docker", "838860800", 500_000_000, 40_000_000),
            **v1_cgroup("/", V1_NO_LIMIT, 9 * 10**9),
        },
    )
    expected = Memory(838_860_800 - 460_000_000, "cgroup v1 limit", 838_860_800, 460_000_000)
    assert available_memory(root) == expected


def test_v1_inside_a_container_reads_the_mount_that_is_its_own_cgroup(tmp_path):
    """Docker without a cgroup namespace: /proc/self/cgroup names /docker/abc, which is mounted
    at /sys/fs/cgroup/memory (mountinfo's root field), so no /docker/abc folder is below it."""
    root = lay_out(
        tmp_path,
        {
            "proc/self/cgroup": "4:memory:/docker/abc\n",
            "proc/self/mountinfo": V1_MOUNTS.format(root="/docker/abc"),
            **v1_cgroup("/", "524288000", 100_000_000),
        },
    )
    expected = Memory(424_288_000, "cgroup v1 limit", 524_288_000, 100_000_000)
    assert available_memory(root) == expected


def test_the_host_wins_when_it_has_less_than_the_cgroup_leaves(tmp_path):
    root = lay_out(
        tmp_path,
        {
            "proc/self/cgroup": "4:memory:/big\n",
            "proc/self/mountinfo": V1_MOUNTS.format(root="/"),
            **v1_cgroup("/big", str(64 * GB), GB),
        },
    )
    assert cgroup_memory(root).available == 63 * GB
    assert available_memory(root) == Memory(HOST_AVAILABLE, HOST)


def test_no_cgroup_at_all_and_nothing_readable(tmp_path):
    host_only = lay_out(tmp_path / "host", {})
    assert cgroup_memory(host_only) is None
    assert available_memory(host_only) == Memory(HOST_AVAILABLE, HOST)
    (tmp_path / "bare").mkdir()
    assert available_memory(str(tmp_path / "bare")) == Memory(None, UNKNOWN)
    assert most_piles(Memory(None, UNKNOWN)) == (16 << 30) // 2 // PILE_BOOKKEEPING_BYTES


def test_the_pile_bound_is_half_of_what_the_cgroup_leaves(tmp_path):
    root = lay_out(tmp_path, {**v2_process("/ctr"), **v2_cgroup("/ctr", "838860800", 38_860_800)})
    assert most_piles(available_memory(root)) == 800_000_000 // 2 // PILE_BOOKKEEPING_BYTES


# -- the real thing: a memory cgroup made for the run ---------------------------------------------

V1_MEMORY = "/sys/fs/cgroup/memory"
LIMIT = 800 * MiB  # as `docker --memory=800m`


@pytest.fixture
def memory_cgroup():
    """A fresh cgroup v1 memory cgroup limited to ``LIMIT`` without swap (as /usr/local/bin/capped
    makes); removed after the test (its processes have ended by then)."""
    path = f"{V1_MEMORY}/pileshuffle-test-{uuid.uuid4().hex[:12]}"
    try:
        os.mkdir(path)
    except OSError as error:
        why = "not root" if os.geteuid() != 0 else f"no cgroup v1 memory controller at {V1_MEMORY}"
        pytest.skip(f"cannot create a memory cgroup: {why} ({error})")
    try:
        with open(f"{path}/memory.limit_in_bytes", "w") as handle:
            handle.write(str(LIMIT))
        if os.path.exists(f"{path}/memory.swappiness"):
            with open(f"{path}/memory.swappiness", "w") as handle:
                handle.write("0")
        yield path
    finally:
        os.rmdir(path)


def in_cgroup(cgroup: str, logs, *args) -> tuple:
    """``python -m pileshuffle ARGS`` run inside ``cgroup`` (its pid written to cgroup.procs
    before exec), its output in files under ``logs``: ``(exit code, stdout, stderr, peak RSS in
    bytes)``; an exit code of -9 is the kernel's kill (a shell says 137)."""
    enter = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
    command = ["sh", "-c", enter, cgroup, sys.executable, "-m", "pileshuffle", *args]
    out, err = logs / "stdout", logs / "stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    _, status, usage = os.wait4(process.pid, 0)  # reaped here for its rusage (Popen.wait has none)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, out.read_text(), err.read_text(), usage.ru_maxrss * 1024


def cgroup_value(cgroup: str, name: str, key: str = None) -> int:
    """A cgroup file's number, or the number after ``key`` in a file of lines ``key value``."""
    lines = open(f"{cgroup}/{name}").read().splitlines()
    if key is None:
        return int(lines[0])
    return next((int(line.split()[1]) for line in lines if line.split()[:1] == [key]), 0)


def test_a_default_run_in_an_800_mib_cgroup_finishes_and_verifies(memory_cgroup, tmp_path):
    """600 MB of 1 KB TFRecords (``pileshuffle generate``'s records), default options, in a cgroup
    of 800 MiB: ``--memory auto`` read 23 GB from /proc/meminfo, kept the runs in memory and the
    kernel killed the run (exit 137, no message). Now ``plan`` says the budget is the cgroup's,
    ``run`` finishes within it (no OOM kill) and ``verify`` passes; the
    pile bound refuses in the cgroup a count the host allows."""
    sample.write_tfrecord(str(tmp_path / "in"), records=600_000, files=4, record_bytes=1000)
    where = ["--input", f"{tmp_path}/in/*.tfrecord", "--output", f"{tmp_path}/out/t"]
    code, out, err, _ = in_cgroup(memory_cgroup, tmp_path, "plan", *where, "--json")
    assert code == 0, err
    planned = json.loads(out)
    assert planned["memory_source"] == "cgroup v1 limit", planned
    assert 0 < planned["memory_budget"] < LIMIT and planned["memory_for_runs"] == 0  # runs on disk
    code, out, err, _ = in_cgroup(memory_cgroup, tmp_path, "plan", *where, "--num_piles=300000")
    assert code == 2 and "--num_piles 300,000: each pile costs" in err, err  # 614 MB of bookkeeping
    assert err.rstrip().endswith("; memory: cgroup v1 limit"), err
    assert most_piles(Memory(host_available(), HOST)) > 300_000  # what the host alone allows
    code, out, err, peak = in_cgroup(memory_cgroup, tmp_path, "run", *where)
    killed = cgroup_value(memory_cgroup, "memory.oom_control", "oom_kill")
    usage = cgroup_value(memory_cgroup, "memory.max_usage_in_bytes")  # with page cache: the limit
    assert code == 0, f"exit {code}, {killed} OOM kill(s), RSS {peak / MiB:.0f} MiB: {err[-2000:]}"
    # Not the run's ru_maxrss: a child's starts at its parent's RSS when forked (Linux keeps the
    # high-water mark across exec), and a pytest worker that ran other tests holds 1-2 GB: 1.7 GB was
    # read for a run the 800 MiB limit never touched. The kernel's verdict is the OOM-kill count.
    assert killed == 0 and usage <= LIMIT, (killed, peak, usage)
    assert "records   600,000 (fingerprints of input and output match)" in out, out
    done = subprocess.run(
        [sys.executable, "-m", "pileshuffle", "verify", *where],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "OK: 600,000 records" in done.stdout, done.stderr


def test_a_store_made_on_a_large_machine_materializes_in_an_800_mib_cgroup(memory_cgroup, tmp_path):
    """A one-pile store of 700 MB, made as a large machine's ``--max_pile_bytes auto`` sizes it
    (1 GiB), materialized inside a cgroup of 800 MiB: ``materialize`` took the store's bound and
    ordered the pile whole, and the kernel killed it (exit 137, no message). Now a local
    materialize bounds piles as ``run``'s auto would for the memory it may use: the pile is
    ordered in sub-piles and every record is written once."""
    sample.write_tfrecord(str(tmp_path / "in"), records=700_000, files=2, record_bytes=1000)
    store, output = str(tmp_path / "s"), str(tmp_path / "m" / "m")
    made = subprocess.run(
        [sys.executable, "-m", "pileshuffle", "run", "--layout=store", "--quiet"]
        + [f"--input={tmp_path}/in/*.tfrecord", f"--output={store}", "--num_piles=1"]
        + ["--seed=2", "--max_pile_bytes=1GiB"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    args = ["materialize", f"--store={store}", f"--output={output}", "--quiet"]
    code, out, err, _ = in_cgroup(memory_cgroup, tmp_path, *args)
    killed = cgroup_value(memory_cgroup, "memory.oom_control", "oom_kill")
    assert code == 0 and killed == 0, f"exit {code}, {killed} OOM kill(s): {err[-2000:]}"
    assert "records   700,000 (fingerprints of input and output match)" in out, out
    with open(f"{output}-manifest.json") as handle:
        manifest = json.load(handle)
    assert manifest["options"]["max_pile_bytes"] == 64 * MiB and manifest["piles_split"] == 1
