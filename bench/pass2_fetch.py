"""Pass 2's fetch of one pile's parts from runs on an object store (``part_fetch``), against a real
gcp-storage-emulator made distant by a proxy delaying every request (tests/delay_proxy.py).

The regime of 10-100 TB jobs in files mode: a pile of ~1 GB gathered from one range of each of
~5,000 pass-1 runs (~240 kB each). Here: ``--parts`` runs, each one part of ``--part_kb`` kB
(records of 1,000 bytes), written by ``PileRuns`` as pass 1 writes them and uploaded to the
emulator; the pile is assembled by ``fragments.read_joined`` (pass 2's reader) and its table
compared with the first row's (same bytes, same order).

    python bench/pass2_fetch.py                          # 5,000 parts of 240 kB, 30 ms
    python bench/pass2_fetch.py --parts 1000 --part_kb 24 --in_flight 1 16

Rows: the emulator direct; through the proxy with no delay; through the proxy with
``--delay_ms``, for each ``--in_flight`` (1 is the old pass 2: one request at a time); and the
same runs on local disk (read_joined's pread, one at a time, against ``part_fetch``). The proxy's
counts give each row's requests and the most in flight at once. The emulator serves one request
at a time: with the delay hidden, a row is bound by its service time, as the no-delay rows are.
"""

import argparse
import dataclasses
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import delay_proxy  # noqa: E402
from gcs import BUCKET, answering, free_port  # noqa: E402

RECORD = 1000
# gcp-storage-emulator rewrites its whole object index after every upload (5,000 uploads of 245 kB:
# 576 s, each slower than the last); in memory nothing reads that copy, so this one skips it.
# Its reads are untouched: one request at a time, the whole object read from memory, then cut.
EMULATOR = """
import sys
from gcp_storage_emulator import server, storage
storage.Storage._write_config_to_file = lambda self: None
port, bucket = int(sys.argv[1]), sys.argv[2]
server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()
"""
HEADER = (
    "| where | in flight | seconds | ms a part | MB/s | requests | most in flight "
    "| vs one at a time |\n|---|---|---|---|---|---|---|---|"
)


def start_emulator():
    """``(process, endpoint)`` of an in-memory emulator holding BUCKET, answering."""
    import subprocess

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", EMULATOR, str(port), BUCKET],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return answering(process, port)


