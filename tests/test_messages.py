"""Messages that misled a new user (issue 54), each through the real command line
(``pileshuffle.cli.main`` in this process, or ``python -m pileshuffle`` for a run that is killed):
one option name for one concept in every command, usage errors exit 2 in every command, verify
names a missing shard once and the totals once, an unfinished run is named as one, verify says
what dedup compared, a re-run that does nothing says when the output was made, and a comma in a
path is pointed to its escape. Each test failed on the code before its fix."""

import datetime
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import kill_when, refused, run_shuffle, shards, succeeded, write_animals

from pileshuffle.cli import COMMANDS
from pileshuffle.cli import main as pileshuffle
from pileshuffle.commands import sample
from pileshuffle.commands.options import CONCEPTS


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """3,000 JSONL records in 2 files (``in/``) shuffled into 4 shards (``out/train``), and a
    pile store of the same (``st/train``)."""
    root = tmp_path_factory.mktemp("messages")
    sample.write_jsonl(str(root / "in"), records=3000, files=2, record_bytes=60)
    run_shuffle(f"{root}/in/*.jsonl", f"{root}/out/train", "--num_piles=4")
    run_shuffle(f"{root}/in/*.jsonl", f"{root}/st/train", "--num_piles=2", "--layout=store")
    return root


# --- one name for one concept --------------------------------------------------------------------

# an option's line in every command's --help
_DECLARED = re.compile(r"^  --([a-z_]+)(?: (\S+))?  \(")


def offered_options(capsys) -> dict:
    """``{command: {option: its value's form}}`` read from every command's ``--help``: "flag",
    the metavar, or the set of choices (without ``auto``, a choice that means "the default")."""
    offered = {}
    for command in COMMANDS:
        capsys.readouterr()
        try:
            code = pileshuffle([command, "--help"])
        except SystemExit as exited:  # argparse's --help
            code = exited.code
        assert code in (0, None), command
        lines = capsys.readouterr().out.splitlines()
        found = {}
        for line in lines:
            declared = _DECLARED.match(line)
            if declared:
                name, value = declared.groups()
                found[name] = (
                    "flag"
                    if value is None
                    else frozenset(value.strip("{}").split(",")) - {"auto"}
                    if value.startswith("{")
                    else value
                )
        assert found or command == "metadata", f"{command} --help lists no option"
        offered[command] = found
    return offered


def test_no_command_offers_another_name_for_a_concept_and_shared_options_take_one_form(capsys):
    offered = offered_options(capsys)
    synonyms = {synonym: name for name, others in CONCEPTS.items() for synonym in others}
    other_names = [
        f"{command} --{option} (the name is --{synonyms[option]})"
        for command, options in offered.items()
        for option in options
        if option in synonyms
    ]
    assert other_names == [], other_names
    every_option = {option for options in offered.values() for option in options}
    assert set(CONCEPTS) <= every_option, f"names no command offers: {set(CONCEPTS) - every_option}"
    forms = {}
    for command, options in offered.items():
        for option, form in options.items():
            forms.setdefault(option, {}).setdefault(form, []).append(command)
    differing = {option: by_form for option, by_form in forms.items() if len(by_form) > 1}
    assert differing == {}, f"options that take another value in another command: {differing}"
    # the check has something to compare
    assert len([o for o in forms if sum(map(len, forms[o].values())) > 1]) >= 8


def test_quality_takes_label_field_as_run_does_and_answers_label_with_it(tmp_path, capsys):
    pattern = write_animals(tmp_path)
    run_shuffle(pattern, str(tmp_path / "out" / "t"), "--num_piles=2")
    out, _ = succeeded(
        capsys,
        "quality",
        f"--input={pattern}",
        f"--output={tmp_path}/out/t",
        "--label_field=animal",
        "--sample=500",
    )
    assert "field 'animal'" in out
    err = refused(
        capsys, "quality", f"--input={pattern}", f"--output={tmp_path}/out/t", "--label=animal"
    )
    assert "unknown option --label (did you mean --label_field?)" in err


# --- usage errors exit 2 in every command --------------------------------------------------------

