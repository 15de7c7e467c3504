"""The quality report of a finished run, and of the shuffles people use instead.

``measure`` locates a sample of output records in the input (``locate``), computes the
order's statistics (``metrics``) and, with ``compare``, puts the same positions through
the other policies (``orders``) and one epoch of SGD (``training``). Every row is
measured on the same sampled records, so the rows' numbers are comparable. The
``pileshuffle`` row is measured on the output's bytes; the other rows are exact
simulations on positions (no bytes needed). The report as text: ``quality.text``.
"""

import dataclasses
import math
import re

import numpy as np

from pileshuffle.errors import InputError, UsageError
from pileshuffle.quality import MIN_SAMPLE, classes, locate, metrics, orders, training

__all__ = [
    "ALPHA",
    "TRAINING_RECORDS",
    "Row",
    "Report",
    "training_stride",
    "thin",
    "measure",
]

ALPHA = 1e-4  # a p-value below this rejects uniformity
_MAX_LABEL_CLASSES = 1000
_DRAWN_RADII = 200_000  # neighbours whose radius the figure draws (the numbers use all)
TRAINING_RECORDS = 200_000  # larger runs train on every k-th input record, in the order delivered
# a reader's "give --format" clause
_READER_FORMAT_HINT = re.compile(r"(?:\s*\([^()]*|;[^;]*)--format\)?$")


@dataclasses.dataclass
class Row:
    """One policy: the sample's (input, delivered) positions, the delivered labels, where
    the sample lands in the next epoch, the training curve and the numbers."""

    policy: str
    x: np.ndarray
    y: np.ndarray
    labels: np.ndarray = None
    next_y: np.ndarray = None
    # the shuffle radius of (at most _DRAWN_RADII) neighbours, over n: the figure's
    radii: np.ndarray = None
    curve: dict = None
    numbers: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Report:
    """What ``measure`` found: records located, the summary (as quality.json holds it), one
    ``Row`` per policy (the run's own first), the label's share and the batch size."""

    records: int
    summary: dict
    rows: list
    label_share: float = None
    batch_size: int = 256


def _uniform(numbers: dict) -> bool:
    """No test rejects a uniform permutation at ``ALPHA``."""
    keys = ("spearman_p", "block_chi2_p", "displacement_p", "batch_dispersion_p")
    return all(numbers[k] >= ALPHA for k in keys if k in numbers)


def training_stride(records: int) -> int:
    """Train on every k-th input record: k = ceil(records / TRAINING_RECORDS)."""
    return max(1, math.ceil(records / TRAINING_RECORDS))


def thin(order: np.ndarray, stride: int) -> np.ndarray:
    """The order restricted to input records 0, k, 2k, ... (renumbered 0, 1, 2, ...)."""
    return order[order % stride == 0] // stride


def _one_pile(records: int, num_piles: int) -> int:
    """The records of one pile: the shuffle buffer row's memory and the radius's near distance."""
    return math.ceil(records / max(1, num_piles))


def _input_policies(file_records, seed: int, num_piles: int) -> dict:
    """``{policy: (epoch-1 order, epoch-2 order)}`` of the shuffles that reorder the input
    itself: no shuffle, file order, a one-pile shuffle buffer over shuffled files."""
    records = int(sum(file_records))
    rng = np.random.default_rng([seed, 0x0A11CE])
    buffer = _one_pile(records, num_piles)
    return {
        "no shuffle": (np.arange(records), np.arange(records)),
        "file order shuffled": tuple(orders.file_order(file_records, rng) for _ in range(2)),
        f"shuffle buffer ({buffer:,} = 1 pile)": tuple(
            orders.shuffle_buffer(orders.file_order(file_records, rng), buffer, rng)
            for _ in range(2)
        ),
    }


