"""The report's figures (matplotlib, imported here only: ``pip install pileshuffle[report]``).

``quality.png``: one row per policy (one row without ``--compare``); columns: input against
delivered position (a sample), the input-block x output-block table over its expectation,
the displacement histogram against the uniform permutation's triangle, label counts per
batch against the binomial (with a label), where each record lands in the next epoch and,
with a label, each class's share per batch before and after (on the run's own row).
``training.png``: held-out loss and accuracy against SGD step, one curve per policy.
"""

import numpy as np

from pileshuffle.quality import metrics, training

__all__ = ["quality_figure", "training_figure"]

_SCATTER_POINTS = 3000
_CLASS_BARS = 12  # classes drawn (the rarest before); quality.json holds every class


def _p(value: float) -> str:
    return f"{value:.2g}" if value >= 1e-99 else "<1e-99"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(
            "the figures need matplotlib: pip install 'pileshuffle[report]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _scatter(ax, x, y, n, xlabel, ylabel):
    step = max(1, len(x) // _SCATTER_POINTS)
    ax.scatter(
        np.asarray(x)[::step] / n,
        np.asarray(y)[::step] / n,
        s=1,
        alpha=0.4,
        color="tab:blue",
        rasterized=True,
    )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)


def _heatmap(ax, row, n):
    blocks = row.numbers["blocks"]
    table = metrics.block_table(row.x, row.y, n, blocks)
    expected = np.outer(table.sum(1), table.sum(0)) / max(1, table.sum())
    ratio = (
        table / np.maximum(expected, 1e-9)
    ).T  # x: input block, y: output block, as in the scatter
    ax.imshow(ratio, cmap="RdBu_r", vmin=0, vmax=2, origin="lower", extent=(0, 1, 0, 1))
    ax.set_title(f"block counts / expected: chi2 p={_p(row.numbers['block_chi2_p'])}", fontsize=8)
    ax.set_xlabel("input block", fontsize=8)
    ax.set_ylabel("output block", fontsize=8)


def _displacement(ax, row, n):
    displacement = (np.asarray(row.y) - np.asarray(row.x)) / n
    ax.hist(displacement, bins=40, range=(-1, 1), density=True, color="tab:blue", alpha=0.7)
    grid = np.linspace(-1, 1, 101)
    ax.plot(grid, metrics.UNIFORM_DISPLACEMENT.pdf(grid), color="black", lw=1, label="uniform")
    ax.set_title(f"displacement: KS p={_p(row.numbers['displacement_p'])}", fontsize=8)
    ax.set_xlabel("(delivered - input) / N", fontsize=8)


def _radius(ax, row):
    ax.hist(row.radii, bins=40, range=(0, 1), density=True, color="tab:blue", alpha=0.7)
    grid = np.linspace(0, 1, 101)
    ax.plot(grid, metrics.UNIFORM_RADIUS.pdf(grid), color="black", lw=1, label="uniform")
    ax.set_title(
        f"radius: median {row.numbers['radius_median']:.3f}, near "
        f"x{row.numbers['radius_within_ratio']:.0f}",
        fontsize=8,
    )
    ax.set_xlabel("|input distance| of neighbours / N", fontsize=8)


def _balance(ax, row, report):
    if row.labels is None:
        ax.axis("off")
        return
    counts = metrics.batch_counts(row.labels, report.batch_size)[:, 0]
    b = report.batch_size
    ax.hist(counts, bins=np.arange(-0.5, b + 1.5, max(1, b // 64)), color="tab:blue", alpha=0.7)
    k, expected = metrics.binomial_reference(counts, b, report.label_share)
    ax.plot(k, expected * max(1, b // 64), color="black", lw=1)
    ax.set_title(
        f"first class per batch: dispersion {row.numbers['batch_dispersion']:.2f}", fontsize=8
    )
    ax.set_xlabel(f"records of the first class in a batch of {b}", fontsize=8)


def _class_shares(ax, section):
    """Each class's share (bars: before grey, after blue) with the 5-95% range of its share
    per batch (before: the input uniformly shuffled; after: the output), rarest first."""
    shown = sorted(section["classes"], key=lambda row: (row["share_before"], str(row["class"])))[
        :_CLASS_BARS
    ]
    where = np.arange(len(shown))
    for offset, share, spread, colour, name in (
        (-0.2, "share_before", "before_uniform", "tab:gray", "before"),
        (0.2, "share_after", "after", "tab:blue", "after"),
    ):
        heights = np.array([row[share] for row in shown])
        ranges = [row[spread] or {"p5": h, "p95": h} for row, h in zip(shown, heights)]
        errors = np.array(
            [
                [max(h - r["p5"], 0) for r, h in zip(ranges, heights)],
                [max(r["p95"] - h, 0) for r, h in zip(ranges, heights)],
            ]
        )
        ax.bar(
            where + offset,
            heights,
            width=0.4,
            color=colour,
            alpha=0.8,
            label=name,
            yerr=errors,
            capsize=2,
        )
    ax.set_xticks(where, [str(row["class"])[:10] for row in shown], fontsize=7, rotation=30)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title(f"class share, 5-95% per batch of {section['batch_size']}", fontsize=8)


def quality_figure(report, path):
    """Draw ``report`` to ``path`` (PNG; a path or a binary file): per policy, the positions
    scatter, the block table, the displacement histogram, label balance per batch and, when
    compared, the next epoch and the shuffle radius; with a label, the class shares before
    and after on the run's own row."""
    plt = _pyplot()
    compare = len(report.rows) > 1
    section = report.summary.get("class_shares")
    columns = (6 if compare else 4) + (1 if section else 0)
    figure, axes = plt.subplots(
        len(report.rows), columns, figsize=(3.0 * columns, 2.6 * len(report.rows)), squeeze=False
    )
    n = report.records
    for line, row in zip(axes, report.rows):
        _scatter(line[0], row.x, row.y, n, "input position", f"{row.policy}\n\ndelivered position")
        line[0].yaxis.label.set_fontweight("bold")
        verdict = "uniform" if row.numbers.get("uniform") else "NOT uniform"
        line[0].set_title(f"spearman {row.numbers['spearman']:+.3f}: {verdict}", fontsize=8)
        _heatmap(line[1], row, n)
        _displacement(line[2], row, n)
        _balance(line[3], row, report)
        if compare:
            _scatter(line[4], row.y, row.next_y, n, "position, this epoch", "position, next epoch")
            line[4].set_title(
                f"next epoch: corr={row.numbers['epoch_correlation']:+.2f}, "
                f"re-meet x{row.numbers['remeet_ratio']:.0f}",
                fontsize=8,
            )
            _radius(line[5], row)
        if section:
            if row is report.rows[-1]:  # the run's own row (last when compared)
                _class_shares(line[-1], section)
            else:
                line[-1].axis("off")
        for ax in line:
            ax.tick_params(labelsize=7)
    figure.tight_layout()
    _save(figure, path, dpi=60)


def training_figure(report, path):
    """Draw each policy's held-out loss and accuracy over one epoch of SGD to ``path`` (PNG;
    a path or a binary file)."""
    plt = _pyplot()
    figure, (loss, accuracy) = plt.subplots(1, 2, figsize=(11, 3.6))
    for number, row in enumerate(report.rows):
        steps = np.asarray(row.curve["steps"])
        label = f"{row.policy} ({row.curve['accuracy'][-1]:.0%})"
        style = {
            "lw": 1.2,
            "label": label,
            "ls": ("-", "--", ":")[number % 3] if number >= 3 else "-",
        }
        loss.plot(steps, row.curve["loss"], **style)
        accuracy.plot(steps, row.curve["accuracy"], **style)
    loss.set_ylabel("held-out loss", fontsize=9)
    accuracy.set_ylabel("held-out accuracy", fontsize=9)
    accuracy.axhline(training.BEST_ACCURACY, color="gray", ls=":", lw=1)
    for ax in (loss, accuracy):
        ax.set_xlabel("SGD step (one epoch, batch 32)", fontsize=9)
        ax.tick_params(labelsize=8)
    accuracy.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.suptitle(
        'one epoch of SGD on "all cats, then all dogs" in each policy\'s order', fontsize=10
    )
    figure.tight_layout()
    _save(figure, path, dpi=80)


def _save(figure, out, dpi: int):
    """Save to ``out`` (a path or a binary file) as a small PNG: 64 colours (the figures are
    flat plots)."""
    import io

    from PIL import Image

    drawn = io.BytesIO()
    figure.savefig(drawn, dpi=dpi, format="png")
    figure.clf()
    drawn.seek(0)
    Image.open(drawn).convert("RGB").quantize(64).save(out, format="png", optimize=True)
