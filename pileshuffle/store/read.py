"""A store's live piles as ``Pile`` objects (the second pass's input), and a check of
every data file against the manifest (``pileshuffle verify`` on a store).

A store pile = the data files of that pile over the live generations, in (generation,
writer) order, as the fragments of an ``engine.pile.Pile``: its ``ordered()`` is the
order ``materialize`` writes and the loader yields with ``reshuffle=False`` at epoch 0.
"""

import collections

import numpy as np

from pileshuffle import names
from pileshuffle.engine.fragments import Fragment, read_table
from pileshuffle.engine.pile import DEFAULT_MAX_PILE_BYTES, Pile
from pileshuffle.errors import InputError
from pileshuffle.formats import get_format, record_hashes, records_bytes
from pileshuffle.formats.tfrecord import FRAME_COLUMN, scan_frames
from pileshuffle.io import storage
from pileshuffle.io.checksums import crc32c_mismatch
from pileshuffle.io.copy_marks import read_copies
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
from pileshuffle.records.fingerprint import Fingerprint, binary_column_parts
from pileshuffle.records.keys import pile_of
from pileshuffle.store import layout

__all__ = ["live_piles", "missing_files", "Problem", "damaged_generations", "check_store"]


def _file_fragment(prefix: str, generation: int, entry: dict) -> Fragment:
    """One data file of a generation as a pile's fragment, ordered by (generation, writer)."""
    return Fragment(
        (generation, entry["writer"]),
        entry["records"],
        entry["bytes"],
        Fingerprint.from_json(entry["fingerprint"]),
        path=layout.join(names.store_dir(prefix), entry["path"]),
    )


def live_piles(
    prefix: str, manifest: dict, max_pile_bytes: int = None, work_dir: str = None
) -> list:
    """The store's ``num_piles`` piles at ``manifest``'s version (empty piles included); in a dedup
    store, piles that keep the first live copy of each record (``store.copies``)."""
    fragments = {p: [] for p in range(manifest["num_piles"])}
    for generation in manifest["generations"]:
        for entry in generation["files"]:
            fragments[entry["pile"]].append(_file_fragment(prefix, generation["generation"], entry))
    limit = max_pile_bytes or manifest.get("max_pile_bytes") or DEFAULT_MAX_PILE_BYTES
    # the first live copy of each content: the rows the manifest counts visible
    dedup = layout.store_dedup(manifest)
    return [
        Pile(
            p,
            manifest["num_piles"],
            tuple(sorted(f, key=lambda x: x.order)),
            limit,
            work_dir,
            dedup=dedup,
        )
        for p, f in fragments.items()
    ]


def missing_files(prefix: str, manifest: dict) -> list:
    """``(generation, path)`` of every data file ``manifest`` lists that does not exist:
    one listing per generation directory, not one request per file."""
    store, missing = names.store_dir(prefix), []
    for generation in manifest["generations"]:
        present = set(
            layout.list_names(
                storage.join(store, names.generation_dir_name(generation["generation"]))
            )
        )
        missing += [
            (generation["generation"], layout.join(store, entry["path"]))
            for entry in generation["files"]
            if entry["path"].rsplit("/", 1)[-1] not in present
        ]
    return missing


class Problem(str):
    """A problem's message (a plain string to every caller), and the generation it is in."""

    generation = None

    @classmethod
    def of(cls, text: str, generation: int) -> "Problem":
        problem = cls(text)
        problem.generation = generation
        return problem


def damaged_generations(problems) -> list:
    """The generations that ``check_store``'s problems are in, ascending."""
    return sorted({p.generation for p in problems if getattr(p, "generation", None) is not None})


def check_store(prefix: str, version: int = None, input_glob: str = None) -> tuple:
    """``(problems, manifest)``: every file the manifest lists exists, has its size, reads
    whole as Arrow IPC, holds its count of records, all of its pile, and its records hash
    to its fingerprint; generations and totals add up. Missing or damaged files are named,
    each with its generation (a ``Problem``'s ``generation``)."""
    prefix = layout.store_prefix(prefix)
    try:
        manifest = layout.read_store_manifest(prefix, version)
    except Exception as error:
        return [f"the store manifest of {prefix} cannot be read: {error}"], None
    if manifest is None:
        return [f"no store at {names.store_dir(prefix)} (no manifest-*.json)"], None
    store = names.store_dir(prefix)
    num_piles, fmt = manifest["num_piles"], get_format(manifest["format"])
    problems = []
    for generation in manifest["generations"]:
        problems += _check_generation(store, generation, num_piles, fmt)
    problems += _check_totals(manifest)
    if input_glob:
        problems += _check_input(input_glob, manifest, fmt)
    return problems, manifest


