"""The sample outputs in README.md and docs/cli.md are what their commands print now: each
marked block (docs/samples.py, which says what every sample runs) is compared with the output
of the real commands, run here on the samples' data, once ``MASKS`` have hidden the figures that
vary (times, speeds, this machine's memory, cores and free disk). ``make samples`` rewrites them.
"""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load_samples():
    """docs/samples.py as a module (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("doc_samples", ROOT / "docs" / "samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


samples = _load_samples()
TEXTS = {doc: (ROOT / doc).read_text() for doc in samples.DOCS}
MARKED = [(doc, name) for doc, text in TEXTS.items() for name, _ in samples.marked(text)]


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """``{name: block}``: every sample as its commands print it now."""
    return samples.make_blocks(tmp_path_factory.mktemp("samples"))


@pytest.mark.parametrize(("doc", "name"), MARKED)
def test_a_marked_block_is_what_its_commands_print(printed, doc, name):
    for marked_name, shown in samples.marked(TEXTS[doc]):
        if marked_name == name:
            diff = samples.difference(f"{doc}: {name}", shown, printed[name])
            assert not diff, f"`make samples` rewrites it:\n{diff}"


def test_every_sample_is_shown_and_every_marker_names_one():
    defined = [sample.name for sample in samples.SAMPLES]
    assert len(set(defined)) == len(defined)
    assert {name for _, name in MARKED} == set(defined)


def test_a_figure_edited_by_hand_is_a_difference(printed):
    """The masks hide only what varies: one record count changed in a fresh block is named."""
    fresh = samples.rewritten(TEXTS["README.md"], printed)
    assert samples.differences({"README.md": fresh}, printed) == []
    edited = fresh.replace("200,000 records in 4 shard(s)", "200,001 records in 4 shard(s)", 1)
    assert edited != fresh
    found = samples.differences({"README.md": edited}, printed)
    assert len(found) == 1 and "README.md: demo" in found[0], found
    assert "-pileshuffle verify: OK: 200,001" in found[0], found[0]
    assert "+pileshuffle verify: OK: 200,000" in found[0], found[0]


def test_masks_hide_times_speeds_and_this_machines_figures():
    one = [
        "time      1.49 s, 134.1 MB/s",
        "pileshuffle: pass 1: 100% 203MB of 203MB, 8/8 files [00:01<00:00, 198MB/s]",
        "memory  x 2 at a time + 725.0 MB = 1.1 GB peak; --memory 14.8 GB "
        "(auto, from 24.71 GB available: host /proc/meminfo): up to 206.4 MB",
        "temp space    73.8 GB free on that disk; 2 worker(s)",
    ]
    other = [
        "time      12.07 s, 16.8 MB/s",
        "pileshuffle: pass 1: 100% 203MB of 203MB, 8/8 files [01:02<00:00, 3.2MB/s]",
        "memory  x 16 at a time + 725.0 MB = 3.4 GB peak; --memory 2.1 GB "
        "(auto, from 3.50 GB available: cgroup v2 limit): up to 206.4 MB",
        "temp space    1.2 TB free on that disk; 16 worker(s)",
    ]
    assert samples.masked("\n".join(one)) == samples.masked("\n".join(other))
    for figure, changed in (("206.4", "206.5"), ("203MB of", "204MB of"), ("725.0", "726.0")):
        edited = "\n".join(one).replace(figure, changed)
        assert samples.masked(edited) != samples.masked("\n".join(one)), figure


def test_only_each_passs_last_progress_line_is_shown():
    lines = [
        "pileshuffle: 8 input file(s)",
        "pileshuffle: pass 1:  40% ...",
        "pileshuffle: pass 1: 100% ...",
        "pileshuffle: pass 2: 1 of 4 piles written",
        "pileshuffle: pass 2: 4 of 4 piles written",
        "records   8",
    ]
    assert samples.finished_progress(lines) == [lines[0], lines[2], lines[4], lines[5]]


def test_a_sample_shows_the_lines_it_keeps_and_a_gap_for_each_run_of_the_others():
    lines = ["a 1", "b 2", "b 3", "a 4", "b 5"]
    assert samples.shown_lines(lines, r"^a") == ["a 1", "...", "a 4", "..."]
    assert samples.shown_lines(lines, "") == lines
