"""Records without a label under ``--balance`` (issue 24): refused naming the file and the
record's place in it, in every format, or kept as the class ``null`` with ``--keep_unlabeled``;
and the counting pass's own readers (label column alone, JSONL lines unsplit, class codes and
JSONL line lengths kept for pass 1) give exactly pass 1's labels and lines; a file changed
between the passes is refused."""

import gzip
import io
import json
import subprocess
import sys
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_verified, refused, run_shuffle, shards

from pileshuffle.errors import InputError
from pileshuffle.formats import ReadReport, get_format
from pileshuffle.formats.labels import (
    ClassCodesReader,
    ClassCodesWriter,
    file_labels,
    kept_class_counts,
    label_counts,
    record_labels,
)
from pileshuffle.formats.tfrecord import frame

BALANCE = ["--label_field=y", "--balance=uniform", "--num_piles=2", "--seed=3"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def example(**features) -> bytes:
    """A serialized ``tf.train.Example``: ints as an int64_list, bytes as a bytes_list."""
    entries = b""
    for name, value in features.items():
        feature = (
            _field(3, _field(1, _varint(value)))
            if isinstance(value, int)
            else _field(1, _field(1, value))
        )
        entries += _field(1, _field(1, name.encode()) + _field(2, feature))
    return _field(1, entries)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def write_tar(path, samples):
    """``samples``: [(key, {extension: bytes})]."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for key, members in samples:
            for extension, data in members.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size, info.mtime = len(data), 0
                archive.addfile(info, io.BytesIO(data))


def inputs(root, fmt, holes):
    """Two files of 30 records each, classes 0/1/2 in 20/6/4 records; in the second file the
    records at the 1-based places ``holes`` have no label ``y``. Returns the input pattern."""
    root.mkdir()
    for part in range(2):
        labels = [0] * 20 + [1] * 6 + [2] * 4
        missing = holes if part == 1 else ()
        if fmt == "jsonl":
            write_jsonl(
                root / f"p{part}.jsonl",
                [{"i": i, **({} if i + 1 in missing else {"y": y})} for i, y in enumerate(labels)],
            )
        elif fmt == "tfrecord":
            records = [
                example(i=i, **({} if i + 1 in missing else {"y": y})) for i, y in enumerate(labels)
            ]
            (root / f"p{part}.tfrecord").write_bytes(b"".join(frame(r) for r in records))
        else:
            write_tar(
                root / f"p{part}.tar",
                [
                    (
                        f"{part}{i:05d}",
                        {"txt": b"%d" % i, **({} if i + 1 in missing else {"y": b"%d" % y})},
                    )
                    for i, y in enumerate(labels)
                ],
            )
    return str(root / f"*.{fmt}")


def cli_run(*args):
    done = subprocess.run(
        [sys.executable, "-m", "pileshuffle", "run", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("pileshuffle: error: ")]
    return done, errors


@pytest.mark.parametrize(
    "fmt, words",
    [
        ("jsonl", ["p1.jsonl", "line 7 of the file", "is not a JSON object with key 'y'"]),
        ("tfrecord", ["p1.tfrecord", "record 7 of the file", "has no feature 'y'"]),
        ("tar", ["p1.tar", "sample 7 of the file", "has no member 'y'"]),
    ],
)
def test_a_record_without_the_label_stops_the_run_naming_the_file_and_its_place(
    tmp_path, fmt, words
):
    pattern = inputs(tmp_path / "in", fmt, holes=(7, 12))
    undersample = ["--undersample"] if fmt == "tar" else []  # tar samples are not copied
    done, errors = cli_run(f"--input={pattern}", f"--output={tmp_path}/o", *BALANCE, *undersample)
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(word in errors[0] for word in words), errors
    assert not list(tmp_path.glob("o-*"))


def test_a_tfrecord_payload_that_is_no_example_is_refused_at_its_place(tmp_path):
    (tmp_path / "in").mkdir()
    records = [example(y=1)] * 3 + [b"\xff\xff not a protobuf"] + [example(y=0)] * 2
    (tmp_path / "in" / "a.tfrecord").write_bytes(b"".join(frame(r) for r in records))
    done, errors = cli_run(f"--input={tmp_path}/in/*.tfrecord", f"--output={tmp_path}/o", *BALANCE)
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert (
        "a.tfrecord" in errors[0] and "record 4 of the file is no tf.train.Example" in errors[0]
    ), errors


def test_a_parquet_file_without_the_column_is_refused_by_name_and_a_null_is_its_own_class(tmp_path):
    for name, table in (
        ("none", pa.table({"i": [4, 5], "z": ["a", "b"]})),
        ("nulls", pa.table({"i": [0, 1, 2, 3], "y": ["a", None, "a", "b"]})),
    ):
        (tmp_path / name).mkdir()
        pq.write_table(table, tmp_path / name / "a.parquet")
    done, errors = cli_run(f"--input={tmp_path}/none/*.parquet", f"--output={tmp_path}/o", *BALANCE)
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "none/a.parquet" in errors[0] and "has no column 'y' (columns: i, z)" in errors[0], (
        errors
    )
    written = run_shuffle(f"{tmp_path}/nulls/*.parquet", f"{tmp_path}/p", *BALANCE)
    assert written["balance"]["records_before"] == {"a": 2, "b": 1, "null": 1}
    assert written["balance"]["records_after"] == {"a": 2, "b": 2, "null": 2}
    written = run_shuffle(
        f"{tmp_path}/none/*.parquet", f"{tmp_path}/q", *BALANCE, "--keep_unlabeled"
    )
    assert (
        written["balance"]["records_before"] == written["balance"]["records_after"] == {"null": 2}
    )


@pytest.mark.parametrize("fmt", ["jsonl", "tfrecord", "tar"])
def test_keep_unlabeled_makes_records_without_the_label_the_class_null(tmp_path, fmt):
    pattern = inputs(tmp_path / "in", fmt, holes=(1, 7, 22, 30))  # one of class 1, two of class 2
    prefix = str(tmp_path / "out" / "t")
    # tar: copies of a sample share its key, which one shard cannot hold twice: undersample
    under = fmt == "tar"
    written = run_shuffle(
        pattern, prefix, *BALANCE, "--keep_unlabeled", *(["--undersample"] if under else [])
    )
    assert written["balance"]["records_before"] == {"0": 38, "1": 11, "2": 7, "null": 4}
    target = 4 if under else 38
    assert written["balance"]["records_after"] == {
        "0": target,
        "1": target,
        "2": target,
        "null": target,
    }
    assert (
        written["totals"]["records"] == 4 * target and written["options"]["keep_unlabeled"] is True
    )
    # verify --input recounts with the unlabeled records as the class null
    assert_verified(pattern, prefix)
    if fmt == "jsonl":
        kept = [json.loads(line) for path in shards(prefix) for line in open(path)]
        assert sum("y" not in r for r in kept) == 38
        from pileshuffle.commands.quality import main as quality_main

        # quality repeats the same copies
        assert (
            quality_main(
                [
                    f"--input={pattern}",
                    f"--output={prefix}",
                    f"--report={tmp_path / 'r'}",
                    "--sample=1000",
                ]
            )
            == 0
        )


def test_keep_unlabeled_puts_a_missing_key_a_json_null_and_an_unreadable_line_in_one_class(
    tmp_path,
):
    (tmp_path / "in").mkdir()
    write_jsonl(
        tmp_path / "in" / "a.jsonl",
        [{"y": "cat"}] * 6 + [{"y": None}, {"x": 1}, "[1, 2]", "", {"y": "dog"}],
    )
    written = run_shuffle(f"{tmp_path}/in/*.jsonl", f"{tmp_path}/o", *BALANCE, "--keep_unlabeled")
    # the blank line is no record
    assert written["balance"]["records_before"] == {
        "cat": 6,
        "dog": 1,
        "null": 3,
    }
    assert written["skipped"]["blank_lines"] == 1


def test_keep_unlabeled_is_refused_where_it_means_nothing(tmp_path, capsys):
    pattern = inputs(tmp_path / "in", "jsonl", holes=())
    out = [f"--input={pattern}", f"--output={tmp_path}/o"]
    assert "only means something with --balance" in refused(
        capsys, "run", *out, "--keep_unlabeled", option="--keep_unlabeled"
    )
    # a store takes it with --balance
    assert "only means something with --balance" in refused(
        capsys, "run", *out, "--keep_unlabeled", "--layout=store", option="--keep_unlabeled"
    )


# -- the counting pass reads what pass 1 reads --------------------------------------------------------


def pass1_labels(fmt, path, field, chunk_bytes, keep_unlabeled=False):
    """The labels pass 1 parses: ``record_labels`` of every chunk ``read_chunks`` gives."""
    out, first = [], 0
    for table in fmt.read_chunks(path, chunk_bytes, False, ReadReport()):
        out += record_labels(table, field, path, first, keep_unlabeled).tolist()
        first += table.num_rows
    return out


def counted_labels(fmt, path, field, chunk_bytes, keep_unlabeled=False):
    out = []
    for labels in file_labels(fmt, path, field, chunk_bytes, False, ReadReport(), keep_unlabeled):
        out += labels.to_pylist() if isinstance(labels, pa.Array) else labels.tolist()
    return out


def test_the_counting_pass_reads_the_labels_pass_1_reads_in_every_format(tmp_path):
    rows = [{"y": i % 3} for i in range(500)] + [
        {"y": "s"},
        {"y": [1, "a"]},
        {"y": None},
        {"y": True},
    ]
    write_jsonl(tmp_path / "a.jsonl", rows)
    # a last line without its newline
    (tmp_path / "b.jsonl").write_text('{"y": 1}\n{"y": "x"}\n{"y": 2}')
    pq.write_table(
        pa.table({"y": pa.array([1, None, 3] * 300, pa.int32()), "z": [b"x" * 50] * 900}),
        tmp_path / "c.parquet",
    )
    pq.write_table(
        pa.table({"y": pa.array([[1, 2], None, []] * 30, pa.list_(pa.int64()))}),
        tmp_path / "d.parquet",
    )
    (tmp_path / "e.tfrecord").write_bytes(
        b"".join(frame(example(y=i % 4, t=b"x" * i)) for i in range(300))
    )
    write_tar(
        tmp_path / "f.tar",
        [(f"k{i:04d}", {"y": b"%d" % (i % 5), "txt": b"x" * i}) for i in range(200)],
    )
    for name in ("a.jsonl", "b.jsonl", "c.parquet", "d.parquet", "e.tfrecord", "f.tar"):
        fmt = get_format(name.rsplit(".", 1)[1])
        for chunk_bytes in (1000, 16 << 20):
            path = str(tmp_path / name)
            assert counted_labels(fmt, path, "y", chunk_bytes) == pass1_labels(
                fmt, path, "y", chunk_bytes
            ), name


def test_lines_are_numbered_from_the_start_of_the_file_across_blocks(tmp_path):
    write_jsonl(
        tmp_path / "a.jsonl", [{"y": 1, "pad": "x" * 30}] * 2345 + [{"z": 1}] + [{"y": 2}] * 10
    )
    path, fmt = str(tmp_path / "a.jsonl"), get_format("jsonl")
    for read in (counted_labels, pass1_labels):
        with pytest.raises(
            InputError,
            match=r"a line \(line 2,346 of the file: .*\) is not a JSON object with key 'y'",
        ):
            read(fmt, path, "y", 4096)
    labels = counted_labels(fmt, path, "y", 4096, keep_unlabeled=True)
    assert labels.count("null") == 1 and labels.index("null") == 2345


def test_class_codes_give_pass_1_the_labels_and_counts_of_the_counting_pass(tmp_path):
    codes, classes = str(tmp_path / "s.codes"), str(tmp_path / "s.classes.json")
    writer = ClassCodesWriter(codes, classes)
    chunks = [
        pa.array(["b", "a", "b"]),
        np.array(["c", "a"], dtype=object),
        pa.array([], pa.string()),
        pa.array(["c"]),
    ]
    for chunk in chunks:
        writer.add(chunk)
    assert (
        writer.close()
        == {"a": 2, "b": 2, "c": 2}
        == label_counts(pa.array(["b", "a", "b", "c", "a", "c"]))
    )
    reader = ClassCodesReader(codes, classes, None, "in.jsonl")
    named = [reader.classes[c] for n in (4, 2) for c in reader.take(n).tolist()]
    assert named == ["b", "a", "b", "c", "a", "c"]
    reader.close()
    reader = ClassCodesReader(codes, classes, None, "in.jsonl")
    with pytest.raises(InputError, match="in.jsonl: has more records than the first pass counted"):
        reader.take(7)
    reader = ClassCodesReader(codes, classes, None, "in.jsonl")
    reader.take(5)
    with pytest.raises(InputError, match="in.jsonl: has fewer records than the first pass counted"):
        reader.close()


def _kept_lines(tmp_path, path, chunk_bytes):
    """The counting pass over the JSONL file ``path`` (``kept_class_counts``): the files it keeps
    for pass 1, ``(codes, classes, lines)``."""
    kept = tuple(str(tmp_path / name) for name in ("s.codes", "s.classes.json", "s.lines"))
    kept_class_counts(get_format("jsonl"), str(path), "y", chunk_bytes, ClassCodesWriter(*kept))
    return kept


def _lines_read(chunks) -> list:
    """The lines of ``read_placed``-style ``(table, places)`` chunks, checked to be at their places."""
    lines, place = [], 0
    for table, places in chunks:
        for line, at in zip(table.column(0).to_pylist(), places.tolist()):
            assert at == place
            lines.append(line)
            place += len(line)
    return lines


@pytest.mark.parametrize(
    "text",
    [
        "".join(json.dumps({"y": i % 3, "pad": "x" * (i % 41)}) + "\n" for i in range(400)),
        '{"y": 1}\n{"y": "a"}\n{"y": 2, "t": "no newline at the end"}',
        json.dumps({"y": 0, "long": "x" * 5000})
        + "\n"
        + '{"y": 1}\n' * 3,  # a line longer than a block
        "",
    ],
)
@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_pass_1_reads_a_jsonl_file_by_the_lines_the_counting_pass_found(tmp_path, text, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    fmt = get_format("jsonl")
    for chunk_bytes in (700, 16 << 20):
        codes, classes, lines = _kept_lines(tmp_path, path, chunk_bytes)
        reader = ClassCodesReader(codes, classes, lines, str(path))
        tables = list(reader.chunks(fmt, chunk_bytes))
        assert _lines_read(tables) == _lines_read(fmt.read_placed(str(path), chunk_bytes))
        assert all(t.nbytes <= chunk_bytes + 5100 for t, _ in tables)
        reader.take(sum(t.num_rows for t, _ in tables))
        reader.close()


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.replace(b'"y": 7', b'"y": 70', 1),  # a line grew
        lambda b: b + b'{"y": 1}\n',  # a line more
        lambda b: b[: b.rindex(b"{")],  # the last line gone
        lambda b: b[:-5],  # cut in the last line
        lambda b: b[:-2] + b"\n",  # the last line a byte shorter
    ],
)
def test_a_jsonl_file_changed_after_the_counting_pass_is_refused_by_pass_1(tmp_path, change):
    path = tmp_path / "a.jsonl"
    write_jsonl(path, [{"y": i % 9, "i": i} for i in range(300)])
    codes, classes, lines = _kept_lines(tmp_path, path, 1000)
    path.write_bytes(change(path.read_bytes()))
    reader = ClassCodesReader(codes, classes, lines, str(path))
    with pytest.raises(
        InputError, match="a.jsonl: changed during the run: its lines are not where the first pass"
    ):
        for table, _ in reader.chunks(get_format("jsonl"), 1000):
            reader.take(table.num_rows)


@pytest.mark.parametrize(
    "policy, undersample", [("uniform", False), ("sqrt", True), ("a=1,b=3,c=2,d=1", False)]
)
def test_copies_from_class_codes_are_the_class_plans_own(policy, undersample):
    from pileshuffle.engine.balance import Policy, class_plan
    from pileshuffle.engine.transforms.assign import class_codes

    rng = np.random.default_rng(7)
    classes = ["a", "b", "c", "d"]
    sources = {
        s: rng.choice(4, size=int(rng.integers(1, 3000)), p=[0.6, 0.25, 0.1, 0.05]).astype(
            np.uint32
        )
        for s in range(3)
    }
    counts = [
        (s, {classes[c]: int(n) for c, n in enumerate(np.bincount(codes, minlength=4)) if n})
        for s, codes in sources.items()
    ]
    plan = class_plan(counts, Policy.parse(policy, undersample), seed=11)
    for s, codes in sources.items():
        from_labels, from_codes = plan.copier(s), plan.copier(s)
        for chunk in np.array_split(codes, 5):
            labels = np.array([classes[c] for c in chunk.tolist()], dtype=object)
            assert from_codes(chunk, classes).tolist() == from_labels(*class_codes(labels)).tolist()
