"""The statistics of an order, each with what a uniform random permutation gives.

Inputs are positions: ``x`` (input position) and ``y`` (delivered position) of a sample of
records drawn independently of their positions, out of ``n`` records; or the label of
every delivered record, in order. Under a uniform permutation:
- Spearman's rho of (x, y) is 0 with standard error 1/sqrt(k-1) for k pairs;
- the input-block x output-block count table is independent (chi-square test);
- the displacement (y - x)/n has the triangular density 1 - |d| on (-1, 1) (KS test); when
  the sample's input positions are not a uniform sample of their own (whole records with
  their ``--balance`` copies come in clusters of adjacent positions), the test is against
  the displacement's law given those positions (``displacement_law``);
- a batch's label counts are hypergeometric (about binomial): the batch x label table is
  independent, and its chi-square over its degrees of freedom (the *dispersion*) is ~1.
Between two epochs: a record's positions are uncorrelated, and two records that shared a
batch share one again with probability (b-1)/(n-1).
The *shuffle radius* ("Dataset Shuffling at Scale"): how far apart in the input two records
delivered one after the other were. Under a uniform permutation |a - b|/n has the
triangular density 2(1 - r) on (0, 1): mean 1/3, median 1 - 1/sqrt(2) (0.29), and a share
2w/n - (w/n)^2 of neighbours were within w records of each other.
"""

import numpy as np
from scipy import stats

__all__ = [
    "UNIFORM_DISPLACEMENT",
    "displacement_law",
    "block_table",
    "independence",
    "order_metrics",
    "batch_counts",
    "batch_metrics",
    "binomial_reference",
    "carry_over",
    "combined_p",
    "UNIFORM_RADIUS",
    "radius",
    "within_uniform",
]

# (y - x)/n under a uniform permutation: 1 - |d| on (-1, 1)
UNIFORM_DISPLACEMENT = stats.triang(c=0.5, loc=-1.0, scale=2.0)


# |a - b|/n of neighbours under a uniform permutation
UNIFORM_RADIUS = stats.triang(c=0.0, loc=0.0, scale=1.0)


def within_uniform(window: int, n: int) -> float:
    """The share of neighbours within ``window`` positions of each other in the input under a
    uniform permutation of ``n`` records (exact: distinct positions, distance 1 .. window-1)."""
    w = min(max(int(window), 1), n)
    return (2 * (w - 1) * n - (w - 1) * w) / (n * (n - 1)) if n > 1 else 1.0


def radius(order: np.ndarray, window: int) -> dict:
    """The shuffle radius of a delivered ``order`` (input positions, every record, in delivery
    order): |distance in the input| of neighbours, over n; its mean and median, a KS test
    against the uniform law, and the share within ``window`` records against the uniform one."""
    order = np.asarray(order, dtype=np.int64)
    n = len(order)
    gaps = np.abs(np.diff(order))
    scaled = gaps / max(n, 1)
    ks = stats.kstest(scaled, UNIFORM_RADIUS.cdf) if len(gaps) else None
    within = float(np.mean(gaps < window)) if len(gaps) else 0.0
    expected = within_uniform(window, n)
    return {
        "radius_mean": float(scaled.mean()) if len(gaps) else 0.0,
        "radius_median": float(np.median(scaled)) if len(gaps) else 0.0,
        "radius_p": float(ks.pvalue) if ks else 1.0,
        "radius_window": int(window),
        "radius_within_window": within,
        "radius_within_window_uniform": expected,
        "radius_within_ratio": within / expected if expected else 0.0,
    }


def _blocks_for(pairs: int) -> int:
    """Blocks per side so that every cell of the block table expects >= 10 pairs."""
    return int(np.clip(np.sqrt(pairs / 10), 2, 16))


