"""pileshuffle benchmark: one run, one table (see bench/README.md).

    .venv/bin/python bench/run.py                 # scale 1: ~1 GB per format, all rows
    .venv/bin/python bench/run.py --scale 10      # 10 GB TFRecord: cat, floor, pileshuffle (+ the 1 GB pileshuffle row)
    .venv/bin/python bench/run.py --quick         # 1/50 of the sizes: a smoke run
    .venv/bin/python bench/run.py --only floor-tfrecord,pileshuffle-tfrecord
    .venv/bin/python bench/run.py --list          # row names

Every row runs as its own process tree; wall time is measured around it, peak RSS is
the largest sum of RSS over the process and all its descendants, sampled every 50 ms.
Data sets are cached under bench/.data/, outputs, logs and results go to bench/.out/.
"""

import argparse
import datetime
import fnmatch
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import checks  # noqa: E402
import datagen  # noqa: E402

DATA = os.path.join(HERE, ".data")
OUT = os.path.join(HERE, ".out")
PY = sys.executable
SEED = 1
GB = 1e9
QUICK_DIVISOR = 50
SAMPLE_SECONDS = 0.05
RSS_TARGET = 1 * GB


def log(message):
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- machine

def package_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "not installed"


def git_revision():
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "pileshuffle"], capture_output=True, text=True).stdout.strip()
        return head + (" (pileshuffle/ modified)" if dirty else "")
    except Exception:
        return "unknown"


def source_digest():
    """sha1 over pileshuffle/*.py as measured (the checkout may hold uncommitted changes)."""
    import hashlib

    digest = hashlib.sha1()
    root = os.path.join(REPO, "pileshuffle")
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()[:12]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine():
    memory = psutil.virtual_memory()
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_total_gib": round(memory.total / 2**30, 1),
        "memory_available_gib": round(memory.available / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "apache_beam": package_version("apache-beam"),
        "pyarrow": package_version("pyarrow"),
        "numpy": package_version("numpy"),
        "google_crc32c": package_version("google-crc32c"),
        "pileshuffle_git": git_revision(),
        "pileshuffle_source_sha1": source_digest(),
        "disk_free_gb": round(shutil.disk_usage(HERE).free / GB, 1),
    }


def machine_lines(m):
    return [
        f"machine: {m['nproc']} cores ({m['cpu']}), {m['memory_total_gib']} GiB RAM ({m['memory_available_gib']} GiB available), "
        f"kernel {m['kernel']}, load average at start {' '.join(map(str, m['load_average_at_start']))}",
        f"software: Python {m['python']}, apache-beam {m['apache_beam']}, pyarrow {m['pyarrow']}, numpy {m['numpy']}, "
        f"google-crc32c {m['google_crc32c']}; pileshuffle at git {m['pileshuffle_git']}, "
        f"sources sha1 {m['pileshuffle_source_sha1']}",
        f"date: {m['date']}; disk free {m['disk_free_gb']} GB",
        "page cache: NOT dropped (no privileges assumed); every row's input is read once with `cat` (untimed) right "
        "before the row, so all rows read from a warm cache; `sync` (untimed) before each row flushes the previous row's writes.",
    ]


# ----------------------------------------------------------------------------- measuring

class Measurement:
    def __init__(self, returncode, wall, peak_rss, peak_procs, cpu, others):
        self.returncode, self.wall, self.peak_rss, self.peak_procs = returncode, wall, peak_rss, peak_procs
        self.cpu, self.others = cpu, others


