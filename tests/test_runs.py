"""Pass-1 runs (``pileshuffle.engine.runs``): parts sized by a memory budget, one object per run in files
mode, and the many-piles regime (thousands of piles over small files) end to end."""

import glob
import hashlib
import os

import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import assert_verified, manifest, run_shuffle, shards

from pileshuffle.commands import sample
from pileshuffle.engine.fragments import Fragment, GroupSegment, read_joined, read_table, to_ipc
from pileshuffle.engine.pile_groups import template_group
from pileshuffle.engine.runs import PileRuns, auto_run_bytes, read_run_index
from pileshuffle.engine.transforms.pass_one import ReadSourceToPiles
from pileshuffle.formats import record_hashes, record_lengths
from pileshuffle.formats.base import records_table
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
from pileshuffle.planning.plan import make_plan
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint, total


def digests(output):
    return {
        os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
        for p in shards(output)
    }


def chunks(count, records, record_bytes=100, seed=0):
    """``count`` keyed chunks of ``records`` distinct records each: (table, keys, hashes, lengths)."""
    rng = np.random.default_rng(seed)
    for c in range(count):
        table = records_table(
            [b"%08d:" % (c * records + i) + rng.bytes(record_bytes - 9) for i in range(records)]
        )
        keys = keymath.record_keys(seed, (0, c), 0, records)
        yield table, keys, record_hashes(table), record_lengths(table)


def test_a_run_is_its_piles_segments_in_pile_order_with_an_index(tmp_path):
    piles, runs = 64, PileRuns(64, 1 << 30, "s000000", str(tmp_path), (0,))
    fed = list(chunks(5, 400))
    for chunk in fed:
        assert list(runs.add(*chunk)) == []  # the budget holds: nothing leaves the writer yet
    elements = runs.flush()
    assert runs.runs == 1 and os.listdir(tmp_path) == ["s000000-r00000.run"]
    data = open(tmp_path / "s000000-r00000.run", "rb").read()
    index, group = read_run_index(data)
    assert group == 1
    assert index[:, 0].tolist() == sorted(index[:, 0].tolist()) == [p for p, _ in elements]
    assert index[:, 1].tolist() == [f.offset for _, f in elements] and index[0, 1] == 0
    assert (index[1:, 1] == index[:-1, 1] + index[:-1, 2]).all()  # back to back
    everything = []
    for (pile, fragment), (_, offset, length, records) in zip(elements, index.tolist()):
        alone = pa.ipc.open_stream(
            data[offset : offset + length]
        ).read_all()  # a segment reads alone
        assert alone.equals(read_table(fragment)) and alone.num_rows == records == fragment.records
        assert set(keymath.pile_of(alone.column(KEY_COLUMN).to_numpy(), piles).tolist()) == {pile}
        assert fragment.fingerprint == Fingerprint.of(
            alone.column(HASH_COLUMN).to_numpy(),
            int(record_lengths(alone.drop_columns([KEY_COLUMN, HASH_COLUMN])).sum()),
        )
        everything += alone.column(0).to_pylist()
    expected = [v for table, *_ in fed for v in table.column(0).to_pylist()]
    assert sorted(everything) == sorted(expected)
    assert total(f.fingerprint for _, f in elements) == total(
        Fingerprint.of(h, int(n.sum())) for _, _, h, n in fed
    )
    with pytest.raises(ValueError, match="not a pileshuffle run"):
        read_run_index(data[:-1])


