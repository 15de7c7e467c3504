"""The Cloud Storage operations `pileshuffle plan` says a run makes (``commands.plan.gcs_operations``):
they grow as the run's shape says (files, piles, the intermediate mode), both renderings carry them,
and they are the requests a real run on gs:// (the emulator, or PILESHUFFLE_TEST_BUCKET) makes."""

import dataclasses
import json
import re
from urllib.parse import urlsplit

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import run_shuffle

from pileshuffle.commands import sample
from pileshuffle.commands.plan import gcs_operations, main, plan_json
from pileshuffle.commands.plan_text import plan_text
from pileshuffle.engine.transforms.assign import Source
from pileshuffle.planning.plan import make_plan

MiB = 1 << 20


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    """3 JSONL files of 2,000 records of about 100 bytes."""
    directory = tmp_path_factory.mktemp("ops")
    sample.write_jsonl(str(directory), records=6000, files=3, record_bytes=100)
    return f"{directory}/*.jsonl"


def planned(pattern, tmp_path, *args):
    options = PipelineOptions([f"--input={pattern}", f"--output={tmp_path}/o/t", *args])
    return make_plan(options), options


def test_operations_grow_with_piles_files_sizes_and_the_intermediate_mode(jsonl, tmp_path):
    plan, _ = planned(jsonl, tmp_path, "--num_piles=8", "--intermediate=shuffle")
    ops = gcs_operations(plan)
    assert "fragments" not in ops and ops["total"] == tuple(
        map(sum, zip(*(v for k, v in ops.items() if k != "total")))
    )
    more_piles = gcs_operations(dataclasses.replace(plan, num_piles=16))
    # each shard: one upload, a size lookup
    assert more_piles["shards"] == (16 + 3, 32 + 5) and ops["shards"] == (
        8 + 3,
        16 + 5,
    )
    assert more_piles["input"] == ops["input"] and more_piles["checks"] == ops["checks"]

    files = gcs_operations(dataclasses.replace(plan, intermediate="files"))
    # 3 small files, each cut into 5 spans (a unit of work is a sixteenth of the input), a group each:
    # a run each, read as 1 segment (the 8 small piles are one group, pile_groups), 2 lookups
    assert len(plan.source_groups) == 15 and files["runs"] == (15, 15 * (1 + 2))
    assert files["total"][0] - ops["total"][0] == 15 and files["total"][1] - ops["total"][1] == 45
    # G = 1
    per_pile = gcs_operations(dataclasses.replace(plan, intermediate="files", max_pile_bytes=1))
    assert per_pile["runs"] == (15, 15 * (8 + 2))

    # many piles, many files: objects grow with the runs, reads with (run, pile) segments; never files x piles
    many = [Source(i, f"gs://b/in/{i}", 64 * MiB) for i in range(64)]
    big = dataclasses.replace(
        plan,
        intermediate="files",
        sources=many,
        input_bytes=64 * 64 * MiB,
        estimated_bytes=64 * 64 * MiB,
        num_piles=4096,
        run_bytes=256 * MiB,
    )
    runs, parts = big.run_shape()
    class_a, class_b = gcs_operations(big)["runs"]
    # 22 groups of at most 3 files (192 MiB): a unit of work fills at most one run of 256 MiB as pass 1
    # holds it (with 16 bytes a record), so one run each (4 files a group held 1.16 x 256 MiB: 2 runs each)
    assert runs == len(big.source_groups) == 22 and class_a == runs and class_b == parts + 2 * runs
    assert 22 * 4000 < parts <= 22 * 4096 < 64 * 4096 / 2.9

    # read whole: 7 reads of 16 MiB, metadata, end
    zipped = [Source(i, f"gs://b/in/{i}.jsonl.gz", 100 * MiB) for i in range(3)]
    bigger = gcs_operations(dataclasses.replace(plan, sources=zipped, input_bytes=300 * MiB))
    assert bigger["input"] == (0, 3 * (1 + 7 + 1))
    # 5 spans of 20 MiB: metadata, 2 reads each
    sized = [Source(i, f"gs://b/in/{i}.jsonl", 100 * MiB) for i in range(3)]
    spans = gcs_operations(dataclasses.replace(plan, sources=sized, input_bytes=300 * MiB))
    assert spans["input"] == (0, 3 * 5 * (1 + 2))
    # listing the input: 3 pages of 1,000
    many = [Source(i, f"gs://b/in/{i}", MiB) for i in range(2500)]
    listed = gcs_operations(dataclasses.replace(plan, sources=many, input_bytes=2500 * MiB))
    assert listed["checks"][0] - ops["checks"][0] == 2 and listed["input"] == (0, 2500 * 3)