def busy_seconds():
    """CPU seconds the whole machine has been busy (all cores)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_for_idle(max_wait, threshold=0.25):
    """Wait (up to ``max_wait`` s) until other processes use under ``threshold`` of a core
    over one second; returns (seconds waited, their last measured use in cores)."""
    started = time.perf_counter()
    while True:
        before = busy_seconds()
        time.sleep(1.0)
        used = busy_seconds() - before
        if used < threshold or time.perf_counter() - started >= max_wait:
            return time.perf_counter() - started, used


def tree_rss(proc):
    try:
        procs = [proc] + proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0, 0
    total, alive = 0, 0
    for p in procs:
        try:
            total += p.memory_info().rss
            alive += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return total, alive


def measure(cmd, name, timeout):
    """Run ``cmd`` (stdout/stderr to bench/.out/logs/NAME.*); wall time and peak tree RSS."""
    logs = os.path.join(OUT, "logs")
    os.makedirs(logs, exist_ok=True)
    cwd = os.path.join(OUT, "cwd")
    os.makedirs(cwd, exist_ok=True)
    os.sync()
    with open(os.path.join(logs, f"{name}.out"), "wb") as out, open(os.path.join(logs, f"{name}.err"), "wb") as err:
        peak = [0, 0]
        stop = threading.Event()
        cpu_before, busy_before = children_cpu_seconds(), busy_seconds()
        started = time.perf_counter()
        proc = psutil.Popen(cmd, stdout=out, stderr=err, cwd=cwd)

        def sample():
            while True:
                rss, count = tree_rss(proc)
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], count)
                if stop.wait(SAMPLE_SECONDS):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            returncode = proc.wait(timeout=timeout)
        except psutil.TimeoutExpired:
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
            returncode = "timeout"
        wall = time.perf_counter() - started
        cpu, busy = children_cpu_seconds() - cpu_before, busy_seconds() - busy_before
        stop.set()
        sampler.join()
    others = max(0.0, busy - cpu) / (wall * (os.cpu_count() or 1))
    return Measurement(returncode, wall, peak[0], peak[1], cpu, others)


def warm(files):
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)


def log_tail(name, lines=15):
    path = os.path.join(OUT, "logs", f"{name}.err")
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


def stdout_json(name):
    """The last JSON line a row printed (floor, beam-common), or {}."""
    try:
        with open(os.path.join(OUT, "logs", f"{name}.out"), errors="replace") as handle:
            for line in reversed(handle.read().splitlines()):
                if line.startswith("{"):
                    return json.loads(line)
    except (OSError, ValueError):
        pass
    return {}


# ----------------------------------------------------------------------------- rows

def dataset_specs(scale, quick):
    div = QUICK_DIVISOR if quick else 1
    specs = {
        "tfrecord": ("tfrecord", 1_000_000 // div, 8, 1000),
        "parquet": ("parquet", 1_000_000 // div, 8, 1000),
        "jsonl": ("jsonl", 2_000_000 // div, 8, 500),
    }
    if scale > 1:
        specs = {"tfrecord-1x": specs["tfrecord"], "tfrecord": ("tfrecord", 1_000_000 * scale // div, 8 * scale, 1000)}
    return specs


def row_plan(scale):
    """(name, kind, data set key, format) in run order."""
    if scale > 1:
        return [
            ("cat-tfrecord", "cat", "tfrecord", "tfrecord"),
            ("floor-tfrecord", "floor", "tfrecord", "tfrecord"),
            ("pileshuffle-tfrecord", "pileshuffle", "tfrecord", "tfrecord"),
            ("pileshuffle-tfrecord-1x", "pileshuffle", "tfrecord-1x", "tfrecord"),
        ]
    return [
        ("cat-tfrecord", "cat", "tfrecord", "tfrecord"),
        ("floor-tfrecord", "floor", "tfrecord", "tfrecord"),
        ("pileshuffle-tfrecord", "pileshuffle", "tfrecord", "tfrecord"),
        ("beam-common-tfrecord", "beam-common", "tfrecord", "tfrecord"),
        ("cat-parquet", "cat", "parquet", "parquet"),
        ("floor-parquet", "floor", "parquet", "parquet"),
        ("pileshuffle-parquet", "pileshuffle", "parquet", "parquet"),
        ("cat-jsonl", "cat", "jsonl", "jsonl"),
        ("floor-jsonl", "floor", "jsonl", "jsonl"),
        ("pileshuffle-jsonl", "pileshuffle", "jsonl", "jsonl"),
        ("shuf-jsonl", "shuf", "jsonl", "jsonl"),
    ]


def selected(name, only):
    if not only:
        return True
    return any(name == p or fnmatch.fnmatch(name, p) or name.startswith(p + "-") for p in only)


def pileshuffle_command():
    script = os.path.join(os.path.dirname(PY), "pileshuffle")
    return [script] if os.path.exists(script) else [PY, "-m", "pileshuffle.cli"]


def planned_piles(data, fmt):
    """The num_piles pileshuffle's default (auto) run chooses for this data set."""
    probe = os.path.join(OUT, "plan-probe")
    shutil.rmtree(probe, ignore_errors=True)
    os.makedirs(probe)
    result = subprocess.run([*pileshuffle_command(), "plan", "--input", data["pattern"], "--output",
                             os.path.join(probe, "train"), "--format", fmt, "--json"], capture_output=True, text=True, cwd=probe)
    shutil.rmtree(probe, ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(f"pileshuffle plan failed: {result.stderr.strip()}")
    return json.loads(result.stdout)["num_piles"]


def command_for(kind, fmt, data, out_dir, piles):
    prefix = os.path.join(out_dir, "train")
    if kind == "cat":
        return ["sh", "-c", 'exec cat "$@" > /dev/null', "sh", *data["files"]], None
    if kind == "shuf":
        target = os.path.join(out_dir, "shuffled.jsonl")
        return ["sh", "-c", 'out="$1"; shift; cat "$@" | shuf -o "$out"', "sh", target, *data["files"]], target
    if kind == "floor":
        return [PY, os.path.join(HERE, "floor.py"), "--format", fmt, "--input", data["pattern"], "--output", prefix,
                "--num_piles", str(piles), "--seed", str(SEED)], prefix + "-*-of-*"
    if kind == "pileshuffle":
        return [*pileshuffle_command(), "run", "--input", data["pattern"], "--output", prefix, "--format", fmt,
                "--seed", str(SEED)], prefix + "-*-of-*"
    if kind == "beam-common":
        return [PY, os.path.join(HERE, "beam_common.py"), "--input", data["pattern"], "--output", prefix], prefix + "-*-of-*"
    raise ValueError(kind)


def run_row(name, kind, fmt, data, piles, timeout, keep, idle_wait):
    out_dir = os.path.join(OUT, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    cmd, outputs = command_for(kind, fmt, data, out_dir, piles)
    warm(data["files"])
    waited, _ = wait_for_idle(idle_wait) if idle_wait > 0 else (0.0, None)
    if waited >= 2:
        log(f"[{name}] waited {waited:.0f} s for other processes to go quiet"
            + (" (they did not: running anyway)" if waited >= idle_wait else ""))
    shown = cmd if len(cmd) < 14 else cmd[:5] + [f"... ({len(data['files'])} input files)"]
    log(f"[{name}] {' '.join(shown)}")
    m = measure(cmd, name, timeout)
    row = {
        "name": name,
        "kind": kind,
        "format": fmt,
        "dataset": data["name"],
        "input_bytes": data["bytes"],
        "records": data["records"],
        "num_piles": piles if kind in ("floor", "pileshuffle") else None,
        "returncode": m.returncode,
        "wall_seconds": round(m.wall, 3),
        "mb_per_s": round(data["bytes"] / 1e6 / m.wall, 1),
        "records_per_s": round(data["records"] / m.wall),
        "peak_rss_bytes": m.peak_rss,
        "peak_processes": m.peak_procs,
        "cpu_seconds": round(m.cpu, 2),
        "cores_used": round(m.cpu / m.wall, 2),
        "other_processes_busy": round(m.others, 3),
        "idle_wait_seconds": round(waited, 1),
        "check_ok": None,
        "check": "",
        "ascending_pairs": None,
        "notes": "",
    }
    if m.returncode != 0:
        row["check_ok"], row["check"] = False, f"FAIL: exit {m.returncode}"
        log(f"[{name}] failed (exit {m.returncode}); stderr tail:\n{log_tail(name)}")
    elif kind == "cat":
        row["check"] = "n/a"
    else:
        files = checks.output_files(outputs)
        manifest = os.path.join(out_dir, "train-manifest.json") if kind == "pileshuffle" else None
        try:
            ok, text, ascending = checks.check_output(fmt, files, data["records"], manifest)
        except Exception as error:  # a malformed output is a failed check, not a crash of the bench
            ok, text, ascending = False, f"FAIL: {error}", None
        row["check_ok"], row["check"], row["ascending_pairs"] = ok, text, ascending
        row["output_files"] = len(files)
        if kind == "pileshuffle" and manifest and os.path.exists(manifest):
            with open(manifest) as handle:
                man = json.load(handle)
            row["pipeline_seconds"] = man.get("seconds")
            row["notes"] = (f"{man['num_piles']} piles ({'auto' if 'auto' in man['options']['num_piles_reason'] else 'fixed'}); "
                            f"pipeline {man.get('seconds') or float('nan'):.2f} s")
        elif kind == "floor":
            info = stdout_json(name)
            row["notes"] = f"{piles} piles; pass 1 {info.get('pass1_seconds', float('nan')):.2f} s, pass 2 {info.get('pass2_seconds', float('nan')):.2f} s"
        elif kind == "beam-common":
            info = stdout_json(name)
            row["notes"] = f"{len(files)} shard(s); pipeline {info.get('seconds', float('nan')):.2f} s"
        elif kind == "shuf":
            row["notes"] = "GNU shuf, whole input in RAM"
    if not keep:
        shutil.rmtree(out_dir, ignore_errors=True)
    log(f"[{name}] {m.wall:.2f} s, {row['mb_per_s']:,.0f} MB/s, peak RSS {m.peak_rss / GB:.2f} GB, {row['check']}")
    return row


# ----------------------------------------------------------------------------- targets

def verdict(ok):
    return "PASS" if ok else "FAIL"


def evaluate_targets(rows, scale):
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
            items.append(("wall<=1.0x floor", ps["median_ratio"] <= 1.0,
                          f"median {ps['median_ratio']:.2f}x, fastest {ps['ratio']:.2f}x") if floor else
                         ("wall<=1.0x floor", None, "no floor row"))
            items.append(rss(ps))
            beam = good("beam-common-tfrecord")
            items.append((">=8x faster than beam-common", beam["wall_seconds"] / ps["wall_seconds"] >= 8,
                          f"{beam['wall_seconds'] / ps['wall_seconds']:.1f}x") if beam else
                         (">=8x faster than beam-common", None, "no beam-common row"))
            results["pileshuffle-tfrecord"] = items
        for fmt in ("parquet", "jsonl"):
            ps = good(f"pileshuffle-{fmt}")
            if ps:
                results[ps["name"]] = [(">=300 MB/s", ps["mb_per_s"] >= 300, f"{ps['mb_per_s']:.0f} MB/s"), rss(ps)]
    else:
        big, one = good("pileshuffle-tfrecord"), good("pileshuffle-tfrecord-1x")
        if big:
            items = [rss(big)]
            limit = f"wall<=1.2x{scale}x(1x wall)"
            if one:
                bound = 1.2 * scale * one["wall_seconds"]
                items.append((limit, big["wall_seconds"] <= bound, f"{big['wall_seconds']:.1f} s vs {bound:.1f} s"))
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
        r["target"] = "; ".join(f"{t}: {'n/a' if ok is None else verdict(ok)} ({v})" for t, ok, v in items)


# ----------------------------------------------------------------------------- table

def fmt_rss(r):
    return f"{r['peak_rss_bytes'] / GB:.2f}" if r["peak_rss_bytes"] else "-"


def table_rows(rows):
    header = ["row", "data", "wall s", "MB/s", "records/s", "peak RSS GB", "x floor", "median s", "median x floor",
              "cores", "others %", "check", "in-order %", "target", "notes"]
    body = []
    for r in rows:
        body.append([
            r["name"],
            f"{r['format']} {r['input_bytes'] / 1e6:,.0f} MB",
            f"{r['wall_seconds']:.2f}",
            f"{r['mb_per_s']:,.0f}",
            f"{r['records_per_s']:,}",
            fmt_rss(r),
            "-" if r.get("ratio") is None else f"{r['ratio']:.2f}",
            f"{r['median_wall_seconds']:.2f}",
            "-" if r.get("median_ratio") is None else f"{r['median_ratio']:.2f}",
            f"{r['cores_used']:.2f}",
            f"{100 * r['other_processes_busy']:.0f}",
            r["check"],
            "-" if r["ascending_pairs"] is None else f"{100 * r['ascending_pairs']:.0f}",
            r.get("target", ""),
            r["notes"],
        ])
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


LEGEND = [
    "wall s: the row's whole process tree, start to exit (interpreter start and imports included); "
    "MB/s: input file bytes / wall (MB = 10^6 B); peak RSS: largest sum of RSS over the process and all its "
    "descendants, sampled every 50 ms (GB = 10^9 B; shared pages count once per process).",
    "x floor: wall / wall of the floor row of the same format in this run (below 1 = faster than the plain "
    "single-process Python 2-pass shuffle). With several rounds, wall s, MB/s and the other columns are the row's "
    "fastest run; median s and median x floor are the row's median run and its ratio to the floor's median. in-order %: share of adjacent pairs among the first 10,000 output "
    "records whose input index ascends (about 50 for a shuffle; 100 = input order kept).",
    "cores: CPU seconds (user+system) of the row's process tree / wall. others %: CPU used by processes outside "
    "the row during the row, as a share of all cores (other engineers' jobs; above ~10 the row's times are inflated).",
    "check: record count of the output (pileshuffle: manifest totals.records; others: counted) vs the generated count.",
]


# ----------------------------------------------------------------------------- main

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=1, help="1 (all formats, ~1 GB each) or N>1 (N GB TFRecord rows only)")
    parser.add_argument("--quick", action="store_true", help=f"1/{QUICK_DIVISOR} of the data sizes (smoke run)")
    parser.add_argument("--only", default="", help="comma-separated row names, prefixes (pileshuffle, floor) or globs")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--keep", action="store_true", help="keep each row's output under bench/.out/NAME")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a row is killed")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds: every row runs once per round, rounds one after another, and each row reports its "
                             "fastest run and its median (default 3 at scale 1, else 1)")
    parser.add_argument("--idle_wait", type=float, default=120,
                        help="before each row, wait up to this many seconds for other processes to go quiet (0: don't)")
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error("--scale must be >= 1")
    if args.repeat is None:
        args.repeat = 3 if args.scale == 1 else 1
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    plan = [p for p in row_plan(args.scale) if selected(p[0], only)]
    if args.list:
        print("\n".join(p[0] for p in row_plan(args.scale)))
        return 0
    if not plan:
        parser.error(f"--only {args.only} selects no row (see --list)")

    os.makedirs(OUT, exist_ok=True)
    m = machine()
    title = f"pileshuffle bench: scale {args.scale}{' (quick: 1/%d size)' % QUICK_DIVISOR if args.quick else ''}, seed {SEED}"
    print(title)
    print("\n".join(machine_lines(m)), flush=True)

    specs = dataset_specs(args.scale, args.quick)
    datasets, piles = {}, {}
    for key in sorted({p[2] for p in plan}, key=list(specs).index):
        fmt, records, files, record_bytes = specs[key]
        datasets[key] = datagen.dataset(DATA, fmt, records, files, record_bytes, seed=0, log=log)
    for key, data in datasets.items():
        if any(p[2] == key and p[1] in ("floor", "pileshuffle") for p in plan):
            piles[key] = planned_piles(data, data["format"])
            log(f"{data['name']}: pileshuffle's auto plan chooses {piles[key]} piles (the floor uses the same)")
    need = 3 * max(d["bytes"] for d in datasets.values())
    if shutil.disk_usage(OUT).free < need:
        log(f"warning: less than {need / GB:.1f} GB free under {OUT}; rows may fail for lack of disk")

    log("warm-up: cat of every input to /dev/null")
    for data in datasets.values():
        warm(data["files"])

    # Rounds, not one row's runs back to back: a slow spell of the VM (see bench/README.md)
    # then hits every row of a round alike instead of all the runs of one row.
    attempts = {name: [] for name, *_ in plan}
    for round_index in range(args.repeat):
        if args.repeat > 1:
            log(f"round {round_index + 1} of {args.repeat}")
        for name, kind, key, fmt in plan:
            attempts[name].append(run_row(name, kind, fmt, datasets[key], piles.get(key), args.timeout, args.keep, args.idle_wait))
    rows = []
    for name, *_ in plan:
        runs = attempts[name]
        ok = [a for a in runs if a["returncode"] == 0 and a["check_ok"] is not False] or runs
        best = dict(min(ok, key=lambda a: a["wall_seconds"]))
        best["attempts_wall_seconds"] = [a["wall_seconds"] for a in runs]
        best["median_wall_seconds"] = round(statistics.median(a["wall_seconds"] for a in ok), 3)
        rows.append(best)

    floors = {(r["format"], r["dataset"]): r for r in rows if r["kind"] == "floor" and r["returncode"] == 0}
    for r in rows:
        floor = floors.get((r["format"], r["dataset"]))
        r["ratio"] = round(r["wall_seconds"] / floor["wall_seconds"], 3) if floor and r["returncode"] == 0 else None
        r["median_ratio"] = round(r["median_wall_seconds"] / floor["median_wall_seconds"], 3) if floor and r["returncode"] == 0 else None
        if args.repeat > 1:
            r["notes"] = (r["notes"] + "; " if r["notes"] else "") + \
                f"{args.repeat} rounds: {', '.join(f'{w:.2f}' for w in r['attempts_wall_seconds'])} s"
    evaluate_targets(rows, args.scale)
    m["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]

    header, body = table_rows(rows)
    print()
    print(text_table(header, body))
    print()
    for line in LEGEND:
        print(line)
    print(f"load average at end: {' '.join(map(str, m['load_average_at_end']))}")
    if args.quick:
        print("quick run: sizes are 1/50, so fixed start-up costs dominate; targets are indicative only.")

    given = list(sys.argv[1:] if argv is None else argv)
    command = "python bench/run.py " + " ".join(given) if given else "make bench"
    stamp = m["date"].replace(":", "-")
    label = f"scale{args.scale}{'-quick' if args.quick else ''}{'-only' if only else ''}"
    archive = os.path.join(OUT, "runs", f"{stamp}-{label}")
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    markdown = "".join([
        f"# {title}\n\n",
        "\n".join(f"- {line}" for line in machine_lines(m)) + "\n",
        f"- command: `{command}`\n\n",
        markdown_table(header, body) + "\n\n",
        "\n".join(f"- {line}" for line in LEGEND) + "\n",
        f"- load average at end: {' '.join(map(str, m['load_average_at_end']))}\n",
    ])
    results = {"title": title, "command": command, "scale": args.scale, "quick": args.quick, "seed": SEED,
               "machine": m, "datasets": list(datasets.values()), "rows": rows}
    for base in (os.path.join(OUT, "results"), archive):  # results.*: the latest run; runs/: every run
        with open(base + ".md", "w") as handle:
            handle.write(markdown)
        with open(base + ".json", "w") as handle:
            json.dump(results, handle, indent=1)
    print(f"\nwritten: {os.path.relpath(os.path.join(OUT, 'results.md'), REPO)}, {os.path.relpath(os.path.join(OUT, 'results.json'), REPO)} "
          f"(and a copy in {os.path.relpath(archive, REPO)}.*)")
    failed = [r["name"] for r in rows if r["returncode"] != 0 or r["check_ok"] is False]
    if failed:
        print(f"rows that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
