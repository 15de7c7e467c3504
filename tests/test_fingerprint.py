"""Per-record CRC32C, the root of every fingerprint: computed across many values at once for
short values and one call each for long ones, or by the compiled loop once a process has hashed
enough values, always equal to ``google_crc32c`` per value."""

import zlib

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.records import compiled_crc, fingerprint, slice_crcs
from pileshuffle.records.fingerprint import column_hashes, payload_hashes
from pileshuffle.records.slice_crcs import crc32_of_slices, crc32c_of_slices

values_lists = st.lists(st.binary(min_size=0, max_size=80), min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(values=values_lists, trim=st.sampled_from([0, 1, 4]))
def test_crc32c_of_slices_equals_one_crc32c_per_value(values, trim):
    # the trimmed bytes: a line's newline, a frame's footer
    framed = [value + b"\n" * trim for value in values]
    data = b"".join(framed)
    offsets = np.cumsum([0] + [len(v) for v in framed]).astype(np.int64)
    got = crc32c_of_slices(data, offsets, trim)
    assert got.dtype == np.uint64
    assert got.tolist() == [google_crc32c.value(value) for value in values]


@settings(max_examples=200, deadline=None)
@given(values=values_lists, trim=st.sampled_from([0, 1, 4]))
def test_the_compiled_loop_equals_one_crc32c_per_value(values, trim):
    framed = [value + b"\n" * trim for value in values]
    offsets = np.cumsum([0] + [len(v) for v in framed]).astype(np.int64)
    got = compiled_crc.slice_crcs(
        np.frombuffer(b"".join(framed), np.uint8), offsets[:-1], np.diff(offsets) - trim
    )
    assert got.dtype == np.uint64
    assert got.tolist() == [google_crc32c.value(value) for value in values]


@settings(max_examples=100, deadline=None)
@given(values=values_lists, before=st.sampled_from([0, 12]), after=st.sampled_from([0, 1, 4]))
def test_crc32_of_slices_in_python_and_compiled_equals_zlib_per_payload(values, before, after):
    """dedup's second CRC: zlib's CRC-32 of each payload, framing trimmed, by either path."""
    framed = [b"h" * before + value + b"\n" * after for value in values]
    offsets = np.cumsum([0] + [len(v) for v in framed]).astype(np.int64)
    want = [zlib.crc32(value) for value in values]
    # a short run: Python
    assert crc32_of_slices(b"".join(framed), offsets, before, after).tolist() == want
    starts, lengths = offsets[:-1] + before, np.diff(offsets) - before - after
    assert (
        compiled_crc.slice_crcs(
            np.frombuffer(b"".join(framed), np.uint8), starts, lengths, "crc32"
        ).tolist()
        == want
    )


def test_the_compiled_loop_refuses_slices_outside_its_buffer():
    raw = np.zeros(10, np.uint8)
    for starts, lengths in (([0], [11]), ([8], [3]), ([-1], [2]), ([2], [-1])):
        with pytest.raises(ValueError, match="outside a buffer of 10 bytes"):
            compiled_crc.slice_crcs(raw, np.array(starts), np.array(lengths))


def test_a_process_hashes_in_python_until_that_has_cost_what_compiling_does(monkeypatch):
    monkeypatch.setattr(slice_crcs, "_python_seconds", 0.0)
    compiled_calls = []
    monkeypatch.setattr(
        compiled_crc, "slice_crcs", lambda *args: compiled_calls.append(len(args[1])) or None
    )
    values = [bytes([n % 251]) * (n % 300) for n in range(1_000)]
    data, offsets = b"".join(values), np.cumsum([0] + [len(v) for v in values]).astype(np.int64)
    expected = [google_crc32c.value(v) for v in values]
    for _ in range(2):
        assert crc32c_of_slices(data, offsets).tolist() == expected
    spent = slice_crcs._python_seconds
    # both calls timed, in Python
    assert compiled_calls == [] and 0 < spent < slice_crcs._COMPILE_AFTER_SECONDS
    # what has been spent pays for compiling now
    monkeypatch.setattr(slice_crcs, "_COMPILE_AFTER_SECONDS", spent)
    assert crc32c_of_slices(data, offsets).tolist() == expected  # None from the loop: Python again
    assert compiled_calls == [1_000]
    monkeypatch.undo()
    monkeypatch.setattr(slice_crcs, "_python_seconds", slice_crcs._COMPILE_AFTER_SECONDS)
    # the real loop: no Python time spent
    assert crc32c_of_slices(data, offsets).tolist() == expected
    assert slice_crcs._python_seconds == slice_crcs._COMPILE_AFTER_SECONDS


def test_short_and_long_values_mixed_in_one_column_hash_as_each_alone():
    rng = np.random.default_rng(7)
    # both sides of the 32-byte split
    values = [rng.bytes(int(n)) for n in rng.integers(0, 200, 2_000)]
    mixed = column_hashes(pa.array(values, pa.binary()))
    alone = [int(column_hashes(pa.array([v], pa.binary()))[0]) for v in values[:300]]
    assert mixed[:300].tolist() == alone
    expected = payload_hashes([google_crc32c.value(v) for v in values], [len(v) for v in values])
    assert mixed.tolist() == expected.tolist()


def test_a_sliced_arrow_column_hashes_its_own_values():
    array = pa.array([b"a" * n for n in range(40)] + [None, b""], pa.binary())
    whole = column_hashes(array)
    assert column_hashes(array.slice(5, 20)).tolist() == whole[5:25].tolist()
    assert len(set(whole[:40].tolist())) == 40  # every length of "a...a" hashes differently


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=40)),
            st.one_of(st.none(), st.text(max_size=20)),
            st.integers(-(2**40), 2**40),
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 5),
    st.integers(0, 10),
    st.integers(0, 10),
)
def test_a_tables_written_bytes_summed_from_offsets_equal_the_sum_of_its_row_lengths(
    rows, parts, cut_start, cut_end
):
    """``rows_bytes`` (pass 2's written bytes, from each chunk's first and last offsets) equals
    ``row_lengths(...).sum()`` for chunked, sliced tables with nulls and large types; so does a
    bytes format's ``records_bytes`` against its ``record_lengths``."""
    from pileshuffle.formats import get_format, record_lengths, records_bytes

    columns = list(zip(*rows))
    table = pa.table(
        {
            "b": pa.array(columns[0], pa.binary()),
            "s": pa.array(columns[1], pa.large_string()),
            "i": pa.array(columns[2], pa.int64()),
        }
    )
    bounds = np.linspace(0, len(rows), parts + 1).astype(int)
    chunked = pa.concat_tables([table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])])
    sliced = chunked.slice(min(cut_start, len(rows)), max(0, len(rows) - cut_start - cut_end))
    for each in (chunked, sliced):
        assert fingerprint.rows_bytes(each) == int(fingerprint.row_lengths(each).sum())
        assert records_bytes(each) == int(record_lengths(each).sum())
    frames = pa.table(
        {
            "frame": pa.array(
                [b"0123456789ab" + (v or b"") + b"wxyz" for v in columns[0]], pa.binary()
            )
        }
    )
    holder = get_format("tfrecord")
    for each in (frames, frames.slice(min(cut_start, len(rows)))):
        assert holder.records_bytes(each) == int(holder.record_lengths(each).sum())
