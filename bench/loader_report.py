"""The loader bench's results: each row's fastest and median round, its ratios to the in-order
read and to tf.data's shuffle, the issue's targets, and the table with its legend."""

import statistics

from workspace import MB

RSS_ALLOWANCE = 200 * MB  # the allowance above (K+1) piles: interpreter, imports, buffers
# rows that hand the in-process batches on: x in-process
DELIVERING = (
    "dl1",
    "dl2",
    "dl4",
    "dl2-arrow",
    "tf-adapter",
    "grain",
    "grain-mp2",
)


VERDICTS = {True: "PASS", False: "FAIL", None: "shown"}  # None: a figure shown, not a target
# a mixture's chunk of 8,192 records being mixed, and its take's copy (Parquet)
MIXING_ALLOWANCE = 32 * MB


def pile_bytes(data):
    return data["bytes"] / data["piles"]


def fastest_rounds(plan, attempts):
    """Each row's fastest good round with its medians and peaks over the good rounds (its last
    round when none was good), in plan order."""
    rows = []
    for name, *_ in plan:
        good = [a for a in attempts[name] if a.get("ok")]
        if not good:
            rows.append(attempts[name][-1])
            continue
        best = dict(min(good, key=lambda a: a["seconds"]))
        best["median_seconds"] = statistics.median(a["seconds"] for a in good)
        best["median_cpu_seconds"] = statistics.median(a["cpu_seconds"] for a in good)
        best["rounds_seconds"] = [round(a["seconds"], 3) for a in good]
        best["peak_rss"] = max(a["peak_rss"] for a in good)
        best["peak_rss_process"] = max(a["peak_rss_process"] for a in good)
        best["peak_rss_main"] = max(a.get("peak_rss_main", 0) for a in good)
        best["peak_rss_worker"] = max(a.get("peak_rss_worker", 0) for a in good)
        rows.append(best)
    return rows


def add_ratios_and_targets(rows, data):
    """Each good row's x in-order, cpu x in-order, x tf-shuffle and targets (``data``: by format).
    Ratios are per record (a mixture row may deliver more records than the others)."""
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        if not r.get("ok"):
            continue
        base, tfs = by_name.get(f"{r['format']}-inorder"), by_name.get("tfrecord-tf-shuffle")
        r["x_inorder"] = speed_ratio(r, base)
        r["cpu_x_inorder"] = (
            cpu_per_record(base) / cpu_per_record(r) if base and base.get("ok") else None
        )
        r["x_tf_shuffle"] = speed_ratio(r, tfs) if r["format"] == "tfrecord" else None
        here = (
            by_name.get(f"{r['format']}-k{r['mix']}")
            if r["kind"] in (*DELIVERING, "dl2-ready")
            else None
        )
        r["x_in_process"] = speed_ratio(r, here)
        r["targets"] = targets(r, by_name, data[r["format"]])


def speed_ratio(row, yardstick):
    """``row``'s median records/s over ``yardstick``'s (None without a good yardstick)."""
    if not yardstick or not yardstick.get("ok"):
        return None
    return median_records_per_s(row) / median_records_per_s(yardstick)


def median_records_per_s(row):
    return row["records"] / row["median_seconds"]


def cpu_per_record(row):
    return row["median_cpu_seconds"] / row["records"]


def targets(row, by_name, data):
    """The issue's targets for a reshuffling loader row, judged on medians: [(target, ok, value)]."""
    if row["kind"] in ("mixture", "mixture-half"):
        return mixture_targets(row, by_name, data)
    if row["kind"] not in ("loader", *DELIVERING) or not row.get("ok"):
        return []
    fmt, out = row["format"], []
    if row["kind"] in ("dl2", "dl2-arrow") and row.get("x_in_process") is not None:
        ratio = row["x_in_process"]
        out.append((f">=0.6x in-process k{row['mix']}", ratio >= 0.6, f"{ratio:.2f}x"))
    base = by_name.get(f"{fmt}-inorder")
    if base and base.get("ok") and row["kind"] == "loader":
        ratio = speed_ratio(row, base)
        out.append(
            (">=0.9x in-order", ratio >= 0.9, f"{ratio:.2f}x; CPU {row['cpu_x_inorder']:.2f}x")
        )
    tf_shuffle = by_name.get("tfrecord-tf-shuffle")
    if fmt == "tfrecord" and tf_shuffle and tf_shuffle.get("ok") and row["mix"] == 1:
        ratio = speed_ratio(row, tf_shuffle)
        out.append((">=1x tf shuffle(62,500)", ratio >= 1.0, f"{ratio:.2f}x"))
    bound = (row["mix"] + 1) * pile_bytes(data) + RSS_ALLOWANCE
    measured = row["peak_rss_process"]
    out.append(
        (
            f"RSS<=(K+1)xpile+200MB={bound / MB:,.0f}MB",
            measured <= bound,
            f"{measured / MB:,.0f} MB",
        )
    )
    return out