def write_runs(directory: str, parts: int, part_bytes: int) -> list:
    """The pile's fragments: ``parts`` runs of one part each in ``directory``, as pass 1 writes."""
    import numpy as np
    import pyarrow as pa

    from pileshuffle.engine.runs import PileRuns

    per_part, rng = max(1, part_bytes // RECORD), np.random.default_rng(0)
    payload = pa.array([rng.bytes(RECORD) for _ in range(per_part)], pa.binary())
    table = pa.table({"payload": payload})
    lengths, fragments = np.full(per_part, RECORD, np.uint64), []
    for n in range(parts):
        keys = rng.integers(0, 2**64 - 1, per_part, dtype=np.uint64)
        writer = PileRuns(1, 1 << 40, f"w{n:05d}", directory, (n,))
        writer.add(table, keys, keys, lengths)
        fragments += [f for _, f in writer.flush()]
    return fragments


def upload(fragments: list, prefix: str) -> list:
    """The fragments' run files put on the emulator under ``prefix``; the fragments, there."""
    from pileshuffle.io import cloud

    bucket = cloud.storage_client().bucket(BUCKET)
    moved = []
    for fragment in fragments:
        name = f"{prefix}/{os.path.basename(fragment.path)}"
        bucket.blob(name).upload_from_filename(fragment.path)
        moved.append(dataclasses.replace(fragment, path=f"gs://{BUCKET}/{name}"))
    return moved


def assemble(fragments: list, in_flight: int, proxy: str = None):
    """``(seconds, table)`` of ``read_joined`` with ``in_flight`` requests at most (the counts of
    ``proxy`` zeroed just before)."""
    from pileshuffle.engine.fragments import read_joined
    from pileshuffle.io import part_fetch

    part_fetch.IN_FLIGHT = in_flight
    read_joined(fragments[:1])  # the bucket's first contact, outside the time
    if proxy:
        delay_proxy.counts(proxy, reset=True)
    began = time.perf_counter()
    table = read_joined(fragments)
    return time.perf_counter() - began, table


def remote_rows(label: str, fragments: list, widths: list, proxy: str, reference):
    """One row per ``widths`` (requests in flight) of the pile read where the environment
    says; each table must equal ``reference`` (the first one read, returned)."""
    total, first = sum(f.length for f in fragments), None
    for in_flight in widths:
        seconds, table = assemble(fragments, in_flight, proxy)
        reference = table if reference is None else reference
        assert table.equals(reference), f"{label}, {in_flight} in flight: a different table"
        del table
        seen = delay_proxy.counts(proxy) if proxy else {"requests": "", "peak": ""}
        first = seconds if first is None else first
        print(
            f"| {label} | {in_flight} | {seconds:.2f} | {seconds / len(fragments) * 1000:.2f} | "
            f"{total / seconds / 1e6:.0f} | {seen['requests']} | {seen['peak']} | "
            f"{first / seconds:.1f}x |",
            flush=True,
        )
    return reference


def local_fetch(fragments: list, in_flight: int) -> float:
    """Seconds to read the local runs' ranges: ``storage.read_range`` (a pread) one after another
    for 1 (read_joined's way), else ``part_fetch`` with ``in_flight`` threads."""
    from pileshuffle.io import part_fetch, storage

    ranges = [(f.path, f.offset, f.length) for f in fragments]
    began = time.perf_counter()
    if in_flight == 1:
        for path, offset, length in ranges:
            storage.read_range(path, offset, length)
    else:
        for _ in part_fetch.in_order(ranges, in_flight=in_flight):
            pass
    return time.perf_counter() - began


def local_rows(fragments: list, widths: list):
    total = sum(f.length for f in fragments)
    for in_flight in widths:
        local_fetch(fragments, in_flight)  # the page cache warm for every row
        seconds = local_fetch(fragments, in_flight)
        per_part = seconds / len(fragments) * 1000
        print(
            f"| local disk | {in_flight} | {seconds:.2f} | {per_part:.3f} | "
            f"{total / seconds / 1e6:.0f} | | | |",
            flush=True,
        )


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", type=int, default=5000)
    parser.add_argument(
        "--part_kb",
        type=int,
        default=240,
        help="kB per part (default 240: 1 GB piles at 10-100 TB)",
    )
    parser.add_argument("--delay_ms", type=float, default=30)
    parser.add_argument("--in_flight", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    args = parser.parse_args(argv)
    from pileshuffle.io import part_fetch

    default, (emulator, direct), proxies = part_fetch.IN_FLIGHT, start_emulator(), []
    try:
        with tempfile.TemporaryDirectory() as directory:
            os.environ["STORAGE_EMULATOR_HOST"] = direct
            local = write_runs(directory, args.parts, args.part_kb * 1000)
            began = time.perf_counter()
            remote, total = upload(local, "pass2"), sum(f.length for f in local)
            print(
                f"{args.parts:,} parts of {total / args.parts / 1000:.0f} kB "
                f"({total / 1e6:,.0f} MB), uploaded in {time.perf_counter() - began:.0f} s; "
                f"default in flight {default}\n\n{HEADER}"
            )
            reference = remote_rows("emulator", remote, [1, default], None, None)
            for delay in (0, args.delay_ms):
                process, endpoint = delay_proxy.start(direct, delay / 1000)
                proxies.append(process)
                os.environ["STORAGE_EMULATOR_HOST"] = endpoint
                widths = args.in_flight if delay else [1, default]
                label = f"proxy, {delay:g} ms"
                reference = remote_rows(label, remote, widths, endpoint, reference)
            local_rows(local, [1, 4, default])
    finally:
        for process in proxies:
            process.kill()
        emulator.kill()


if __name__ == "__main__":
    main()
