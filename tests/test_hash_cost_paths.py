"""Record hashes by the cheaper paths (issue 56) equal their definition: a value's hash is
``mix64(crc32c(value) | len(value) << 32)`` (a null: the null constant), a row's folds its values'
hashes in column order, a line's is its payload's without the newline. Checked against that
definition written out with ``google_crc32c`` one value at a time, on every path a value can take:
all at once for short values (in batches), one view per value for long ones, one ``bytes`` copy
for the ones between; and the meter that decides when to compile counts CPU, not waiting. The
JSONL reader reads a local file's bytes into one block each (a cut line is read again, not
joined)."""

import threading
import time

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest

from pileshuffle.formats import get_format
from pileshuffle.records import slice_crcs
from pileshuffle.records.fingerprint import column_hashes, mix64, row_hashes
from pileshuffle.records.slice_crcs import crc32c_of_slices

NULL_HASH = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def value_hash(value) -> int:
    """The definition of a bytes or text value's hash, one value at a time."""
    if value is None:
        return NULL_HASH
    data = value.encode() if isinstance(value, str) else value
    return int(mix64(np.array([google_crc32c.value(data) | len(data) << 32], np.uint64))[0])


def defined_row_hashes(columns) -> list:
    """The definition of ``row_hashes`` for columns of bytes/text values, one value at a time."""
    rows = []
    for values in zip(*columns):
        row = 0
        for position, value in enumerate(values):
            folded = (row * 0x100000001B3 + value_hash(value) + position) & MASK
            row = int(mix64(np.array([folded], np.uint64))[0])
        rows.append(row)
    return rows


def mixed_values(rng, count, lengths) -> list:
    """``count`` random values, lengths drawn from ``lengths`` (a list of (low, high) ranges)."""
    spans = [lengths[i] for i in rng.integers(0, len(lengths), count)]
    return [rng.bytes(int(rng.integers(low, high + 1))) for low, high in spans]


@pytest.fixture(autouse=True)
def in_python(monkeypatch):
    """Every hash here by the Python paths (the compiled loop has tests of its own)."""
    monkeypatch.setattr(slice_crcs, "_python_seconds", 0.0)


@pytest.mark.parametrize(
    "lengths",
    [
        [(0, 0)],  # empty values only
        [(0, 32)],  # short: all at once
        [(33, 255)],  # between: slices of one bytes copy
        [(256, 3000)],  # long: one view each
        [(0, 0), (1, 32), (33, 200), (400, 70_000)],  # all of them in one column
    ],
    ids=["empty", "short", "between", "long", "mixed"],
)
def test_a_binary_columns_hashes_are_the_definitions(lengths):
    values = mixed_values(np.random.default_rng(len(lengths)), 500, lengths)
    assert column_hashes(pa.array(values, pa.binary())).tolist() == [value_hash(v) for v in values]


def test_short_values_past_one_batch_hash_in_their_own_order():
    """More short values than ``_ACROSS_BATCH``: batches in order, each value its own hash."""
    values = mixed_values(np.random.default_rng(3), 2 * slice_crcs._ACROSS_BATCH + 77, [(0, 32)])
    data = b"".join(values)
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int64)
    want = [google_crc32c.value(v) for v in values]
    assert crc32c_of_slices(data, offsets).tolist() == want
    assert crc32c_of_slices(pa.py_buffer(data), offsets).tolist() == want


def test_nulls_sliced_chunked_and_large_types_hash_as_their_values():
    rng = np.random.default_rng(5)
    names = [None if i % 7 == 0 else "ü" * int(n) for i, n in enumerate(rng.integers(0, 40, 300))]
    values = mixed_values(rng, 300, [(0, 20), (300, 2000)])
    payloads = [None if i % 11 == 0 else v for i, v in enumerate(values)]
    table = pa.table(
        {"name": pa.array(names, pa.string()), "payload": pa.array(payloads, pa.binary())}
    )
    want = defined_row_hashes([names, payloads])
    assert row_hashes(table).tolist() == want
    large = pa.table(
        {
            "name": pa.array(names, pa.large_string()),
            "payload": pa.array(payloads, pa.large_binary()),
        }
    )
    assert row_hashes(large).tolist() == want  # large offsets, same values: same hashes
    chunked = pa.concat_tables([table.slice(0, 120), table.slice(120, 1), table.slice(121)])
    assert chunked.column(1).num_chunks == 3
    assert row_hashes(chunked).tolist() == want
    sliced = table.slice(37, 200)  # arrays whose offsets start inside their buffers
    assert sliced.column(1).chunk(0).offset == 37
    assert row_hashes(sliced).tolist() == want[37:237]
    assert row_hashes(chunked.slice(100, 50)).tolist() == want[100:150]


def test_a_null_hashes_as_a_null_whatever_bytes_its_slot_holds():
    """Arrow lets a null's slot span bytes (a filter or a writer may leave them): not its value."""
    data = b"kept" + b"x" * 500 + b"too"
    offsets = np.array([0, 4, 504, 507], np.int32)
    validity = pa.py_buffer(bytes([0b101]))
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    array = pa.Array.from_buffers(pa.binary(), 3, buffers)
    assert array.to_pylist() == [b"kept", None, b"too"]
    assert column_hashes(array).tolist() == [value_hash(b"kept"), NULL_HASH, value_hash(b"too")]


