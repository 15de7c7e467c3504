"""The job pileshuffle exists for, planned from a sample: ``plan --input SAMPLE --input_bytes N``
with Dataflow's options sizes piles from the worker (``--max_pile_bytes auto``), runs and units from
the job, and prices both intermediate modes; shard names widen past 99,999 piles; a Dataflow launch
whose workers' disks cannot hold their spill is refused before anything is staged."""

import base64
import fnmatch
import gzip
import json
import math
import random
import zlib

import pytest
from test_dataflow_job import PROJECT, launch

from pileshuffle.commands import sample
from pileshuffle.commands.plan import main as plan_main
from pileshuffle.engine.output_files import check_replaceable
from pileshuffle.errors import OutputError
from pileshuffle.io import storage
from pileshuffle.names import SHARD_NAME, SHARD_TAIL, shard_name, shard_pattern
from pileshuffle.planning.job_model import (
    MEASURED_CPU_PER_GB,
    SIZING_RATE,
    WORKER_OVERHEAD,
    rate_per_vcpu,
)

GiB, TB = 1 << 30, 10**12
DATAFLOW = ["--runner=DataflowRunner", "--temp_location=gs://bucket/tmp"]


@pytest.fixture(scope="module")
def kilobyte_records(tmp_path_factory):
    """A sample of 1 KB TFRecords, the records of the job the defaults are sized for."""
    directory = tmp_path_factory.mktemp("scale") / "sample"
    sample.write_tfrecord(str(directory), records=600, files=2, record_bytes=1000)
    return f"{directory}/*.tfrecord"


def planned(capsys, tmp_path, records, *args) -> dict:
    """``pileshuffle plan --json`` of ``records`` with ``args``, read back."""
    assert (
        plan_main(["--input", records, "--output", str(tmp_path / "o" / "t"), "--json", *args]) == 0
    )
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "terabytes, piles, records_per_part", [(10, (2_000, 30_000), 50), (100, (20_000, 300_000), 20)]
)
def test_a_dataflow_job_of_10_and_100_tb_with_default_options(
    capsys, tmp_path, kilobyte_records, terabytes, piles, records_per_part
):
    """The issue's "done when": auto piles in range, shuffle-mode parts of enough records, files
    mode at 100 TB at or under $3 per TB with pass 2's GETs ($0.0004 per 1,000) in the price."""
    plan = planned(
        capsys, tmp_path, kilobyte_records, *DATAFLOW, "--input_bytes", str(terabytes * TB)
    )
    # files of 1 GB
    assert plan["input_bytes"] == terabytes * TB and plan["files"] == terabytes * 1000
    assert piles[0] <= plan["num_piles"] <= piles[1], plan["num_piles"]
    assert plan["max_pile_bytes"] == GiB and plan["workers"]["machine"] == "n2-highmem-4"
    files, shuffle = plan["modes"]["files"], plan["modes"]["shuffle"]
    assert shuffle["records_per_part"] >= records_per_part, shuffle["records_per_part"]
    assert shuffle["pass2_requests_per_pile"] == 0 and shuffle["shuffled_bytes"] > terabytes * TB
    gets = files["pass2_requests_per_pile"] * plan["num_piles"]
    assert gets == files["parts"] and files["gcs_operations"]["class_b"] > gets
    assert files["dollars"]["gcs_operations"] >= gets * 0.0004 / 1000
    # more GETs than a bucket serves in its first 20 minutes
    assert files["request_ramp_seconds"] > 20 * 60
    if terabytes == 100:
        assert files["dollars_per_tb"] <= 3.0, files["dollars"]
        # runs spill: ask for disk
        assert files["disk_size_gb"] > 25 and files["disk_per_worker"] > 25 * GiB
    # the Shuffle service's $0.011 per GB
    assert shuffle["dollars_per_tb"] > files["dollars_per_tb"]
    assert plan["modes"][plan["intermediate"]]["run_bytes"] == plan["run_bytes"]


