"""PyTorch adapter: ``ShuffledDataset.torch()`` is a ``torch.utils.data.IterableDataset``.

Invariants:
- The process that iterates it (a DataLoader worker w of n, or the main process as worker 0
  of 1) iterates ``dataset.for_worker(w, n)``: the workers of a rank read disjoint, contiguous
  parts of the rank's share, and together all of it, each loading only the piles its part
  overlaps.
- ``state_dict()`` is the state of that part after the records it has yielded (a batch counts
  once it is yielded). torchdata's ``StatefulDataLoader`` asks each worker for it after every
  batch and gives every worker its own state back on resume: the stream goes on exactly.
- Which epoch a pass reads follows the one rule of ``loader.passes``, kept in a
  ``PassClock`` that the main process and every worker copy share: ``set_epoch`` and a
  ``load_state_dict`` in the main process reach new and persistent workers alike, and a
  loaded state is read by one pass only.
- ``load_state_dict(list)`` takes the states of every consumer of an earlier split (another
  ``num_workers`` or world size): the rest of the epoch is dealt out again, nothing lost or
  repeated; each worker reads its part in global order, so the stream's order differs from
  the uninterrupted one. A list that is exactly this split's states (in any order: worker j
  takes ``list[j]``) resumes exactly: that is how a plain ``DataLoader`` resumes
  (``loader_states``, from the number of batches taken: ``loader.torch_resume``).

Only this module (and ``pileshuffle.loader.tf`` for TensorFlow) imports torch.
"""

import os

import pyarrow as pa
import torch.utils.data
from torch.utils.data import default_convert, get_worker_info

from pileshuffle.loader.batching import array_batches
from pileshuffle.loader.handoff import ArrowOnArrival, BytesOnArrival, arrow_batch, reduced
from pileshuffle.loader.passes import PassClock
from pileshuffle.loader.torch_resume import resumed_part, states_epoch

__all__ = [
    "TorchDataset",
    "TensorsOnArrival",
    "torch_ready",
]


