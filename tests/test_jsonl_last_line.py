"""A JSONL file whose last line has no newline (issue 54): read when that line is blank or a whole
JSON value (it gets its newline in the output); else the file was cut short, and the run stops in
one line naming the file and the byte where the cut line starts, or under ``--skip_corrupt`` skips
it and counts it. The same rule for every reader that finds lines: a file read whole (plain or
gzip), a file read in spans by several workers, ``--balance``'s counting pass and pass 1, and
``verify --input``. Lines that end in a newline are never parsed (a line in the middle that is
no JSON is a record as before); a CRLF line keeps its ``\\r``, so ``--dedup exact`` keeps it
beside the same text with LF."""

import collections
import gzip
import json

import pytest
from helpers import (
    FAST,
    assert_nothing_published,
    manifest,
    refused,
    run_shuffle,
    shard_bytes,
    shards,
    succeeded,
)

from pileshuffle.commands.verify import verify

NOT_JSON = b"a line in the middle that is no JSON\n"  # never parsed: a record as any other
# 60 of each class
GOOD = b"".join(
    json.dumps({"i": i, "y": "ab"[i % 2], "text": "x" * (i % 37)}).encode() + b"\n"
    for i in range(120)
)
GOOD_WITH_MIDDLE = GOOD[: GOOD.index(b'{"i": 60,')] + NOT_JSON + GOOD[GOOD.index(b'{"i": 60,') :]
LAST = json.dumps({"i": 120, "y": "a", "text": "the last record"}).encode()
CUT = LAST[:9]  # the last record cut 9 bytes in
CUT_MESSAGE = (
    "truncated record: the file ends inside a line (9 bytes without a newline) that is "
    "not a whole JSON value"
)


