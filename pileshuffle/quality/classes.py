"""Class shares per batch: what an order (and ``--balance``) does to each class.

For each class of the label: its share of all records before (the input) and after (the
output), and its share of each full batch of ``batch_size`` records: the mean, the 5th and
95th percentiles, and the share of batches holding no record of it. *Before* is measured in
the input's own order and computed for the input uniformly shuffled (a batch then holds a
hypergeometric number of the class: exact, no simulation); *after* is measured on the
output, next to what a uniform shuffle of the output's records gives. On an unbalanced
run the shares of all records are equal before and after; ``--balance`` changes them.
"""

import numpy as np
from scipy import stats

from pileshuffle.quality import metrics

__all__ = ["measured", "uniform", "class_shares", "text_lines"]

_QUANTILES = (5, 95)
_SHOWN = 8  # classes in the text summary (the rarest before); quality.json holds every class


def measured(ids: np.ndarray, classes: int, batch_size: int) -> list:
    """Per class, its share of each full batch of the order ``ids`` (class ids, in order):
    ``{mean, p5, p95, empty}``; None for every class when no batch is full."""
    counts = metrics.batch_counts(ids, batch_size)
    if not len(counts):
        return [None] * classes
    counts = np.pad(counts, ((0, 0), (0, classes - counts.shape[1])))
    shares = counts / batch_size
    # as the hypergeometric's ppf
    low, high = np.percentile(shares, _QUANTILES, axis=0, method="inverted_cdf")
    return [
        {
            "mean": float(shares[:, c].mean()),
            "p5": float(low[c]),
            "p95": float(high[c]),
            "empty": float(np.mean(counts[:, c] == 0)),
        }
        for c in range(classes)
    ]


def uniform(count: int, records: int, batch_size: int):
    """The same numbers for a batch of a uniform shuffle of ``records`` records, ``count`` of
    the class: a hypergeometric draw of ``batch_size``; None when no batch is full."""
    if records < batch_size or records == 0:
        return None
    law = stats.hypergeom(records, count, batch_size)
    low, high = law.ppf([q / 100 for q in _QUANTILES])
    return {
        "mean": count / records,
        "p5": float(low) / batch_size,
        "p95": float(high) / batch_size,
        "empty": float(law.pmf(0)),
    }


def _name(value):
    return value.item() if isinstance(value, np.generic) else value


def class_shares(
    before_ids: np.ndarray, after_ids: np.ndarray, values, batch_size: int, what: str
) -> dict:
    """The section of quality.json: ``before_ids`` the input's class ids in input order,
    ``after_ids`` the output's in output order, ``values`` the class of each id."""
    classes = len(values)
    before_counts = np.bincount(before_ids, minlength=classes)
    after_counts = np.bincount(after_ids, minlength=classes)
    before, after = (
        measured(before_ids, classes, batch_size),
        measured(after_ids, classes, batch_size),
    )
    rows = []
    for c, value in enumerate(values):
        rows.append(
            {
                "class": _name(value),
                "records_before": int(before_counts[c]),
                "records_after": int(after_counts[c]),
                "share_before": float(before_counts[c] / max(len(before_ids), 1)),
                "share_after": float(after_counts[c] / max(len(after_ids), 1)),
                "before": before[c],
                "before_uniform": uniform(int(before_counts[c]), len(before_ids), batch_size),
                "after": after[c],
                "after_uniform": uniform(int(after_counts[c]), len(after_ids), batch_size),
            }
        )
    return {
        "label": what,
        "batch_size": batch_size,
        "batches_before": len(before_ids) // batch_size,
        "batches_after": len(after_ids) // batch_size,
        "classes": rows,
    }


def _cell(numbers) -> str:
    if numbers is None:
        return "-"
    return (
        f"{numbers['mean']:.1%} [{100 * numbers['p5']:.1f}-{100 * numbers['p95']:.1f}] "
        f"{numbers['empty']:.0%}"
    )


def text_lines(section: dict) -> list:
    """The section as aligned text: one line per class (the rarest before first); the
    output's uniform expectation is in quality.json (``after_uniform``)."""
    shown = sorted(section["classes"], key=lambda row: (row["share_before"], str(row["class"])))
    header = ["class", "before -> after", "input order", "input shuffled", "output"]
    rows = [
        [
            str(row["class"]),
            f"{row['share_before']:.1%} -> {row['share_after']:.1%}",
            _cell(row["before"]),
            _cell(row["before_uniform"]),
            _cell(row["after"]),
        ]
        for row in shown[:_SHOWN]
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        f"  class shares ({section['label']}): of all records, before -> after; per batch of "
        f"{section['batch_size']}: mean [5%-95%] and the batches without the class"
    ]
    lines += [
        "    "
        + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [header, *rows]
    ]
    if len(shown) > _SHOWN:
        lines.append(f"    ... and {len(shown) - _SHOWN:,} more classes in quality.json")
    return lines
