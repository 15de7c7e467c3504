"""Where each output record came from, found by its hash; and every record's label (what a
label is: ``quality.label``).

A record's position is located by its fingerprint hash (``formats.record_hashes``, the
hash ``verify`` and the manifests use): one pass over the input and one over the output
(each read with the format's ``read_chunks``) keep the records whose hash is below a
threshold, and matching hashes pair an input position with an output position. Hash
values are independent of positions, so the kept records are a uniform sample, and the
threshold bounds memory whatever the input size. Hashes seen more than once in the input
sample (duplicate records) are dropped: their positions are ambiguous.

A ``--balance`` output holds each input record as many times as its copies say (none, for
a record undersampling cut). Its order is measured against the input with each record
repeated by its copies (``scan_with_copies``: pass 1's own expansion, ``keyed_chunks``), and
the copies of one record, which share a hash, are paired with its output places by their
pass-1 keys (``match``): pass 2 writes records in key order, so this is the run's own pairing.
"""

import dataclasses

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.formats import record_hashes
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
from pileshuffle.quality.label import Label

# pass 1's key stream tag (transforms.assign.INPUT_STREAM; that module imports Beam)
_INPUT_STREAM = 0

__all__ = [
    "threshold_for",
    "Scan",
    "scan",
    "run_keys",
    "scan_with_copies",
    "scan_distinct",
    "scan_store",
    "match",
    "class_ids",
]

_HASH_SPACE = 2**64


