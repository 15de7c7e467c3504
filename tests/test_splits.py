"""A large file read in spans by several workers: every record once, keyed as when read whole.

A span is a byte range of a file; a record belongs to the span it starts in (a JSONL line at its
first byte, a Parquet row group at its first page). Readers are checked against the whole read
for any cut (hypothesis), then the real pipeline for any split size: the same bytes out.
"""

import glob
import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import manifest, run_shuffle, shard_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.engine.sources import Source, source_groups, split_sources, stats_by_file
from pileshuffle.errors import InputError
from pileshuffle.formats import get_format


def read_spans(fmt, path, cuts, chunk_bytes):
    """``read_placed`` of each span between sorted ``cuts`` (0 and the size included), joined, with
    the spans checked to chain as pass 1's are (``check_spans_chain``)."""
    from pileshuffle.engine.sources import SourceStats, check_spans_chain
    from pileshuffle.formats import ReadReport

    tables, places, stats = [], [], []
    for start, stop in zip(cuts, cuts[1:]):
        report = ReadReport()
        for table, where in fmt.read_placed(path, chunk_bytes, report=report, span=(start, stop)):
            assert table.num_rows == len(where)
            tables.append(table)
            places.append(where)
        stats.append(SourceStats(0, path, None, span=(start, stop), reached=report.reached))
    check_spans_chain(stats)
    return tables, np.concatenate(places) if places else np.zeros(0, np.int64)


def whole(fmt, path):
    read = list(fmt.read_placed(path, 1 << 20))
    return [t for t, _ in read], np.concatenate([p for _, p in read]) if read else np.zeros(
        0, np.int64
    )


def assert_spans_read_as_whole(format_name, path, cuts, chunk_bytes):
    """The file read in the spans between ``cuts`` (fractions of its size) gives the whole read's
    records, at the same places."""
    fmt, size = get_format(format_name), os.path.getsize(path)
    tables, places = read_spans(
        fmt, path, sorted({0, size, *(int(c * size) for c in cuts)}), chunk_bytes
    )
    expected_tables, expected_places = whole(fmt, path)
    assert places.tolist() == expected_places.tolist()
    assert same_records(tables, expected_tables, fmt.record_column)


def same_records(a, b, column):
    flatten = lambda tables: [v for t in tables for v in t.column(column).to_pylist()]  # noqa: E731
    return flatten(a) == flatten(b)


text = st.text(
    st.characters(blacklist_characters="\n\x00", blacklist_categories=("Cs",)), max_size=30
)
lines = st.lists(text.map(str.encode), min_size=1, max_size=60)  # UTF-8 of any width


@given(
    lines=lines,
    last_newline=st.booleans(),
    cuts=st.lists(st.floats(0, 1), max_size=12),
    chunk_bytes=st.sampled_from([1, 7, 64, 1 << 20]),
)
@settings(max_examples=100, deadline=None)
def test_jsonl_spans_give_every_line_once_at_its_offset(
    tmp_path_factory, lines, last_newline, cuts, chunk_bytes
):
    """Cuts anywhere (mid-line, on a newline, past a line start, spans shorter than a line,
    empty spans), a last line without its newline, blocks smaller than a line."""
    path = str(tmp_path_factory.mktemp("jsonl") / "one.jsonl")
    if not last_newline:  # read when whole JSON (a cut one: test_jsonl_last_line.py)
        lines = lines[:-1] + [json.dumps(lines[-1].decode()).encode()]
    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    with open(path, "wb") as f:
        f.write(data)
    size = len(data)
    bounds = sorted({0, size, *(int(c * size) for c in cuts)})
    fmt = get_format("jsonl")
    tables, places = read_spans(fmt, path, bounds, chunk_bytes)
    expected_tables, expected_places = whole(fmt, path)
    assert places.tolist() == expected_places.tolist()
    assert same_records(tables, expected_tables, "line")
    # a line starts after each newline
    starts = [0] + [i + 1 for i, byte in enumerate(data[:-1]) if byte == 10]
    bom = b"\xef\xbb\xbf" if data.startswith(b"\xef\xbb\xbf") else b""  # not part of the first line
    records = [
        (start + (len(bom) if start == 0 else 0), line[len(bom) :] if start == 0 else line)
        for start, line in zip(starts, data.split(b"\n"))
    ]
    # blank lines are no records
    assert places.tolist() == [at for at, line in records if line.strip(b" \t\r")]


