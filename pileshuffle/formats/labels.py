"""A record's label as text, in any format: a Parquet column, a JSON key of a JSONL line, a
feature of the ``tf.train.Example`` a TFRecord holds, or a member of a tar sample.

Labels are compared as text so that every chunk's labels (and the quality report's and
``--balance``'s classes) agree: a string or bytes (UTF-8) as itself, a number as its JSON
text, several values as a JSON list; a Parquet null is ``"null"``. A record without the label is an ``InputError`` naming
the file (``path``).
"""

import json

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.fingerprint import binary_column_parts
from pileshuffle.formats import holder_of
from pileshuffle.formats.example import NotAnExample, feature_values
from pileshuffle.formats.tar import KEY_FIELD, sample_dict
from pileshuffle.names import FRAME_COLUMN, LINE_COLUMN, TAR_SAMPLE_COLUMN

__all__ = ["record_labels", "label_text"]


def label_text(values: list) -> str:
    """A label's values as the text labels compare by (module docstring)."""
    texts = [v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v for v in values]
    return str(texts[0]) if len(texts) == 1 else json.dumps(texts)


def record_labels(table: pa.Table, field: str, path: str) -> np.ndarray:
    """The label ``field`` of every record of a records table, as text (object array)."""
    if table.column_names == [LINE_COLUMN]:
        return _json_labels(table, field, path)
    if table.column_names in ([FRAME_COLUMN], [TAR_SAMPLE_COLUMN]):
        return _payload_labels(table, field, path)
    if field not in table.column_names:
        raise InputError(path, f"has no column {field!r} (columns: {', '.join(table.column_names)})")
    column = table.column(field)
    try:
        return column.cast(pa.string()).fill_null("null").to_numpy(zero_copy_only=False)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested types
        return np.array([json.dumps(v, default=str) for v in column.to_pylist()], dtype=object)


# JSON label types Arrow's reader extracts in C++ (only the label's field is built), with the
# text each has: a string as itself, an integer and a bool as their JSON text. 4x faster than
# json.loads per line (0.15 against 0.6 s per 91 MB); other types go line by line.
_ARROW_JSON_TYPES = (pa.string(), pa.int64(), pa.bool_())


def _json_labels(table, field, path):
    data, offsets = binary_column_parts(table.column(LINE_COLUMN))
    for kind in _ARROW_JSON_TYPES:
        column = _arrow_json_column(data, field, kind)
        if column is not None and len(column) == table.num_rows and not column.null_count:
            return column.cast(pa.string()).to_numpy(zero_copy_only=False).astype(object)
    return _json_labels_line_by_line(data, offsets, field, path)


def _arrow_json_column(data, field, kind):
    """Column ``field`` of the JSON lines ``data`` read as ``kind`` by Arrow, or None."""
    import pyarrow.json as pj

    options = pj.ParseOptions(explicit_schema=pa.schema([(field, kind)]), unexpected_field_behavior="ignore")
    try:
        read = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(use_threads=False,
                                                                                block_size=max(1 << 20, data.size + 1)),
                            parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return read.column(field).combine_chunks()


def _json_labels_line_by_line(data, offsets, field, path):
    data, out = data.to_pybytes(), []
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        try:
            value = json.loads(data[a:b])[field]
            out.append(value if isinstance(value, str) else json.dumps(value, default=str))
        except (ValueError, KeyError, TypeError, IndexError):
            raise InputError(path, f"a line ({data[a:b][:60]!r}) is not a JSON object with key {field!r}") from None
    return np.array(out, dtype=object)


def _payload_labels(table, field, path):
    """Labels from payloads: a ``tf.train.Example`` feature (TFRecord), a member (tar)."""
    holder = holder_of(table)
    data, offsets = binary_column_parts(table.column(0))
    data, out = data.to_pybytes(), []
    for index, (a, b) in enumerate(zip((offsets[:-1] + holder.before).tolist(), (offsets[1:] - holder.after).tolist())):
        if holder.name == "tar":
            sample = sample_dict(data[a:b])
            values = [sample[field]] if field in sample else None
            where = f"the sample {sample[KEY_FIELD]!r}"
        else:
            try:
                values = feature_values(data[a:b], field)
            except NotAnExample as error:
                raise InputError(path, f"record {index} of a chunk is no tf.train.Example ({error}): --label reads "
                                       "a feature of one; use --label_bytes START:END for other payloads") from None
            where = "a tf.train.Example"
        if values is None:
            raise InputError(path, f"{where} has no {'member' if holder.name == 'tar' else 'feature'} {field!r}")
        out.append(label_text(values))
    return np.array(out, dtype=object)