def threshold_for(records: int, sample: int) -> int:
    """Keep hashes below this to keep about ``sample`` of ``records`` records."""
    if records <= sample:
        return _HASH_SPACE
    return int(_HASH_SPACE * sample // records)


@dataclasses.dataclass
class Scan:
    """One ordered pass over files: records per file, the sampled records' hashes and
    positions, and (when asked) every record's label value."""

    file_records: list
    hashes: np.ndarray
    positions: np.ndarray
    labels: np.ndarray = None
    longest: int = 0  # the longest payload, when a --label_bytes label was read
    keys: np.ndarray = None  # the sampled records' pass-1 keys (``scan_with_copies``)
    # every record's pass-1 key, in input order (a scan of a run's input)
    order_keys: np.ndarray = None

    @property
    def records(self) -> int:
        return int(sum(self.file_records))

    @staticmethod
    def joined(
        file_records, hashes, positions, labels=None, longest=0, keys=None, order_keys=None
    ) -> "Scan":
        """A scan from per-chunk parts (``labels``, ``keys``, ``order_keys`` None: not
        asked for)."""
        return Scan(
            file_records,
            np.concatenate(hashes) if hashes else np.zeros(0, np.uint64),
            np.concatenate(positions).astype(np.int64) if positions else np.zeros(0, np.int64),
            None
            if labels is None
            else (np.concatenate(labels) if labels else np.zeros(0, np.int64)),
            longest,
            None if keys is None else (np.concatenate(keys) if keys else np.zeros(0, np.uint64)),
            None
            if order_keys is None
            else (np.concatenate(order_keys) if order_keys else np.zeros(0, np.uint64)),
        )


def scan(fmt, paths, threshold: int, label: Label = None, keys_of=None, sizes=None) -> Scan:
    """``paths`` read in order with ``fmt``: the records whose hash is below ``threshold`` (a
    hash-value sample, the same records in input and output), given ``label`` every record's
    label value, and given ``keys_of`` (a run's input: ``run_keys``) every record's pass-1
    key. ``sizes``: path -> bytes as listed, so a remote file is read in one download
    (``_chunks_of``)."""

    def chunks(number, path):
        first = 0
        for table, places in fmt.read_placed(path):
            yield (
                table,
                record_hashes(table),
                None if keys_of is None else keys_of(number, places, first),
            )
            first += table.num_rows

    return _sampled(
        ((path, _chunks_of(fmt, path, sizes, chunks(n, path))) for n, path in enumerate(paths)),
        threshold,
        label,
        keys=False,
    )


def _chunks_of(fmt, path: str, sizes, chunks):
    """``chunks`` (a generator reading ``path``), read inside ``fmt.read_once``: a remote Parquet
    file that ``sizes`` lists comes from one download where it may be held, not a request per
    column chunk, each a stream to the end of the object."""
    with fmt.read_once(path, (sizes or {}).get(path)):
        yield from chunks


def run_keys(manifest: dict):
    """``scan``'s ``keys_of`` for the input of the run that wrote ``manifest``: ``(file number,
    places, rank of the first) -> keys`` as its pass 1 drew them: by place (format_version 1.1
    on), by rank in the file (1.0)."""
    from pileshuffle.records.keys import position_keys, record_keys

    seed = int(manifest.get("seed") or 0)
    if tuple(int(n) for n in str(manifest.get("format_version", "1.0")).split(".")) >= (1, 1):
        return lambda number, places, first: position_keys(seed, (_INPUT_STREAM, number), places)
    return lambda number, places, first: record_keys(
        seed, (_INPUT_STREAM, number), first, len(places)
    )


def scan_with_copies(
    fmt, paths, manifest: dict, threshold: int, label: Label = None, sizes=None
) -> Scan:
    """``scan`` of the input of a ``--balance`` run with each record repeated by its copies, as
    pass 1 emits them (its own ``class_counts``, ``class_plan`` and ``keyed_chunks``, from the
    manifest's label field, policy, seed and ``skip_corrupt``): positions count the copies,
    ``file_records`` are the copies per file, and ``keys`` the sampled copies' pass-1 keys."""
    from pileshuffle.engine.balance import from_manifest_options
    from pileshuffle.engine.transforms.assign import (
        INPUT_STREAM,
        Source,
        copies_balance,
        keyed_chunks,
    )
    from pileshuffle.formats import ReadReport
    from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES

    options = manifest.get("options", {})
    (field, policy, keep_unlabeled), skip = (
        from_manifest_options(options),
        bool(options.get("skip_corrupt")),
    )
    seed = int(manifest.get("seed") or 0)
    # ids: ranks in the sorted file list
    sources = [Source(number, path, 0) for number, path in enumerate(paths)]
    balance = copies_balance(fmt, sources, field, policy, seed, skip, keep_unlabeled)

    def copies(source):
        read = keyed_chunks(
            fmt,
            source,
            seed,
            (INPUT_STREAM, source.id),
            DEFAULT_CHUNK_BYTES,
            skip,
            ReadReport(),
            balance,
        )
        for table, keys, hashes, _, _ in _chunks_of(fmt, source.path, sizes, read):
            yield table, hashes, keys

    return _sampled(((s.path, copies(s)) for s in sources), threshold, label, keys=True)


def scan_distinct(
    fmt, paths, manifest: dict, threshold: int, label: Label = None, sizes=None
) -> Scan:
    """``scan`` of the input of a ``--dedup`` run as its output holds it: the first record of each
    content in input order (``dedup.Dedup``, from the manifest's options), positions counted among
    them, and their pass-1 keys (content keys). Reads the input twice; which records are first waits
    in the local temp folder (``dedup.first_occurrences``: 17 bytes a record), not in memory."""
    import tempfile

    from pileshuffle.engine.dedup import DEDUP_STREAM, Dedup, first_occurrences
    from pileshuffle.records.keys import position_keys

    dedup, seed = Dedup.from_options(manifest.get("options")), int(manifest.get("seed") or 0)

    def contents(path):
        return _chunks_of(fmt, path, sizes, dedup.file_contents(fmt, path))

    with tempfile.TemporaryDirectory(prefix="pileshuffle-quality-") as folder:
        is_first = first_occurrences((c for path in paths for _, _, c in contents(path)), folder)
        at = [0]

        def distinct_chunks(path):
            for table, _, content in contents(path):
                kept = np.asarray(is_first[at[0] : at[0] + table.num_rows])
                at[0] += table.num_rows
                distinct = table.filter(pa.array(kept))
                yield (
                    distinct,
                    record_hashes(distinct),
                    position_keys(seed, (DEDUP_STREAM,), content[kept]),
                )

        return _sampled(
            ((path, distinct_chunks(path)) for path in paths), threshold, label, keys=False
        )


def _sampled(files, threshold: int, label, keys: bool) -> Scan:
    """The ``Scan`` of ``files`` = ``[(path, chunks)]`` in order, each chunk ``(table, hashes,
    pass-1 keys or None)``: the records whose hash is below ``threshold`` (with ``keys``, their
    keys), labels, and every key given."""
    file_records, hashes, positions, sampled_keys, labels, order_keys = [], [], [], [], [], []
    position = longest = 0
    for path, chunks in files:
        count = 0
        for table, chunk_hashes, chunk_keys in chunks:
            kept = (
                np.flatnonzero(chunk_hashes < np.uint64(threshold))
                if threshold < _HASH_SPACE
                else np.arange(len(chunk_hashes))
            )
            hashes.append(chunk_hashes[kept])
            positions.append(kept + position + count)
            if keys:
                sampled_keys.append(chunk_keys[kept])
            if chunk_keys is not None:
                order_keys.append(chunk_keys)
            if label is not None:
                labels.append(label.values(table, path))
                longest = max(longest, label.longest(table))
            count += table.num_rows
        file_records.append(count)
        position += count
    return Scan.joined(
        file_records,
        hashes,
        positions,
        labels if label is not None else None,
        longest,
        sampled_keys if keys else None,
        order_keys if order_keys else None,
    )


def scan_store(output, threshold: int, label: Label = None) -> Scan:
    """A pile store's records in written order (``output``: the loader's ``Output``):
    piles in order, each pile's files (live generations, then writers; in a dedup store, the
    rows readers get) stably sorted by key, with the pass-1 hashes the store keeps. One pile
    in memory at a time."""
    from pileshuffle.loader.order import sort_by_key

    pile_records, hashes, positions, labels = [], [], [], []
    position = longest = 0
    # a grown pile is several refs, one per sub-pile, each over all its files
    for pile in output.piles:
        table = _pile_table(output, pile)
        count = table.num_rows if table is not None else 0
        if count:
            order = sort_by_key(table.column(KEY_COLUMN).to_numpy())
            pile_hashes = table.column(HASH_COLUMN).to_numpy()[order]
            kept = (
                np.flatnonzero(pile_hashes < np.uint64(threshold))
                if threshold < _HASH_SPACE
                else np.arange(count)
            )
            hashes.append(pile_hashes[kept])
            positions.append(kept + position)
            if label is not None:
                records = table.drop_columns([KEY_COLUMN, HASH_COLUMN])
                labels.append(label.values(records, pile.files[0])[order])
                longest = max(longest, label.longest(records))
        pile_records.append(count)
        position += count
    return Scan.joined(
        pile_records, hashes, positions, labels if label is not None else None, longest
    )


def _pile_table(output, pile):
    """One pile ref's rows as readers get them (None: it has no files): its files' tables in
    order, a dedup store's copies hidden, and of a grown pile only the ref's sub-pile."""
    from pileshuffle.loader.piles import sub_pile_of

    filesystem = pile.source.filesystem
    tables = []
    for path in pile.files:
        try:
            with filesystem.open_input_stream(path) as stream:
                table = pa.ipc.open_stream(stream).read_all()
            # a dedup store: copies hidden
            visible = pile.source.visible_rows(path, table.num_rows)
            tables.append(table if visible is None else table.take(visible))
        except FileNotFoundError:
            raise InputError(
                path,
                f"is missing, but the store version read ({output.location}) lists it; "
                f"`pileshuffle verify --output` on the store names every damaged generation",
            ) from None
    table = pa.concat_tables(tables) if tables else None
    if table is not None and pile.part is not None:
        sub, ways = pile.part
        table = table.filter(
            sub_pile_of(table.column(KEY_COLUMN).to_numpy(), pile.source.num_piles, ways) == sub
        )
    return table


def match(source: Scan, target: Scan):
    """``(x, y, left_out)``: input and output positions of the sampled records found on
    both sides, in output order. Hashes repeated in the input sample are left out (their
    count returned), unless ``source`` has pass-1 keys (``_match_copies``)."""
    if source.keys is not None:
        return _match_copies(source, target)
    unique, first, counts = np.unique(source.hashes, return_index=True, return_counts=True)
    single = counts == 1
    unique, where = unique[single], source.positions[first[single]]
    slot = np.searchsorted(unique, target.hashes)
    slot = np.minimum(slot, max(len(unique) - 1, 0))
    found = (unique[slot] == target.hashes) if len(unique) else np.zeros(len(target.hashes), bool)
    return where[slot[found]], target.positions[found], int(counts[~single].sum())


def _match_copies(source: Scan, target: Scan):
    """``match`` for an input with its copies: the records of one hash (a record's copies, or
    identical records) are paired in key order with their output places in output order, as
    pass 2 wrote them. A hash found a different number of times on the two sides (not so on
    the run's own input) is left out: the count returned is of its output records."""
    by_key = np.lexsort((source.keys, source.hashes))
    in_hashes, x = source.hashes[by_key], source.positions[by_key]
    by_place = np.lexsort((target.positions, target.hashes))
    out_hashes, y = target.hashes[by_place], target.positions[by_place]
    in_unique, in_counts = np.unique(in_hashes, return_counts=True)
    out_unique, out_counts = np.unique(out_hashes, return_counts=True)
    common, at_in, at_out = np.intersect1d(
        in_unique, out_unique, assume_unique=True, return_indices=True
    )
    paired = common[in_counts[at_in] == out_counts[at_out]]
    keep_in, keep_out = np.isin(in_hashes, paired), np.isin(out_hashes, paired)
    # the same hashes, each as often, in the same (hash) order: aligned
    x, y = x[keep_in], y[keep_out]
    back = np.argsort(y, kind="stable")
    return x[back], y[back], int(np.isin(out_hashes, common).sum() - keep_out.sum())


def class_ids(*value_arrays):
    """The label values of several arrays as shared class ids ``0..k-1`` (sorted values),
    and the values themselves."""
    joined = np.concatenate(value_arrays)
    values, ids = np.unique(joined, return_inverse=True)
    bounds = np.cumsum([0, *(len(v) for v in value_arrays)])
    return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])], values