def measure(
    fmt, input_paths, output, manifest, sample=100_000, label=None, batch_size=256, compare=False
):
    """The report of one finished run (see the module docstring). ``input_paths`` in order, or
    {path: bytes as listed}; ``output``: the shards' paths in order, or a pile store opened by
    the loader (``loader.outputs.open_output``). A ``--balance`` output is measured against its
    input with each record repeated by its copies (``locate.scan_with_copies``)."""
    # a dedup store: what readers get
    total = int(manifest["totals"].get("distinct", manifest["totals"]["records"]))
    threshold = locate.threshold_for(total, sample)
    balanced = _balanced(manifest)
    source, before = _scan_input(fmt, input_paths, manifest, threshold, label, compare, balanced)
    if isinstance(output, (list, tuple)):
        sizes = {shard["path"]: shard["bytes"] for shard in manifest["shards"]}
        target = locate.scan(fmt, output, threshold, label, sizes=sizes)
    else:
        target = locate.scan_store(output, threshold, label)
    _check_same_records(source.records, target.records, input_paths, balanced)
    x, y, duplicates = locate.match(source, target)
    _check_located(len(x), len(target.hashes) - duplicates, input_paths)
    n = target.records
    input_ids, output_ids, values, before_ids = _class_ids(
        label, source, before, target, balanced and compare
    )
    numbers = metrics.order_metrics(x, y, n, given_x=balanced)
    own = Row("pileshuffle output", x, y, output_ids, numbers=numbers)
    summary = {
        "records": n,
        "records_used": int(len(x)),
        "sample_threshold": f"{threshold:#x}" if threshold < 2**64 else "all",
        "duplicates_left_out": duplicates,
        "num_piles": int(manifest.get("num_piles", 0)),
        "seed": manifest.get("seed"),
        **own.numbers,
    }
    if balanced:
        summary["balance"] = _balance_summary(manifest)
    share = _label_numbers(summary, own, label, values, before_ids, batch_size)
    # the figure reads the row's
    summary["uniform"] = own.numbers["uniform"] = _uniform(own.numbers)
    rows = [own]
    if compare:
        rows = _compare_policies(own, source, target.file_records, manifest, input_ids, batch_size)
        summary["pileshuffle_order_reproduced"] = rows[-1].numbers.pop("reproduced")
        summary["policies"] = [{"policy": r.policy, **r.numbers} for r in rows]
        summary["training"] = {
            "task": "cats then dogs, one epoch of SGD (batch 32)",
            "best_accuracy": training.BEST_ACCURACY,
        }
    return Report(n, summary, rows, share, batch_size)


def _label_numbers(summary: dict, own: Row, label, values, before_ids, batch_size: int):
    """The output's share of the label's first class, None without a label or on one value; adds
    the batch test to ``own``'s numbers and the label's section to ``summary`` (on one value, why
    the label is left out)."""
    if label is None:
        return None
    if own.labels is None:
        summary["label"] = {
            "what": label.describe(),
            "classes": len(values),
            "note": _one_value_note(label, values, summary["records"]),
        }
        return None
    own.numbers.update(metrics.batch_metrics(own.labels, batch_size))
    share = float(np.mean(own.labels == 0))
    summary.update(
        {
            k: own.numbers[k]
            for k in ("batch_size", "batches", "batch_dispersion", "batch_dispersion_p")
        }
    )
    summary["label"] = {
        "what": label.describe(),
        "classes": len(values),
        "first_class_share": share,
    }
    summary["class_shares"] = classes.class_shares(
        before_ids, own.labels, values, batch_size, label.describe()
    )
    return share


def _check_same_records(input_records: int, output_records: int, input_paths, balanced: bool):
    """Refuse an input that holds another number of records than the output (with
    ``--balance``'s copies): it is not the run's input."""
    if input_records != output_records:
        copies = " with --balance's copies" if balanced else ""
        raise InputError(
            _named(input_paths),
            f"hold {input_records:,} records{copies}, the output {output_records:,}: "
            "pass the run's own --input",
        )


def _scan_input(fmt, input_paths, manifest, threshold, label, compare, balanced):
    """``(source, before)``: the input scanned as the run's output holds it (with --balance's
    copies, or --dedup's distinct records), and as it is (for its labels). A remote Parquet file
    that ``input_paths`` lists with its size ({path: bytes}) is read in one download."""
    sizes = input_paths if isinstance(input_paths, dict) else None
    input_paths = list(input_paths)
    try:
        if balanced:
            source = locate.scan_with_copies(
                fmt, input_paths, manifest, threshold, label if compare else None, sizes
            )
            # labels only
            before = None if label is None else locate.scan(fmt, input_paths, 0, label, sizes=sizes)
        # the distinct records: against those
        elif "dedup" in manifest or "dedup" in (manifest.get("options") or {}):
            source = before = locate.scan_distinct(
                fmt, input_paths, manifest, threshold, label, sizes
            )
        else:
            source = before = locate.scan(
                fmt, input_paths, threshold, label, locate.run_keys(manifest), sizes
            )
    except InputError as error:
        raise _without_format_hint(error, fmt) from None
    return source, before