@pytest.mark.parametrize("mode", ["files", "shuffle"])
def test_a_run_of_small_piles_has_a_segment_a_group_whose_views_are_the_piles_parts(tmp_path, mode):
    """With ``group`` G a run has one segment per group of G piles it reaches (index rows at the
    group's first pile, G in the footer), and each pile's view of it holds exactly the records,
    bytes' accounting and fingerprint of that pile's part in a run without groups."""
    piles, group, fed = 64, 5, list(chunks(4, 300))
    directory = str(tmp_path / "g") if mode == "files" else None
    alone, grouped = (
        PileRuns(piles, 1 << 30, "a", str(tmp_path / "a")),
        PileRuns(piles, 1 << 30, "g", directory, group=group),
    )
    for chunk in fed:
        alone.add(*chunk)
        grouped.add(*chunk)
    per_pile, segments = dict(alone.flush()), list(grouped.flush())
    # 1,200 records reach every group
    assert [key for key, _ in segments] == list(range(-(-piles // group)))
    assert all(isinstance(s, GroupSegment) for _, s in segments)
    views = [view for key, segment in segments for view in segment.views()]
    assert [p for p, _ in views] == sorted(per_pile)
    for pile, view in views:
        part = per_pile[pile]
        assert (view.records, view.fingerprint) == (part.records, part.fingerprint)
        # held bytes, estimated per pile
        assert abs(view.nbytes - part.nbytes) <= 0.02 * part.nbytes + 64
        assert read_table(view).equals(read_table(part)) and read_joined([view]).equals(
            read_joined([part])
        )
    for key, segment in segments:
        assert set(int(p) // group for p in segment.piles[:, 0]) == {key}
        assert segment.fragment.fingerprint == total(v.fingerprint for _, v in segment.views())
    if mode == "files":
        index, footer_group = read_run_index(open(tmp_path / "g" / "g-r00000.run", "rb").read())
        assert footer_group == group and index[:, 0].tolist() == [
            key * group for key, _ in segments
        ]
        assert index[:, 3].tolist() == [s.fragment.records for _, s in segments]
    else:
        assert all(s.fragment.payload is not None for _, s in segments)


def test_a_piles_parts_read_in_place_equal_each_part_read_as_a_stream(tmp_path):
    """``read_joined`` reads a segment's one batch in place under a schema parsed once; a segment
    of another schema (other metadata), with a dictionary column, of two batches, or a whole
    file is read as a stream: the table equals reading every part alone, in order, whatever
    the mix (its speed: bench's piles-* rows)."""

    def table(start, **metadata):
        return pa.table(
            {"i": pa.array(range(start, start + 3), pa.int64()), "s": ["a", "b", "c"]}
        ).replace_schema_metadata(metadata or None)

    segments = [to_ipc(t) for t in (table(0), table(3), table(6, source=b"other"), table(9))]
    run = tmp_path / "w-r00000.run"
    run.write_bytes(b"".join(segments))
    offsets = np.cumsum([0] + [len(s) for s in segments]).tolist()
    ranged = [
        Fragment((0, n), 3, 0, Fingerprint(), path=str(run), offset=offsets[n], length=len(s))
        for n, s in enumerate(segments)
    ]
    whole = tmp_path / "whole.arrow"
    whole.write_bytes(to_ipc(table(12)))
    two_batches = pa.concat_tables([table(18), table(21)])
    parts = [
        *ranged,
        Fragment((1,), 3, 0, Fingerprint(), path=str(whole)),
        Fragment((2,), 3, 0, Fingerprint(), payload=to_ipc(table(15))),
        Fragment((3,), 6, 0, Fingerprint(), payload=to_ipc(two_batches)),
    ]
    joined = read_joined(parts)
    assert (
        joined.column("i").to_pylist()
        == list(range(24))
        == [v for f in parts for v in read_table(f).column("i").to_pylist()]
    )
    assert joined.schema.metadata is None and read_joined(ranged[2:3]).schema.metadata == {
        b"source": b"other"
    }
    dictionary = [pa.table({"s": pa.array(list(v)).dictionary_encode()}) for v in ("ab", "bc")]
    read = read_joined(
        [Fragment((n,), 2, 0, Fingerprint(), payload=to_ipc(t)) for n, t in enumerate(dictionary)]
    )
    assert read.column("s").to_pylist() == list("abbc")


def test_parts_grow_with_the_budget_not_with_the_input_chunk(tmp_path):
    """At 4,096 piles a 16 MiB-like chunk of 1,000 records reaches ~900 piles with ~1 record
    each; held to a budget, 20 chunks leave as parts of ~5 records."""
    piles = 4096
    per_chunk = PileRuns(piles, 1, "a")  # flushes after every chunk: the old per-chunk parts
    held = PileRuns(piles, 1 << 30, "b")
    small, large = [], []
    for chunk in chunks(20, 1000):
        small += per_chunk.add(*chunk)
        large += held.add(*chunk)
    large += held.flush()
    assert sum(f.records for _, f in small) == sum(f.records for _, f in large) == 20_000
    assert len(small) > 3 * len(large) and len(large) <= piles
    assert 20_000 / len(large) > 4.5 > 20_000 / len(small)
    # shuffle mode: the payload is the segment itself, read the same way
    assert sum(read_table(f).num_rows for _, f in large) == 20_000
    # the default budget keeps parts of 1 KB records at 8 or more per element at 100,000 piles
    assert auto_run_bytes(100_000) / 100_000 >= 8 * (1000 + 16)
    assert auto_run_bytes(16) == 64 << 20 and auto_run_bytes(4096) == 256 << 20


def test_thousands_of_piles_over_many_small_files_write_few_runs(tmp_path):
    """The regime of 10 TB in 10,000 piles at small scale: 48 files, 2,048 piles. Pass 1 writes one
    object per run (as ``plan`` counts them: about 16 groups of 3 files), not 48 x 2,048 fragments, and
    both intermediate modes give the same bytes, which verify."""
    source = str(tmp_path / "in")
    sample.write_jsonl(source, records=24_000, files=48, record_bytes=120)
    pattern = f"{source}/*.jsonl"
    options = PipelineOptions(
        [f"--input={pattern}", f"--output={tmp_path}/o/t", "--num_piles=2048", "--run_bytes=1MiB"]
    )
    plan = make_plan(options)
    group = template_group(plan)
    dofn = ReadSourceToPiles(
        "jsonl",
        plan.seed,
        plan.num_piles,
        str(tmp_path / "runs"),
        run_bytes=plan.run_bytes,
        group=group,
    )
    elements = [
        o for sources in plan.source_groups for o in dofn.process(sources) if isinstance(o, tuple)
    ]
    # one element per (run, group)
    assert group > 1 and all(isinstance(e, GroupSegment) for _, e in elements)
    written = glob.glob(str(tmp_path / "runs" / "*.run"))
    runs, parts = plan.run_shape()
    assert len(written) == runs and abs(len(elements) - parts) < 0.05 * parts
    assert len(written) <= 16 and len(elements) < 0.5 * 48 * 2048
    outputs = {}
    for mode in ("files", "shuffle"):
        out = str(tmp_path / mode / "t")
        run_shuffle(
            pattern,
            out,
            "--num_piles=2048",
            "--run_bytes=1MiB",
            f"--intermediate={mode}",
            "--seed=3",
        )
        assert manifest(out)["totals"]["records"] == 24_000
        outputs[mode] = digests(out)
    assert outputs["files"] == outputs["shuffle"]
    assert_verified(pattern, str(tmp_path / "files" / "t"))


def test_a_work_folder_that_cannot_be_removed_is_reported_not_swallowed(tmp_path):
    """Clean-up after publishing: a leftover it cannot delete (here a file made immutable, which
    even root cannot delete) leaves the output published and says which folder, on stderr."""
    import subprocess
    import sys

    from pileshuffle.planning.locations import work_dir_for

    source = str(tmp_path / "in")
    sample.write_jsonl(source, records=2_000, files=2, record_bytes=100)
    output = str(tmp_path / "out" / "t")
    work_dir = work_dir_for(output, None)
    os.makedirs(work_dir)
    stuck = os.path.join(work_dir, "stuck")
    open(stuck, "w").close()
    made = subprocess.run(["chattr", "+i", stuck], capture_output=True, text=True)
    # as root a refusal is a failure (a file system without immutable files)
    if made.returncode != 0:
        refused = pytest.fail if os.geteuid() == 0 else pytest.skip
        refused(f"chattr +i needs root and failed: {made.stderr.strip()}")
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pileshuffle",
                "run",
                f"--input={source}/*.jsonl",
                f"--output={output}",
                "--num_piles=4",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        subprocess.run(["chattr", "-i", stuck])
    assert done.returncode == 0, done.stderr
    assert manifest(output)["totals"]["records"] == 2_000
    assert f"could not remove {work_dir}" in done.stderr


def test_local_runs_keep_off_the_grpc_data_plane_that_grew_without_bound():
    """Beam's multi_threading mode grew to 5-24 GB in 2 of 5 runs of 1 GB in 4,096 piles
    (docs/performance.md, Many piles); in_memory runs the same threads without it. A user's own
    --direct_running_mode still wins."""
    from apache_beam.options.pipeline_options import DirectOptions

    from pileshuffle.planning.runners import local_defaults

    chosen = local_defaults(PipelineOptions([])).view_as(DirectOptions)
    assert chosen.direct_running_mode == "in_memory" and chosen.direct_num_workers == 0
    given = local_defaults(PipelineOptions(["--direct_running_mode=multi_threading"])).view_as(
        DirectOptions
    )
    assert given.direct_running_mode == "multi_threading"


@pytest.mark.parametrize(
    "value, said",
    [
        ("0", "below the minimum of 1MiB"),
        ("512KiB", "below the minimum of 1MiB"),
        ("abc", "not a size: 'abc'"),
    ],
)
def test_a_run_bytes_that_is_no_budget_is_refused_in_one_line(tmp_path, value, said):
    import subprocess
    import sys

    source = str(tmp_path / "in")
    sample.write_jsonl(source, records=100, files=1, record_bytes=100)
    for command in ("run", "plan"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pileshuffle",
                command,
                f"--input={source}/*.jsonl",
                f"--output={tmp_path}/o/t",
                f"--run_bytes={value}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
        assert "--run_bytes: " in done.stderr and said in done.stderr, done.stderr
    assert not (tmp_path / "o").exists() or os.listdir(tmp_path / "o") == []
