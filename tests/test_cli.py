"""The command line a user meets: --help, refused options and values, own outputs left out
of --input, progress lines, the plan, the command table. Real runs on generated data."""

import dataclasses
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import FAST, manifest, run_shuffle, shard_bytes, shards

from pileshuffle.commands import sample
from pileshuffle.commands.metadata import template_metadata
from pileshuffle.commands.options import check_argv
from pileshuffle.errors import InputError, UsageError
from pileshuffle.planning.template_parameters import PARAMETERS

PY = sys.executable


def cli(*args, cwd=None, **kwargs):
    return subprocess.run(
        [PY, "-m", "pileshuffle", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        **kwargs,
    )


def one_line(text):
    return " ".join(text.split())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli") / "data"
    sample.write_tfrecord(str(directory), records=3000, files=3, record_bytes=100, vary=True)
    return directory


# -- 1. --help ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["-m", "pileshuffle", "run"], ["-m", "pileshuffle.pipeline"]],
    ids=["pileshuffle run", "python -m pileshuffle.pipeline"],
)
def test_help_lists_every_parameter_with_its_default_and_the_metadata_help_text(command):
    done = subprocess.run([PY, *command, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = one_line(done.stdout)
    for entry in template_metadata()["parameters"]:
        parameter = next(p for p in PARAMETERS if p.name == entry["name"])
        help_text = entry["helpText"].rsplit(" Example: ", 1)[0]
        assert f"--{entry['name']}" in text
        assert one_line(help_text) in text, entry["name"]
        default = (
            "required"
            if not entry["isOptional"]
            else f"default: {'false' if parameter.flag else parameter.default or 'none'}"
        )
        assert re.search(rf"--{entry['name']}\b[^(]*\({re.escape(default)}\)", text), (
            entry["name"],
            default,
        )
    for beam_option in ("--runner", "--temp_location", "Dataflow", "Dask"):
        assert beam_option in text


def test_commands_are_one_table_entry_each():
    from pileshuffle.cli import COMMANDS

    done = cli("--help")
    assert done.returncode == 0
    for name, command in COMMANDS.items():
        assert f"{name}  " in done.stdout and command.description in done.stdout
    wrong = cli("shufle")
    assert wrong.returncode == 2 and "unknown command 'shufle'" in wrong.stderr


# -- 2. unknown options ---------------------------------------------------------------------------


def test_a_mistyped_option_is_refused_with_a_suggestion_before_anything_runs(inputs, tmp_path):
    output = tmp_path / "out" / "train"
    done = cli(
        "run",
        "--input",
        f"{inputs}/*.tfrecord",
        "--output",
        str(output),
        "--num_pile",
        "3",
        "--sead",
        "5",
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "pileshuffle: error: unknown option --num_pile (did you mean --num_piles?)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command, typo, message",
    [
        ("append", "--inptu=x", "unknown option --inptu (did you mean --input?)"),
        # the store's seed is fixed
        (
            "append",
            "--seed=3",
            "unknown option --seed (see pileshuffle append --help)",
        ),
        ("materialize", "--overwrit", "unknown option --overwrit (did you mean --overwrite?)"),
        (
            "expire",
            "--grace_second=1",
            "unknown option --grace_second (did you mean --grace_seconds?)",
        ),
        ("gc", "--ruuner=DirectRunner", "unknown option --ruuner (did you mean --runner?)"),
    ],
)
def test_store_commands_refuse_unknown_options_before_touching_the_store(
    tmp_path, command, typo, message
):
    store = tmp_path / "s"
    args = {
        "append": ["--input", str(tmp_path / "none")],
        "materialize": ["--output", str(tmp_path / "o")],
        "expire": ["--keep_generations", "1"],
        "gc": [],
    }[command]
    done = cli(command, "--store", str(store), *args, typo)
    assert done.returncode == 2
    assert done.stderr.strip() == f"pileshuffle: error: pileshuffle {command}: {message}"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "typo, suggestion",
    [
        ("--sead=5", "--seed"),
        ("--temp_locaton=/tmp", "--temp_location"),
        ("--ruuner=DataflowRunner", "--runner"),
        ("--dask_client_adress=tcp://x:1", "--dask_client_address"),
    ],
)
def test_typos_of_ours_beams_and_runners_options_name_the_right_one(typo, suggestion):
    with pytest.raises(
        UsageError, match=f"unknown option {typo.split('=')[0]} \\(did you mean {suggestion}\\?\\)"
    ):
        check_argv(["--input=x", typo])


def test_the_flex_launchers_arguments_and_runner_options_are_accepted():
    # --dedup with --balance is refused: their examples are checked on their own
    exclusive = (
        "dedup",
        "dedup_key",
    )
    launcher = [f"--{p.name}={p.example}" for p in PARAMETERS if p.name not in exclusive] + [
        "--runner=DataflowRunner",
        "--project=p",
        "--region=us-central1",
        "--temp_location=gs://b/tmp",
        "--staging_location=gs://b/staging",
        "--sdk_container_image=i",
        "--job_name=j",
        "--service_account_email=a@b",
        "--number_of_worker_harness_threads=2",
        "--experiments=use_runner_v2",
        "--max_num_workers=20",
        "--worker_machine_type=n2-highmem-4",
        "--labels=a=b",
        "--setup_file=./setup.py",
    ]
    values = check_argv(launcher)
    assert values.seed == "42" and values.input == PARAMETERS[0].example
    values = check_argv(
        [
            f"--{p.name}={p.example}"
            for p in PARAMETERS
            if p.name in exclusive or p.optional is False
        ]
    )
    assert (values.dedup, values.dedup_key) == ("key", "url")
    check_argv(
        [
            "--input=x",
            "--output=y",
            "--runner=DaskRunner",
            "--dask_client_address=tcp://h:8786",
            "--dask_npartitions=8",
        ]
    )
    check_argv(
        [
            "--input=x",
            "--output=y",
            "--direct_running_mode=in_memory",
            "--direct_num_workers=1",
            "--",
            "--not_an_option",
        ]
    )


# -- 3. values ------------------------------------------------------------------------------------


BAD_VALUES = [
    (["--num_piles=0"], "--num_piles: must be auto or a whole number of at least 1, not '0'"),
    (["--num_piles", "-3"], "--num_piles: must be auto or a whole number of at least 1, not '-3'"),
    (["--num_piles=2.5"], "--num_piles:"),
    (
        ["--max_pile_bytes=1KiB"],
        "--max_pile_bytes: 1KiB is below the minimum of 1MiB with --num_piles=auto",
    ),
    (
        ["--max_pile_bytes=1KiB", "--num_piles=4"],
        "--max_pile_bytes: 1KiB is below the minimum of 16KiB",
    ),
    (["--max_pile_bytes=64Mo"], "--max_pile_bytes: not a size: '64Mo'"),
    (["--max_pile_bytes=lots"], "--max_pile_bytes: not a size"),
    (["--seed=-1"], "--seed: must be a whole number from 0 to 2**64-1, not '-1'"),
    (["--seed=1.5"], "--seed:"),
    (["--seed=18446744073709551616"], "--seed:"),
    (["--compression=zstd"], "--compression: tfrecord output takes auto, none, gzip, not 'zstd'"),
    (["--format=jsonl", "--compression=snappy"], "--compression: jsonl output takes"),
    (["--format=csv"], "--format: 'csv' is not one of auto, tfrecord, parquet, jsonl"),
    (["--intermediate=memory"], "--intermediate: 'memory' is not one of files, shuffle"),
    (["--overwrite=maybe"], "--overwrite: 'maybe' is not true or false"),
    (["--seed"], "--seed: expected one argument"),
]


@pytest.mark.parametrize("bad, message", BAD_VALUES, ids=[" ".join(b) for b, _ in BAD_VALUES])
def test_each_bad_value_is_one_line_naming_the_option_and_nothing_is_written(
    inputs, tmp_path, capsys, bad, message
):
    from pileshuffle.pipeline import main

    output = tmp_path / "out" / "train"
    assert main([f"--input={inputs}/*.tfrecord", f"--output={output}", *FAST, *bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pileshuffle: error: {message}"), err
    assert not (tmp_path / "out").exists()


def test_a_bad_value_exits_2_from_the_command_line(inputs, tmp_path):
    done = cli(
        "run",
        "--input",
        f"{inputs}/*.tfrecord",
        "--output",
        str(tmp_path / "o"),
        "--num_piles",
        "-3",
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "pileshuffle: error: --num_piles: must be auto or a whole number of at least 1, not '-3'"
    ]
    assert os.listdir(tmp_path) == []


def test_the_minimum_size_holds_for_the_python_api_too(inputs, tmp_path):
    with pytest.raises(UsageError, match="--max_pile_bytes"):
        run_shuffle(f"{inputs}/*.tfrecord", str(tmp_path / "o"), "--max_pile_bytes=100KiB")


def test_more_piles_than_records_is_warned(inputs, tmp_path):
    done = cli(
        "plan",
        "--input",
        f"{inputs}/*.tfrecord",
        "--output",
        str(tmp_path / "o"),
        "--num_piles",
        "5000",
    )
    assert done.returncode == 0, done.stderr
    assert (
        re.search(r"5000 piles for about [23],[0-9]{3} records", done.stderr)
        and "most shards will be empty" in done.stderr
    )


# -- 4. pileshuffle's own outputs in the input pattern ------------------------------------------------


def test_a_rerun_into_the_same_folder_leaves_its_own_output_out(tmp_path):
    data = tmp_path / "data"
    sample.write_tfrecord(str(data), records=2000, files=2, record_bytes=80)
    first = run_shuffle(f"{data}/*", str(data / "shuffled"), "--num_piles=3", "--seed=7")
    assert first["inputs_left_out"] == {} and first["totals"]["records"] == 2000
    before = shard_bytes(str(data / "shuffled"))
    done = cli(
        "run",
        "--input",
        f"{data}/*",
        "--output",
        str(data / "shuffled"),
        "--num_piles=3",
        "--seed=7",
        "--overwrite",
        *FAST,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "left out  4 file(s) that --input matched but pileshuffle wrote: 3 x a shard of this run's output"
        in done.stdout
    )
    assert "the manifest of " in done.stdout
    assert manifest(str(data / "shuffled"))["totals"]["records"] == 2000
    assert shard_bytes(str(data / "shuffled")) == before


def test_a_pattern_matching_another_finished_output_leaves_it_out(tmp_path, inputs):
    data = tmp_path / "data"
    sample.write_tfrecord(str(data), records=1000, files=2, record_bytes=80)
    run_shuffle(f"{data}/*", str(data / "other"), "--num_piles=2")
    (data / "other-store" / "g000000").mkdir(parents=True)  # a pile store beside it
    (data / "other-store" / "manifest-00000001.json").write_text("{}")
    (data / "other-store" / "g000000" / "p00000-w00000.arrows").write_bytes(b"x")
    result = run_shuffle(f"{data}/**", str(tmp_path / "out" / "x"), "--num_piles=2")
    assert result["totals"]["records"] == 1000
    assert sorted(os.path.basename(p) for p in result["inputs_left_out"]) == [
        "manifest-00000001.json",
        "other-00000-of-00002.tfrecord",
        "other-00001-of-00002.tfrecord",
        "other-manifest.json",
        "p00000-w00000.arrows",
    ]
    # naming only a finished output's shards shuffles that output again: deliberate, kept
    again = run_shuffle(
        f"{data}/other-*", str(tmp_path / "again" / "x"), "--num_piles=2", "--seed=3"
    )
    assert again["totals"]["records"] == 1000
    assert list(again["inputs_left_out"].values()) == [f"the manifest of {data}/other"]


def test_a_pattern_of_only_this_runs_own_output_is_refused_naming_the_overlap(tmp_path):
    data = tmp_path / "data"
    sample.write_tfrecord(str(data), records=500, files=1, record_bytes=80)
    run_shuffle(f"{data}/*", str(tmp_path / "s"), "--num_piles=2")
    with pytest.raises(
        InputError,
        match=r"matches only files pileshuffle wrote \(2 x a shard of this run's output ",
    ):
        run_shuffle(f"{tmp_path}/s-*", str(tmp_path / "s"), "--num_piles=2", "--overwrite")


def test_own_files_are_recognised_by_name():
    from pileshuffle.engine.inputs import own_file

    assert own_file("d/.pileshuffle-work-0123abcd/fragments/s000001-p00003.arrows", "d/x", {})
    assert own_file(
        "gs://b/d/x.pileshuffle-staging/shard-00000-of-00004.tfrecord", "gs://b/d/x", {}
    )
    assert own_file("d/p-store/g000003/p00001-w00002.arrows", "d/x", {}) == "a pile store's file"
    assert own_file("d/x-00001-of-00004.tfrecord.gz", "d/x", {}).startswith(
        "a shard of this run's output"
    )
    assert (
        own_file("d/y-00001-of-00004.parquet", "d/x", {"d/y-manifest.json": 1})
        == "a shard of the finished output d/y"
    )
    # no manifest: someone else's shards
    assert own_file("d/part-00001-of-00004.tfrecord", "d/x", {}) == ""
    assert own_file("d/my-store/data.tfrecord", "d/x", {}) == ""


# -- 5. progress ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def progress_runs(inputs, tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    runs = {}
    for name, extra in (("shown", []), ("quiet", ["--quiet"])):
        output = str(root / name / "train")
        done = cli(
            "run",
            "--input",
            f"{inputs}/*.tfrecord",
            "--output",
            output,
            "--num_piles=4",
            "--seed=5",
            *extra,
        )
        assert done.returncode == 0, done.stderr
        runs[name] = (done, output)
    return runs


def test_progress_lines_show_both_passes_off_a_terminal(progress_runs, inputs):
    done, _ = progress_runs["shown"]
    total = sum(os.path.getsize(inputs / n) for n in os.listdir(inputs))
    lines = [line for line in done.stderr.splitlines() if "pass " in line]
    assert "\r" not in done.stderr  # plain lines for logs
    assert re.fullmatch(
        rf"pileshuffle: pass 1: 100% {total / 1e6:.0f}\.?\d*kB of .*, 3/3 files \[.*B/s\]",
        lines[-2],
    ) or re.fullmatch(
        r"pileshuffle: pass 1: 100% \S+B of \S+B, 3/3 files \[\d\d:\d\d<\d\d:\d\d, .*B/s\]",
        lines[-2],
    ), lines
    assert re.fullmatch(
        r"pileshuffle: pass 2: 4 of 4 piles written \[\d\d:\d\d<\d\d:\d\d\]", lines[-1]
    ), lines


def test_quiet_prints_no_progress_and_the_shards_are_the_same_bytes(progress_runs):
    quiet, quiet_output = progress_runs["quiet"]
    shown, shown_output = progress_runs["shown"]
    assert quiet.stderr == "" and "pass 1" in shown.stderr
    assert quiet.stdout.splitlines()[0] == shown.stdout.splitlines()[0]
    assert shard_bytes(quiet_output) == shard_bytes(shown_output) and len(shards(quiet_output)) == 4


def test_the_auto_reason_is_printed_once(inputs, tmp_path):
    done = cli("run", "--input", f"{inputs}/*.tfrecord", "--output", str(tmp_path / "o"), *FAST)
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).count("s + 6*sqrt(s) headroom") == 1


def test_a_terminal_gets_a_live_tqdm_line(inputs, tmp_path):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(
        [
            PY,
            "-m",
            "pileshuffle",
            "run",
            "--input",
            f"{inputs}/*.tfrecord",
            "--output",
            str(tmp_path / "o"),
            "--num_piles=4",
        ],
        stdout=subprocess.PIPE,
        stderr=follower,
    )
    os.close(follower)
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    process.communicate(timeout=300)
    reader.join(timeout=10)
    os.close(leader)
    terminal = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0, terminal
    assert "\r" in terminal and "pass 1" in terminal and "pass 2" in terminal
    assert "4/4" in terminal and "piles" in terminal


# -- 6. plan --------------------------------------------------------------------------------------


def test_plan_speaks_to_a_person_and_json_keeps_the_machine_form(inputs, tmp_path):
    args = [
        "--input",
        f"{inputs}/*.tfrecord",
        "--output",
        str(tmp_path / "o" / "t"),
        "--num_piles=4",
    ]
    text = cli("plan", *args)
    assert text.returncode == 0, text.stderr
    heads = [line[:14].strip() for line in text.stdout.splitlines()]
    assert heads == [
        "input",
        "records",
        "piles",
        "pile size",
        "split again",
        "memory",
        "temp space",
        "output space",
        "pass 1",
        "gcs requests",
        "output",
        "runner",
    ], text.stdout
    assert "3 tfrecord file(s)" in text.stdout and "s + 6*sqrt(s)" in text.stdout
    # 3 files of 123 kB, each read in 5 spans (a unit of work is a sixteenth of the input): a run each,
    # and the 4 small piles are one group (pile_groups): one part a run
    assert (
        "15 run objects" in text.stdout and "15 parts (a segment a group of 4 piles)" in text.stdout
    )
    assert "FnApiRunner" in text.stdout
    machine = json.loads(cli("plan", *args, "--json").stdout)
    assert (
        machine["files"] == 3
        and machine["num_piles"] == 4
        and (machine["runs"], machine["parts"]) == (15, 15)
    )
    assert machine["piles_per_part"] == 4
    assert {
        "input_bytes",
        "reason",
        "output",
        "compression",
        "intermediate",
        "work_dir",
        "estimated_records",
        "split_probability",
        "space",
        "runner",
    } <= set(machine)
    assert 2400 < machine["estimated_records"] < 3600
    assert not (tmp_path / "o").exists() or os.listdir(tmp_path / "o") == []


def test_plan_counts_runs_not_files_times_piles(inputs, tmp_path):
    """40,000 piles over 3 files: pass 1 writes 15 runs (one per span: a unit of work is a sixteenth
    of this small input), whose parts the plan counts; nothing grows as files x piles, so there is
    nothing to warn about."""
    from pileshuffle.commands.plan_text import plan_text
    from pileshuffle.planning.plan import make_plan

    options = PipelineOptions(
        [f"--input={inputs}/*.tfrecord", f"--output={tmp_path}/o", "--num_piles=40000"]
    )
    plan = make_plan(options)
    runs, parts = plan.run_shape()
    # ~192 records a run reach ~111 of the 157 groups of 256 small piles (pile_groups): one part each
    assert runs == 15 and 15 * 105 < parts < 15 * 117
    per_pile = dataclasses.replace(
        plan, max_pile_bytes=1
    ).run_shape()  # G = 1: a part per pile reached
    # ~2,880 records reach ~2,780-2,880 of 40,000
    assert per_pile[0] == 15 and 2800 < per_pile[1] < 2900
    on_gcs = dataclasses.replace(plan, work_dir="gs://bucket/tmp/.pileshuffle-work-0123")
    text = plan_text(on_gcs, options)
    assert (
        "warning" not in text
        and f"{runs:,} run objects" in text
        and f"{parts:,} parts (a segment a group" in text
    )
    shuffled = plan_text(dataclasses.replace(on_gcs, intermediate="shuffle"), options)
    assert "run objects" not in shuffled and f"{parts:,} parts (a segment a group" in shuffled
    assert (
        "through the runner's GroupByKey" in shuffled
        and "the local runner keeps all of it in memory" in shuffled
    )


def test_split_probability_agrees_with_the_binomial():
    from scipy import stats

    from pileshuffle.planning.pile_sizes import PileSizes

    records, piles, record_bytes = 1_000_000, 100, 100.0
    for limit_records in (10_100, 10_200, 10_300, 10_600):
        sizes = PileSizes(records, piles, record_bytes, int(limit_records * record_bytes))
        # piles taken as independent
        exact = 1 - stats.binom.cdf(limit_records, records, 1 / piles) ** piles
        assert abs(sizes.split_probability - exact) < 0.02 + 0.2 * exact, (
            limit_records,
            sizes.split_probability,
            exact,
        )
    assert (
        PileSizes(
            records, piles, record_bytes, int(sizes.headroom * record_bytes)
        ).split_probability
        < 1e-6
    )


def test_generate_is_a_command_module_too(tmp_path):
    done = cli(
        "generate",
        "--format",
        "jsonl",
        "--output_dir",
        str(tmp_path / "d"),
        "--records",
        "10",
        "--files",
        "2",
    )
    assert done.returncode == 0, done.stderr
    paths = done.stdout.split()
    assert len(paths) == 2 and all(os.path.exists(p) for p in paths)
    assert sum(len(open(p).readlines()) for p in paths) == 10


def test_a_pile_count_beyond_what_memory_can_hold_is_refused_by_plan_and_run_alike(
    inputs, tmp_path
):
    """`--num_piles 1000000000` on a few thousand records once ran this machine out of its 23 GB
    (each pile costs ~2 KB of bookkeeping: a shard, accounted for and listed in the manifest).
    Now `plan` and `run` refuse it in one line with the bound, before anything is written and
    before Beam's import; a run planned in-process says what auto chooses."""
    from helpers import run_shuffle

    from pileshuffle.errors import UsageError

    bound = (
        r"--num_piles 1,000,000,000: each pile costs about 2,048 bytes of memory .* 2,048\.0 GB in all, more "
        r"than half the [\d.,]+ GB available here: at most [\d,]+ piles "
    )
    for command in ("plan", "run"):
        # each import: a line on stderr
        done = cli(
            command,
            "--input",
            f"{inputs}/*.tfrecord",
            "--output",
            str(tmp_path / "o" / "t"),
            "--num_piles=1000000000",
            env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        imports = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
        [line] = [
            line for line in done.stderr.strip().splitlines() if not line.startswith("import time:")
        ]
        assert re.search(
            bound + r"\(--num_piles auto chooses a count that fits the input\)", line
        ), line
        # refused before Beam's import
        assert imports and not [name for name in imports if "apache_beam" in name]
        assert not (tmp_path / "o").exists()
    with pytest.raises(UsageError, match=bound + r"\(--num_piles auto chooses 1 for this input\)"):
        run_shuffle(f"{inputs}/*.tfrecord", str(tmp_path / "o" / "t"), "--num_piles=1000000000")
    assert (
        cli(
            "plan",
            "--input",
            f"{inputs}/*.tfrecord",
            "--output",
            str(tmp_path / "o" / "t"),
            "--num_piles=100000",
        ).returncode
        == 0
    )


def test_version_and_type_information():
    """`pileshuffle --version` says the version the manifests record; the package ships its
    PEP 561 marker (py.typed) so type checkers read its annotations."""
    import importlib.resources

    import pileshuffle

    done = cli("--version")
    assert (done.returncode, done.stdout) == (0, f"pileshuffle {pileshuffle.__version__}\n")
    assert "--version" in cli("--help").stdout
    assert importlib.resources.files("pileshuffle").joinpath("py.typed").is_file()
    setup = open(
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")
    ).read()
    assert 'package_data={"pileshuffle": ["py.typed"]}' in setup


def test_plan_sizes_compressed_parquet_by_its_rows_and_gzip_by_a_decompressed_sample(tmp_path):
    """A 0.6 MB zstd Parquet file of 300,000 rows of ~1 KB (303 MB in Arrow) was planned as
    66,416 records of 9 bytes in 1 pile (its footer's encoded sizes); a .jsonl.gz as 4x its size.
    Now: the footer's exact row count times a decoded sample's row size, and a gzip file's size
    times the expansion of its first MiB."""
    import gzip

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pileshuffle.planning.plan import make_plan

    os.makedirs(tmp_path / "pq")
    rows = 300_000
    pq.write_table(
        pa.table({"i": np.arange(rows), "text": ["lorem ipsum dolor sit amet " * 37] * rows}),
        str(tmp_path / "pq" / "z.parquet"),
        compression="zstd",
    )
    plan = make_plan(
        PipelineOptions([f"--input={tmp_path}/pq/*.parquet", f"--output={tmp_path}/o1"])
    )
    assert plan.estimated_records == rows and 1000 < plan.mean_record_bytes < 1030
    assert plan.num_piles == 5  # 303 MB in piles of at most 64 MiB
    os.makedirs(tmp_path / "gz")
    lines = [json.dumps({"i": i, "t": "x" * (i % 200)}) + "\n" for i in range(20_000)]
    with gzip.open(tmp_path / "gz" / "a.jsonl.gz", "wt") as handle:
        handle.writelines(lines)
    plan = make_plan(
        PipelineOptions([f"--input={tmp_path}/gz/*.jsonl.gz", f"--output={tmp_path}/o2"])
    )
    assert abs(plan.estimated_records - 20_000) < 2_000, plan.estimated_records


@pytest.mark.parametrize(
    "command, given, refusal",
    [
        ("run", ["--seed=1", "--seed=2"], "--seed: given 2 times; give it once"),
        ("plan", ["--num_piles=2", "--num_piles", "3"], "--num_piles: given 2 times; give it once"),
        ("run", ["--quiet", "true", "stray"], "'stray' is not an option or an option's value"),
        # an unquoted glob, expanded
        (
            "run",
            ["extra.tfrecord"],
            "'extra.tfrecord' is not an option or an option's value",
        ),
    ],
)
def test_a_repeated_option_or_a_stray_word_is_refused_not_dropped(
    inputs, tmp_path, command, given, refusal
):
    """argparse kept the last of a repeated option (`--seed 1 --seed 2` shuffled with 2) and
    dropped words that are no option's value (an unquoted pattern the shell expanded: all files
    but the first ignored). Now both are refused in one line, before anything runs; Beam's
    repeatable options (--experiments) still repeat."""
    done = cli(
        command, "--input", f"{inputs}/*.tfrecord", "--output", str(tmp_path / "o" / "t"), *given
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"pileshuffle: error: {refusal}" + done.stderr.strip().split(refusal, 1)[1]
    ]
    assert not (tmp_path / "o").exists()
    materialize = cli(
        "materialize", "--store", str(tmp_path / "s"), "--output", str(tmp_path / "m"), "stray"
    )
    assert materialize.returncode == 2 and "'stray' is not an option" in materialize.stderr
    repeated = cli(
        "plan",
        "--input",
        f"{inputs}/*.tfrecord",
        "--output",
        str(tmp_path / "o" / "t"),
        "--experiments=a",
        "--experiments=b",
    )
    assert repeated.returncode == 0, repeated.stderr