def test_both_renderings_carry_the_operations(jsonl, tmp_path, capsys):
    plan, options = planned(jsonl, tmp_path, "--num_piles=8", "--intermediate=files")
    class_a, class_b = gcs_operations(plan)["total"]
    line = [t for t in plan_text(plan, options).splitlines() if t.startswith("gcs requests")]
    assert line == [
        f"gcs requests  about {class_a:,} class A (uploads, copies, lists) and {class_b:,} class B (reads) "
        "Cloud Storage operations if every path were on gs://"
    ]
    remote = dataclasses.replace(
        plan,
        sources=[dataclasses.replace(s, path=f"gs://b/{s.id}") for s in plan.sources],
        output="gs://b/o/t",
        work_dir="gs://b/o/.work",
    )
    assert plan_text(remote, options).count("operations\n") == 1  # the run's own: no "if"

    assert (
        main(
            [
                f"--input={jsonl}",
                f"--output={tmp_path}/o/t",
                "--num_piles=8",
                "--intermediate=files",
                "--json",
            ]
        )
        == 0
    )
    machine = json.loads(capsys.readouterr().out)["gcs_operations"]
    assert (machine["class_a"], machine["class_b"]) == (class_a, class_b)
    assert set(machine["steps"]) == {"checks", "input", "runs", "shards"}
    assert sum(s["class_a"] for s in machine["steps"].values()) == class_a
    assert plan_json(dataclasses.replace(plan, layout="store"), options)["gcs_operations"] is None


# -- against the requests a real run makes ---------------------------------------------------------


def _storage_operations(method: str, url: str, body) -> list:
    """The billed operations ("A", "B") of one HTTP request to Cloud Storage's JSON API: a batch
    counts each request it carries; deletes and the chunks of a resumable upload are free."""
    path = urlsplit(url).path
    if path.endswith("/batch/storage/v1"):
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
        lines = re.findall(r"^(GET|POST|PUT|PATCH|DELETE) (\S+) HTTP/1\.1", text, re.MULTILINE)
        return [c for m, p in lines for c in _storage_operations(m, p, None)]
    if method == "DELETE" or (path.startswith("/upload/") and method == "PUT"):
        return []
    if method != "GET" or re.search(r"/(copyTo|rewriteTo)/|/compose$|/b/[^/]+/o$", path):
        return ["A"]  # an upload (its first request), a copy, a list
    return ["B"]


def storage_operations_seen(monkeypatch) -> list:
    """The Cloud Storage operations (``"A"``, ``"B"``) every request from now on makes, as it makes them."""
    import requests

    seen, send = [], requests.Session.request

    def spy(session, method, url, *rest, **kwargs):
        if "/storage/v1" in url:
            seen.extend(_storage_operations(method, url, kwargs.get("data")))
        return send(session, method, url, *rest, **kwargs)

    monkeypatch.setattr(requests.Session, "request", spy)
    return seen


@pytest.mark.parametrize(
    "intermediate, memory", [("files", "1MiB"), ("files", "auto"), ("shuffle", "auto")]
)
def test_the_counts_are_the_requests_of_a_real_run(
    jsonl, gcs, tmp_path, monkeypatch, intermediate, memory
):
    """Files mode with runs uploaded (``--memory`` too small to keep any) and with runs kept in memory."""
    source = f"{gcs}/in"
    sample.write_jsonl(source, records=6000, files=3, record_bytes=100)
    args = [
        "--format=jsonl",
        "--num_piles=8",
        f"--intermediate={intermediate}",
        f"--memory={memory}",
    ]
    plan, _ = planned(f"{source}/*.jsonl", tmp_path, *args)
    seen = storage_operations_seen(monkeypatch)
    run_shuffle(f"{source}/*.jsonl", f"{gcs}/out/t", *args)
    class_a, class_b = gcs_operations(dataclasses.replace(plan, output=f"{gcs}/out/t"))["total"]
    # the first look at the bucket is pyarrow's (not through requests), and once per process
    assert (seen.count("A"), seen.count("B") + 1) == (class_a, class_b), (
        seen.count("A"),
        seen.count("B") + 1,
    )