def _check_generation(store: str, generation: dict, num_piles: int, fmt) -> list:
    """The ``Problem``s of one generation: each of its data files (``_check_file``, then its
    copies file: ``_check_copies_file``), and its files' fingerprints adding up to its own."""
    number, problems, found = generation["generation"], [], Fingerprint()
    for entry in generation["files"]:
        path = layout.join(store, entry["path"])
        problem = _check_file(path, entry, num_piles, fmt) or _check_copies_file(
            store, number, entry
        )
        if problem:
            problems.append(Problem.of(f"{problem} (generation {number})", number))
        found += Fingerprint.from_json(entry["fingerprint"])
    if (
        found != Fingerprint.from_json(generation["fingerprint"])
        or found.records != generation["records"]
    ):
        problems.append(
            Problem.of(
                f"generation {number}: its files' fingerprints do not add up to the generation's "
                f"({found.records} vs {generation['records']} records)",
                number,
            )
        )
    return problems


def _check_totals(manifest: dict) -> list:
    """The manifest's totals are the sum of its generations' records and payload bytes (and,
    in a dedup store, of the records readers see: ``layout.visible_records``)."""
    records = sum(g["records"] for g in manifest["generations"])
    payload = sum(g["payload_bytes"] for g in manifest["generations"])
    totals = {"records": records, "payload_bytes": payload}
    if layout.store_dedup(manifest) is not None:
        totals["distinct"] = layout.visible_records(manifest["generations"])
    if manifest["totals"] == totals:
        return []
    return [
        f"the manifest's totals {manifest['totals']} are not the sum of its generations "
        f"({records} records, {payload} payload bytes"
        + (f", {totals['distinct']} distinct)" if "distinct" in totals else ")")
    ]


def _check_input(input_glob: str, manifest: dict, fmt) -> list:
    """The input files hold exactly the live generations' records (as a multiset); in a
    balanced store, each generation's with its copies (``_check_copies``)."""
    from pileshuffle.engine.inputs import match_inputs
    from pileshuffle.errors import PileshuffleError
    from pileshuffle.formats import read_fingerprint
    from pileshuffle.records.fingerprint import total

    try:
        sources = match_inputs(input_glob)  # leaves store files out
        if layout.store_balance(manifest) is not None:
            return _check_copies(sources, manifest, fmt)
        found = total(read_fingerprint(fmt, s.path)[0] for s in sources)
    except PileshuffleError as error:
        return [f"input {error}"]
    live = total(Fingerprint.from_json(g["fingerprint"]) for g in manifest["generations"])
    if found != live:
        from pileshuffle.records.fingerprint import how_records_differ

        return [f"the input is not the store's live generations: {how_records_differ(found, live)}"]
    return []


def _check_copies(sources, manifest: dict, fmt) -> list:
    """A balanced store: every live generation holds exactly its own input files' records,
    each as many times as the store's policy copies it on that generation's class counts
    (recomputed from its files among ``sources``, ``_generation_sources``); every source
    must be one of some generation's."""
    from pileshuffle.records.fingerprint import how_records_differ
    from pileshuffle.verify.expected import copies_fingerprint

    field, policy, keep_unlabeled = layout.store_balance(manifest)
    problems, used = [], set()
    for generation in manifest["generations"]:
        own, missing = _generation_sources(generation, sources)
        used.update(s.path for s in own)
        if missing:
            problems.append(
                f"generation {generation['generation']}: its input {missing} is not in --input (or "
                "has another size): its copies cannot be recomputed"
            )
            continue
        skipped = bool(generation["skipped"]["records"])  # read as the append read it
        copied, recorded = (
            copies_fingerprint(
                fmt, own, field, policy, int(manifest["seed"]), skipped, keep_unlabeled
            ),
            Fingerprint.from_json(generation["fingerprint"]),
        )
        if copied != recorded:
            problems.append(
                f"generation {generation['generation']} is not its input with the copies --balance "
                f"gives: {how_records_differ(copied, recorded)}"
            )
    extra = [s.path for s in sources if s.path not in used]
    if extra:
        problems.append(
            f"the input holds {len(extra)} file(s) that no live generation was read from: "
            + ", ".join(extra[:3])
            + (" ..." if len(extra) > 3 else "")
        )
    return problems


