"""The issue's targets for the shuffle bench's rows, each judged PASS/FAIL (or n/a) with the
measured value (bench/README.md, "target")."""

from workspace import GB

RSS_TARGET = 1 * GB  # the bound on a pileshuffle run's peak tree RSS
FLOOR_TARGET = 0.7  # TFRecord: at most this share of the plain 2-pass floor's time (issue 22)
# Parquet, JSONL: at least this many times DuckDB's out-of-core throughput (issue 22)
DUCKDB_TARGET = 1.5
# --balance: at most this many times a plain run of the same output size (issue 24)
BALANCE_TARGET = 1.2
# 1 GB in 4,096 piles: at most 1.5x the 16-pile time, 1.5 GB (issue 35)
MANY_PILES_TARGET, MANY_PILES_RSS = 1.5, 1.5 * GB


def _many_piles_items(row, sixteen):
    """issue 35's bar for a many-piles row: its median over the same mode's 16-pile median, and its peak."""
    items = [
        (
            "RSS<=1.5GB",
            row["peak_rss_bytes"] <= MANY_PILES_RSS,
            f"{row['peak_rss_bytes'] / GB:.2f} GB",
        )
    ]
    if not row["name"].endswith("-4096"):
        return items
    name = f"wall<={MANY_PILES_TARGET}x 16 piles"
    if not sixteen:
        return [*items, (name, None, "no 16-pile row")]
    ratio = row["median_wall_seconds"] / sixteen["median_wall_seconds"]
    return [
        *items,
        (
            name,
            ratio <= MANY_PILES_TARGET,
            f"{ratio:.2f}x (medians {row['median_wall_seconds']:.2f} vs "
            f"{sixteen['median_wall_seconds']:.2f} s)",
        ),
    ]


def verdict(ok):
    return "PASS" if ok else "FAIL"


def _against_duckdb(ps, duck):
    """pileshuffle's median throughput over DuckDB's out-of-core one, and its peak memory against DuckDB's."""
    name = f">={DUCKDB_TARGET}x DuckDB"
    if duck is None:
        return [(name, None, "no DuckDB row"), ("RSS<=DuckDB's", None, "no DuckDB row")]
    speed = duck["median_wall_seconds"] / ps["median_wall_seconds"]
    return [
        (name, speed >= DUCKDB_TARGET, f"{speed:.2f}x (medians)"),
        (
            "RSS<=DuckDB's",
            ps["peak_rss_bytes"] <= duck["peak_rss_bytes"],
            f"{ps['peak_rss_bytes'] / GB:.2f} vs {duck['peak_rss_bytes'] / GB:.2f} GB",
        ),
    ]


def _balance_items(bal, same_output, same_input):
    """issue 24's bar on the medians: a ``--balance`` row over the plain run of as many records as
    it writes; its ratio to the plain run of the same input goes into its notes (no bar, for reading)."""
    name = f"wall<={BALANCE_TARGET}x plain of the same output size"
    if same_input:
        ratio = bal["median_wall_seconds"] / same_input["median_wall_seconds"]
        bal["notes"] = f"{bal['notes']}; x plain of the same input: {ratio:.2f} (medians)"
    if not same_output:
        return [(name, None, "no same-output row")]
    ratio = bal["median_wall_seconds"] / same_output["median_wall_seconds"]
    return [
        (
            name,
            ratio <= BALANCE_TARGET,
            f"{ratio:.2f}x (medians {bal['median_wall_seconds']:.2f} vs "
            f"{same_output['median_wall_seconds']:.2f} s)",
        )
    ]


def evaluate_targets(rows, scale):
    """Set every row's ``targets`` (a list of dicts) and ``target`` (their one-line text)."""
    by = {r["name"]: r for r in rows}

    def good(name):
        r = by.get(name)
        return r if r and r["returncode"] == 0 else None

    def rss(r):
        return ("RSS<=1GB", r["peak_rss_bytes"] <= RSS_TARGET, f"{r['peak_rss_bytes'] / GB:.2f} GB")

    results = {}
    if scale == 1:
        ps = good("pileshuffle-tfrecord")
        if ps:
            items = []
            floor = good("floor-tfrecord")
            # judged on the medians (with one round, the only runs): a lucky fastest run proves little here
            items.append(
                (
                    f"wall<={FLOOR_TARGET}x floor",
                    ps["median_ratio"] <= FLOOR_TARGET,
                    f"median {ps['median_ratio']:.2f}x, fastest {ps['ratio']:.2f}x",
                )
                if floor
                else (f"wall<={FLOOR_TARGET}x floor", None, "no floor row")
            )
            items.append(rss(ps))
            beam = good("beam-common-tfrecord")
            items.append(
                (
                    ">=8x faster than beam-common",
                    beam["wall_seconds"] / ps["wall_seconds"] >= 8,
                    f"{beam['wall_seconds'] / ps['wall_seconds']:.1f}x",
                )
                if beam
                else (">=8x faster than beam-common", None, "no beam-common row")
            )
            results["pileshuffle-tfrecord"] = items
        for fmt in ("parquet", "jsonl"):
            ps = good(f"pileshuffle-{fmt}")
            if ps:
                results[ps["name"]] = [*_against_duckdb(ps, good(f"duckdb-{fmt}")), rss(ps)]
            # default piles; piles for the output
            for bal in (
                good(f"balance-{fmt}"),
                good(f"balance-{fmt}-piles"),
            ):
                if bal:
                    results[bal["name"]] = [
                        *_balance_items(
                            bal,
                            good(f"balance-{fmt}-same-output"),
                            good(f"balance-{fmt}-same-input"),
                        ),
                        rss(bal),
                    ]
            # labels already balanced: the output is the input's size (+0.3%)
            near = good(f"pileshuffle-{fmt}-balanced")
            if near:
                results[near["name"]] = [*_balance_items(near, ps, None), rss(near)]
        for mode in ("files", "shuffle"):
            for m in (16, 1024, 4096):
                row = good(f"piles-{mode}-{m}")
                if row:
                    results[row["name"]] = _many_piles_items(row, good(f"piles-{mode}-16"))
    else:
        big, one = good("pileshuffle-tfrecord"), good("pileshuffle-tfrecord-1x")
        if big:
            items = [rss(big)]
            limit = f"wall<=1.2x{scale}x(1x wall)"
            if one:
                bound = 1.2 * scale * one["wall_seconds"]
                items.append(
                    (
                        limit,
                        big["wall_seconds"] <= bound,
                        f"{big['wall_seconds']:.1f} s vs {bound:.1f} s",
                    )
                )
            else:
                items.append((limit, None, "no 1x row"))
            results["pileshuffle-tfrecord"] = items
    for name, r in by.items():
        if r["kind"] == "pileshuffle" and r["returncode"] != 0:
            results[name] = [("run succeeds", False, f"exit {r['returncode']}")]
        if r["kind"] == "pileshuffle" and r.get("check_ok") is False:
            results.setdefault(name, []).append(("record count", False, r["check"]))
    for r in rows:
        items = results.get(r["name"], [])
        r["targets"] = [{"target": t, "pass": ok, "value": v} for t, ok, v in items]
        r["target"] = "; ".join(
            f"{t}: {'n/a' if ok is None else verdict(ok)} ({v})" for t, ok, v in items
        )
