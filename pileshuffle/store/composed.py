"""``WritePileStore``: a Beam pipeline's piles into a pile store (the composed use).

``ShuffleToPiles``' ``Pile`` elements, before any pass-2 order, each become one data file of
a new generation (writer 0: at most ``num_piles`` files), published as the template path's
generations are (``store.publish``). The store's lock is taken when the pipeline is built and
released by the publication; a store that keys records otherwise (``--dedup``) or balances
its generations (``--balance``) is refused before anything is written.
"""

import dataclasses

import apache_beam as beam
import pyarrow as pa

from pileshuffle import names
from pileshuffle.engine.fragments import read_batches
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.errors import OutputError
from pileshuffle.formats import get_format
from pileshuffle.records.fingerprint import Fingerprint
from pileshuffle.store import layout
from pileshuffle.store.generation_files import StoreFiles
from pileshuffle.store.lock import StoreLock, release_lock
from pileshuffle.store.publish import publish

__all__ = ["WritePileStore"]


class _WriteStorePile(beam.DoFn):
    """Composed use: copy one ``Pile`` (ShuffleToPiles' output, before any pass-2 order)
    into the generation as its single data file (writer 0): one file per pile."""

    def __init__(self, store, generation, num_piles):
        self._store, self._generation, self._num_piles = store, generation, num_piles

    def setup(self):
        prepare_worker()

    def process(self, pile):
        if pile.dedup is not None:
            raise OutputError(
                f"the store {self._store} keeps piles as pass 1 made them, duplicates included; "
                "ShuffleToPiles(dedup=...) drops them in pass 2: write its piles with WritePiles"
            )
        if pile.num_piles != self._num_piles:
            raise OutputError(
                f"the store {self._store} has {self._num_piles} piles; these records were "
                f"assigned to {pile.num_piles} (use ShuffleToPiles(num_piles={self._num_piles}))"
            )
        files = StoreFiles(self._store, self._generation, 0)
        for fragment in pile.fragments:
            for batch in read_batches(fragment):
                files.append(pile.index, pa.Table.from_batches([batch]), Fingerprint())
        fingerprint = pile.fingerprint
        for stored in files.commit_files(pile.work_dir):
            yield dataclasses.replace(stored, fingerprint=fingerprint)


class WritePileStore(beam.PTransform):
    """Write ``Pile`` elements (``ShuffleToPiles``' output) into the pile store at
    ``prefix`` as one new generation; returns a PCollection holding the published manifest.

    The store is created (version 1) if it does not exist, with ``format``, ``num_piles``
    and ``seed`` (what materialize and the loader report); an existing store must have the
    same format and number of piles, and no ``--balance`` (a balanced store's generations
    come from ``append``). Each pile becomes one data file (writer 0): at most
    ``num_piles`` files per generation. Records are stored in ShuffleToPiles' canonical
    fragment order with their keys; ShuffleToPiles' keys come from ``seed`` (unkeyed:
    uniform but not reproducible; ``keyed=True``: a function of the ids). The store's
    lock is taken when the pipeline is built and released when the generation is
    published (a failed pipeline leaves it; the next command in this process or after this
    process has ended takes it over). Not on Beam's DaskRunner (ShuffleToPiles refuses it).
    """

    def __init__(
        self, prefix, format, num_piles=None, seed=0, compression="auto", max_pile_bytes=64 << 20
    ):
        super().__init__()
        self._prefix = layout.clean_prefix(prefix)
        fmt = get_format(format)
        self._format, self._num_piles, self._seed = fmt.name, num_piles, int(seed)
        self._compression = fmt.output_compression(compression, [])
        self._max_pile_bytes = int(max_pile_bytes)

    def expand(self, piles):
        token = StoreLock(
            self._prefix, "WritePileStore (a Beam pipeline)", same_process_is_stale=True
        ).acquire()
        base = layout.read_store_manifest(self._prefix)
        if base is None:
            if self._num_piles is None:
                raise ValueError("WritePileStore needs num_piles to create a new store")
            base = layout.new_manifest(
                self._format, self._compression, self._num_piles, self._seed, self._max_pile_bytes
            )
        if base["format"] != self._format or (
            self._num_piles is not None and base["num_piles"] != int(self._num_piles)
        ):
            release_lock(self._prefix, token)
            raise OutputError(
                f"the store {names.store_dir(self._prefix)} holds {base['format']} in "
                f"{base['num_piles']} piles, not {self._format} in {self._num_piles}"
            )
        if layout.store_dedup(base) is not None:
            release_lock(self._prefix, token)
            raise OutputError(
                f"the store {names.store_dir(self._prefix)} keys every record by its content to "
                "keep each distinct one once (--dedup); WritePileStore's piles are keyed "
                "otherwise: add records with `pileshuffle append`"
            )
        if layout.store_balance(base) is not None:
            release_lock(self._prefix, token)
            raise OutputError(
                f"the store {names.store_dir(self._prefix)} balances every generation by "
                f"{base['options']['label_field']!r} ({base['options']['balance']}); "
                "WritePileStore writes records as they come: add them with `pileshuffle append`"
            )
        generation = base["next_generation"]
        layout.remove_unpublished(self._prefix)
        items = piles | "WriteStorePile" >> beam.ParDo(
            _WriteStorePile(names.store_dir(self._prefix), generation, base["num_piles"])
        )
        return publish(items, self._prefix, base, generation, 1, token)
