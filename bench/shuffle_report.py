"""The shuffle bench's report: the table (text on stdout, markdown in results.md), its legend,
and the files a run leaves (bench/.out/results.md|json, a copy of both under bench/.out/runs/)."""

import json
import os

from machine import machine_lines
from workspace import GB, OUT, REPO

LEGEND = [
    "wall s: the row's whole process tree, start to exit (interpreter start and imports included); "
    "MB/s: input file bytes / wall (MB = 10^6 B); peak RSS: largest sum of RSS over the process and all its "
    "descendants, sampled every 50 ms (GB = 10^9 B; shared pages count once per process).",
    "x floor: wall / wall of the floor row of the same format in this run (below 1 = faster than the plain "
    "single-process Python 2-pass shuffle). With several rounds, wall s, MB/s and the other columns are the row's "
    "fastest run; median s and median x floor are the row's median run and its ratio to the floor's median. in-order %: share of adjacent pairs among the first 10,000 output "
    "records whose input index ascends (about 50 for a shuffle; 100 = input order kept).",
    "user, sys CPU s/GB: the row's median user and system CPU seconds (its whole process tree) per GB of input "
    "(10^9 B): on Dataflow vCPU-seconds are the bill, and on this VM CPU seconds are steadier than wall seconds. "
    "cores: CPU seconds (user+system) of the row's process tree / wall. others %: CPU used by processes outside "
    "the row during the row, as a share of all cores (other engineers' jobs; above ~10 the row's times are inflated).",
    "check: record count of the output (pileshuffle: manifest totals.records; others: counted) vs the generated count.",
    "chi2/dof: the 16 x 16 input block x output block chi-square over every output record (input block of its index, "
    "output block of its position; pileshuffle's `quality` statistic) over its 225 degrees of freedom: 1.00 +- 0.09 "
    "for a uniform permutation, far below 1 too even, far above 1 blocks kept together ('-': not a permutation or tar).",
    "disk GB: peak / at exit of the bytes under the row's folder bench/.out/NAME (output, work files, spills, caches; "
    "sampled every 0.5 s). Ray's own session files stay in /tmp/ray.",
]


def fmt_rss(r):
    return f"{r['peak_rss_bytes'] / GB:.2f}" if r["peak_rss_bytes"] else "-"


def fmt_disk(r):
    if r.get("peak_disk_bytes") is None:
        return "-"
    return f"{r['peak_disk_bytes'] / GB:.2f} / {r['end_disk_bytes'] / GB:.2f}"


def fmt_chi2(r):
    return (
        f"{r['block_chi2'] / r['block_chi2_dof']:.2f}" if r.get("block_chi2") is not None else "-"
    )


def table_rows(rows):
    """(header, body): one line of cells per row."""
    header = [
        "row",
        "data",
        "wall s",
        "MB/s",
        "records/s",
        "peak RSS GB",
        "x floor",
        "median s",
        "median x floor",
        "user CPU s/GB",
        "sys CPU s/GB",
        "cores",
        "others %",
        "disk GB",
        "check",
        "in-order %",
        "chi2/dof",
        "target",
        "notes",
    ]
    body = []
    for r in rows:
        body.append(
            [
                r["name"],
                f"{r['format']} {r['input_bytes'] / 1e6:,.0f} MB",
                f"{r['wall_seconds']:.2f}",
                f"{r['mb_per_s']:,.0f}",
                f"{r['records_per_s']:,}",
                fmt_rss(r),
                "-" if r.get("ratio") is None else f"{r['ratio']:.2f}",
                f"{r['median_wall_seconds']:.2f}",
                "-" if r.get("median_ratio") is None else f"{r['median_ratio']:.2f}",
                f"{r['median_user_cpu_per_gb']:.2f}",
                f"{r['median_system_cpu_per_gb']:.2f}",
                f"{r['cores_used']:.2f}",
                f"{100 * r['other_processes_busy']:.0f}",
                fmt_disk(r),
                r["check"],
                "-" if r["ascending_pairs"] is None else f"{100 * r['ascending_pairs']:.0f}",
                fmt_chi2(r),
                r.get("target", ""),
                r["notes"],
            ]
        )
    return header, body


def text_table(header, body):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def markdown_table(header, body):
    esc = lambda x: str(x).replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(esc(c) for c in cells) + " |" for cells in body]
    return "\n".join(out)


def print_report(header, body, m, quick):
    """The table and its legend on stdout, after the title and machine lines."""
    print()
    print(text_table(header, body))
    print()
    for line in LEGEND:
        print(line)
    print(f"load average at end: {' '.join(map(str, m['load_average_at_end']))}")
    if quick:
        print(
            "quick run: sizes are 1/50, so fixed start-up costs dominate; targets are indicative only."
        )


def report_markdown(title, m, command, header, body):
    """results.md: the title, the machine, the command, the table and its legend."""
    return "".join(
        [
            f"# {title}\n\n",
            "\n".join(f"- {line}" for line in machine_lines(m)) + "\n",
            f"- command: `{command}`\n\n",
            markdown_table(header, body) + "\n\n",
            "\n".join(f"- {line}" for line in LEGEND) + "\n",
            f"- load average at end: {' '.join(map(str, m['load_average_at_end']))}\n",
        ]
    )


def write_results(markdown, results, label):
    """bench/.out/results.{md,json}: the latest run; bench/.out/runs/DATE-LABEL.{md,json}: every run."""
    stamp = results["machine"]["date"].replace(":", "-")
    archive = os.path.join(OUT, "runs", f"{stamp}-{label}")
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    for base in (os.path.join(OUT, "results"), archive):
        with open(base + ".md", "w") as handle:
            handle.write(markdown)
        with open(base + ".json", "w") as handle:
            json.dump(results, handle, indent=1)
    print(
        f"\nwritten: {os.path.relpath(os.path.join(OUT, 'results.md'), REPO)}, {os.path.relpath(os.path.join(OUT, 'results.json'), REPO)} "
        f"(and a copy in {os.path.relpath(archive, REPO)}.*)"
    )