def test_workers_are_priced_at_the_rate_measured_at_the_parts_records(
    capsys, tmp_path, kilobyte_records
):
    """``rate_per_vcpu`` is 1 GB over the measured CPU-s per GB times the worker factor at each
    measured regime, the mean CPU midway on log(records per part), the nearest regime outside;
    100 TB in shuffle mode (about 30 records per part) pays more for its workers than files mode."""
    for mode, ((few, few_cpu), (some, some_cpu), (many, many_cpu)) in MEASURED_CPU_PER_GB.items():
        for records, cpu in ((few, few_cpu), (some, some_cpu), (many, many_cpu)):
            assert rate_per_vcpu(mode, records) == pytest.approx(1e9 / (cpu * WORKER_OVERHEAD))
        midway = rate_per_vcpu(mode, (few * some) ** 0.5)
        assert midway == pytest.approx(1e9 / ((few_cpu + some_cpu) / 2 * WORKER_OVERHEAD))
        assert rate_per_vcpu(mode, 1) == rate_per_vcpu(mode, few)
        assert rate_per_vcpu(mode, 10**6) == rate_per_vcpu(mode, many)
    plan = planned(capsys, tmp_path, kilobyte_records, *DATAFLOW, "--input_bytes", str(100 * TB))
    files, shuffle = plan["modes"]["files"], plan["modes"]["shuffle"]
    assert shuffle["records_per_part"] < files["records_per_part"]
    assert shuffle["dollars"]["workers"] > 1.2 * files["dollars"]["workers"]


def test_units_stay_four_or_more_per_thread_of_the_cluster_asked_for(
    capsys, tmp_path, kilobyte_records
):
    """A unit of pass 1 fills one run and Dataflow cannot split it: on 2,000 workers of 4 threads
    10 TB's files-mode runs shrink from 2.5 GB (parts of 256 KiB) to keep 4 units a thread, so a
    unit started last is at most a quarter of the job; the one-hour cluster already has more."""
    hour = planned(capsys, tmp_path, kilobyte_records, *DATAFLOW, "--input_bytes", str(10 * TB))
    wide = planned(
        capsys,
        tmp_path,
        kilobyte_records,
        *DATAFLOW,
        "--max_num_workers=2000",
        "--input_bytes",
        str(10 * TB),
    )
    an_hour = math.ceil(10 * TB / SIZING_RATE / 3600 / 4)  # 4-vCPU workers at the sizing rate
    assert (
        hour["workers"]["expected_workers"] == an_hour
        and wide["workers"]["expected_workers"] == 2000
    )
    for plan in (hour, wide):
        for mode in plan["modes"].values():
            assert mode["units_per_thread"] >= 4 and mode["tail_share"] <= 0.25, mode
    assert wide["run_bytes"] < hour["run_bytes"] / 2
    # the price: more GETs
    assert wide["modes"]["files"]["parts"] > 2 * hour["modes"]["files"]["parts"]


