"""JSONL as JSON readers read it: a UTF-8 byte order mark at a file's start is not part of its first
record, blank (whitespace-only) lines are not records (counted, in the summary and the manifest), and
CRLF lines keep their bytes. Every output line parses where its input line parsed; DuckDB reads every
output; a split read, `--balance`, `verify` and the loader agree."""

import glob
import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pytest
from helpers import run_shuffle, shard_bytes, shards

from pileshuffle.commands.report import summary
from pileshuffle.commands.verify import verify
from pileshuffle.formats import get_format
from pileshuffle.formats.base import ReadReport
from pileshuffle.loader import ShuffledDataset

BOM = b"\xef\xbb\xbf"
BLANKS = [b"\n", b"   \n", b"\t\r\n", b" \r\n"]


def records(first, count, animal="cat", ending=b"\n"):
    return [
        json.dumps({"i": i, "animal": animal, "text": "w" * (i % 50)}).encode() + ending
        for i in range(first, first + count)
    ]


@pytest.fixture
def awkward(tmp_path):
    """Two JSONL files: one with a BOM and blank lines among LF lines (one blank line at the very
    end and one right after the BOM), one with CRLF lines; 900 records in all, 5 blank lines."""
    folder = tmp_path / "in"
    folder.mkdir()
    lf = records(0, 600)
    body = (
        [b"\n"]
        + lf[:200]
        + [BLANKS[1]]
        + lf[200:400]
        + [BLANKS[2], BLANKS[3]]
        + lf[400:]
        + [b"  \n"]
    )
    (folder / "a.jsonl").write_bytes(BOM + b"".join(body))
    (folder / "b.jsonl").write_bytes(b"".join(records(600, 300, "dog", b"\r\n")))
    return str(folder / "*.jsonl"), 900, 5


def output_lines(prefix):
    return [
        line
        for path in shards(prefix)
        for line in open(path, "rb").read().splitlines(keepends=True)
    ]


def test_a_bom_and_blank_lines_are_no_records_and_every_output_line_parses(awkward, tmp_path):
    pattern, expected, blank = awkward
    prefix = str(tmp_path / "out" / "t")
    manifest = run_shuffle(pattern, prefix, "--num_piles=3", "--seed=2")
    lines = output_lines(prefix)
    assert len(lines) == expected == manifest["totals"]["records"]
    # each parses; none lost
    assert sorted(json.loads(line)["i"] for line in lines) == list(range(expected))
    assert not any(BOM in line for line in lines)
    assert sum(line.endswith(b"\r\n") for line in lines) == 300  # CRLF lines keep their bytes
    assert manifest["skipped"]["blank_lines"] == blank
    assert f"{blank} blank line(s)" in summary(manifest)
    assert verify(pattern, prefix) == []
    loaded = [json.loads(record) for record in ShuffledDataset(prefix, seed=1)]
    assert sorted(r["i"] for r in loaded) == list(range(expected))


def test_duckdb_reads_every_output_of_an_awkward_input(awkward, tmp_path):
    import duckdb

    pattern, expected, _ = awkward
    for compression in ("none", "gzip"):
        prefix = str(tmp_path / compression / "t")
        run_shuffle(pattern, prefix, "--num_piles=2", "--seed=3", f"--compression={compression}")
        files = ", ".join(f"'{path}'" for path in shards(prefix))
        count, ids = duckdb.sql(
            f"SELECT count(*), count(DISTINCT i) FROM read_json([{files}], "
            "format='newline_delimited')"
        ).fetchall()[0]
        assert count == ids == expected


def test_spans_read_the_records_the_whole_file_reads(awkward):
    """A span's reader leaves out the same BOM and blank lines, wherever the cuts fall."""
    path = sorted(glob.glob(awkward[0]))[0]
    fmt, size = get_format("jsonl"), os.path.getsize(path)
    whole, report = list(fmt.read_placed(path, 1 << 20, report=ReadReport())), ReadReport()
    for cuts in ([1, 2, 3, 4], [100, 4000, 4001], list(range(0, size, 997))):
        bounds, report = sorted({0, size, *cuts}), ReadReport()
        parts = [
            part
            for start, stop in zip(bounds, bounds[1:])
            for part in fmt.read_placed(path, 64, report=report, span=(start, stop))
        ]
        assert pa.concat_tables([t for t, _ in parts]).equals(
            pa.concat_tables([t for t, _ in whole])
        )
        assert (
            np.concatenate([p for _, p in parts]).tolist()
            == np.concatenate([p for _, p in whole]).tolist()
        )
        assert report.blank_lines == 5


def test_a_plain_input_read_in_spans_and_its_gzip_read_whole_give_the_same_bytes(awkward, tmp_path):
    pattern, _, blank = awkward
    (tmp_path / "gz").mkdir()
    for path in glob.glob(pattern):
        (tmp_path / "gz" / (os.path.basename(path) + ".gz")).write_bytes(
            gzip.compress(open(path, "rb").read())
        )
    plain = run_shuffle(pattern, str(tmp_path / "plain" / "t"), "--num_piles=3", "--seed=4")
    packed = run_shuffle(
        str(tmp_path / "gz" / "*.jsonl.gz"),
        str(tmp_path / "packed" / "t"),
        "--num_piles=3",
        "--seed=4",
        "--compression=none",
    )
    assert shard_bytes(str(tmp_path / "plain" / "t")) == shard_bytes(str(tmp_path / "packed" / "t"))
    assert plain["skipped"]["blank_lines"] == packed["skipped"]["blank_lines"] == blank


def test_balance_reads_the_same_records(awkward, tmp_path):
    pattern, expected, blank = awkward
    prefix = str(tmp_path / "out" / "t")
    manifest = run_shuffle(
        pattern, prefix, "--label_field=animal", "--balance=uniform", "--num_piles=2", "--seed=5"
    )
    assert manifest["balance"]["records_before"] == {"cat": 600, "dog": 300}
    assert manifest["balance"]["records_after"] == {"cat": 600, "dog": 600}
    assert manifest["skipped"]["blank_lines"] == blank
    assert all(json.loads(line)["animal"] in ("cat", "dog") for line in output_lines(prefix))
    assert verify(pattern, prefix) == []


def test_a_file_of_blank_lines_only_holds_no_records(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"".join(records(0, 10)))
    (folder / "b.jsonl").write_bytes(BOM + b"\n \n\r\n")
    manifest = run_shuffle(str(folder / "*.jsonl"), str(tmp_path / "out" / "t"), "--num_piles=2")
    assert manifest["totals"]["records"] == 10 and manifest["skipped"]["blank_lines"] == 3
    assert {os.path.basename(i["path"]): i["records"] for i in manifest["inputs"]} == {
        "a.jsonl": 10,
        "b.jsonl": 0,
    }
