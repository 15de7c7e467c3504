"""Orders of N records as position arrays: the shuffles people use, simulated exactly.

Every function returns an *order*: ``order[t]`` is the input position of the record
delivered t-th (a permutation of ``0..N-1``). Nothing here reads bytes or imports Beam;
the shuffle policies are what they are on positions alone.

- ``file_order``: input files in a random order, each file's records in file order;
- ``shuffle_buffer``: tf.data's ``shuffle(buffer_size)`` (also PyTorch iterable pipelines,
  WebDataset's ``shuffle``): fill a buffer, then repeatedly emit a uniformly chosen slot
  and refill it with the next record; at the end the buffer drains in random order;
- ``pileshuffle_order``: the 2-pass shuffle, with the run's own keys (``keys.position_keys``
  of each record's place in its file), so given the places it equals a run's output order;
- ``epoch_positions``: the loader's epoch order (``pileshuffle.loader.order``): piles in a
  seeded permutation, each pile's records spread over a sliding window of ``mix`` piles.
"""

import numpy as np

from pileshuffle.records import keys as keymath

__all__ = [
    "inverse",
    "file_order",
    "shuffle_buffer",
    "pileshuffle_keys",
    "pileshuffle_order",
    "pile_records",
    "epoch_positions",
]

# pass 1's key stream tag (transforms.assign.INPUT_STREAM; that module imports Beam)
_INPUT_STREAM = 0


def inverse(order: np.ndarray) -> np.ndarray:
    """``position[i]``: where input record i is delivered."""
    position = np.empty_like(order)
    position[order] = np.arange(len(order), dtype=order.dtype)
    return position


def _file_starts(file_records) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(file_records, dtype=np.int64)))


def file_order(file_records, rng: np.random.Generator) -> np.ndarray:
    """Files in a random order, records in file order."""
    starts = _file_starts(file_records)
    return np.concatenate(
        [np.arange(starts[f], starts[f + 1]) for f in rng.permutation(len(file_records))]
        or [np.zeros(0, np.int64)]
    ).astype(np.int64)


def shuffle_buffer(stream: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``stream`` through a shuffle buffer of ``size`` records, exactly as tf.data does it."""
    stream = np.asarray(stream, dtype=np.int64)
    size = min(max(1, int(size)), len(stream))
    buffer = stream[:size].tolist()
    out = np.empty(len(stream), dtype=np.int64)
    picks = rng.integers(0, size, len(stream) - size).tolist()
    incoming = stream[size:].tolist()
    for t, (slot, record) in enumerate(zip(picks, incoming)):
        out[t] = buffer[slot]
        buffer[slot] = record
    # the drain: uniform order
    out[len(incoming) :] = rng.permutation(np.asarray(buffer, dtype=np.int64))
    return out


def pileshuffle_keys(file_places, seed: int) -> np.ndarray:
    """Pass 1's key U of every input record, in input order. ``file_places[f]``: where file f's
    records start (``RecordFormat.read_placed``), or a count n for places ``0..n-1`` (the rows
    of a Parquet file; for a simulation, any file)."""
    parts = [
        keymath.position_keys(
            seed,
            (_INPUT_STREAM, source),
            np.arange(int(places)) if np.ndim(places) == 0 else places,
        )
        for source, places in enumerate(file_places)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def pileshuffle_order(file_places, seed: int) -> np.ndarray:
    """The output order of ``pileshuffle run`` on files whose records are at these places
    (``pileshuffle_keys``): all records sorted by U (pile = top digits of U, pass 2 sorts
    each pile by U)."""
    return np.argsort(pileshuffle_keys(file_places, seed), kind="stable").astype(np.int64)


def pile_records(file_places, seed: int, num_piles: int) -> np.ndarray:
    """Records per pile of that run."""
    return np.bincount(
        keymath.pile_of(pileshuffle_keys(file_places, seed), num_piles), minlength=num_piles
    )


def epoch_positions(pile_sizes, seed: int, epoch: int, mix: int = 1) -> np.ndarray:
    """The loader's epoch as positions in the written output (piles one after another):
    ``result[t]`` is the output position of the record the epoch delivers t-th. The order
    is the loader's own (``pileshuffle.loader.order.epoch_order``), not a copy of it."""
    from pileshuffle.loader.order import epoch_order

    pile, index = epoch_order(pile_sizes, seed=seed, epoch=epoch, mix=mix, reshuffle=True)
    return _file_starts(pile_sizes)[pile] + index
