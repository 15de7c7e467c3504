"""Each command is one function of one typed options object, shared by the command line, the
flex template's ``main`` and Python callers: the same options give the same bytes either way,
and a bad value in a typed object is refused before anything runs, as on the command line."""

import os

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import FAST, run_shuffle, shard_bytes

from pileshuffle.commands import append, materialize, sample
from pileshuffle.commands.run import run
from pileshuffle.commands.store_options import (
    AppendOptions,
    ExpireOptions,
    GcOptions,
    MaterializeOptions,
)
from pileshuffle.errors import UsageError


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("typed")
    sample.write_tfrecord(str(root / "a"), records=900, files=3, record_bytes=50)
    sample.write_tfrecord(
        str(root / "b"), records=300, files=1, record_bytes=50, seed=2, name="more"
    )
    return str(root / "a" / "*.tfrecord"), str(root / "b" / "*.tfrecord"), root


def test_run_takes_pipeline_options_and_gives_the_command_lines_bytes(inputs):
    first, _, root = inputs
    by_argv = str(root / "argv" / "t")
    run_shuffle(first, by_argv, "--num_piles=3", "--seed=5", "--quiet")
    typed = str(root / "typed" / "t")
    options = PipelineOptions(FAST, input=first, output=typed, num_piles="3", seed="5", quiet=True)
    manifest = run(options)
    assert manifest["totals"]["records"] == 900
    assert shard_bytes(typed) == shard_bytes(by_argv)


def test_a_bad_value_in_typed_options_is_refused_before_anything_runs(inputs, tmp_path):
    first, _, _ = inputs
    with pytest.raises(UsageError, match="num_piles"):
        run(PipelineOptions(FAST, input=first, output=str(tmp_path / "o" / "t"), num_piles="0"))
    assert not os.path.exists(tmp_path / "o")
    with pytest.raises(UsageError, match="--keep_generations"):
        ExpireOptions(store=str(tmp_path / "s"))
    with pytest.raises(UsageError, match="--grace_seconds"):
        GcOptions(store=str(tmp_path / "s"), grace_seconds=-1)


def test_store_commands_take_their_options_objects(inputs):
    first, second, root = inputs
    typed, by_argv = str(root / "store-typed" / "s"), str(root / "store-argv" / "s")
    for prefix in (typed, by_argv):
        run_shuffle(first, prefix, "--num_piles=3", "--seed=5", "--layout=store", "--quiet")
    beam = PipelineOptions(FAST)
    appended = append.append(AppendOptions(store=typed, input=second, beam=beam))
    append.append([f"--store={by_argv}", f"--input={second}", *FAST])
    assert appended["totals"]["records"] == 1200
    materialize.materialize(MaterializeOptions(store=typed, output=typed + "-m", beam=beam))
    materialize.materialize([f"--store={by_argv}", f"--output={by_argv}-m", *FAST])
    assert (
        shard_bytes(typed + "-m") == shard_bytes(by_argv + "-m")
        and len(shard_bytes(typed + "-m")) == 3
    )