def test_text_and_binary_with_the_same_bytes_hash_alike():
    words = ["", "a", "naïve", "x" * 40, "y" * 300]
    text = column_hashes(pa.array(words, pa.string()))
    binary = column_hashes(pa.array([w.encode() for w in words], pa.binary()))
    assert text.tolist() == binary.tolist()
    assert text.tolist() == [value_hash(w) for w in words]


def test_lines_hash_as_their_payloads_whatever_their_lengths():
    """A JSONL line's hash is its payload's (no newline), over a buffer the reader did not copy."""
    lengths = [(0, 0), (1, 30), (40, 200), (300, 5000)]
    payloads = mixed_values(np.random.default_rng(9), 400, lengths)
    payloads = [p.replace(b"\n", b" ") for p in payloads]
    lines = b"".join(p + b"\n" for p in payloads)
    offsets = np.cumsum([0] + [len(p) + 1 for p in payloads]).astype(np.int64)
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(bytearray(lines))]
    table = pa.table({"line": pa.Array.from_buffers(pa.binary(), len(payloads), buffers)})
    want = [value_hash(p) for p in payloads]
    assert get_format("jsonl").record_hashes(table).tolist() == want
    assert get_format("jsonl").record_hashes(table.slice(10, 100)).tolist() == want[10:110]


def test_the_compile_meter_counts_cpu_not_time_spent_waiting_for_another_thread():
    """Two threads hashing at once take turns holding the GIL: the time each call waits is no
    work, so the meter (what decides when compiling pays) never reads more than the CPU used."""
    values = mixed_values(np.random.default_rng(1), 20_000, [(300, 600)])
    data = pa.py_buffer(b"".join(values))
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int64)

    def hash_repeatedly():
        for _ in range(8):
            crc32c_of_slices(data, offsets)

    cpu_before = time.process_time()
    threads = [threading.Thread(target=hash_repeatedly) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu = time.process_time() - cpu_before
    assert slice_crcs._python_seconds < slice_crcs._COMPILE_AFTER_SECONDS  # nothing compiled
    assert 0 < slice_crcs._python_seconds <= cpu


@pytest.mark.parametrize("storage", ["beam", "arrow"])
@pytest.mark.parametrize("last_newline", [True, False])
def test_a_local_jsonl_file_is_read_in_blocks_that_each_hold_bytes_read_once(
    tmp_path, monkeypatch, last_newline, storage
):
    """Each block of a local file is one read of at most ``chunk_bytes`` (the line a block cut
    starts the next one) and holds the file's bytes at its offset; the lines are the file's,
    through Beam's file handles and Arrow's."""
    from pileshuffle.formats.text import line_blocks

    monkeypatch.setenv("PILESHUFFLE_STORAGE", storage)

    rng = np.random.default_rng(11)
    lines = [b"%d" % i + b"x" * int(n) for i, n in enumerate(rng.integers(0, 200, 400))]
    if not last_newline:  # read when it is a whole JSON value
        lines[-1] = b"12345"
    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    (tmp_path / "a.jsonl").write_bytes(data)
    got = []
    for buf, end, base in line_blocks(str(tmp_path / "a.jsonl"), 256):
        assert len(buf) <= 256 + (not last_newline)  # (a last line without one gets its newline)
        whole = data[base : base + end] if base + end <= len(data) else data[base:] + b"\n"
        assert bytes(buf[:end]) == whole
        got.append(bytes(buf[:end]))
    assert b"".join(got).split(b"\n")[:-1] == lines


def test_a_process_told_of_many_records_compiles_from_the_first_hash_and_one_of_few_does_not(
    monkeypatch, tmp_path
):
    from apache_beam.options.pipeline_options import PipelineOptions

    from pileshuffle.commands import sample
    from pileshuffle.engine.transforms.graph import _records_per_process
    from pileshuffle.planning.plan import make_plan

    monkeypatch.setattr(slice_crcs, "_python_seconds", 0.0)
    slice_crcs.expect_records(1_000_000)  # 0.37 s in Python: less than compiling
    assert slice_crcs._compiled_slice_crcs() is None
    # 1.5 s in Python (2 GB of 500-byte lines): compile at once
    slice_crcs.expect_records(4_000_000)
    assert slice_crcs._compiled_slice_crcs() is not None
    raw = np.frombuffer(b"abcdef" * 10, dtype=np.uint8)
    got = crc32c_of_slices(raw, np.array([0, 7, 60]))
    assert got.tolist() == [
        google_crc32c.value(bytes(raw[0:7])),
        google_crc32c.value(bytes(raw[7:60])),
    ]
    sample.write_jsonl(str(tmp_path), records=3_000, files=2, record_bytes=100)
    plan = make_plan(PipelineOptions([f"--input={tmp_path}/*.jsonl", f"--output={tmp_path}/o/t"]))
    # this machine: one process reads all
    assert _records_per_process(plan) == plan.written_records > 0