def test_the_text_shows_both_modes_side_by_side_and_the_units_tail(
    capsys, tmp_path, kilobyte_records
):
    assert (
        plan_main(
            [
                "--input",
                kilobyte_records,
                "--output",
                str(tmp_path / "t"),
                *DATAFLOW,
                "--input_bytes=100TB",
                "--intermediate=shuffle",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    heads = [line[:14].strip() for line in lines]
    at = heads.index("modes")
    assert heads[at - 1] == "workers" and heads[at + 1 : at + 7] == [
        "pass 1",
        "units",
        "parts",
        "pass-2 GETs",
        "disk",
        "cost",
    ]
    assert lines[at].split()[1:] == ["files", "shuffle", "(this", "run)"]
    assert "tail" in lines[at + 2] and "ramp" in lines[at + 4] and "per TB" in lines[at + 6]
    assert "n2-highmem-4 (4 vCPUs" in lines[at - 1]


@pytest.mark.parametrize(
    "machine, threads, per_thread",
    [
        ("n1-standard-1", None, (int(3.75 * GiB) - GiB - 10**9) // 1),
        ("n2-standard-4", 2, (16 * GiB - GiB - 4 * 10**9) // 8),
        ("custom-2-6144", None, (6 * GiB - GiB - 2 * 10**9) // 2),
    ],
)
def test_auto_piles_are_a_third_of_what_one_worker_thread_holds(
    capsys, tmp_path, kilobyte_records, machine, threads, per_thread
):
    """One SDK process per vCPU, ``number_of_worker_harness_threads`` bundles in each (one by default),
    each thread the worker's memory less 1 GiB and 1 GB per SDK process."""
    given = [f"--number_of_worker_harness_threads={threads}"] if threads else []
    plan = planned(
        capsys,
        tmp_path,
        kilobyte_records,
        *DATAFLOW,
        f"--worker_machine_type={machine}",
        *given,
        "--input_bytes",
        str(TB),
    )
    assert plan["workers"]["memory_per_thread"] == per_thread
    # down to a power of two
    assert plan["max_pile_bytes"] <= per_thread // 3 < 2 * plan["max_pile_bytes"]
    assert plan["max_pile_bytes"] & (plan["max_pile_bytes"] - 1) == 0


def test_a_machine_type_it_cannot_size_needs_max_pile_bytes(capsys, tmp_path, kilobyte_records):
    args = [
        "--input",
        kilobyte_records,
        "--output",
        str(tmp_path / "t"),
        *DATAFLOW,
        "--worker_machine_type=c3-highcpu-4",
    ]
    assert plan_main(args) == 2
    error = capsys.readouterr().err
    assert (
        error.count("\n") == 1
        and "--worker_machine_type c3-highcpu-4" in error
        and "give --max_pile_bytes" in error
    )
    assert plan_main([*args, "--max_pile_bytes=512MiB", "--disk_size_gb=40"]) == 0


def test_a_local_plan_sizes_piles_from_memory_and_keeps_eight_per_thread(
    capsys, tmp_path, kilobyte_records
):
    """Locally auto piles come from --memory over the threads, but no fewer than 8 per thread: a
    small input keeps today's 64 MiB piles, 10 GB with room gets 16 piles, with 2 GiB it gets
    piles of a third of what each of 2 threads holds beside the 725 MB base, down to a power of two."""
    local = ["--direct_num_workers=2"]
    small = planned(capsys, tmp_path, kilobyte_records, *local, "--memory=64GiB")
    assert (small["max_pile_bytes"], small["num_piles"]) == (64 << 20, 1)
    roomy = planned(
        capsys, tmp_path, kilobyte_records, *local, "--memory=64GiB", "--input_bytes", str(10**10)
    )
    assert 16 <= roomy["num_piles"] <= 17 and 64 << 20 < roomy["max_pile_bytes"] < GiB
    tight = planned(
        capsys, tmp_path, kilobyte_records, *local, "--memory=2GiB", "--input_bytes", str(10**10)
    )
    # (2 GiB - 725 MB) / 2 / 3 = 237 MB
    assert tight["max_pile_bytes"] == 128 << 20 and tight["num_piles"] > 70
    assert roomy["modes"]["files"]["dollars_per_tb"] is None  # priced on Dataflow only


def test_a_local_plan_of_10_tb_says_its_one_worker_is_this_machine(
    capsys, tmp_path, kilobyte_records
):
    """The workers line of a local plan scaled to 10 TB: one worker, this machine, not one sized to
    read the input in an hour (Dataflow's sizing, which a local run does not do)."""
    args = ["--input", kilobyte_records, "--output", str(tmp_path / "o" / "t")]
    assert plan_main([*args, "--direct_num_workers=2", "--input_bytes=10TB"]) == 0
    workers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("workers")]
    assert len(workers) == 1 and workers[0].endswith("expected 1 worker(s) (this machine)")
    assert plan_main([*args, *DATAFLOW, "--input_bytes=10TB"]) == 0
    dataflow = capsys.readouterr().out
    assert f"hour at {SIZING_RATE / 1e6:,.0f} MB/s per vCPU)" in dataflow


def test_shard_names_widen_past_99999_piles(tmp_path):
    """Six-digit counts give six-digit numbers for every shard of the output (they sort in shard
    order); the glob, the name and tail patterns take them as they take five digits, and a run
    that checks its output tells a wide shard's name from a name that is none."""
    piles = 123_456
    names = [
        shard_name("out/train", i, piles, ".tfrecord") for i in (0, 9, 99_999, 100_000, piles - 1)
    ]
    assert names[1] == "out/train-000009-of-123456.tfrecord" and names == sorted(names)
    assert shard_name("out/train", 3, 64, "") == "out/train-00003-of-00064"
    for name in names + [shard_name("out/train", 3, 64, ".tfrecord")]:
        assert fnmatch.fnmatchcase(name, shard_pattern("out/train")) and SHARD_NAME.match(name)
        index, count, suffix = SHARD_TAIL.match(name[len("out/train") :]).groups()
        assert int(count) in (piles, 64) and suffix == ".tfrecord" and len(index) == len(count)
    prefix = str(tmp_path / "train")
    for name in ("train-0009-of-123456", "train-00009x-of-123456.tfrecord"):  # no shard's names
        (tmp_path / name).write_bytes(b"")
    check_replaceable(prefix, overwrite=False)
    (tmp_path / "train-000009-of-123456.tfrecord").write_bytes(b"")  # one, which no run wrote
    with pytest.raises(
        OutputError, match=r"/train-000009-of-123456.tfrecord is named like a shard of --output"
    ):
        check_replaceable(prefix, overwrite=False)


def first_mib_expands(random_lines: int) -> bytes:
    """A JSONL gzip stream of 64 MiB of one 1 KB line repeated (deflated about 470:1), then
    ``random_lines`` lines of random base64 (about 1.3:1). ``plan`` sizes a compressed file by the
    expansion of its first MiB, so it takes the whole file to hold about 470 times its size."""
    line = (json.dumps({"text": "a" * 1000}) + "\n").encode()
    rng = random.Random(7)
    rest = b"".join(
        b'{"text": "%s"}\n' % base64.b64encode(rng.randbytes(750)) for _ in range(random_lines)
    )
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = [deflate.compress(line * (16 * 2**20 // len(line))) for _ in range(4)]
    return b"".join(data + [deflate.compress(rest), deflate.flush()])


def test_a_dataflow_launch_whose_spill_overflows_the_workers_disk_is_refused_in_one_line(
    gcs, capsys, tmp_path
):
    """A 3 MB .jsonl.gz that the plan takes to hold about 1.4 GB (read whole: one unit) in runs of
    2 GiB spills that much per writer: 4 writers of n2-highmem-4 spill about 5 GiB beside the
    system's 10 GB, which a 12 GB disk cannot hold. The launch is refused in one line with the
    plan's figures and the size to ask for (the default 25 GB is enough); with it the job is written."""
    data = first_mib_expands(random_lines=4000)
    # a whole stream of lines
    assert len(gzip.decompress(data)) == (4 * (16 * 2**20 // 1013) + 4000) * 1013
    storage.write_whole(f"{gcs}/in/big.jsonl.gz", data)
    shape = ["--intermediate=files", "--run_bytes=2GiB", "--num_piles=64"]
    args = [*PROJECT, f"--input={gcs}/in/*.jsonl.gz", *shape]
    planned_files = planned(
        capsys,
        tmp_path,
        f"{gcs}/in/*.jsonl.gz",
        *shape,
        "--runner=DataflowRunner",
        f"--temp_location={gcs}/tmp",
        "--disk_size_gb=12",
    )["modes"]["files"]
    assert planned_files["spilled_per_writer"] > 1.1 * GiB and planned_files["disk_size_gb"] == 25
    refused = launch(gcs, *args, "--disk_size_gb=12")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    [line] = refused.stderr.splitlines()
    spill, asked = (
        float(line.split("spills up to ")[1].split()[0]),
        int(line.split("give --disk_size_gb ")[1].split()[0]),
    )
    assert (
        spill == round(planned_files["disk_per_worker"] / GiB, 1)
        and asked == planned_files["disk_size_gb"]
    )
    assert "more than its --disk_size_gb 12 holds beside 10 GB" in line and "4 thread(s)" in line
    assert storage.match(f"{gcs}/staging/**") == [] and storage.match(f"{gcs}/job.json") == []
    accepted = launch(gcs, *args, f"--disk_size_gb={asked}")
    assert accepted.returncode == 0, accepted.stderr
    pool = storage.read_json(f"{gcs}/job.json")["environment"]["workerPools"][0]
    # the worker the plan sized for
    assert (pool["machineType"], pool["diskSizeGb"]) == (
        "n2-highmem-4",
        asked,
    )


def test_materialize_bounds_piles_by_the_dataflow_workers_that_order_them():
    """A store made where auto gave 1 GiB piles, materialized on Dataflow: its piles are ordered
    within what the job's workers hold (run's auto for that machine type), a machine type plan
    does not know or a runner whose workers it cannot see keeps the store's bound, and a given
    --max_pile_bytes is taken as it is."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pileshuffle.commands.materialize import _pile_bound

    store = {"max_pile_bytes": GiB}

    def on(*args):
        return PipelineOptions([*DATAFLOW, *args])

    assert _pile_bound(None, store, on("--worker_machine_type=n1-standard-1")) == GiB // 2
    assert _pile_bound(None, store, on("--worker_machine_type=n2-highmem-4")) == GiB
    assert _pile_bound(None, store, on("--worker_machine_type=c3-highcpu-4")) == GiB
    assert _pile_bound(None, store, PipelineOptions(["--runner=DaskRunner"])) == GiB
    assert _pile_bound("16KiB", store, on("--worker_machine_type=n1-standard-1")) == 16 << 10
