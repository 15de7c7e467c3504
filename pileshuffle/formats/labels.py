"""A record's label as text, in any format: a Parquet column, a JSON key of a JSONL line, a
feature of the ``tf.train.Example`` a TFRecord holds, or a member of a tar sample.

Labels are compared as text so that every chunk's labels (and the quality report's and
``--balance``'s classes) agree: a string or bytes (UTF-8) as itself, a number as its JSON
text, several values as a JSON list; a Parquet or JSON null is ``"null"``. A record without
the label, or whose label cannot be read (a line that is no JSON object, a payload that is no
``tf.train.Example``), is an ``InputError`` naming the file (``path``) and the record's place
in it (line, record or sample number: ``first`` is how many records of the file come before
the table); with ``keep_unlabeled`` it is the class ``"null"`` instead (``NULL_CLASS``).

``file_labels`` reads only what the labels need (a Parquet file's label column; a JSONL line's label
is found without parsing the line when it can be: ``json_labels``): ``--balance``'s counting pass.
Where labels cost a parse (JSON, ``tf.train.Example``, tar headers) the counting pass keeps them for
pass 1 (``ClassCodesWriter``, ``ClassCodesReader``: 4 bytes a record), so each label is parsed once;
of JSONL it keeps each line's length too (4 more), so each line is found once.
"""

import json

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.formats import holder_of
from pileshuffle.formats.base import ReadReport, open_input, read_up_to
from pileshuffle.formats.example import NotAnExample, feature_values
from pileshuffle.formats.json_labels import KEEP_HINT, NULL_CLASS, json_labels
from pileshuffle.formats.tar import KEY_FIELD, sample_dict
from pileshuffle.formats.text import check_text, json_records, known_line_chunks, line_views
from pileshuffle.io import storage
from pileshuffle.names import FRAME_COLUMN, LINE_COLUMN, TAR_SAMPLE_COLUMN
from pileshuffle.records.fingerprint import binary_column_parts, binary_lengths

__all__ = [
    "record_labels",
    "label_text",
    "file_labels",
    "label_counts",
    "sampled_label_counts",
    "NULL_CLASS",
    "ClassCodesWriter",
    "ClassCodesReader",
    "kept_class_counts",
]


def label_text(values: list) -> str:
    """A label's values as the text labels compare by (module docstring)."""
    texts = [v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v for v in values]
    return str(texts[0]) if len(texts) == 1 else json.dumps(texts)


def record_labels(
    table: pa.Table, field: str, path: str, first: int = 0, keep_unlabeled: bool = False
) -> np.ndarray:
    """The label ``field`` of every record of a records table, as text (object array);
    ``first``: the records of ``path`` before the table (module docstring)."""
    return _objects(_labels(table, field, path, first, keep_unlabeled))


def file_labels(
    fmt,
    path: str,
    field: str,
    chunk_bytes: int,
    skip_corrupt=False,
    report=None,
    keep_unlabeled=False,
):
    """Yield the labels of every record of the file ``path`` in order, a chunk at a time (Arrow
    string arrays or object arrays: ``label_counts`` counts either), reading no more than the
    labels need: the same records and labels as ``record_labels`` of ``fmt.read_chunks``."""
    if fmt.name == "parquet":
        yield from _parquet_file_labels(path, field, keep_unlabeled)
    elif fmt.name == "jsonl":
        blocks = _jsonl_file_labels(path, field, chunk_bytes, keep_unlabeled, skip_corrupt, report)
        yield from (labels for labels, _ in blocks)
    else:
        first = 0
        for table in fmt.read_chunks(path, chunk_bytes, skip_corrupt, report):
            yield _labels(table, field, path, first, keep_unlabeled)
            first += table.num_rows


