"""A Mixture's shares per window against its weights, beside what independent coin flips
(tf.data's ``sample_from_datasets``) would give with the same weights.

Measured on the positions of one mixture epoch: which dataset each position reads
(``Mixture.sources_at``, the records' true sources: tests/test_mixture.py checks every
delivered record against it), cut into consecutive batches of ``batch_size`` and into every
sliding window of that length. Coin flips are simulated with the same seed and lengths.
"""

import numpy as np

__all__ = ["MAX_POSITIONS", "parse_mixture", "window_shares", "text_lines"]

# positions measured at most (80 MB of counts): a longer epoch is measured on its start
MAX_POSITIONS = 10_000_000


def parse_mixture(text: str):
    """``"PREFIX=WEIGHT,PREFIX=WEIGHT"`` as ``(prefixes, weights)``; a ValueError names a bad
    part."""
    prefixes, weights = [], []
    for part in text.split(","):
        prefix, sep, weight = part.rpartition("=")
        try:
            value = float(weight)
        except ValueError:
            value = None
        if not sep or not prefix or value is None:
            raise ValueError(
                f"--mixture: {part!r} is not PREFIX=WEIGHT (e.g. out/web=0.7,out/code=0.3)"
            )
        prefixes.append(prefix)
        weights.append(value)
    return prefixes, weights


def _counts_per_window(sources: np.ndarray, count: int, size: int):
    """Per dataset: its records in each consecutive batch of ``size`` (``sources`` holds at
    least one), and in every sliding window of ``size``."""
    batches = sources[: len(sources) // size * size].reshape(-1, size)
    per_batch = [np.count_nonzero(batches == i, axis=1) for i in range(count)]
    sliding = []
    for i in range(count):
        cumulative = np.concatenate([[0], np.cumsum(sources == i, dtype=np.int64)])
        sliding.append(cumulative[size:] - cumulative[:-size])
    return per_batch, sliding


def _stats(per_batch, sliding, share, size) -> dict:
    return {
        "mean_per_batch": float(per_batch.mean()),
        "min_per_batch": int(per_batch.min()),
        "max_per_batch": int(per_batch.max()),
        "batches_without": float((per_batch == 0).mean()),
        "max_deviation": float(np.abs(sliding - share * size).max()),
    }


def window_shares(mixture, batch_size: int) -> dict:
    """The report's ``mixture`` section for ``mixture``'s current epoch (module docstring)."""
    total = min(mixture.records_per_epoch, MAX_POSITIONS)
    if total < batch_size:
        raise ValueError(
            f"the mixture's epoch holds {mixture.records_per_epoch:,} records, fewer than one "
            f"batch of {batch_size:,}: give a smaller --batch_size"
        )
    count = len(mixture.sources)
    shares = np.array(mixture.weights, dtype=np.float64) / sum(mixture.weights)
    sources = mixture.sources_at(0, total).astype(np.int64)
    flips = np.random.default_rng(mixture.seed).choice(count, size=total, p=shares)
    mixed, flipped = (
        _counts_per_window(sources, count, batch_size),
        _counts_per_window(flips, count, batch_size),
    )
    datasets = []
    for i, source in enumerate(mixture.sources):
        datasets.append(
            {
                "output": source.output.location,
                "weight": float(shares[i]),
                "share": float((sources == i).mean()),
                "mixture": _stats(mixed[0][i], mixed[1][i], shares[i], batch_size),
                "coin_flips": _stats(flipped[0][i], flipped[1][i], shares[i], batch_size),
            }
        )
    return {
        "epoch": mixture.epoch,
        "stop": mixture.stop,
        "records_per_epoch": mixture.records_per_epoch,
        "positions_measured": total,
        "batch_size": batch_size,
        "datasets": datasets,
    }


def text_lines(section: dict) -> list:
    """The section as lines of the text summary."""
    size = section["batch_size"]
    lines = [
        f"mixture: epoch {section['epoch']}, {section['positions_measured']:,} positions "
        f"(stop={section['stop']!r}, {section['records_per_epoch']:,} per epoch), batches of "
        f"{size}",
        f"  {'dataset':<32} {'weight':>7} {'share':>7}   per batch (min-max, mean), sliding-window "
        "worst deviation, batches without it: mixture | coin flips",
    ]
    for d in section["datasets"]:
        m, c = d["mixture"], d["coin_flips"]
        lines.append(
            f"  {d['output'][-32:]:<32} {d['weight']:>7.4f} {d['share']:>7.4f}   "
            f"{m['min_per_batch']}-{m['max_per_batch']} ({m['mean_per_batch']:.2f}), "
            f"{m['max_deviation']:.2f}, {m['batches_without']:.1%} | "
            f"{c['min_per_batch']}-{c['max_per_batch']} ({c['mean_per_batch']:.2f}), "
            f"{c['max_deviation']:.2f}, {c['batches_without']:.1%}"
        )
    return lines