USAGE_ERRORS = {  # command -> argv that is a usage error (root: the `finished` fixture's folder, tmp: a new one)
    "run": lambda root, tmp: ["--input", f"{root}/nothere/*", "--output", f"{tmp}/o/t"],
    "plan": lambda root, tmp: ["--input", f"{root}/nothere/*", "--output", f"{tmp}/o/t"],
    "verify": lambda root, tmp: ["--input", f"{root}/nothere/*", "--output", f"{root}/out/train"],
    "info": lambda root, tmp: ["--output", f"{root}/nothere/train"],
    "append": lambda root, tmp: ["--store", f"{root}/st/train", "--input", f"{root}/nothere/*"],
    "expire": lambda root, tmp: ["--store", f"{root}/nothere/train", "--keep_generations=1"],
    "gc": lambda root, tmp: ["--store", f"{root}/nothere/train"],
    "materialize": lambda root, tmp: ["--store", f"{root}/nothere/train", "--output", f"{tmp}/m/t"],
    "generate": lambda root, tmp: ["--output_dir", f"{tmp}/g", "--records=0"],
    "metadata": lambda root, tmp: ["--pretty"],
    "quality": lambda root, tmp: ["--input", f"{root}/nothere/*", "--output", f"{root}/out/train"],
}


def test_every_command_has_a_usage_error_case():
    assert set(USAGE_ERRORS) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(USAGE_ERRORS))
def test_a_usage_error_exits_2_in_every_command(finished, tmp_path, capsys, command):
    err = refused(capsys, command, *USAGE_ERRORS[command](finished, tmp_path))
    assert "FAILED" not in err and "problem(s)" not in err
    assert (
        not (tmp_path / "o").exists()
        and not (tmp_path / "m").exists()
        and not (tmp_path / "g").exists()
    )


def test_verify_of_a_store_against_a_pattern_that_matches_nothing_is_a_usage_error(
    finished, capsys
):
    err = refused(
        capsys, "verify", "--input", f"{finished}/nothere/*", "--output", f"{finished}/st/train"
    )
    assert f"{finished}/nothere/*: matches no file" in err and "FAILED" not in err


# --- verify: each missing file once, the totals once, one way to write numbers -------------------


def test_a_deleted_shard_is_named_once_and_the_totals_once(finished, tmp_path, capsys):
    shutil.copytree(finished / "out", tmp_path / "out")
    output = str(tmp_path / "out" / "train")
    listed = json.loads(open(f"{output}-manifest.json").read())["shards"][1]
    gone = shards(output)[1]
    os.remove(gone)
    capsys.readouterr()
    assert pileshuffle(["verify", f"--input={finished}/in/*.jsonl", f"--output={output}"]) == 1
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if "FAILED" in line]
    assert len(failed) == 2, err
    assert err.count(gone) == 1 and f"{listed['records']:,} records" in failed[0], err
    assert (
        "the shards present hold" in failed[1] and "3,000" in failed[1] and "fingerprint" not in err
    ), err
    assert re.findall(r"\b\d{4,}\b", err.replace(gone, "")) == [], (
        f"a number without separators: {err}"
    )


def test_a_damaged_shard_is_named_once(finished, tmp_path, capsys):
    shutil.copytree(finished / "out", tmp_path / "out")
    output = str(tmp_path / "out" / "train")
    damaged = shards(output)[2]
    data = bytearray(open(damaged, "rb").read())
    data[100] ^= 0x01
    open(damaged, "wb").write(data)
    capsys.readouterr()
    assert pileshuffle(["verify", f"--input={finished}/in/*.jsonl", f"--output={output}"]) == 1
    err = capsys.readouterr().err
    assert (
        len([line for line in err.splitlines() if "FAILED" in line]) == 1
        and err.count(damaged) == 1
    ), err


# --- an unfinished run -----------------------------------------------------------------------------