def sampled_label_counts(fmt, paths: list, field: str, sample_bytes: int) -> dict:
    """``{class: records}`` of the first labels (about ``sample_bytes`` of records, a Parquet file's
    first batch of its label column) of each file of ``paths``: an estimate of the classes' shares;
    missing labels are the class ``"null"``, a file that cannot be read is left out."""
    counts = {}
    for path in paths:
        labels = file_labels(fmt, path, field, sample_bytes, keep_unlabeled=True)
        try:
            for label, n in label_counts(next(labels, [])).items():
                counts[label] = counts.get(label, 0) + n
        except InputError:
            continue
        finally:
            labels.close()
    return counts


def label_counts(labels) -> dict:
    """``{class: records}`` of one chunk's labels (``file_labels``' or ``record_labels``')."""
    if isinstance(labels, pa.Array):
        import pyarrow.compute as pc

        found = pc.value_counts(labels)
        return dict(zip(found.field("values").to_pylist(), found.field("counts").to_pylist()))
    names, found = np.unique(np.asarray(labels, dtype=object).astype(str), return_counts=True)
    return dict(zip(names.tolist(), found.tolist()))


class ClassCodesWriter:
    """One source's labels as the counting pass reads them, for pass 1: each record's class
    code (uint32, little-endian, written as it comes) to ``codes_path``, on ``close`` the classes
    in code order (a JSON list) to ``classes_path``, and with ``lines_path`` (JSONL) each line's
    length with its newline (uint32), so that pass 1 need not look for the lines again.
    ``close`` returns ``{class: records}``."""

    def __init__(self, codes_path: str, classes_path: str, lines_path: str = None):
        self._classes_path, self._codes, self._counts = classes_path, {}, np.zeros(0, np.int64)
        self._handle = storage.open_write(codes_path)
        self._lines = None if lines_path is None else storage.open_write(lines_path)

    def add(self, labels, line_lengths=None):
        """One chunk's labels (``file_labels``' or ``record_labels``'), and its lines' lengths
        when the writer keeps them."""
        if isinstance(labels, pa.Array):
            encoded = labels.dictionary_encode()
            names, inverse = (
                encoded.dictionary.to_pylist(),
                encoded.indices.to_numpy(zero_copy_only=False),
            )
        else:
            names, inverse = np.unique(np.asarray(labels, dtype=object), return_inverse=True)
            names = names.tolist()
        mapping = np.array(
            [self._codes.setdefault(name, len(self._codes)) for name in names], dtype="<u4"
        )
        codes = mapping[inverse.reshape(-1)] if len(names) else np.zeros(0, "<u4")
        self._handle.write(codes.tobytes())
        if self._lines is not None:
            self._lines.write(np.asarray(line_lengths, "<u4").tobytes())
        found = np.bincount(codes, minlength=len(self._codes))
        self._counts = found + np.pad(self._counts, (0, len(found) - len(self._counts)))

    def close(self) -> dict:
        self._handle.close()
        if self._lines is not None:
            self._lines.close()
        storage.write_whole(self._classes_path, json.dumps(list(self._codes)).encode())
        return dict(sorted(zip(self._codes, self._counts.tolist())))


def kept_class_counts(
    fmt,
    path: str,
    field: str,
    chunk_bytes: int,
    writer: ClassCodesWriter,
    skip_corrupt=False,
    keep_unlabeled=False,
) -> dict:
    """``--balance``'s counting pass over the file ``path``: every record's class (and every
    JSONL line's length) to ``writer``; its ``{class: records}``."""
    if fmt.name == "jsonl":
        blocks = _jsonl_file_labels(path, field, chunk_bytes, keep_unlabeled, skip_corrupt)
        for labels, lines in blocks:
            writer.add(labels, binary_lengths(lines))
    else:
        for labels in file_labels(
            fmt, path, field, chunk_bytes, skip_corrupt, ReadReport(), keep_unlabeled
        ):
            writer.add(labels)
    return writer.close()


