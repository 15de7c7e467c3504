"""The Cloud Storage operations a run makes (``gcs_operations``), counted from the code (Beam
2.77's gcsio under ``storage``) and checked against the emulator's requests
(tests/test_gcs_operations.py, tests/test_spills.py): what ``plan`` prints and prices."""

import math

__all__ = ["gcs_operations"]

# one ranged GET: Beam's gcsio read buffer (16 MiB); formats read 16 MiB at a time too
_READ_REQUEST_BYTES = 16 << 20
_LIST_PAGE = 1000  # objects per list request (storage.objects.list's largest page)
# class B per pass-1 run beside its segments' reads: two lookups (Beam's upload and delete;
# counted on the emulator)
_RUN_B = 2
# counted on the emulator: 14 lists (the plan's and Finalize's output checks, clean-ups) + uploads
# of the 2 write probes, the lock, the journal and the manifest; the bucket's first look, manifest
# checks, the plan's sample, the lookups before deleting the probes, journal and lock, and the
# reads of the lock and the manifest
_FIXED_A, _FIXED_B = 19, 20
# a direct publication's preparation (counted on the emulator): the listings and lookups that find
# nothing published at the output, and its journal's upload
_PREPARE_A, _PREPARE_B = 3, 5


def _read_requests(fmt: str, source) -> int:
    """Class B operations of reading one input file, or a span of one, in pass 1 (see
    ``gcs_operations``)."""
    # a span: its metadata, each started 16 MiB (the line across its end with it); Parquet's footer
    if source.span is not None:
        return 1 + math.ceil((source.span_bytes + 1) / _READ_REQUEST_BYTES) + (fmt == "parquet")
    # its metadata, each started 16 MiB, the end (or footer)
    reads = 1 + math.ceil(source.size / _READ_REQUEST_BYTES) + 1
    # TFRecord: its size looked up first (2), a frame header read across the first 16 MiB boundary
    if fmt == "tfrecord":
        reads += 2 + (source.size > _READ_REQUEST_BYTES)
    return reads


def gcs_operations(plan) -> dict:
    """Cloud Storage operations a run of a shard-layout ``plan`` makes with every path on gs://,
    as ``{step: (class A, class B)}`` for "checks", "input", "runs" (files mode only),
    "shards" and "total". Class A: uploads, copies, lists; class B: reads of objects and their
    metadata; deletes are free. Counted from the code and checked against the emulator (exact
    for JSONL, within one read per file for TFRecord and Parquet), assuming:

    - an upload is one class A however many 16 MiB chunks it sends (a completed resumable
      upload is one); a rename is a copy (A) and a delete, as Beam's GCSFileSystem does it;
    - reading an input file: its metadata (Beam's reader reloads it), one read per started
      16 MiB, one that finds the end (Parquet: its footer); TFRecord adds 2-3 (``_read_requests``);
      a span of a large file (``sources.split_sources``): its metadata and its 16 MiB reads;
      the plan reads each Parquet footer three times (6: schema, rows, the first file's sample);
    - files mode writes one run per ``run_bytes`` a group of sources holds (``Plan.run_shape``;
      none for the share of them a local run keeps in memory, ``Plan.memory_for_runs``),
      each uploaded straight to its name (1 A) and deleted at the end (2 lookups: 2 B); pass 2
      reads each (run, pile) segment in one ranged GET with no metadata read (1 B each);
    - a shard of a new output is uploaded straight to its final name (1 A) and its size looked
      up (2 B); the publication is prepared with listings, lookups and a journal (3 A, 5 B).
      (Replacing a finished output with --overwrite stages each shard and copies it: 1 A more
      per shard.)
    - a list returns 1,000 objects; no pile is split again (``plan`` prints the chance);
    - not counted: retries, Dataflow's staging of the job, each worker process's first look at
      a bucket (1 B). (google-cloud-storage >= 3 would read the bucket's metadata for each new
      client, one per Beam file operation: ``cloud.configure_beam`` turns that off.)"""
    files, piles = len(plan.sources), plan.num_piles
    # the plan: sizes, footers
    sampled = 2 * (plan.format == "tfrecord") + 6 * files * (plan.format == "parquet")
    steps = {
        "checks": (_FIXED_A + math.ceil(files / _LIST_PAGE), _FIXED_B + sampled),
        "input": (
            0,
            sum(_read_requests(plan.format, s) for group in plan.source_groups for s in group),
        ),
    }
    if plan.intermediate == "files":
        runs, parts = plan.run_shape()
        # runs kept in memory make none
        on_disk = max(0.0, 1 - plan.memory_for_runs / max(1.0, plan.held_bytes))
        runs, parts = round(runs * on_disk), round(parts * on_disk)
        steps["runs"] = (runs + max(0, math.ceil(runs / _LIST_PAGE) - 1), parts + _RUN_B * runs)
    steps["shards"] = (piles + _PREPARE_A, 2 * piles + _PREPARE_B)
    steps["total"] = tuple(sum(part[i] for part in steps.values()) for i in (0, 1))
    return steps