def _generation_sources(generation: dict, sources) -> tuple:
    """``(sources, missing)``: ``generation``'s input files among ``sources``, numbered by
    their rank in its ``inputs`` (as its append numbered them), and the first one not found
    (None). A file is found by identity and size, as ``append`` recognises it, else (a copy
    elsewhere) by the one file of its name and size."""
    from pileshuffle.engine.inputs import file_identity
    from pileshuffle.engine.transforms.assign import Source

    by_identity = {(file_identity(s.path), s.size): s for s in sources}
    by_name = collections.defaultdict(list)
    for source in sources:
        by_name[(source.path.rsplit("/", 1)[-1], source.size)].append(source)
    own = []
    for rank, entry in enumerate(generation["inputs"]):
        size, name = entry.get("bytes"), entry["path"].rsplit("/", 1)[-1]
        found = by_identity.get((entry.get("identity") or file_identity(entry["path"]), size))
        if found is None and len(by_name[(name, size)]) == 1:
            found = by_name[(name, size)][0]
        if found is None:
            return own, entry["path"]
        own.append(Source(rank, found.path, found.size))
    return own, None


def _check_copies_file(store: str, generation: int, entry: dict) -> str:
    """A dedup store's copies file of a data file (``copy_marks``): there, whole, rows ascending and
    in the data file, each naming a generation up to its own, and counted as the manifest lists."""
    copies = entry.get("copies")
    if copies is None:
        return None
    path = layout.join(store, copies["path"])
    if not storage.exists(path):
        return f"copies file {path} is missing"
    data, listed = storage.read_buffer(path), copies["bytes"]
    if data.size != listed:
        return f"copies file {path} is damaged: {data.size:,} bytes, the manifest says {listed:,}"
    mismatch = crc32c_mismatch(data, copies.get("crc32c"))
    if mismatch is not None:
        return f"copies file {path} is damaged: {mismatch}"
    try:
        row, earlier = read_copies(data, path)
    except InputError as error:
        return str(error)
    if len(row) and (row[0] < 0 or row[-1] >= entry["records"] or np.any(np.diff(row) <= 0)):
        return (
            f"copies file {path} is damaged: its rows are not ascending places in {entry['path']}"
        )
    if len(earlier) and (earlier.min() < 0 or earlier.max() > generation):
        return f"copies file {path} is damaged: it names generations other than 0 to {generation}"
    counts = collections.Counter(earlier.tolist())
    if {str(g): counts[g] for g in sorted(counts)} != copies["earlier"]:
        return (
            f"copies file {path} does not hold the copies its manifest entry counts "
            f"({copies['earlier']})"
        )
    return None


def _check_file(path: str, entry: dict, num_piles: int, fmt) -> str:
    if not storage.exists(path):
        return f"store file {path} is missing"
    try:
        size = storage.size(path)
        if size != entry["bytes"]:
            return (
                f"store file {path} is damaged: {size:,} bytes, the manifest says "
                f"{entry['bytes']:,}"
            )
        mismatch = crc32c_mismatch(storage.read_buffer(path), entry.get("crc32c"))
        if mismatch is not None:
            return f"store file {path} is damaged: {mismatch}"
        table = read_table(Fragment((0,), entry["records"], size, Fingerprint(), path=path))
    except Exception as error:
        return (
            f"store file {path} is damaged: cannot be read as Arrow IPC ({type(error).__name__}: "
            f"{error})"
        )
    if KEY_COLUMN not in table.column_names or HASH_COLUMN not in table.column_names:
        return f"store file {path} is damaged: it lacks the {KEY_COLUMN} or {HASH_COLUMN} column"
    if table.num_rows != entry["records"]:
        return (
            f"store file {path} holds {table.num_rows:,} records; the manifest says "
            f"{entry['records']:,}"
        )
    piles = pile_of(table.column(KEY_COLUMN).to_numpy(), num_piles)
    if table.num_rows and not (piles == entry["pile"]).all():
        return f"store file {path} is damaged: it holds keys of other piles than {entry['pile']}"
    records = table.drop_columns([KEY_COLUMN, HASH_COLUMN])
    # frames hash from their stored CRCs: check those first
    if FRAME_COLUMN in records.column_names:
        data, _ = binary_column_parts(records.column(FRAME_COLUMN))
        data = data.to_pybytes()
        starts, end, problem = scan_frames(data)
        if problem or end != len(data) or len(starts) != records.num_rows:
            return (
                f"store file {path} is damaged: a TFRecord frame in it is corrupt "
                f"({problem or 'bad framing'})"
            )
    hashes = record_hashes(records)
    if Fingerprint.of(hashes, records_bytes(records)) != Fingerprint.from_json(
        entry["fingerprint"]
    ):
        return f"store file {path} is damaged: its records do not match the manifest's fingerprint"
    if not (table.column(HASH_COLUMN).to_numpy() == hashes).all():
        return (
            f"store file {path} is damaged: its records' stored hashes do not match their contents"
        )
    return None