@given(
    groups=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    cuts=st.lists(st.floats(0, 1), max_size=10),
    dictionary=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_parquet_spans_give_every_row_group_once_with_its_row_numbers(
    tmp_path_factory, groups, cuts, dictionary
):
    path = str(tmp_path_factory.mktemp("parquet") / "one.parquet")
    rows = sum(groups)
    table = pa.table({"i": np.arange(rows), "s": [f"row {i % 7}" for i in range(rows)]})
    with pq.ParquetWriter(path, table.schema, use_dictionary=dictionary) as writer:
        at = 0
        for n in groups:
            writer.write_table(table.slice(at, n))
            at += n
    size = os.path.getsize(path)
    bounds = sorted({0, size, *(int(c * size) for c in cuts)})
    fmt = get_format("parquet")
    tables, places = read_spans(fmt, path, bounds, chunk_bytes=64)
    assert places.tolist() == list(range(rows))
    assert [v for t in tables for v in t.column("i").to_pylist()] == list(range(rows))


def test_large_files_are_cut_into_spans_that_cover_them_and_nothing_else_is(tmp_path):
    """Spans tile a file; a gzip JSONL, a TFRecord under --skip_corrupt and a small file are read
    whole; units are the budget, or a sixteenth of the input if less."""
    big = Source(0, "big.jsonl", 1_000_000)
    zipped, framed, small = (
        Source(1, "big.jsonl.gz", 1_000_000),
        Source(2, "x.tfrecord", 1_000_000),
        Source(3, "s.jsonl", 10),
    )
    spans = split_sources([big, small], budget=50_000, fmt=get_format("jsonl"))
    cut = [s.span for s in spans if s.id == 0]
    assert len(cut) == 20 and cut[0][0] == 0  # 20 units of 50,000 bytes and cut[-1][1] == big.size
    assert all(a[1] == b[0] for a, b in zip(cut, cut[1:]))
    assert spans[-1] == small and spans[-1].span is None
    assert split_sources([zipped], 100_000, get_format("jsonl")) == [zipped]
    assert len(split_sources([framed], 100_000, get_format("tfrecord"))) == 16
    # skips need the walk
    assert split_sources([framed], 100_000, get_format("tfrecord"), skip_corrupt=True) == [framed]
    shards = Source(4, "x.tar", 1_000_000)
    assert len(split_sources([shards], 100_000, get_format("tar"))) == 16
    assert split_sources([shards], 100_000, get_format("tar"), skip_corrupt=True) == [shards]
    assert [len(g) for g in source_groups(spans, 50_000)] == [1] * 20 + [1]
    # a sixteenth of the input
    assert len(split_sources([big], budget=10**9, fmt=get_format("jsonl"))) == 16


def _write_big_jsonl(path, records):
    rng = np.random.default_rng(3)
    with open(path, "w") as f:
        for i in range(records):
            f.write(json.dumps({"i": i, "text": "w" * int(rng.integers(0, 200))}) + "\n")


@pytest.fixture(scope="module")
def big_inputs(tmp_path_factory):
    """One 24 MB JSONL file, one Parquet file of 96 row groups, one 24 MB TFRecord file, one 33 MB
    WebDataset tar: large enough that a unit of work (a sixteenth of the input, or --run_bytes)
    cuts them into 16 to 33 spans."""
    root = tmp_path_factory.mktemp("big")
    _write_big_jsonl(str(root / "one.jsonl"), 200_000)
    rows = 96 * 4000
    table = pa.table({"i": np.arange(rows), "text": ["x" * (i % 97) for i in range(rows)]})
    pq.write_table(
        table,
        str(root / "one.parquet"),
        row_group_size=4000,
        compression="none",
        use_dictionary=False,
    )
    rng = np.random.default_rng(4)
    _tfrecord_file(
        str(root / "one.tfrecord"),
        [b"%d " % i + bytes(int(n)) for i, n in enumerate(rng.integers(0, 400, 110_000))],
    )
    import tarfile

    _tar_file(
        str(root / "one.tar"),
        [
            (f"s{i:06d}", [("jpg", int(n)), ("cls", 1)])
            for i, n in enumerate(rng.integers(0, 1500, 12_000))
        ],
        tarfile.PAX_FORMAT,
    )
    return root


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "tfrecord", "tar"])
def test_one_large_file_gives_the_same_bytes_for_any_split_size(big_inputs, tmp_path, fmt):
    """The unit of work is --run_bytes or a sixteenth of the input: 1 MiB and auto cut the file
    into different spans, read by different bundles; every shard is byte for byte the same, the
    manifest lists the file once with all its records, and verify proves it."""
    path = str(big_inputs / f"one.{fmt}")
    size = os.path.getsize(path)
    spans = [
        len(split_sources([Source(0, path, size)], budget, get_format(fmt)))
        for budget in (1 << 20, 256 << 20)
    ]
    # spans of at most --run_bytes (one run each); a sixteenth of the input
    assert spans == [
        -(-size // (1 << 20)),
        16,
    ]
    outputs = {}
    for run_bytes in ("1MiB", "auto"):
        out = str(tmp_path / run_bytes / "s")
        run_shuffle(path, out, "--num_piles=7", "--seed=5", f"--run_bytes={run_bytes}", "--quiet")
        outputs[run_bytes] = shard_bytes(out)
        listed = manifest(out)["inputs"]
        assert len(listed) == 1 and listed[0]["records"] == manifest(out)["totals"]["records"]
    assert outputs["1MiB"] == outputs["auto"]
    from pileshuffle.verify.checks import verify_shards

    assert verify_shards(path, str(tmp_path / "auto" / "s")) == []


def test_a_span_reader_names_a_bad_line_by_its_byte_offset(tmp_path):
    path = str(tmp_path / "bad.jsonl")
    with open(path, "wb") as f:
        f.write(b'{"a": 1}\n' * 100 + b'{"a": "\x00"}\n' + b'{"a": 1}\n' * 100)
    fmt = get_format("jsonl")
    with pytest.raises(InputError, match=r"the line at byte 900 is not text \(a NUL byte"):
        read_spans(fmt, path, [0, 450, os.path.getsize(path)], 1 << 20)
    with pytest.raises(InputError, match=r"line 101 is not text"):
        whole(fmt, path)


def test_span_stats_add_up_per_file():
    from pileshuffle.engine.sources import SourceStats
    from pileshuffle.records.fingerprint import Fingerprint

    a = SourceStats(0, "f", Fingerprint.of(np.array([1, 2], np.uint64), 10), 1, 5, ("x",))
    b = SourceStats(0, "f", Fingerprint.of(np.array([3], np.uint64), 4), 0, 0, ())
    c = SourceStats(1, "g", Fingerprint.of(np.array([9], np.uint64), 1))
    merged = stats_by_file([c, b, a])
    assert [m.source for m in merged] == [0, 1]
    assert merged[0].fingerprint == Fingerprint.of(np.array([1, 2, 3], np.uint64), 14)
    assert (merged[0].skipped_records, merged[0].skipped_bytes, merged[0].problems) == (
        1,
        5,
        ("x",),
    )


def test_a_gzip_jsonl_file_is_read_whole_and_keyed_as_its_plain_form(tmp_path):
    """A compressed stream cannot be entered mid-way: read whole, its lines keyed by their
    offsets in the decompressed text, so it shuffles exactly as the plain file does."""
    plain = str(tmp_path / "plain" / "a.jsonl")
    os.makedirs(os.path.dirname(plain))
    _write_big_jsonl(plain, 3000)
    zipped = str(tmp_path / "gz" / "a.jsonl.gz")
    os.makedirs(os.path.dirname(zipped))
    with open(plain, "rb") as src, gzip.open(zipped, "wb") as dst:
        dst.write(src.read())
    for where in (plain, zipped):
        run_shuffle(
            where,
            str(tmp_path / os.path.basename(os.path.dirname(where)) / "out" / "s"),
            "--num_piles=3",
            "--seed=2",
            "--compression=none",
            "--quiet",
        )
    assert shard_bytes(str(tmp_path / "plain" / "out" / "s")) == shard_bytes(
        str(tmp_path / "gz" / "out" / "s")
    )
    assert len(glob.glob(str(tmp_path / "gz" / "out" / "s-*.jsonl"))) == 3


def _tfrecord_file(path, payloads):
    from pileshuffle.formats.tfrecord import frame

    with open(path, "wb") as f:
        for payload in payloads:
            f.write(frame(payload))


payloads = st.lists(
    st.one_of(st.binary(max_size=60), st.integers(0, 3000).map(lambda n: bytes(n))),
    min_size=1,
    max_size=40,
)


@given(
    payloads=payloads,
    cuts=st.lists(st.floats(0, 1), max_size=10),
    chunk_bytes=st.sampled_from([16, 100, 1 << 20]),
)
@settings(max_examples=100, deadline=None)
def test_tfrecord_spans_find_their_first_frame_by_its_crcs_and_give_every_frame_once(
    tmp_path_factory, payloads, cuts, chunk_bytes
):
    """Cuts anywhere (in a header, a payload of zeros, a footer), frames larger than a block,
    empty payloads: the frames of all spans are the whole read's, at the same places."""
    path = str(tmp_path_factory.mktemp("tfrecord") / "one.tfrecord")
    _tfrecord_file(path, payloads)
    assert_spans_read_as_whole("tfrecord", path, cuts, chunk_bytes)


def _bytes_read_by_this_process() -> int:
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar:")).split()[1])


def test_a_tfrecord_span_smaller_than_a_chunk_is_read_once_not_a_chunk_at_a_time(tmp_path):
    """A span of 2 MB of a 24 MB file, read with 16 MiB chunks: its frames, and about its own bytes
    read (a job of small runs has spans of a few MB; reading 16 MiB for each, and checking every
    frame's CRC in it, cost 8x the bytes at 2.9 MB spans: issue 56)."""
    path = str(tmp_path / "big.tfrecord")
    rng = np.random.default_rng(0)
    _tfrecord_file(path, [rng.bytes(1000) for _ in range(24_000)])
    fmt, (start, stop) = get_format("tfrecord"), (4_000_000, 6_000_000)
    before = _bytes_read_by_this_process()
    tables, places = read_spans(fmt, path, [start, stop], 16 << 20)
    read = _bytes_read_by_this_process() - before
    frames = 1000 + 16
    first = -(-start // frames) * frames
    assert places.tolist() == list(range(first, stop, frames))
    assert sum(t.num_rows for t in tables) == len(places)
    assert stop - start <= read <= (stop - start) + (256 << 10), read


@given(
    payloads=payloads,
    damaged=st.floats(0, 1),
    where=st.sampled_from(["length", "length crc", "payload", "footer"]),
    cuts=st.lists(st.floats(0, 1), max_size=8),
    chunk_bytes=st.sampled_from([16, 100, 1 << 20]),
)
@settings(max_examples=100, deadline=None)
def test_a_damaged_frame_anywhere_fails_a_read_in_spans_for_any_cuts(
    tmp_path_factory, payloads, damaged, where, cuts, chunk_bytes
):
    """Strict reading never loses a damaged frame: whichever span it falls in (the first one's
    first frame too, at a span's start, across a boundary), some span's walk refuses it or the
    spans do not chain."""
    from pileshuffle.errors import PileshuffleError
    from pileshuffle.formats.tfrecord import frame

    frames = [frame(p) for p in payloads]
    index = min(int(damaged * len(frames)), len(frames) - 1)
    at = (
        sum(len(f) for f in frames[:index])
        + {"length": 0, "length crc": 9, "payload": 12, "footer": len(frames[index]) - 1}[where]
    )
    if where == "payload" and len(payloads[index]) == 0:
        at += 1  # no payload byte: damage the footer
    data = bytearray(b"".join(frames))
    data[at] ^= 0x20
    path = str(tmp_path_factory.mktemp("damaged") / "one.tfrecord")
    with open(path, "wb") as f:
        f.write(bytes(data))
    size = len(data)
    with pytest.raises(PileshuffleError):
        read_spans(
            get_format("tfrecord"),
            path,
            sorted({0, size, *(int(c * size) for c in cuts)}),
            chunk_bytes,
        )


@pytest.mark.parametrize(
    "inner_frames, copies",
    [(4000, 4), (16000, 1)],
    ids=["payloads-in-a-span", "spans-in-a-payload"],
)
def test_a_payload_that_reads_as_a_frame_across_a_span_boundary_fails_the_run_and_publishes_nothing(
    tmp_path, inner_frames, copies
):
    """A record whose payload is itself a TFRecord file (a frame inside a frame): a span that
    starts inside it finds an inner frame by its CRCs, and its walk breaks at the outer frame's
    footer (some span's always does: the one that holds that footer began inside the payload). The
    run stops before publishing, naming the file and why; read whole (.gz), the same records shuffle.
    (A walk that would not break is caught by the spans' chain: the next test.)"""
    from pileshuffle.formats.tfrecord import frame

    # ~0.9 or 3.6 MB of frames
    inner = b"".join(frame(b"inner %d " % i + bytes(200)) for i in range(inner_frames))
    path = tmp_path / "in" / "nested.tfrecord"
    path.parent.mkdir()
    _tfrecord_file(
        str(path), [b"first"] + [inner] * copies + [b"last %d" % i for i in range(20_000)]
    )
    out = str(tmp_path / "out" / "s")
    from pileshuffle.errors import PileshuffleError

    with pytest.raises(
        PileshuffleError,
        match=r"nested\.tfrecord at byte offset \d+: corrupt record: the length field "
        r"fails its CRC where a record of the file read from its middle ends: a "
        r"record's payload holds TFRecord records, and such a file cannot be read in "
        r"spans \(give it compressed",
    ):
        run_shuffle(str(path), out, "--num_piles=3", "--seed=1")
    assert glob.glob(out + "*") == [] or not os.path.exists(out + "-manifest.json")
    zipped = tmp_path / "gz" / "nested.tfrecord.gz"
    zipped.parent.mkdir()
    zipped.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))
    run_shuffle(
        str(zipped),
        str(tmp_path / "gz-out" / "s"),
        "--num_piles=3",
        "--seed=1",
        "--compression=none",
    )
    assert manifest(str(tmp_path / "gz-out" / "s"))["totals"]["records"] == 1 + copies + 20_000


