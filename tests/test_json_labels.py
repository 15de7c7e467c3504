"""A JSON line's label (``formats/json_labels.py``): the RE2 match, Arrow's JSON reader and
``json.loads`` give every line the same label, whichever reads it and whatever lines share its
block; the match reads only top-level keys, and a key named twice keeps its first value."""

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.errors import InputError
from pileshuffle.formats.json_labels import _arrow_read, _line_by_line, _matched, json_labels


def lines_array(lines) -> pa.Array:
    return pa.array(
        [line if isinstance(line, bytes) else line.encode() for line in lines], pa.binary()
    )


def by_json(lines, field="y", keep_unlabeled=True):
    """Each line's label as ``json.loads`` reads it (tier 3), one line at a time."""
    return _line_by_line(
        [line.encode() if isinstance(line, str) else line for line in lines],
        np.arange(1, len(lines) + 1),
        field,
        "x.jsonl",
        keep_unlabeled,
    ).to_pylist()


scalars = st.one_of(
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.sampled_from(["cat", 'a"b', "é", "{", "]", "y", "\\", "\u2028"]),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.sampled_from(["y", "z"]), scalars, max_size=2),
)


@st.composite
def json_lines(draw):
    """A JSON object line whose keys may repeat, nest, and hold the label's name as a value."""
    pairs = draw(st.lists(st.tuples(st.sampled_from(["y", "z", "w", "label"]), values), max_size=5))
    body = ", ".join(
        f"{json.dumps(k)}{draw(st.sampled_from([':', ' : ', ':  ']))}"
        f"{json.dumps(v, ensure_ascii=draw(st.booleans()))}"
        for k, v in pairs
    )
    return (
        draw(st.sampled_from(["", " "]))
        + "{"
        + body
        + "}"
        + draw(st.sampled_from(["\n", " \n", "\r\n"]))
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(json_lines(), min_size=1, max_size=12), st.integers(0, 11))
def test_every_reader_gives_a_line_the_label_json_loads_gives_it_whatever_block_it_is_in(
    lines, cut
):
    expected = by_json(lines)
    assert (
        json_labels(lines_array(lines), "y", "x.jsonl", keep_unlabeled=True).to_pylist() == expected
    )
    head, tail = lines[:cut], lines[cut:]  # another block cut: the same labels
    parts = [
        json_labels(lines_array(p), "y", "x.jsonl", keep_unlabeled=True).to_pylist()
        for p in (head, tail)
        if p
    ]
    assert sum(parts, []) == expected
    matched = _matched(lines_array(lines), "y").to_pylist()
    assert all(m is None or m == e for m, e in zip(matched, expected))
    arrow = _arrow_read(lines_array(lines), "y", keep_unlabeled=True)
    assert arrow is None or arrow.to_pylist() == expected


def test_the_match_reads_plain_top_level_labels_and_leaves_the_rest_to_the_parsers():
    lines = [
        '{"index": 1, "y": 4, "text": "abc"}\n',  # the usual line: matched
        '{"a": "ya", "y": "cat"}\n',  # a string starting with the name first: matched at the key
        '{"a": "y", "y": "cat"}\n',  # the name as a value first: not matched (its first "y" is no key)
        '{"meta": {"y": 5}, "y": 3}\n',  # a nested y first: not matched (Arrow reads 3)
        '{"y": "a\\"b"}\n',  # an escape: not matched
        '{"y": 1.50}\n',  # json's text of 1.50 is 1.5: not matched
        '{"y": -0}\n',
        '{"y": null}\n',
        '{"y": true}\n',
        '{"y": [1, 2]}\n',
        '{"t": "\\"y\\": 9", "y": 2}\n',
    ]
    assert _matched(lines_array(lines), "y").to_pylist() == [
        "4",
        "cat",
        None,
        None,
        None,
        None,
        None,
        "null",
        "true",
        None,
        None,
    ]
    assert json_labels(lines_array(lines), "y", "x").to_pylist() == [
        "4",
        "cat",
        "cat",
        "3",
        'a"b',
        "1.5",
        "0",
        "null",
        "true",
        "[1, 2]",
        "2",
    ]


def test_a_key_named_twice_keeps_its_first_value_in_every_reader():
    lines = ['{"y": 1, "y": 2}\n', '{"y": 1.5, "y": 2}\n', '{"m": {}, "y": "a", "y": "b"}\n']
    assert json_labels(lines_array(lines), "y", "x").to_pylist() == ["1", "1.5", "a"]
    assert by_json(lines) == ["1", "1.5", "a"]