class TorchDataset(torch.utils.data.IterableDataset):
    """``dataset``'s records (``batch_size=None``) or batches, split by DataLoader worker.

    Records are what ``iter(dataset)`` yields; batches are ``dataset.batches(batch_size,
    drop_last=..., as_numpy=...)`` (use ``DataLoader(..., batch_size=None)``): a list of
    ``bytes`` (TFRecord, JSONL), or for Parquet a dict of numpy arrays (``as_numpy=True``,
    which the DataLoader turns into tensors) or a ``pyarrow.RecordBatch`` (``as_numpy=False``).
    Batching in the worker costs one inter-process message per batch instead of one Python
    step per record in the DataLoader.

    The training loop receives the same with or without workers: ``list[bytes]``, a dict of
    tensors (strings and binary: numpy object arrays) or a ``RecordBatch``. From a worker a
    batch crosses as its buffers in shared memory (``loader.handoff``: a bytes batch is one
    values buffer plus int64 offsets, a Parquet batch its Arrow IPC message), and the main
    process makes the ``bytes``, numpy columns and tensors. A ``collate_fn`` of one's own runs
    in the worker on ``BytesOnArrival`` or ``TensorsOnArrival``, which read like the list or
    dict (what it returns crosses as the DataLoader sends it).
    """

    def __init__(self, dataset, *, batch_size=None, drop_last=False, as_numpy=True):
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.as_numpy = as_numpy
        # a worker's own state (torchdata's StatefulDataLoader gives it in the worker)
        self._resume = None
        self._part = None  # the part this process iterates now
        # passes this copy has begun (persistent workers and the main process count on)
        self._passes = 0
        # (pass id, worker) of the part under way: the clock is told when it is used up
        self._ending = None
        self._clock = PassClock()

    # -- epochs and length

    def set_epoch(self, epoch):
        """The next iteration's epoch (call it in the main process). It reaches the workers of
        the next iteration whether they are new or persistent (``persistent_workers=True``
        keeps the workers' own copies of this object). Without it, each iteration reads the
        epoch after the last one's."""
        self.dataset.set_epoch(epoch)
        self._clock.set_epoch(self.dataset.epoch)

    @property
    def epoch(self) -> int:
        """The epoch of the iteration under way (or, when ``set_epoch`` or a state came since,
        of the next one)."""
        return self._clock.current(self._first_epoch())["epoch"]

    def _first_epoch(self) -> int:
        return self.dataset._next_pass().epoch

    def __len__(self):
        """Records this rank yields per epoch (with ``batch_size``, batches per epoch depend on
        ``num_workers``: every worker ends on its own last, possibly partial, batch)."""
        if self.batch_size is not None:
            raise TypeError(
                "len() of a batched torch dataset is not defined (it depends on num_workers); "
                "len(ds) gives the records per epoch"
            )
        return len(self.dataset)

    # -- iterating

    def _worker(self):
        info = get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def _pass_id(self):
        """Shared by the workers of one DataLoader iteration, new for the next: torch draws a
        base seed per iteration (worker seed = base seed + id), and a persistent worker or the
        main process counts its own passes."""
        info = get_worker_info()
        origin = (
            ["main", os.getpid()] if info is None else ["workers", int(info.seed) - int(info.id)]
        )
        return [*origin, self._passes]

    def _part_to_iterate(self):
        worker, num_workers = self._worker()
        own, self._resume = self._resume, None
        own_epoch = None if own is None else states_epoch(own)
        pass_id = self._pass_id()
        decision = self._clock.begin(pass_id, worker, num_workers, self._first_epoch(), own_epoch)
        self._ending = (pass_id, worker)
        self._passes += 1
        if own is not None:
            decision = {"epoch": own_epoch, "state": own}
        return self._part_of_pass(decision, worker, num_workers)

    def _part_of_pass(self, decision, worker, num_workers):
        """Worker ``worker``'s part of a pass that reads ``decision`` (an epoch from its
        start, or the rest of a state or a list of states)."""
        dataset, resume = self.dataset._at_epoch(decision["epoch"]), decision["state"]
        if isinstance(resume, list):
            return resumed_part(dataset, resume, worker, num_workers)
        part = dataset.for_worker(worker, num_workers)
        if resume is not None:
            part.load_state_dict(resume)
        return part

    def __iter__(self):
        # The part is made here, not in the generator: torch asks for state_dict() right
        # after iter(), before the generator has run.
        self._part = self._part_to_iterate()
        return _then(self._items(self._part), self._clock.end, *self._ending)

    def _items(self, part):
        if self.batch_size is None:
            return iter(part)
        in_worker = get_worker_info() is not None
        if self.dataset.format != "parquet":
            if not in_worker:  # the main process: part.batches() as they are
                return part.batches(self.batch_size, drop_last=self.drop_last)
            arrays = _payload_arrays(part, self.batch_size, self.drop_last)
            return (
                BytesOnArrival(array, ring=True, format=self.dataset.format) for array in arrays
            )
        batches = (
            torch_ready(batch, self.as_numpy)
            for batch in part.batches(self.batch_size, drop_last=self.drop_last)
        )
        if not in_worker:
            return (
                (_writable(_numpy_columns(batch)) for batch in batches)
                if self.as_numpy
                else batches
            )
        arrival = TensorsOnArrival if self.as_numpy else ArrowOnArrival
        return (arrival(batch, ring=True) for batch in batches)

    # -- state

    def state_dict(self):
        """The state of the part this process iterates (before any iteration: of the part it
        would iterate)."""
        if self._part is not None:
            return self._part.state_dict()
        upcoming = (
            self._resume
            if self._resume is not None
            else self._clock.peek(self._first_epoch())["state"]
        )
        if isinstance(upcoming, dict):
            return upcoming
        worker, num_workers = self._worker()
        return self.dataset._at_epoch(self.epoch).for_worker(worker, num_workers).state_dict()

    def load_state_dict(self, state):
        """Resume the next iteration, and only that one, from ``state``: one consumer's state
        (what ``state_dict()`` returned in this same worker) or the list of every consumer's
        states of an earlier split (``worker_states``, ``loader_states``). Checked here: a
        state of another output, seed or mix is refused at once."""
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        for one in states:
            self.dataset._check_state(one)
        resume = states if isinstance(state, (list, tuple)) else state
        self._part = None
        if get_worker_info() is not None:  # torchdata gives each worker its own state
            self._resume = resume
        else:
            self._clock.load_state(resume, states_epoch(resume))


