"""The report of bench/dedup.py: each row's medians over its rounds, its ratios to the plain
pileshuffle run and to DuckDB's two steps (and the dedup target), and the markdown table.
"""

import statistics

from workspace import GB

TARGET = 1.15  # pileshuffle-dedup's median wall over pileshuffle's


def summarize(row, runs, skipped):
    """A row's medians over its good runs (all runs if none was good)."""
    if skipped:
        return {"row": row, "status": skipped, "runs": []}
    good, bad = (
        [r for r in runs if r["check_ok"]] or runs,
        [r["check"] for r in runs if not r["check_ok"]],
    )
    return {
        "row": row,
        "status": bad[0] if bad else "ok",
        "runs": runs,
        "median_wall_seconds": round(statistics.median(r["wall_seconds"] for r in good), 3),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in good),
        "median_cores": round(statistics.median(r["cores_used"] for r in good), 2),
        "max_others_busy": max(r["others_busy"] for r in runs),
        "records_out": good[0]["records_out"],
        "peak_disk_bytes": max(r["peak_disk_bytes"] or 0 for r in good),
    }


def add_ratios(rows):
    """x plain and x duckdb-2step from the medians, and the per-round ratio to plain (same round)."""
    by = {r["row"]: r for r in rows}
    for r in rows:
        for key, base in (("x_plain", "pileshuffle"), ("x_duckdb_2step", "duckdb-2step")):
            b = by.get(base)
            ok = r["status"] == "ok" and b and b["status"] == "ok"
            r[key] = round(r["median_wall_seconds"] / b["median_wall_seconds"], 3) if ok else None
        plain = by.get("pileshuffle", {}).get("runs", [])
        if r["runs"] and r["row"] != "pileshuffle" and len(plain) == len(r["runs"]):
            r["round_x_plain"] = [
                round(a["wall_seconds"] / p["wall_seconds"], 3) for a, p in zip(r["runs"], plain)
            ]
    dedup = by.get("pileshuffle-dedup")
    if dedup is not None:
        x = dedup["x_plain"]
        dedup["target"] = (
            (f"<= {TARGET}x plain: " + ("PASS" if x <= TARGET else "FAIL") + f" ({x:.2f}x)")
            if x
            else f"<= {TARGET}x plain: not measured"
        )


def notes(r):
    if not r["runs"]:
        return ""
    walls = ", ".join(f"{x['wall_seconds']:.2f}" for x in r["runs"])
    details = next((x.get("details") or {} for x in r["runs"] if x["check_ok"]), {})
    extra = (
        [f"{details.get('num_piles')} piles; pipeline {details['pipeline_seconds']:.2f} s"]
        if details.get("pipeline_seconds") is not None
        else []
    )
    if details.get("memory_limit"):  # DuckDB's
        extra.append(
            f"DuckDB {details.get('duckdb')}, memory_limit {details['memory_limit']}"
            + "".join(f", {k} {v:.2f} s" for k, v in details.get("steps", {}).items())
        )
    paired = (
        f" (x plain: {', '.join(f'{x:.2f}' for x in r['round_x_plain'])})"
        if r.get("round_x_plain")
        else ""
    )
    return "; ".join(extra + [f"rounds: {walls} s{paired}"])


def table(sets):
    head = [
        "data",
        "row",
        "median wall s",
        "peak RSS GB",
        "cores",
        "records in",
        "records out",
        "check",
        "x plain",
        "x duckdb-2step",
        "others % (max)",
        "target",
        "notes",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for data, rows in sets:
        for r in rows:
            got = {
                k: r.get(k)
                for k in (
                    "median_wall_seconds",
                    "peak_rss_bytes",
                    "median_cores",
                    "x_plain",
                    "x_duckdb_2step",
                )
            }
            cells = [
                "-" if v is None else f"{v / GB if k == 'peak_rss_bytes' else v:.2f}"
                for k, v in got.items()
            ]
            out, others = r.get("records_out"), r.get("max_others_busy")
            lines.append(
                f"| {data['bytes'] / 1e6:,.0f} MB, {data['params']['dup_fraction']:g} copies | {r['row']} | "
                + " | ".join(cells[:3])
                + f" | {data['records']:,} | {'-' if out is None else f'{out:,}'} | "
                f"{r['status']} | {cells[3]} | {cells[4]} | {'-' if others is None else f'{100 * others:.0f}'} | "
                f"{r.get('target', '')} | {notes(r)} |"
            )
    return lines
