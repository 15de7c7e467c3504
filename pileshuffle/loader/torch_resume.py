"""Resuming a torch iteration: the states a DataLoader's workers go on from.

``worker_states`` takes them out of a torchdata ``StatefulDataLoader`` state (to resume with
another number of workers); ``loader_states`` computes them for a plain ``DataLoader`` from
the number of batches it handed out, which follow from its round robin alone
(``round_robin``). ``resumed_part`` is the part worker w goes on with from a list of states:
exactly where it stopped when the list is this split's states, else its share of the
unfinished tails dealt out again. Imports no torch: ``loader.torch`` does.
"""

__all__ = ["worker_states", "loader_states", "round_robin", "resumed_part", "states_epoch"]

# torchdata's StatefulDataLoader state keys (torchdata.stateful_dataloader, 0.8 - 0.11)
_SNAPSHOT, _STEPS_SINCE_SNAPSHOT = "_snapshot", "_steps_since_snapshot"
_WORKER_SNAPSHOTS, _DATASET_STATE = "_worker_snapshots", "dataset_state"


def states_epoch(state) -> int:
    """The epoch of a state, or of a list of states (all of one epoch)."""
    return int((state[0] if isinstance(state, list) else state)["epoch"])


def resumed_part(dataset, states, worker, num_workers):
    """Worker ``worker``'s part after resuming from ``states`` (all consumers of a split).

    When ``states`` are exactly this split's states (in any order), worker j goes on with
    ``states[j]``'s part where it stopped: every part continues its own order. Otherwise the
    unfinished tails are dealt out again (``ShuffledDataset.load_state_dict(list)``)."""
    parts = [dataset.for_worker(w, num_workers) for w in range(num_workers)]
    for part in parts:
        part.set_epoch(states[0]["epoch"])
    owners = [_own_part(parts, state) for state in states]
    if len(states) == num_workers and sorted(o for o in owners if o is not None) == list(
        range(num_workers)
    ):
        part = parts[owners[worker]]
        part.load_state_dict(states[worker])
        return part
    parts[worker].load_state_dict(states)
    return parts[worker]


def _own_part(parts, state):
    """The index of the part ``state`` is a state of (same output, epoch and consumer), or
    None. Its ranges are not compared: after an elastic resume a consumer's ranges are its
    share of the redealt tails, not the standard split's, and its state still continues it."""
    for index, part in enumerate(parts):
        fresh = part.state_dict()
        if all(
            state.get(key) == value
            for key, value in fresh.items()
            if key not in ("position", "ranges")
        ):
            return index
    return None


def worker_states(loader_state):
    """The per-worker dataset states in a ``StatefulDataLoader.state_dict()`` (worker order),
    to resume with another ``num_workers``: ``tds.load_state_dict(worker_states(state))`` then
    a new loader that is NOT given ``state`` (torchdata refuses another worker count).
    Needs ``snapshot_every_n_steps=1`` (torchdata's default): with a longer interval the
    worker states lag behind the batches taken."""
    if _SNAPSHOT not in loader_state:  # num_workers=0: the dataset state is at the top
        return [loader_state[_DATASET_STATE]]
    if loader_state.get(_STEPS_SINCE_SNAPSHOT, 0):
        raise ValueError(
            f"this StatefulDataLoader state is {loader_state[_STEPS_SINCE_SNAPSHOT]} batch(es) "
            "past its last worker snapshot: create the loader with snapshot_every_n_steps=1 to "
            "resume with another number of workers"
        )
    workers = loader_state[_SNAPSHOT][_WORKER_SNAPSHOTS]
    return [workers[f"worker_{w}"][_DATASET_STATE] for w in range(len(workers))]


def loader_states(torch_dataset, batches, *, num_workers, batch_size=None, drop_last=False):
    """The states of the workers of a plain ``torch.utils.data.DataLoader`` (``in_order=True``,
    the default) that has handed out ``batches`` batches of this epoch, in the order a new
    loader's workers are to take them: ``torch_dataset.load_state_dict(loader_states(...))``,
    then a new DataLoader with the same ``num_workers`` and batch size goes on exactly.

    A DataLoader deals its workers' batches round robin (worker 0, 1, ..., n-1, 0, ...),
    skipping a worker once its part is used up; each worker's batches are its part's records
    cut ``batch_size`` at a time (the adapter's ``batch_size``, or the DataLoader's when the
    adapter yields records), the last one partial unless ``drop_last``. So the records each
    worker handed out follow from ``batches`` alone; the list starts with the worker whose
    turn is next, because a new loader starts its round robin at worker 0.

    The pass is the one under way (or, when ``set_epoch``/``load_state_dict`` came since,
    or ``batches`` is 0 and the last pass is used up, the next). A pass that resumed exactly
    (the states of this same split) counts the batches of the epoch from its start, as if
    never interrupted; a pass that resumed with another split begins a new split, and counts
    the batches since the resume.
    """
    size = torch_dataset.batch_size or batch_size
    drop = drop_last or torch_dataset.drop_last
    if not size:
        raise ValueError(
            "batch_size: the DataLoader's batch size (the adapter yields single records)"
        )
    workers = max(1, num_workers)
    decision = torch_dataset._clock.current(torch_dataset._first_epoch(), at_start=batches == 0)
    parts = [torch_dataset._part_of_pass(decision, w, workers) for w in range(workers)]

    def batches_of(n):
        return n // size if drop else -(-n // size)

    starts = [part._resume_at or 0 for part in parts]
    records = [len(part) for part in parts]
    before = sum(batches_of(start) for start in starts)
    if batches < before:
        raise ValueError(
            f"{batches} batches taken, but the pass resumed after {before} batches of this epoch"
        )
    remaining = [batches_of(n) - batches_of(start) for n, start in zip(records, starts)]
    taken, turn = round_robin(batches - before, remaining)
    states = [
        part.state_after(min(n, start + t * size))
        for part, n, start, t in zip(parts, records, starts, taken)
    ]
    return states[turn:] + states[:turn]


def round_robin(batches, per_worker):
    """``(taken, turn)``: how many of the first ``batches`` batches came from each worker, and
    whose turn is next, when batches are dealt round robin and worker w drops out after its
    ``per_worker[w]`` batches."""
    if batches > sum(per_worker):
        raise ValueError(
            f"{batches} batches taken, but an epoch has only {sum(per_worker)} with these workers"
        )
    taken, last = [0] * len(per_worker), len(per_worker) - 1
    while batches:
        active = [w for w, n in enumerate(per_worker) if taken[w] < n]
        rounds = min(batches // len(active), min(per_worker[w] - taken[w] for w in active))
        # rounds == 0: the first of a last round
        dealt = active[:batches] if rounds == 0 else active
        for w in dealt:
            taken[w] += max(rounds, 1)
        batches -= len(dealt) * max(rounds, 1)
        last = dealt[-1]
    after = [(last + 1 + i) % len(per_worker) for i in range(len(per_worker))]
    turn = next((w for w in after if taken[w] < per_worker[w]), 0)
    return taken, turn
