"""``--memory`` (``pileshuffle.engine.memory_runs``): on the local runner pass-1 runs that fit in the budget
stay in memory between the passes, the rest go to the temp folder; the same bytes for any budget,
nothing kept after the run (published or failed), and ``plan`` says what the budget keeps."""

import glob
import hashlib
import os

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import FAST, assert_verified, manifest, run_shuffle, shards

from pileshuffle.commands import sample
from pileshuffle.engine import memory_runs, runs
from pileshuffle.errors import InputError
from pileshuffle.planning.plan import make_plan

MiB = 1 << 20


def digests(prefix):
    return [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in shards(prefix)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """24 JSONL files of 500 records of ~200 bytes (units of work of 2 files, a run of about 230 kB each)."""
    directory = tmp_path_factory.mktemp("memory_in")
    sample.write_jsonl(str(directory), records=12_000, files=24, record_bytes=200)
    return str(directory)


def kept_runs(monkeypatch) -> list:
    """The runs ``memory_runs.keep`` keeps from now on (their paths)."""
    kept, real = [], memory_runs.keep
    monkeypatch.setattr(memory_runs, "keep", lambda *a: real(*a) and (kept.append(a[2]) or True))
    return kept


def written_runs(monkeypatch) -> list:
    """The runs written to the temp folder from now on (their paths)."""
    written, real = [], runs.storage.put_in_place
    monkeypatch.setattr(
        runs.storage,
        "put_in_place",
        lambda temps, finals: written.extend(finals) or real(temps, finals),
    )
    return written


# 32: segments of groups of piles; 2: a segment a pile, kept as slices
@pytest.mark.parametrize("piles", [32, 2])
def test_the_same_bytes_whether_runs_stay_in_memory_on_disk_or_both(
    files, tmp_path, monkeypatch, piles
):
    pattern = f"{files}/*.jsonl"
    plan = make_plan(
        PipelineOptions(
            [f"--input={pattern}", f"--output={tmp_path}/p/t", f"--num_piles={piles}", *FAST]
        )
    )
    # what the passes hold: no room for runs in a budget this small
    working = plan.memory_budget - plan.memory_for_runs
    runs_planned = plan.run_shape()[0]
    assert runs_planned >= 8
    seen = {}
    for name, budget in (("disk", working), ("both", working + 1 * MiB), ("memory", "auto")):
        kept, written = kept_runs(monkeypatch), written_runs(monkeypatch)
        out = str(tmp_path / name / "t")
        run_shuffle(pattern, out, f"--num_piles={piles}", "--seed=9", f"--memory={budget}")
        seen[name] = digests(out)
        made = len(kept) + len([w for w in written if w.endswith(".run")])
        # every run accounted for; none kept after
        assert made == runs_planned and memory_runs.kept_bytes() == 0
        assert {"disk": not kept, "both": 0 < len(kept) < made, "memory": len(kept) == made}[
            name
        ], (name, len(kept))
        monkeypatch.undo()
    assert seen["disk"] == seen["both"] == seen["memory"]
    assert manifest(str(tmp_path / "memory" / "t"))["totals"]["records"] == 12_000
    carried = {name: manifest(str(tmp_path / name / "t"))["between_passes"] for name in seen}
    assert carried["disk"]["in_memory_bytes"] == carried["memory"]["written_bytes"] == 0
    assert 0 < carried["both"]["in_memory_bytes"] and 0 < carried["both"]["written_bytes"]
    # the same segments wherever they were: about the same bytes
    segments = carried["disk"]["written_bytes"]
    # (a pile's segment kept as slices of pass 1's chunks counts one batch header a chunk: runs._sliced)
    assert segments == pytest.approx(carried["memory"]["in_memory_bytes"], rel=0.01)
    assert segments == pytest.approx(sum(carried["both"].values()), rel=0.01)
    # lines + keys and hashes
    assert 1.0 < segments / manifest(str(tmp_path / "disk" / "t"))["totals"]["payload_bytes"] < 1.3
    assert_verified(pattern, str(tmp_path / "memory" / "t"))


def test_a_failed_run_keeps_nothing_in_memory(files, tmp_path, monkeypatch):
    """Pass 1 keeps the runs of the files before a bad one; the failure drops them with the work folder."""
    source = tmp_path / "in"
    source.mkdir()
    for path in sorted(glob.glob(f"{files}/*.jsonl"))[:12]:
        (source / os.path.basename(path)).write_bytes(open(path, "rb").read())
    # a NUL byte: not text
    (source / "zz-bad.jsonl").write_bytes(b'{"ok": 1}\n' * 50 + b'{"a": "\x00"}\n')
    kept = kept_runs(monkeypatch)
    with pytest.raises(InputError, match="zz-bad.jsonl"):
        run_shuffle(
            f"{source}/*.jsonl",
            str(tmp_path / "o" / "t"),
            "--num_piles=8",
            "--direct_num_workers=1",
        )
    assert kept and memory_runs.kept_bytes() == 0
    assert not os.path.exists(tmp_path / "o" / "t-manifest.json")


def test_plan_says_what_the_budget_keeps(files, tmp_path, capsys):
    from pileshuffle.commands.plan import main

    args = [f"--input={files}/*.jsonl", f"--output={tmp_path}/o/t", "--num_piles=32"]
    assert main(args + ["--memory=4GiB"]) == 0
    line = [t for t in capsys.readouterr().out.splitlines() if t.startswith("memory")][0]
    assert "--memory 4.3 GB" in line and "pass-1 runs in memory" in line
    plan = make_plan(PipelineOptions(args + ["--memory=4GiB"]))
    assert plan.memory_budget == 4 << 30 and 0 < plan.memory_for_runs < plan.memory_budget
    if (
        os.cpu_count() or 1
    ) > 1:  # one worker thread per core unless told otherwise, as the runner will run
        alone = make_plan(PipelineOptions(args + ["--memory=4GiB", "--direct_num_workers=1"]))
        assert alone.memory_for_runs > plan.memory_for_runs
    assert main(args + ["--memory=64MiB"]) == 0
    assert (
        "no more than the passes hold, so every pass-1 run goes to disk" in capsys.readouterr().out
    )
    shuffled = make_plan(PipelineOptions(args + ["--memory=4GiB", "--intermediate=shuffle"]))
    # the runner holds shuffle mode's parts
    assert (shuffled.memory_budget, shuffled.memory_for_runs) == (
        0,
        0,
    )
    assert main(args + ["--memory=lots"]) == 2
    assert "--memory: not a size: 'lots'" in capsys.readouterr().err


def test_the_summary_says_how_records_went_between_the_passes(files, tmp_path):
    from pileshuffle.commands.report import summary

    pattern = f"{files}/*.jsonl"
    for mode, budget in (("files", "1MiB"), ("shuffle", "auto")):
        out = str(tmp_path / mode / "t")
        run_shuffle(
            pattern,
            out,
            "--num_piles=8",
            "--seed=9",
            f"--memory={budget}",
            f"--intermediate={mode}",
        )
        found = manifest(out)
        carried, payload = found["between_passes"], found["totals"]["payload_bytes"]
        line = next(x for x in summary(found).splitlines() if x.startswith("between"))
        if mode == "files":  # a budget below what the passes hold: every run on disk
            assert (
                carried["written_bytes"] > payload
                and carried["in_memory_bytes"] == carried["shuffled_bytes"] == 0
            )
            assert (
                line
                == f"between   {carried['written_bytes'] / 1e6:,.1f} MB written ({carried['written_bytes'] / payload:.2f} per payload byte)"
            )
        else:
            assert (
                carried["written_bytes"] == carried["in_memory_bytes"] == 0
                and carried["shuffled_bytes"] > payload
            )
            assert line.endswith(
                f"{carried['shuffled_bytes'] / 1e6:,.1f} MB through the runner's shuffle"
            )


def test_runs_kept_in_memory_ask_no_temp_space(files, tmp_path):
    """The space check (``run`` refuses a run the disk cannot hold) counts only the runs that go to disk."""
    args = [f"--input={files}/*.jsonl", f"--output={tmp_path}/o/t", "--num_piles=32"]
    on_disk, in_memory = (
        make_plan(PipelineOptions(args + [f"--memory={m}"])) for m in ("64MiB", "4GiB")
    )
    assert on_disk.memory_for_runs == 0 < on_disk.needs[on_disk.work_dir]
    assert in_memory.memory_for_runs > on_disk.needs[on_disk.work_dir]  # room for every run
    assert (
        in_memory.needs[in_memory.work_dir] == 0
        and in_memory.space[in_memory.work_dir][0] < on_disk.space[on_disk.work_dir][0]
    )