class ClassCodesReader:
    """Pass 1's side of ``ClassCodesWriter`` (the same paths, then the source ``path``): the
    class codes of the next ``count`` records (``take``) and the classes they index
    (``classes``); with ``lines_path`` the source's tables read by the lines the counting pass
    found (``chunks``). A file that changed between the passes is an ``InputError``."""

    def __init__(self, codes_path: str, classes_path: str, lines_path: str, path: str):
        self.classes = storage.read_json(classes_path)
        self._handle, self._path = storage.open_read(codes_path, "uncompressed"), path
        self._codes_path, self._lines_path = codes_path, lines_path
        self._lines = None if lines_path is None else storage.open_read(lines_path, "uncompressed")
        self._lengths, self._lengths_ended = np.zeros(0, "<u4"), False

    def chunks(self, fmt, chunk_bytes: int, skip_corrupt=False, report=None):
        """The source's ``(table, positions)`` as ``fmt.read_placed`` gives them."""
        if self._lines is None:
            return fmt.read_placed(self._path, chunk_bytes, skip_corrupt, report)
        return known_line_chunks(self._path, self._next_lengths, chunk_bytes, skip_corrupt, report)

    def _next_lengths(self, max_bytes: int) -> np.ndarray:
        """The lengths of the next lines that fit in ``max_bytes`` (at least one; none at the
        end)."""
        while not self._lengths_ended and int(self._lengths.sum(dtype=np.int64)) < max_bytes:
            data = read_up_to(self._lines, self._lines_path, 4 * _LENGTHS_READ)
            self._lengths_ended = len(data) < 4 * _LENGTHS_READ
            self._lengths = np.concatenate((self._lengths, np.frombuffer(data, "<u4")))
        fit = max(
            1,
            int(np.searchsorted(np.cumsum(self._lengths, dtype=np.int64), max_bytes, side="right")),
        )
        taken, self._lengths = self._lengths[:fit], self._lengths[fit:]
        return taken

    def take(self, count: int) -> np.ndarray:
        """The uint32 class codes of the next ``count`` records."""
        data = read_up_to(self._handle, self._codes_path, 4 * count)
        if len(data) < 4 * count:
            raise InputError(
                self._path,
                "has more records than the first pass counted: it changed during the run",
            )
        return np.frombuffer(data, "<u4")

    def close(self):
        extra = self._handle.read(1)
        self._handle.close()
        if self._lines is not None:
            self._lines.close()
        if extra:
            raise InputError(
                self._path,
                "has fewer records than the first pass counted: it changed during the run",
            )


_LENGTHS_READ = 1 << 16  # line lengths pass 1 reads at a time (256 KiB)


def _objects(labels) -> np.ndarray:
    if isinstance(labels, pa.Array):
        return labels.to_numpy(zero_copy_only=False).astype(object)
    return labels


def _labels(table, field, path, first, keep_unlabeled):
    if table.column_names == [LINE_COLUMN]:
        return json_labels(table.column(LINE_COLUMN), field, path, first, keep_unlabeled)
    if table.column_names in ([FRAME_COLUMN], [TAR_SAMPLE_COLUMN]):
        return _payload_labels(table, field, path, first, keep_unlabeled)
    if field not in table.column_names:
        if keep_unlabeled:
            return pa.array(np.full(table.num_rows, NULL_CLASS, dtype=object), pa.string())
        raise InputError(
            path, f"has no column {field!r} (columns: {', '.join(table.column_names)}){KEEP_HINT}"
        )
    return _column_labels(table.column(field))


def _column_labels(column):
    """A column's labels: an Arrow string array (numbers as their text, nulls ``"null"``)."""
    try:
        labels = column.cast(pa.string()).fill_null(NULL_CLASS)
        return labels.combine_chunks() if isinstance(labels, pa.ChunkedArray) else labels
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested types
        return np.array([json.dumps(v, default=str) for v in column.to_pylist()], dtype=object)