def mixture_targets(row, by_name, data):
    """A Mixture of two outputs: its records/s at least 0.8x one output's reshuffling row;
    memory within the loader's bound per source: what it holds above its imports at most twice
    what one output's row holds, plus ``MIXING_ALLOWANCE`` (the records being mixed). The half
    row's speed is shown, not judged: it reads half of each output's epoch, so it loads the
    piles across that boundary in both of its epochs (a fixed cost per epoch, see
    docs/performance.md)."""
    alone = by_name.get(f"{row['format']}-k{row['mix']}")
    if not row.get("ok") or not alone or not alone.get("ok"):
        return []
    ratio = speed_ratio(row, alone)
    held, bound = above_imports(row), 2 * above_imports(alone) + MIXING_ALLOWANCE
    judged = row["kind"] == "mixture"  # the half row's speed is shown (None), not judged
    return [
        (
            f"{'>=0.8' if judged else ''}x one output (k{row['mix']})",
            ratio >= 0.8 if judged else None,
            f"{ratio:.2f}x",
        ),
        (
            f"above imports<=2x one output's+{MIXING_ALLOWANCE / MB:.0f}MB={bound / MB:,.0f}MB",
            held <= bound,
            f"{held / MB:,.0f} MB",
        ),
    ]


def above_imports(row):
    return row["peak_rss_process"] - row["rss_before"]


def table(rows):
    header = [
        "row",
        "records/s",
        "MB/s",
        "median s",
        "x in-order",
        "x in-process",
        "x tf-shuffle",
        "cpu s",
        "cpu x in-order",
        "peak RSS MB",
        "largest proc MB",
        "main / worker MB",
        "RSS before MB",
        "above imports MB",
        "targets",
    ]
    body = []
    for r in rows:
        if not r.get("ok"):
            body.append([r["name"], *["-"] * (len(header) - 2), f"FAILED: {r.get('error', '')}"])
            continue
        body.append(
            [
                r["name"],
                f"{r['records_per_s']:,.0f}",
                f"{r['mb_per_s']:,.0f}",
                f"{r['median_seconds']:.2f}",
                "-" if r.get("x_inorder") is None else f"{r['x_inorder']:.2f}",
                "-" if r.get("x_in_process") is None else f"{r['x_in_process']:.2f}",
                "-" if r.get("x_tf_shuffle") is None else f"{r['x_tf_shuffle']:.2f}",
                f"{r['median_cpu_seconds']:.2f}",
                "-" if r.get("cpu_x_inorder") is None else f"{r['cpu_x_inorder']:.2f}",
                f"{r['peak_rss'] / MB:,.0f}",
                f"{r['peak_rss_process'] / MB:,.0f}",
                main_and_worker(r),
                f"{r['rss_before'] / MB:,.0f}",
                f"{above_imports(r) / MB:,.0f}",
                "; ".join(f"{t}: {VERDICTS[ok]} ({v})" for t, ok, v in r.get("targets", [])),
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def main_and_worker(row):
    """The row's main process's own peak RSS and its largest DataLoader worker's ('-' without workers)."""
    worker = row.get("peak_rss_worker", 0)
    return f"{row.get('peak_rss_main', 0) / MB:,.0f} / {worker / MB:,.0f}" if worker else "-"


LEGEND = """\
records/s, MB/s: the row's fastest round (MB/s = shard file bytes / time; 1 MB = 10^6 B); median s: its median
round. Speeds are records/s: a mixture row delivers 2N records, the others N. x in-order: the median speed of
the row / that of the loader's in-order read of the same shards (same format); x in-process: / that of the
same mix read in-process (kK: list[bytes], or Parquet RecordBatches); x tf-shuffle: / that of tf.data's
shuffle(62,500).batch(256) (TFRecord). cpu s: median CPU seconds of the row's process (all threads) and its
DataLoader workers over the same span; cpu x in-order: in-order's / the row's, per record
(steadier than wall times when other jobs share the cores; wall ratios are the targets). peak RSS: the largest
sum of RSS over the row's process tree in its timed span (DataLoader workers included); largest proc: the largest single
process's RSS (what the (K+1) x pile + 200 MB target is judged on: each DataLoader worker holds its own piles);
main / worker: each one's own peak (the row's process, its largest DataLoader worker); RSS before: the row's
process just before its first batch (interpreter + imports: torch's ~0.2 GB, TensorFlow's ~0.5 GB); above
imports: largest proc - RSS before (the data the row holds). DataLoader workers are forked from the main
process but count its shared library pages only once they touch them, so for the -dlN rows this understates.
targets: PASS/FAIL on medians; "shown": a figure compared without a target."""