def test_a_line_the_match_cannot_read_is_named_by_its_line_in_the_file():
    lines = ['{"y": 1}\n'] * 5 + ['{"z": {"y": 1}}\n'] + ['{"y": 1}\n'] * 3
    with pytest.raises(InputError, match=r"line 106 of the file: .*not a JSON object with key 'y'"):
        json_labels(lines_array(lines), "y", "x.jsonl", first=100)
    assert (
        json_labels(lines_array(lines), "y", "x.jsonl", keep_unlabeled=True).to_pylist()[5]
        == "null"
    )


def test_a_line_broken_after_its_label_keeps_the_label_and_one_broken_before_it_is_refused():
    assert json_labels(lines_array(['{"y": 7, "t": oops\n']), "y", "x").to_pylist() == ["7"]
    with pytest.raises(InputError, match="line 1 of the file"):
        json_labels(lines_array(['{"t": oops, "y": 7}\n']), "y", "x")


@pytest.mark.parametrize("field", ['a"b', "a.b", "é", "(x)*", "y\\"])
def test_field_names_with_pattern_and_json_characters_are_read_as_written(field):
    lines = [
        json.dumps({field: "v", "k": 1}) + "\n",
        json.dumps({"k": 1, field: 2}, ensure_ascii=False) + "\n",
    ]
    assert json_labels(lines_array(lines), field, "x").to_pylist() == ["v", "2"]
    other = [json.dumps({"ab" if field == "a.b" else "zz": 1, field: 3}) + "\n"]
    assert json_labels(lines_array(other), field, "x").to_pylist() == ["3"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=40),
    st.booleans(),
    st.integers(4, 64),
)
def test_line_views_give_the_lines_of_line_blocks_from_one_reused_buffer(
    tmp_path_factory, lines, last_newline, chunk_bytes
):
    """Lines longer than a block, a last line without its newline, and gzip (line_blocks' path)."""
    import gzip

    from pileshuffle.formats.text import line_blocks, line_views

    if not last_newline:  # read when whole JSON (a cut one: test_jsonl_last_line.py)
        lines = lines[:-1] + [b"%d" % len(lines[-1])]
    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    root = tmp_path_factory.mktemp("lines")
    (root / "a.jsonl").write_bytes(data)
    (root / "b.jsonl.gz").write_bytes(gzip.compress(data))
    expected = [bytes(buf[:end]) for buf, end, _ in line_blocks(str(root / "a.jsonl"), chunk_bytes)]
    expected = [line + b"\n" for line in b"".join(expected).split(b"\n")[:-1]]
    for name in ("a.jsonl", "b.jsonl.gz"):
        got = []
        for views, raw in line_views(str(root / name), chunk_bytes):
            got += views.to_pylist()  # copied out before the next block overwrites the buffer
            assert raw.tobytes() == b"".join(views.to_pylist())
        parts = data.split(b"\n")
        assert (
            got
            == expected
            == [part + b"\n" for part in (parts[:-1] if parts[-1] == b"" else parts)]
        )


def test_the_counting_pass_names_a_line_that_is_no_text_as_pass_1_does(tmp_path):
    from pileshuffle.formats import get_format
    from pileshuffle.formats.labels import file_labels

    (tmp_path / "a.jsonl").write_bytes(b'{"y": 1}\n' * 3 + b'{"y": "\xff\xfe"}\n' + b'{"y": 2}\n')
    with pytest.raises(InputError, match=r"line 4 is not text \(invalid UTF-8"):
        list(file_labels(get_format("jsonl"), str(tmp_path / "a.jsonl"), "y", 1 << 20))


def test_a_label_past_the_lines_first_bytes_is_read_by_the_parsers():
    from pileshuffle.formats.json_labels import _HEAD_BYTES

    lines = [
        '{"t": "' + "x" * _HEAD_BYTES + '", "y": 5}\n',
        '{"y": 6, "t": "' + "x" * _HEAD_BYTES + '"}\n',
    ]
    heads = pa.array([line.encode()[:_HEAD_BYTES] for line in lines], pa.binary())
    assert _matched(heads, "y").to_pylist() == [None, "6"]
    assert json_labels(lines_array(lines), "y", "x").to_pylist() == ["5", "6"] == by_json(lines)