def _parquet_file_labels(path, field, keep_unlabeled):
    """The label column of a Parquet file alone (a projection: no other column is read)."""
    import pyarrow.parquet as pq

    with open_input(path, "uncompressed") as handle:
        try:
            parquet = pq.ParquetFile(handle)
        except (pa.ArrowInvalid, OSError) as error:
            raise InputError(path, f"is not a Parquet file ({error})") from error
        names = parquet.schema_arrow.names
        if field not in names:
            if keep_unlabeled:
                yield pa.array(
                    np.full(parquet.metadata.num_rows, NULL_CLASS, dtype=object), pa.string()
                )
                return
            raise InputError(
                path, f"has no column {field!r} (columns: {', '.join(names)}){KEEP_HINT}"
            )
        try:
            for batch in parquet.iter_batches(
                batch_size=1 << 16, columns=[field], use_threads=False
            ):
                yield _column_labels(batch.column(0))
        except (pa.ArrowInvalid, OSError) as error:
            raise InputError(path, f"cannot be read as Parquet ({error})") from error


# The counting pass's JSONL blocks: its reused buffer and each block's arrays stay in the CPU's
# caches (the whole pass over 1 GB: 0.85 CPU-s at 4 MiB, 0.93 at 2 and 8, 1.2 at 16, 1.4 at 32).
_LABEL_BLOCK_BYTES = 4 << 20


def _jsonl_file_labels(path, field, chunk_bytes, keep_unlabeled, skip_corrupt=False, report=None):
    """``(labels, lines)`` for each block of a JSONL file, of at most ``_LABEL_BLOCK_BYTES``, read
    into one reused buffer (``text.line_views``: keep only what is made of ``lines``; a cut last
    line refused, or skipped under ``skip_corrupt``), its lines checked to be text only when a
    label fails; else pass 1 checks them (1.1 against 1.55 CPU-s per GB at 16 MiB)."""
    first = base = 0
    for lines, raw in line_views(path, min(chunk_bytes, _LABEL_BLOCK_BYTES), skip_corrupt, report):
        offsets = np.frombuffer(lines.buffers()[1], np.int32)[
            lines.offset : lines.offset + len(lines) + 1
        ]
        # the records among the lines (json_records: no BOM, no blank line), as pass 1 reads them
        try:
            records = json_records(raw, offsets, base)[0].column(0)
            labels = json_labels(records, field, path, first, keep_unlabeled)
            labels.validate(full=True)
        except (InputError, pa.ArrowInvalid):  # a line that is no text is named as pass 1 names it
            check_text(path, raw.tobytes(), offsets, first)
            raise
        yield labels, lines
        first, base = first + len(lines), base + len(raw)


def _payload_labels(table, field, path, first, keep_unlabeled):
    """Labels from payloads: a ``tf.train.Example`` feature (TFRecord), a member (tar)."""
    holder = holder_of(table)
    data, offsets = binary_column_parts(table.column(0))
    data, out = data.to_pybytes(), []
    for index, (a, b) in enumerate(
        zip((offsets[:-1] + holder.before).tolist(), (offsets[1:] - holder.after).tolist())
    ):
        number = first + index + 1
        if holder.name == "tar":
            sample = sample_dict(data[a:b])
            values = [sample[field]] if field in sample else None
            where = f"sample {number:,} of the file (key {sample[KEY_FIELD]!r})"
        else:
            try:
                values = feature_values(data[a:b], field)
            except NotAnExample as error:
                if keep_unlabeled:
                    values = None
                else:
                    raise InputError(
                        path,
                        f"record {number:,} of the file is no tf.train.Example ({error}): "
                        "--label_field reads a feature of one; use --label_bytes START:END for "
                        "other payloads",
                    ) from None
            where = f"record {number:,} of the file (a tf.train.Example)"
        if values is None:
            if keep_unlabeled:
                out.append(NULL_CLASS)
                continue
            what = "member" if holder.name == "tar" else "feature"
            raise InputError(path, f"{where} has no {what} {field!r}{KEEP_HINT}")
        out.append(label_text(values))
    return np.array(out, dtype=object)