class TensorsOnArrival:
    """A DataLoader worker's Parquet batch (a ``pyarrow.RecordBatch``) that the main process
    unpickles as the dict of tensors the DataLoader makes of numpy columns (``default_convert``:
    numbers and bools as tensors, strings and binary as numpy object arrays). The batch crosses
    as its Arrow IPC message (``ring``: through the worker's shared memory, ``loader.handoff``)
    and becomes numpy in the main process; per tensor torch would make one shared-memory segment
    and a socket round trip, which cost more than a small column's bytes. In the worker it reads
    like the dict of numpy arrays (for a ``collate_fn`` of one's own) but is no ``Mapping``,
    which the DataLoader would turn into tensors in the worker."""

    __slots__ = ("batch", "ring", "_columns")

    def __init__(self, batch, *, ring=False):
        self.batch, self.ring, self._columns = batch, ring, None

    @property
    def columns(self) -> dict:
        """The numpy columns (made on first use), as ``ds.batches(as_numpy=True)`` gives them."""
        if self._columns is None:
            self._columns = _numpy_columns(self.batch)
        return self._columns

    def __reduce__(self):
        return reduced([self.batch.serialize()], _tensors, (self.batch.schema,), ring=self.ring)

    def __getitem__(self, name):
        return self.columns[name]

    def __iter__(self):
        return iter(self.columns)

    def __len__(self):
        return len(self.columns)

    def keys(self):
        return self.columns.keys()

    def items(self):
        return self.columns.items()

    def values(self):
        return self.columns.values()


def torch_ready(batch: pa.RecordBatch, tensors: bool = True) -> pa.RecordBatch:
    """A Parquet batch as the torch adapter hands it out, with and without workers
    (docs/loader.md, "Column types"): a dictionary column as its values; for ``tensors`` also a
    timestamp, date, time or duration column as its integers (counts of its unit; a timestamp's
    since the epoch, UTC), and a null in a number, bool or such column refused, naming it (a
    tensor cannot hold one). Strings and binary keep None."""
    columns = []
    for field, column in zip(batch.schema, batch.columns):
        kind = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        if kind != field.type:
            column = column.cast(kind)
        if tensors and pa.types.is_temporal(kind):
            column = column.view(pa.int32() if kind.bit_width == 32 else pa.int64())
        if tensors and column.null_count and _is_tensor(column.type):
            raise ValueError(
                f"ds.torch(): column {field.name!r} has null values, which a tensor cannot hold: "
                "fill them in the data, or leave the column out with columns=[...]"
            )
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _is_tensor(kind) -> bool:
    """Whether a column of ``kind`` becomes a tensor (numbers and bools; strings and binary
    stay numpy objects)."""
    return pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _numpy_columns(batch) -> dict:
    """A batch's columns as ``ShuffledDataset.batches(as_numpy=True)`` makes them (a table's
    ``to_numpy``)."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    return {name: column.to_numpy() for name, column in zip(table.column_names, table.columns)}


def _tensors(views, schema):
    """The main process's side of ``TensorsOnArrival``."""
    return default_convert(_writable(_numpy_columns(arrow_batch(views, schema))))


def _payload_arrays(part, batch_size, drop_last):
    """``part.batches(batch_size, drop_last=drop_last)`` of a bytes format as ``large_binary``
    arrays (``batching.array_batches``): the same records and position, no ``bytes`` made in
    the worker. The position is set at once, as ``batches()`` sets it."""
    tables = part._tables(batch_size)

    def arrays():
        for array in array_batches(tables, batch_size):
            # as ShuffledDataset._batches: a batch counts once yielded, a dropped one too
            part._position += len(array)
            if len(array) == batch_size or not drop_last:
                yield array

    return arrays()


def _writable(columns):
    """Numpy columns torch can take without its warning about read-only arrays (Arrow's
    zero-copy numbers are read-only; copying a batch of numbers is cheap)."""
    return {
        name: array if array.flags.writeable else array.copy() for name, array in columns.items()
    }


def _then(items, done, *args):
    """``items``, then ``done(*args)`` once they are used up (not when abandoned)."""
    yield from items
    done(*args)