def block_table(x, y, n: int, blocks: int) -> np.ndarray:
    """``blocks`` x ``blocks`` counts of the (x, y) pairs by input and output block of ``n``
    positions; a uniform order fills it evenly."""
    cells = (np.asarray(x) * blocks // n) * blocks + np.asarray(y) * blocks // n
    return np.bincount(cells, minlength=blocks * blocks).reshape(blocks, blocks)


def independence(table: np.ndarray):
    """``(chi2, dof, p)`` of a contingency table (empty rows and columns dropped)."""
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    if min(table.shape) < 2:
        return 0.0, 0, 1.0
    result = stats.chi2_contingency(table, correction=False)
    return float(result.statistic), int(result.dof), float(result.pvalue)


def displacement_law(x, n: int):
    """The CDF of (y - x)/n for the input positions ``x`` when each y is uniform on (0, 1)*n:
    the mean over the sample of clip(x/n + d, 0, 1). On uniformly sampled x it is the
    triangular law; on clustered x (records with their copies) it keeps the KS test exact,
    where the triangle would see the clusters as a bad order. O(k log k)."""
    u = np.sort(np.asarray(x, dtype=np.float64) / max(n, 1))
    k, running = len(u), np.concatenate(([0.0], np.cumsum(u)))

    def cdf(d):
        d = np.asarray(d, dtype=np.float64)
        low = np.searchsorted(u, -d, side="right")  # x/n <= -d: no y below x + d*n
        high = np.maximum(np.searchsorted(u, 1 - d, side="left"), low)  # x/n >= 1 - d: every y
        return ((running[high] - running[low]) + d * (high - low) + (k - high)) / max(k, 1)

    return cdf


def order_metrics(x, y, n: int, given_x: bool = False) -> dict:
    """Rank correlation, block chi-square and displacement of sampled (x, y) pairs; with
    ``given_x`` the displacement is tested against its law given these x (``displacement_law``)."""
    x, y = np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64)
    k = len(x)
    rho = float(stats.spearmanr(x, y).statistic) if k > 2 else 0.0
    z = rho * np.sqrt(max(k - 1, 1))
    blocks = _blocks_for(k)
    chi2, dof, p = independence(block_table(x, y, n, blocks))
    displacement = (y - x) / n
    law = displacement_law(x, n) if given_x else UNIFORM_DISPLACEMENT.cdf
    ks = stats.kstest(displacement, law) if k else None
    return {
        "spearman": rho,
        "spearman_p": float(2 * stats.norm.sf(abs(z))),
        "blocks": blocks,
        "block_chi2": chi2,
        "block_chi2_dof": dof,
        "block_chi2_p": p,
        "displacement_mean_abs": float(np.abs(displacement).mean()) if k else 0.0,
        "displacement_ks": float(ks.statistic) if ks else 0.0,
        "displacement_p": float(ks.pvalue) if ks else 1.0,
    }


def batch_counts(labels: np.ndarray, batch_size: int) -> np.ndarray:
    """Full batches x label classes: how many records of each class each batch holds."""
    labels = np.asarray(labels, dtype=np.int64)
    batches = len(labels) // batch_size
    if batches == 0:
        return np.zeros((0, int(labels.max(initial=0)) + 1), np.int64)
    classes = int(labels.max()) + 1
    cells = np.repeat(np.arange(batches), batch_size) * classes + labels[: batches * batch_size]
    return np.bincount(cells, minlength=batches * classes).reshape(batches, classes)


def batch_metrics(labels: np.ndarray, batch_size: int) -> dict:
    """Label balance per batch: the batch x class chi-square, its dispersion (chi2/dof,
    ~1 when uniform, large when batches are dominated by one class) and p-value."""
    counts = batch_counts(labels, batch_size)
    chi2, dof, p = independence(counts)
    return {
        "batch_size": batch_size,
        "batches": int(len(counts)),
        "batch_dispersion": chi2 / dof if dof else 1.0,
        "batch_chi2_dof": dof,
        "batch_dispersion_p": p,
    }


def binomial_reference(counts_of_one_class: np.ndarray, batch_size: int, share: float):
    """``(k, expected batches with k records of the class)`` under Binomial(b, share)."""
    k = np.arange(batch_size + 1)
    return k, stats.binom.pmf(k, batch_size, share) * len(counts_of_one_class)


def carry_over(first: np.ndarray, second: np.ndarray, batch_size: int) -> dict:
    """How much of one epoch's order the next keeps. ``first``/``second``: where each
    input record is delivered in the two epochs (full arrays)."""
    first, second = np.asarray(first, np.int64), np.asarray(second, np.int64)
    n = len(first)
    correlation = (
        float(np.corrcoef(first, second)[0, 1]) if n > 2 and first.std() and second.std() else 0.0
    )
    keep = first < n // batch_size * batch_size
    a, b = first[keep] // batch_size, second[keep] // batch_size
    # records per (batch, next batch)
    _, together = np.unique(a * (n // batch_size + 1) + b, return_counts=True)
    pairs_again = float((together * (together - 1) // 2).sum())
    per_batch = np.bincount(a)
    pairs = float((per_batch * (per_batch - 1) // 2).sum())
    return {
        "epoch_correlation": correlation,
        "remeet": pairs_again / pairs if pairs else 0.0,
        "remeet_uniform": (batch_size - 1) / (n - 1) if n > 1 else 0.0,
    }


def combined_p(statistics, dofs) -> float:
    """p-value of independent chi-square statistics taken together (their sum is
    chi-square with the summed degrees of freedom)."""
    return float(stats.chi2.sf(float(np.sum(statistics)), int(np.sum(dofs))))