def test_a_killed_run_is_named_by_verify_info_and_the_loader_with_the_command_that_finishes_it(
    tmp_path, capsys
):
    from pileshuffle.loader import ShuffledDataset
    from pileshuffle.loader.piles import NoOutputError
    from pileshuffle.names import output_lock_path, staging_dir

    sample.write_jsonl(str(tmp_path / "in"), records=60_000, files=2, record_bytes=100)
    output = str(tmp_path / "out" / "train")
    command = [
        sys.executable,
        "-m",
        "pileshuffle",
        "run",
        f"--input={tmp_path}/in/*.jsonl",
        f"--output={output}",
        "--num_piles=32",
        "--memory=1MiB",
        "--quiet",
    ]
    killed = kill_when(
        command,
        lambda: os.path.exists(output_lock_path(output)) and os.path.isdir(staging_dir(output)),
    )
    assert killed and not os.path.exists(f"{output}-manifest.json"), (
        "the run finished before it could be killed"
    )
    said = [
        refused(capsys, "verify", f"--output={output}"),
        refused(capsys, "info", f"--output={output}"),
    ]
    with pytest.raises(NoOutputError) as loader:
        ShuffledDataset(output)
    said.append(str(loader.value))
    for text in said:
        # the run's own command
        assert "an unfinished run is there" in text and f"--output={output}" in text, text
        assert (
            "stopped before it published" in text and "run that command again to finish it" in text
        ), text
        assert staging_dir(output) in text and output_lock_path(output) in text, text
    # as the message says
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    succeeded(capsys, "verify", f"--input={tmp_path}/in/*.jsonl", f"--output={output}")


def test_a_run_still_writing_is_named_as_one(finished, tmp_path, capsys):
    from pileshuffle.planning.locations import OutputLock

    output = str(tmp_path / "out" / "train")
    os.makedirs(tmp_path / "out")
    with OutputLock(output, "pileshuffle run --output elsewhere").held():
        err = refused(capsys, "verify", f"--output={output}")
    assert (
        "is writing it now" in err
        and f"pid {os.getpid()}" in err
        and "wait for it to publish" in err
    )


# --- verify says what dedup compared ---------------------------------------------------------------


@pytest.mark.parametrize(
    "option, compared",
    [
        ("--dedup_key=url", "a 64-bit hash of their 'url' value"),
        ("--dedup=exact", "a 64-bit hash of their content"),
    ],
)
def test_verify_of_a_dedup_output_names_what_was_compared(tmp_path, capsys, option, compared):
    (tmp_path / "in").mkdir()
    lines = [json.dumps({"url": f"u{i % 7}", "text": f"t{i % 5}"}) + "\n" for i in range(200)]
    (tmp_path / "in" / "a.jsonl").write_text("".join(lines))
    run_shuffle(f"{tmp_path}/in/*.jsonl", f"{tmp_path}/o", option, "--num_piles=2")
    out, _ = succeeded(capsys, "verify", f"--input={tmp_path}/in/*.jsonl", f"--output={tmp_path}/o")
    assert compared in out and "200 read" in out, out
    other = "a 64-bit hash of their content" if "url" in option else "'url'"
    assert other not in out, out


# --- a re-run that does nothing --------------------------------------------------------------------


def test_a_rerun_that_does_nothing_says_when_the_output_was_made_not_its_old_speed(
    finished, tmp_path, capsys
):
    argv = [
        "run",
        f"--input={finished}/in/*.jsonl",
        f"--output={tmp_path}/o/t",
        "--num_piles=2",
        "--quiet",
    ]
    first, _ = succeeded(capsys, *argv)
    assert "MB/s" in first
    made = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc).timestamp()
    os.utime(f"{tmp_path}/o/t-manifest.json", (made, made))
    out, err = succeeded(capsys, *argv)
    assert "nothing to do" in err and "finished 2026-01-02 03:04:05 UTC" in err, err
    assert (
        "finished  2026-01-02 03:04:05 UTC" in out and "MB/s" not in out and "time " not in out
    ), out
    assert "records   3,000" in out


# --- a comma in a path -----------------------------------------------------------------------------


def test_an_unescaped_comma_in_a_path_names_the_escape(finished, tmp_path, capsys):
    (tmp_path / "c,omma").mkdir()
    shutil.copy(finished / "in" / "part-000.jsonl", tmp_path / "c,omma")
    err = refused(capsys, "plan", f"--input={tmp_path}/c,omma/*", f"--output={tmp_path}/o/t")
    assert f"{tmp_path}/c: does not exist" in err and f"--input '{tmp_path}/c\\,omma/*'" in err, err
    succeeded(capsys, "plan", f"--input={tmp_path}/c\\,omma/*", f"--output={tmp_path}/o/t")
    err = refused(
        capsys,
        "plan",
        f"--input={finished}/in/*.jsonl,{tmp_path}/nothere/*",
        f"--output={tmp_path}/o/t",
    )
    assert "\\," not in err, err  # the comma is between two patterns: no escape to suggest
