"""A JSON line's label: the value of the first top-level key ``field`` of the line's object, as
text (a string as itself, a number, ``true``, ``false`` and ``null`` as their JSON text, a list or
an object as ``json.dumps`` writes it).

Three readers, each line going to the cheapest that can read it. A line's label never depends on
the lines read with it: the counting pass, pass 1 and ``quality`` cut a file into other blocks and
must find the same classes.

1. ``_matched``: lines whose object opens with keys that hold strings without escapes, numbers,
   ``true``, ``false`` or ``null``, none of them the key, until the key, whose value is a string
   without escapes, an integer, ``true``, ``false`` or ``null``: the lines of nearly every data set
   whose label is in the line's first ``_HEAD_BYTES``. One RE2 match per line says so (pyarrow's
   ``match_substring_regex`` on those bytes, DFA only), the first occurrence of the quoted key is
   then the key (no string before it is the key, and no quote is escaped), and the value is read
   after it with numpy: 0.08 s per 125 MB of 500-byte lines against 0.13 for ``extract_regex`` and
   0.23 for Arrow's JSON reader. Every key before it is a top-level key (no bracket opened), and so
   is it. The rest of the line is not parsed: a line broken after its label keeps its label.
2. ``_arrow_read``: Arrow's JSON reader over the other lines of a block (labels after nested
   values or later in the line, strings with escapes). It refuses a key named twice; such
   lines go to 3.
3. ``_line_by_line``: ``json.loads``, the first of a key named twice winning, as in 1.
"""

import functools
import json

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError

__all__ = ["json_labels", "NULL_CLASS", "KEEP_HINT"]

NULL_CLASS = "null"  # a null label's class, and a missing label's with keep_unlabeled
KEEP_HINT = "; with --balance, --keep_unlabeled makes such records the class null"

# Tier 1's grammar (JSON's, RFC 8259), on bytes (Arrow matches binary arrays as Latin-1).
_SPACE = r"[ \t\r\n]*"
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
# values whose text is their label ("-0" is 0 to json)
_PLAIN = r'"[^"\\]*"|0|-?[1-9][0-9]*|true|false|null'
_QUOTE = ord('"')


def _byte_set(members: bytes) -> np.ndarray:
    """A 256-entry table: ``table[byte]`` says whether ``byte`` is one of ``members``."""
    table = np.zeros(256, bool)
    table[np.frombuffer(members, np.uint8)] = True
    return table


_VALUE_ENDS, _BEFORE_VALUE = _byte_set(b",} \t\r\n"), _byte_set(b": \t\r\n")
# JSON label types Arrow's reader extracts in C++ (only the label's field is built), with the
# text each has: a string as itself, an integer and a bool as their JSON text.
_ARROW_JSON_TYPES = (pa.string(), pa.int64(), pa.bool_())
# Tier 1 matches a line's first bytes: RE2 then stops at them instead of scanning the rest of the
# line for a later match it will not take (0.09 against 0.13 s per 125 MB of 500-byte lines); a
# match there is the line's match (anchored at the start, no "$"). Lines whose label comes later
# go to Arrow's reader.
_HEAD_BYTES = 256


def json_labels(
    lines, field: str, path: str, first: int = 0, keep_unlabeled: bool = False
) -> pa.Array:
    """The labels (an Arrow string array) of ``lines`` (a binary array of JSON lines) of the file
    ``path``; ``first``: its lines before them. A line without the key, or no JSON object, is an
    ``InputError`` naming its line, or the class ``"null"`` with ``keep_unlabeled``."""
    import pyarrow.compute as pc

    if isinstance(lines, pa.ChunkedArray):
        lines = lines.chunk(0) if lines.num_chunks == 1 else lines.combine_chunks()
    labels = _matched(pc.binary_slice(lines, 0, _HEAD_BYTES), field)
    for read in (
        lambda rest, _: _arrow_read(rest, field, keep_unlabeled),
        lambda rest, at: _line_by_line(
            rest.to_pylist(), at + first + 1, field, path, keep_unlabeled
        ),
    ):
        unread = labels.is_null()
        if not unread.true_count:
            break
        at = np.flatnonzero(unread.to_numpy(zero_copy_only=False))
        found = read(lines.take(pa.array(at)), at)
        if found is not None:
            labels = pc.replace_with_mask(labels, unread, found)
    return labels