def _class_ids(label, source, before, target, with_copies: bool):
    """``(input_ids, output_ids, values, before_ids)``: the label's class ids of the order's
    input (``with_copies``: the input with --balance's copies), of the output and of the input
    as it is, and the label's values; the ids are None on one value, all four without a label."""
    if label is None:
        return None, None, None, None
    _check_label_reach(label, target)
    copied = [source.labels] if with_copies else []
    ids, values = locate.class_ids(before.labels, target.labels, *copied)
    if len(values) > _MAX_LABEL_CLASSES:
        raise ValueError(
            f"the label ({label.describe()}) takes {len(values):,} values; label balance needs "
            f"a categorical label (at most {_MAX_LABEL_CLASSES:,} values)"
        )
    if len(values) <= 1:  # one class: every batch is all of it, the test has nothing to test
        return None, None, values, None
    before_ids, output_ids = ids[0], ids[1]
    # the order's input: with the copies on a balanced run
    input_ids = ids[-1] if copied else before_ids
    return input_ids, output_ids, values, before_ids


def _balanced(manifest) -> bool:
    """Whether the output was written with ``--balance`` (a shard manifest's or a store's
    ``options`` say so). A store balances each generation on its own class counts: one of
    several generations is refused (the input with its copies is recomputed as one run's)."""
    if not (manifest.get("options") or {}).get("balance"):
        return False
    generations = manifest.get("generations") or []
    if len(generations) > 1:
        raise UsageError(
            f"the store holds {len(generations)} generations, each balanced by --balance on its "
            "own class counts: quality measures a balanced store of one generation (or a balanced "
            "run's shards)"
        )
    return True


def _balance_summary(manifest) -> dict:
    """What the order of a ``--balance`` output is compared with: its input with each record
    repeated by its copies (paired with the output's records by their pass-1 keys)."""
    options = manifest.get("options") or {}
    balance = manifest.get("balance") or (
        (manifest.get("generations") or [{}])[0].get("balance") or {}
    )
    return {
        "label_field": options.get("label_field"),
        "policy": balance.get("policy", options.get("balance")),
        "undersample": bool(options.get("undersample")),
        "input_records": int(sum(balance.get("records_before", {}).values())),
        "records": int(manifest["totals"]["records"]),
        "order_input": "the input with each record repeated by its copies, in pass 1's order",
    }


def _named(paths) -> str:
    paths = list(paths)  # or {path: bytes}
    return ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")


def _without_format_hint(error: InputError, fmt) -> InputError:
    """A reader's error on ``--input`` with its hint to give ``--format`` replaced: quality
    has no ``--format``, it reads the input in the run's format (from its manifest), so a
    file that does not read as that is not the run's input."""
    problem = _READER_FORMAT_HINT.sub("", error.problem)
    if problem == error.problem:
        return error
    return InputError(
        error.path,
        f"{problem} (quality reads --input as the run's {fmt.name} records: is it the "
        "run's input?)",
        error.offset,
    )


def _check_located(located: int, expected: int, input_paths):
    """Refuse a verdict on fewer than ``MIN_SAMPLE`` located records (or, on a smaller
    output, fewer than the ``expected`` sampled output records not left out as duplicates):
    the run's own input holds every one of them, another input of the same size few or none,
    and on a handful no test can tell a shuffle from a bad order."""
    needed = min(MIN_SAMPLE, expected)
    if located < needed:
        raise InputError(
            _named(input_paths),
            f"only {located:,} of the {expected:,} sampled output records were found "
            f"in --input: is it the run's input? (a verdict needs {needed:,})",
        )