def test_spans_whose_readers_disagree_where_records_start_publish_nothing():
    """``check_spans_chain``: each span that searched for its first record must start it where the
    walk of the spans before goes on; a span with no record must lie wholly before that place."""
    from pileshuffle.engine.sources import SourceStats, check_spans_chain
    from pileshuffle.errors import IntegrityError

    def spans(*reached, size=400):
        cuts = [i * size // len(reached) for i in range(len(reached) + 1)]
        return [
            SourceStats(0, "f.tfrecord", None, span=(a, b), reached=r)
            for (a, b), r in zip(zip(cuts, cuts[1:]), reached)
        ]

    # the last span holds no record start
    check_spans_chain(spans((0, 130), (130, 230), (230, 400), (None, None)))
    # a record over a whole span
    check_spans_chain(spans((0, 350), (None, None), (350, 400), (None, None)))
    check_spans_chain(spans(None, None))  # spans that did not search (JSONL, Parquet)
    # the walk ends inside a span that found none
    for bad in (
        spans((0, 130), (120, 230)),  # overlap: a payload read as records
        spans((0, 130), (140, 230)),  # a gap: records skipped
        spans((0, 150), (None, None), (None, None), (None, None)),
    ):
        with pytest.raises(
            IntegrityError,
            match=r"f\.tfrecord: read in spans, its readers disagree where records start",
        ):
            check_spans_chain(bad)


def test_a_damaged_frame_in_a_file_read_in_spans_is_named_at_its_offset(big_inputs, tmp_path):
    """Strict reading in spans refuses damage as the whole read does: the run fails naming the file
    and the damaged frame's offset, and publishes nothing."""
    from pileshuffle.errors import InputError

    data = bytearray((big_inputs / "one.tfrecord").read_bytes())
    places = whole(get_format("tfrecord"), str(big_inputs / "one.tfrecord"))[1]
    damaged = int(places[len(places) * 2 // 3])
    data[damaged + 14] ^= 0xFF  # a payload byte: the data fails its CRC
    path = tmp_path / "in" / "one.tfrecord"
    path.parent.mkdir()
    path.write_bytes(bytes(data))
    out = str(tmp_path / "out" / "s")
    with pytest.raises(
        InputError,
        match=rf"one\.tfrecord at byte offset {damaged}: corrupt record: the data \(\d+ bytes\) fails its CRC",
    ):
        run_shuffle(str(path), out, "--num_piles=3", "--seed=1")
    assert not os.path.exists(out + "-manifest.json") and glob.glob(out + "-0*") == []


def _tar_file(path, samples, tar_format):
    """A WebDataset tar: each sample ``(key, [(extension, size), ...])`` as consecutive members."""
    import io
    import tarfile

    with tarfile.open(path, "w", format=tar_format) as archive:
        for number, (key, members) in enumerate(samples):
            for extension, size in members:
                data = (b"%d." % number + extension.encode()) * (size // 4 + 1)
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = size
                archive.addfile(info, io.BytesIO(data[:size]))


tar_samples = st.lists(
    st.tuples(
        # long: PAX or GNU headers
        st.sampled_from(["s", "dir/s", "a/very/long/path/" + "d" * 120 + "/s"]),
        st.lists(
            st.tuples(st.sampled_from(["jpg", "cls", "json"]), st.integers(0, 1500)),
            min_size=1,
            max_size=3,
            unique_by=lambda m: m[0],
        ),
    ),
    min_size=1,
    max_size=25,
)


@given(
    samples=tar_samples,
    cuts=st.lists(st.floats(0, 1), max_size=10),
    tar_format=st.sampled_from(["pax", "gnu"]),
    chunk_bytes=st.sampled_from([512, 3000, 1 << 20]),
)
@settings(max_examples=80, deadline=None)
def test_tar_spans_move_each_boundary_to_a_sample_start_both_sides_agree_on(
    tmp_path_factory, samples, cuts, tar_format, chunk_bytes
):
    """Cuts anywhere (a header, a PAX or GNU long-name entry, data, the end-of-archive blocks),
    samples of one to three members: the samples of all spans are the whole read's, at the same
    places, and the spans chain."""
    import tarfile

    path = str(tmp_path_factory.mktemp("tar") / "one.tar")
    keyed = [(f"{prefix}{number:05d}", members) for number, (prefix, members) in enumerate(samples)]
    _tar_file(path, keyed, tarfile.PAX_FORMAT if tar_format == "pax" else tarfile.GNU_FORMAT)
    assert_spans_read_as_whole("tar", path, cuts, chunk_bytes)


def test_a_tar_member_holding_a_tar_archive_fails_the_run_in_spans_and_shuffles_read_whole(
    tmp_path,
):
    """A sample whose member is itself a tar archive: a span boundary inside it finds the inner
    headers. The span before walks the real members and finds no sample starting where the span
    after begins: the run stops before publishing, naming the file and the offset; read whole
    (.gz), the same samples shuffle."""
    import io
    import tarfile

    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as archive:
        for i in range(3000):
            info = tarfile.TarInfo(f"inner{i:05d}.txt")
            info.size = 100
            archive.addfile(info, io.BytesIO(bytes(100)))
    path = tmp_path / "in" / "nested.tar"
    path.parent.mkdir()
    with tarfile.open(path, "w") as archive:
        for i in range(400):
            data = inner.getvalue() if i % 100 == 50 else b"x" * 3000
            info = tarfile.TarInfo(f"s{i:05d}.{'tar' if i % 100 == 50 else 'bin'}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    from pileshuffle.errors import PileshuffleError

    out = str(tmp_path / "out" / "s")
    with pytest.raises(
        PileshuffleError,
        match=r"nested\.tar.*a tar member's data holds what reads as tar headers here: such "
        r"a file cannot be read in spans",
    ):
        run_shuffle(str(path), out, "--num_piles=3", "--seed=1")
    assert not os.path.exists(out + "-manifest.json") and glob.glob(out + "-0*") == []
    zipped = tmp_path / "gz" / "nested.tar.gz"
    zipped.parent.mkdir()
    zipped.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))
    run_shuffle(
        str(zipped),
        str(tmp_path / "gz-out" / "s"),
        "--num_piles=3",
        "--seed=1",
        "--compression=none",
    )
    assert manifest(str(tmp_path / "gz-out" / "s"))["totals"]["records"] == 400


def _whole_scan_resync(buf: bytes, start: int):
    """What ``resync`` answered when it scanned the whole buffer at once: the reference."""
    import struct

    from pileshuffle.records.crc import masked_crc

    for pos in range(start + 1, len(buf) - 11):
        if (
            buf[pos + 4 : pos + 8] != bytes(4)
            or masked_crc(buf[pos : pos + 8]) != struct.unpack_from("<I", buf, pos + 8)[0]
        ):
            continue
        end = pos + 16 + int.from_bytes(buf[pos : pos + 4], "little")
        if (
            end > len(buf)
            or masked_crc(buf[pos + 12 : end - 4]) == struct.unpack_from("<I", buf, end - 4)[0]
        ):
            return pos
    return None


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.binary(max_size=120).map(lambda p: ("frame", p)),
            st.binary(max_size=60).map(lambda b: ("junk", b)),
        ),
        max_size=6,
    ),
    start=st.integers(-1, 400),
    window=st.sampled_from([1, 16, 64 << 10]),
)
def test_a_span_start_finds_the_first_frame_window_by_window_as_a_whole_scan_does(
    parts, start, window
):
    from pileshuffle.formats import tfrecord, tfrecord_sync

    buf = b"".join(tfrecord.frame(p) if kind == "frame" else p for kind, p in parts)
    start, default = min(start, len(buf)), tfrecord_sync.RESYNC_WINDOW_BYTES
    # small ones: many windows, frames across their edges
    tfrecord_sync.RESYNC_WINDOW_BYTES = window
    try:
        assert tfrecord_sync.resync(buf, start) == _whole_scan_resync(buf, start)
    finally:
        tfrecord_sync.RESYNC_WINDOW_BYTES = default