def _matched(lines: pa.Array, field: str) -> pa.Array:
    """Tier 1 (module docstring) over ``lines`` as given (the lines' heads): each line's label,
    or null where tier 1 cannot read it."""
    import pyarrow.compute as pc

    from pileshuffle.records.fingerprint import binary_column_parts

    key = json.dumps(field, ensure_ascii=False).encode()
    if b"\\" in key:  # a key JSON escapes is never matched as written
        return pa.nulls(len(lines), pa.string())
    rows = np.flatnonzero(
        pc.match_substring_regex(lines, _tier1_pattern(key)).to_numpy(zero_copy_only=False)
    )
    data, offsets = binary_column_parts(lines)
    raw = np.frombuffer(data, np.uint8)
    start = offsets[rows] + pc.find_substring(lines, key.decode()).to_numpy()[rows] + len(key)
    while len(start):  # over the colon and the spaces between key and value
        step = _BEFORE_VALUE[raw[start]]
        if not step.any():
            break
        start = start + step
    quoted = raw[start] == _QUOTE
    start = start + quoted
    end, going = start.copy(), np.arange(len(start))
    while len(going):  # to the closing quote, or the first comma, brace or space
        byte = raw[end[going]]
        going = going[~np.where(quoted[going], byte == _QUOTE, _VALUE_ENDS[byte])]
        end[going] += 1
    labels = _strings(raw, start, end)
    if len(rows) == len(lines):
        return labels
    found = np.zeros(len(lines), bool)
    found[rows] = True
    return pc.replace_with_mask(pa.nulls(len(lines), pa.string()), pa.array(found), labels)


@functools.lru_cache(maxsize=16)
def _tier1_pattern(key: bytes) -> str:
    """Tier 1's RE2 pattern for the quoted key ``key``: pairs of other keys and scalars, then it
    with a plain value, then a comma or the object's end."""
    other = _other_string(key)
    pair = rf"{other}{_SPACE}:{_SPACE}(?:{other}|{_NUMBER}|true|false|null){_SPACE},{_SPACE}"
    return (
        rf"^{_SPACE}\{{{_SPACE}(?:{pair})*{_literal(key)}{_SPACE}:{_SPACE}(?:{_PLAIN}){_SPACE}[,}}]"
    )


def _other_string(key: bytes) -> str:
    """An RE2 pattern of the JSON strings without escapes other than ``key`` (quotes included):
    a proper prefix of its text, a string leaving it at some byte, or one going on after it."""
    text = key[1:-1]
    plain = r'[^"\\]'
    ways = [_literal(text[:i]) for i in range(len(text))]
    ways += [rf'{_literal(text[:i])}[^"\\\x{text[i]:02x}]{plain}*' for i in range(len(text))]
    ways.append(rf"{_literal(text)}{plain}+")
    return '"(?:' + "|".join(ways) + ')"'


def _literal(text: bytes) -> str:
    """RE2 (Latin-1) pattern matching exactly the bytes ``text``."""
    return "".join(chr(c) if chr(c).isalnum() and c < 128 else f"\\x{c:02x}" for c in text)


def _strings(raw: np.ndarray, start: np.ndarray, end: np.ndarray) -> pa.Array:
    """An Arrow string array of ``raw[start[i]:end[i]]`` (UTF-8: the lines were checked)."""
    lengths = end - start
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    picked = raw[np.repeat(start - offsets[:-1], lengths) + np.arange(offsets[-1])]
    return pa.Array.from_buffers(
        pa.string(),
        len(lengths),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(picked)],
    )


def _arrow_read(lines: pa.Array, field: str, keep_unlabeled: bool):
    """Tier 2 (module docstring): the labels of all ``lines`` as Arrow reads them, or None."""
    import pyarrow.json as pj

    from pileshuffle.records.fingerprint import binary_column_parts

    data, _ = binary_column_parts(lines)
    for kind in _ARROW_JSON_TYPES:
        options = pj.ParseOptions(
            explicit_schema=pa.schema([(field, kind)]), unexpected_field_behavior="ignore"
        )
        try:
            column = (
                pj.read_json(
                    pa.BufferReader(data),
                    parse_options=options,
                    read_options=pj.ReadOptions(
                        use_threads=False, block_size=max(1 << 20, data.size + 1)
                    ),
                )
                .column(field)
                .combine_chunks()
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
            continue
        # Arrow skips blank lines: a count that differs goes line by line, which names them
        if len(column) == len(lines) and (keep_unlabeled or not column.null_count):
            return column.cast(pa.string()).fill_null(NULL_CLASS)
    return None


def _line_by_line(
    lines: list, numbers: np.ndarray, field: str, path: str, keep_unlabeled: bool
) -> pa.Array:
    """Tier 3 (module docstring): ``lines`` (bytes) read by ``json.loads``; ``numbers``: their
    line numbers in the file, counted from 1."""
    out = []
    for line, number in zip(lines, numbers.tolist()):
        try:
            value = json.loads(line, object_pairs_hook=_first_of_each_key)[field]
            out.append(value if isinstance(value, str) else json.dumps(value, default=str))
        except (ValueError, KeyError, TypeError, IndexError):
            if not keep_unlabeled:
                raise InputError(
                    path,
                    f"a line (line {number:,} of the file: {line.rstrip()[:60]!r}) is "
                    f"not a JSON object with key {field!r}{KEEP_HINT}",
                ) from None
            out.append(NULL_CLASS)
    return pa.array(out, pa.string())


def _first_of_each_key(pairs: list) -> dict:
    """A JSON object whose keys named twice keep their first value (tier 1's reading)."""
    found = {}
    for key, value in pairs:
        found.setdefault(key, value)
    return found