def _one_value_note(label, values, records: int) -> str:
    """Why a label of one value (or none, on no records) is left out: every batch holds only
    that value, so the batch test (p = 1 on any order) would say nothing."""
    takes = "one value" if len(values) else "no value"
    return (
        f"the label ({label.describe()}) takes {takes} over the {records:,} records: no batch can "
        "be unbalanced, so the label test is left out"
    )


def _check_label_reach(label, target):
    """Refuse ``--label_bytes START:END`` that starts past the end of every record: every
    label would be the padding 0."""
    if label.start is not None and target.records and target.longest <= label.start:
        raise UsageError(
            f"{label.option()}: the records are at most {target.longest:,} bytes long, so START "
            f"must be below {target.longest:,}"
        )


def _compare_policies(own: Row, source, pile_sizes, manifest, input_ids, batch_size):
    """The other policies on the same sampled records, then the run's own row.

    Input policies are simulated on input positions. The loader's epochs reorder the
    output: its rows take the sample's measured output positions (and the output's labels)
    through the loader's epoch order. Training needs every record's input position: it
    uses the run's order re-derived from its seed (``reproduced`` says how much of the
    sample it matches: 100% for ``run`` and a store's first generation). On a ``--balance``
    run the input positions count the copies (``source``: ``locate.scan_with_copies``)."""
    seed, num_piles = int(manifest.get("seed") or 0), int(manifest["num_piles"])
    given_x = _balanced(manifest)  # the sample's input positions come in clusters of copies
    n = int(sum(pile_sizes))
    written = np.argsort(source.order_keys, kind="stable")  # the run's order, from its seed
    task = training.cats_then_dogs(len(range(0, n, training_stride(n))), seed)
    window = _one_pile(n, num_piles)  # "near": within one pile's records, the buffer row's memory
    rows = []
    for policy, (first, second) in _input_policies(source.file_records, seed, num_piles).items():
        where, where_next = orders.inverse(first), orders.inverse(second)
        labels = None if input_ids is None else input_ids[first]
        row = Row(policy, own.x, where[own.x], labels, where_next[own.x])
        rows.append(_complete(row, where, where_next, first, n, batch_size, task, window, given_x))
    for mix in (1, 4):
        first, second = (orders.epoch_positions(pile_sizes, seed, epoch, mix) for epoch in (1, 2))
        where, where_next = orders.inverse(first), orders.inverse(second)
        labels = None if own.labels is None else own.labels[first]
        row = Row(f"loader, mix={mix}", own.x, where[own.y], labels, where_next[own.y])
        rows.append(
            _complete(row, where, where_next, written[first], n, batch_size, task, window, given_x)
        )
    own.next_y = own.y  # the shards read again: the same order
    _complete(own, np.arange(n), np.arange(n), written, n, batch_size, task, window)
    own.numbers["reproduced"] = (
        float(np.mean(orders.inverse(written)[own.x] == own.y)) if len(own.x) else 1.0
    )
    return rows + [own]


def _complete(
    row: Row, where, where_next, training_order, n, batch_size, task, window, given_x=False
) -> Row:
    """Fill in a row's numbers: order and batch statistics (unless measured already; ``given_x``:
    see ``metrics.order_metrics``),
    carry-over into the next epoch, the shuffle radius of the delivered order
    (``training_order``: input positions in delivery order) with ``window`` records as the
    near distance, one epoch of training, the verdict."""
    if not row.numbers:
        row.numbers = metrics.order_metrics(row.x, row.y, n, given_x)
        if row.labels is not None:
            row.numbers.update(metrics.batch_metrics(row.labels, batch_size))
    row.numbers.update(metrics.carry_over(where, where_next, batch_size))
    uniform_rate = row.numbers["remeet_uniform"]
    row.numbers["remeet_ratio"] = row.numbers["remeet"] / uniform_rate if uniform_rate else 0.0
    row.numbers.update(metrics.radius(training_order, window))
    row.radii = np.abs(np.diff(training_order[: _DRAWN_RADII + 1])) / max(n, 1)
    row.curve = training.train_one_epoch(task, thin(training_order, training_stride(n)))
    row.numbers["held_out_accuracy"] = row.curve["accuracy"][-1] if row.curve["accuracy"] else None
    row.numbers["uniform"] = _uniform(row.numbers)
    return row