def write(path, data: bytes) -> str:
    """``data`` at ``path``, gzip-compressed when its name ends in ``.gz``; the path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return str(path)


def inputs(root, body: bytes, read_as: str):
    """``(pattern, path of the file holding body, the other file's bytes or b"")``, the file
    read by the reader ``read_as`` names: ``span`` (alone: the plan cuts it into spans),
    ``whole`` (small beside a large file: read whole) or ``gzip`` (``.jsonl.gz``: read whole)."""
    if read_as == "gzip":
        return str(root / "*.jsonl.gz"), write(root / "a.jsonl.gz", body), b""
    if read_as == "span":
        return str(root / "*.jsonl"), write(root / "a.jsonl", body), b""
    big = GOOD * 25
    write(root / "a.jsonl", big)
    return str(root / "*.jsonl"), write(root / "b.jsonl", body), big


def spans_of(pattern, path, tmp_path):
    """The spans pass 1 reads ``path`` in (``[None]``: whole), as the run's plan cuts it."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pileshuffle.planning.plan import make_plan

    plan = make_plan(PipelineOptions([f"--input={pattern}", f"--output={tmp_path}/plan/o", *FAST]))
    return [s.span for group in plan.source_groups for s in group if s.path == path]


def lines_of(data: bytes) -> collections.Counter:
    return collections.Counter(data.splitlines(keepends=True))


def output_lines(output) -> collections.Counter:
    """The lines of every shard of ``output`` (gzip ones decompressed)."""

    def text(path):
        data = open(path, "rb").read()
        return gzip.decompress(data) if path.endswith(".gz") else data

    return lines_of(b"".join(text(path) for path in shards(output)))


@pytest.mark.parametrize("read_as", ["span", "whole", "gzip"])
def test_a_file_cut_inside_its_last_record_stops_the_run_naming_file_and_byte(
    tmp_path, capsys, read_as
):
    pattern, path, _ = inputs(tmp_path / "in", GOOD_WITH_MIDDLE + CUT, read_as)
    start = len(GOOD_WITH_MIDDLE)
    spans = spans_of(pattern, path, tmp_path)
    assert (len(spans) > 1 and spans[-1][0] < start) if read_as == "span" else spans == [None]
    output = str(tmp_path / "out" / "o")
    err = refused(capsys, "run", f"--input={pattern}", f"--output={output}", *FAST)
    assert f"{path} at byte offset {start}: {CUT_MESSAGE}" in err, err
    assert_nothing_published(output)


@pytest.mark.parametrize("read_as", ["span", "whole", "gzip"])
def test_skip_corrupt_skips_the_cut_line_and_counts_it(tmp_path, capsys, read_as):
    pattern, path, other = inputs(tmp_path / "in", GOOD_WITH_MIDDLE + CUT, read_as)
    output = str(tmp_path / "out" / "o")
    succeeded(
        capsys,
        "run",
        f"--input={pattern}",
        f"--output={output}",
        "--skip_corrupt",
        "--quiet",
        *FAST,
    )
    skipped = manifest(output)["skipped"]
    assert skipped["records"] == 1 and skipped["bytes"] == len(CUT)
    assert skipped["problems"] == [
        f"{path} at byte offset {len(GOOD_WITH_MIDDLE)}: {CUT_MESSAGE} "
        "(Expecting ',' delimiter: character 10)"
    ]
    assert output_lines(output) == lines_of(GOOD_WITH_MIDDLE + other)  # the middle line too
    out, _ = succeeded(capsys, "info", f"--output={output}")
    assert "1 corrupt record(s) skipped" in out, out
    assert verify(pattern, output) == []  # verify --input skips it as the run did


@pytest.mark.parametrize("read_as", ["span", "whole", "gzip"])
def test_a_whole_json_last_line_without_newline_is_read_and_gets_its_newline(tmp_path, read_as):
    bare, path, _ = inputs(tmp_path / "bare" / "in", GOOD_WITH_MIDDLE + LAST, read_as)
    ended, _, _ = inputs(tmp_path / "ended" / "in", GOOD_WITH_MIDDLE + LAST + b"\n", read_as)
    outputs = [str(tmp_path / name / "out" / "o") for name in ("bare", "ended")]
    found = run_shuffle(bare, outputs[0], "--num_piles=3", "--seed=4")
    run_shuffle(ended, outputs[1], "--num_piles=3", "--seed=4")
    assert shard_bytes(outputs[0]) == shard_bytes(outputs[1])
    assert found["skipped"]["records"] == 0 and found["inputs"][-1]["records"] == 122
    assert output_lines(outputs[0])[LAST + b"\n"] == 1
    assert verify(bare, outputs[0]) == []


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_balance_reads_the_last_line_by_the_same_rule(tmp_path, capsys, name):
    """The counting pass (its own line finder) and pass 1 (reading by the lines it found)."""
    balance = ["--label_field=y", "--balance=uniform", "--num_piles=3", "--seed=2"]
    path, output = write(tmp_path / "cut" / name, GOOD + CUT), str(tmp_path / "cut" / "out" / "o")
    err = refused(capsys, "run", f"--input={path}", f"--output={output}", *balance, *FAST)
    assert f"{path} at byte offset {len(GOOD)}: {CUT_MESSAGE}" in err, err
    assert_nothing_published(output)

    skipped = run_shuffle(path, output, *balance, "--skip_corrupt")
    assert skipped["skipped"]["records"] == 1 and skipped["skipped"]["bytes"] == len(CUT)
    assert skipped["balance"]["records_before"] == {"a": 60, "b": 60}  # the cut line in no class
    assert verify(path, output) == []

    bare = write(tmp_path / "bare" / name, GOOD + LAST)
    ended = write(tmp_path / "ended" / name, GOOD + LAST + b"\n")
    outputs = [str(tmp_path / folder / "out" / "o") for folder in ("bare", "ended")]
    found = run_shuffle(bare, outputs[0], *balance)
    run_shuffle(ended, outputs[1], *balance)
    assert found["balance"]["records_before"] == {"a": 61, "b": 60}
    assert shard_bytes(outputs[0]) == shard_bytes(outputs[1])
    assert verify(bare, outputs[0]) == []


def test_verify_input_names_an_input_cut_after_the_run(tmp_path):
    path, output = write(tmp_path / "in" / "a.jsonl", GOOD + LAST + b"\n"), str(tmp_path / "o")
    run_shuffle(path, output, "--num_piles=3")
    write(tmp_path / "in" / "a.jsonl", GOOD + CUT)
    problems = verify(path, output)
    assert len(problems) == 1, problems
    assert f"{path} at byte offset {len(GOOD)}: {CUT_MESSAGE}" in problems[0], problems


def test_a_crlf_line_and_the_same_text_with_lf_are_two_records_under_dedup_exact(tmp_path):
    path = write(tmp_path / "in" / "a.jsonl", b'{"a": 1}\r\n{"a": 1}\n{"a": 1}\n{"a": 1}\r\n')
    output = str(tmp_path / "out" / "o")
    found = run_shuffle(path, output, "--dedup=exact", "--num_piles=1")
    assert found["dedup"]["records_kept"] == 2 and found["dedup"]["records_dropped"] == 2
    assert output_lines(output) == {b'{"a": 1}\r\n': 1, b'{"a": 1}\n': 1}
