"""The Dataflow flex template: metadata.json, option parsing, the entry point, the Dockerfile.

No Docker engine, gcloud or GCP here: these tests check what the launcher and the image
rely on (files, parameters, entry point); the translated Dataflow job itself: test_dataflow_job.py.
"""

import json
import os
import re
import subprocess
import sys

import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from helpers import manifest, read_tfrecord_payloads, shard_bytes, shards

from pileshuffle.commands import sample
from pileshuffle.commands.metadata import template_metadata
from pileshuffle.planning.parameters import PileshuffleOptions, parse_bytes, parse_flag
from pileshuffle.planning.template_parameters import PARAMETERS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(REPO, "templates")
PY = sys.executable


def metadata_file():
    with open(os.path.join(TEMPLATES, "metadata.json")) as handle:
        return json.load(handle)


# -- metadata.json -------------------------------------------------------------------------


def test_metadata_json_is_generated_from_the_option_definitions():
    assert metadata_file() == template_metadata(), (
        "templates/metadata.json is stale: run `make metadata`"
    )


def test_metadata_lists_every_parameter_with_an_example():
    entries = {p["name"]: p for p in metadata_file()["parameters"]}
    assert list(entries) == [p.name for p in PARAMETERS]
    for parameter in PARAMETERS:
        entry = entries[parameter.name]
        assert entry["label"] and entry["helpText"]
        assert entry["helpText"].endswith(f" Example: {parameter.example}")
        assert entry["isOptional"] == (parameter.name not in ("input", "output"))
        assert set(entry) <= {"name", "label", "helpText", "isOptional", "paramType", "regexes"}
    assert {name: e["paramType"] for name, e in entries.items() if e["paramType"] != "TEXT"} == {
        "input": "GCS_READ_FILE",
        "output": "GCS_WRITE_FILE",
        **{p.name: "BOOLEAN" for p in PARAMETERS if p.flag},
    }
    # the template runs on Dataflow: a local path is refused at launch
    for name in (
        "input",
        "output",
    ):
        assert entries[name]["regexes"][0].startswith("^gs://")
        assert not re.fullmatch(entries[name]["regexes"][0], "/data/train")


def examples_from_help_text():
    return {
        p["name"]: p["helpText"].rsplit(" Example: ", 1)[1] for p in metadata_file()["parameters"]
    }


@pytest.mark.parametrize("parameter", PARAMETERS, ids=[p.name for p in PARAMETERS])
def test_example_values_pass_the_regexes_and_the_pipeline_option_parser(parameter):
    example = examples_from_help_text()[parameter.name]
    assert example == parameter.example
    entry = next(p for p in metadata_file()["parameters"] if p["name"] == parameter.name)
    for regex in entry.get("regexes", []):
        assert re.fullmatch(regex, example), f"{parameter.name}: {example!r} does not match {regex}"
        if parameter.default is not None and not parameter.flag:
            assert re.fullmatch(regex, str(parameter.default)), (
                f"default of {parameter.name} fails its regex"
            )
    # the launcher passes --name=value; the pipeline parses it with Beam's parser plus ours
    options = PipelineOptions([f"--{parameter.name}={example}"]).view_as(PileshuffleOptions)
    value = getattr(options, parameter.name)
    if parameter.flag:
        assert value is parse_flag(example)
    else:
        assert value == example
    if parameter.name in ("max_pile_bytes", "run_bytes"):
        assert parse_bytes(value) > 0 and parameter.default == "auto"
    if parameter.kind is int:
        int(value)


@pytest.mark.parametrize(
    "name, bad", [("format", "csv"), ("intermediate", "memory"), ("compression", "lz4")]
)
def test_values_outside_the_choices_are_rejected(name, bad):
    entry = next(p for p in metadata_file()["parameters"] if p["name"] == name)
    assert not any(re.fullmatch(r, bad) for r in entry["regexes"])
    with pytest.raises(SystemExit):
        PipelineOptions([f"--{name}={bad}"]).view_as(PileshuffleOptions)


def test_regexes_reject_malformed_values():
    regexes = {p["name"]: p["regexes"] for p in metadata_file()["parameters"] if "regexes" in p}
    for name, bad in [
        ("num_piles", "0"),
        ("num_piles", "12x"),
        ("seed", "1.5"),
        ("max_pile_bytes", "lots"),
        ("overwrite", "maybe"),
        ("output", "gs://b/out-*"),
    ]:
        assert not any(re.fullmatch(r, bad) for r in regexes[name]), (name, bad)


# -- the entry point, as the launcher runs it ---------------------------------------------------


@pytest.fixture(scope="module")
def template_input(tmp_path_factory):
    directory = tmp_path_factory.mktemp("template") / "in"
    sample.write_tfrecord(str(directory), records=1200, files=3, record_bytes=60, vary=True)
    return str(directory / "*.tfrecord")


def template_args(input_glob, output):
    """Every template parameter, as ``--name=value`` (what the flex launcher passes)."""
    values = {
        "input": input_glob,
        "output": output,
        "format": "tfrecord",
        "compression": "none",
        "num_piles": "4",
        "max_pile_bytes": "1MiB",
        "run_bytes": "auto",
        "memory": "auto",
        "seed": "42",
        "intermediate": "files",
        "overwrite": "true",
        "skip_corrupt": "false",
        "quiet": "false",
        "layout": "shards",
        "label_field": "",
        "balance": "",
        "undersample": "false",
        "keep_unlabeled": "false",
        "dedup": "none",
        "dedup_key": "",
    }
    assert set(values) == {p.name for p in PARAMETERS}, "a new parameter needs a value here"
    return [f"--{name}={value}" for name, value in values.items()]


LOCAL = ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.mark.parametrize("entry", ["module", "template_main"])
def test_entry_point_runs_the_pipeline_with_template_style_arguments(
    tmp_path, template_input, entry
):
    output = str(tmp_path / "out" / "train")
    command = (
        [PY, "-m", "pileshuffle.pipeline"]
        if entry == "module"
        else [PY, os.path.join(TEMPLATES, "main.py")]
    )
    done = subprocess.run(
        command + template_args(template_input, output) + LOCAL,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "records   1,200" in done.stdout
    found = manifest(output)
    assert found["totals"]["records"] == 1200 and found["seed"] == 42 and found["num_piles"] == 4
    assert len(shards(output)) == 4
    payloads = read_tfrecord_payloads(shards(output))
    assert sorted(sample.index_of(p) for p in payloads) == list(range(1200))


def test_entry_point_output_equals_an_in_process_run(tmp_path, template_input):
    from pileshuffle.pipeline import run

    first, second = str(tmp_path / "a" / "train"), str(tmp_path / "b" / "train")
    done = subprocess.run(
        [PY, "-m", "pileshuffle.pipeline", *template_args(template_input, first), *LOCAL],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run([*template_args(template_input, second), *LOCAL])
    assert shard_bytes(first) == shard_bytes(second)


def test_entry_point_reports_a_bad_parameter_in_one_line(tmp_path):
    done = subprocess.run(
        [
            PY,
            "-m",
            "pileshuffle.pipeline",
            f"--input={tmp_path}/nothing-*.tfrecord",
            f"--output={tmp_path}/o",
            *LOCAL,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "matches no file" in done.stderr and "Traceback" not in done.stderr


# -- DataflowRunner: submit, do not wait ------------------------------------------------------------


def test_dataflow_runs_are_not_waited_for():
    from pileshuffle.engine.runner import should_wait

    assert should_wait(PipelineOptions(["--runner=DataflowRunner"]), None) is False
    assert should_wait(PipelineOptions(["--runner=DirectRunner"]), None) is True
    assert should_wait(PipelineOptions([]), None) is True
    assert should_wait(PipelineOptions(["--runner=DaskRunner"]), None) is True
    assert (
        should_wait(PipelineOptions(["--runner=PortableRunner", "--no_wait_until_finish"]), None)
        is False
    )
    assert should_wait(PipelineOptions(["--runner=DataflowRunner"]), True) is True


def test_the_templates_graph_skips_beams_type_check_unless_asked_for():
    from apache_beam.options.pipeline_options import TypeOptions

    from pileshuffle.engine.runner import graph_defaults

    for argv in ([], ["--runner=DataflowRunner"], ["--runner=DaskRunner"]):
        assert (
            graph_defaults(PipelineOptions(argv)).view_as(TypeOptions).pipeline_type_check is False
        )
    asked = graph_defaults(PipelineOptions(["--pipeline_type_check"]))
    assert asked.view_as(TypeOptions).pipeline_type_check is True


# -- Dockerfile, Cloud Build config, Makefile -----------------------------------------------------


def dockerfile_instructions():
    """``(INSTRUCTION, arguments)`` of templates/Dockerfile, continuation lines joined."""
    with open(os.path.join(TEMPLATES, "Dockerfile")) as handle:
        text = re.sub(r"\\\n", " ", handle.read())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def test_dockerfile_parses_and_uses_the_documented_images():
    instructions = dockerfile_instructions()
    known = {"ARG", "FROM", "COPY", "RUN", "ENV", "WORKDIR", "ENTRYPOINT"}
    assert {word for word, _ in instructions} <= known
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert re.fullmatch(
        r"gcr\.io/dataflow-templates-base/python311-template-launcher-base:\d{8}-rc\d\d",
        args["LAUNCHER_IMAGE"],
    ), "a dated release of the launcher base image, never latest"
    assert froms[0] == "${LAUNCHER_IMAGE} AS launcher"
    assert froms[-1] == "apache/beam_python3.11_sdk:${BEAM_VERSION}"
    import apache_beam

    assert args["BEAM_VERSION"] == apache_beam.__version__, (
        "the image's Beam must be the one tested here"
    )
    assert (
        "COPY",
        "--from=launcher /opt/google/dataflow/python_template_launcher "
        "/opt/google/dataflow/python_template_launcher",
    ) in instructions
    entrypoint = next(rest for word, rest in instructions if word == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["/opt/apache/beam/boot"]


def test_the_image_installs_the_dependency_versions_the_tests_ran_with():
    """templates/constraints.txt pins pileshuffle's dependencies; this environment (made by make
    install with the same file) has exactly them, and the image installs the package under it."""
    from importlib.metadata import version

    pins = {}
    for line in open(os.path.join(TEMPLATES, "constraints.txt")):
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            pins[name] = pinned
    assert set(pins) == {
        "apache-beam",
        "pyarrow",
        "numpy",
        "google-crc32c",
        "tqdm",
        "numba",
        "llvmlite",
    }
    assert {name: version(name) for name in pins} == pins
    args = dict(
        rest.split("=", 1)
        for word, rest in dockerfile_instructions()
        if word == "ARG" and "=" in rest
    )
    assert args["BEAM_VERSION"] == pins["apache-beam"]
    install = next(
        rest for word, rest in dockerfile_instructions() if word == "RUN" and "pip install" in rest
    )
    assert "--constraint /tmp/pileshuffle-src/constraints.txt" in install and "pip check" in install
    assert "--constraint templates/constraints.txt" in open(os.path.join(REPO, "Makefile")).read()


def test_dockerfile_env_paths_point_at_files_copied_from_the_repo():
    instructions = dockerfile_instructions()
    copies = {}  # image path -> repository path
    for word, rest in instructions:
        if word == "COPY" and not rest.startswith("--from"):
            *sources, destination = rest.split()
            for source in sources:
                assert os.path.exists(os.path.join(REPO, source)), (
                    f"COPY source {source} is not in the repo"
                )
                target = (
                    destination + os.path.basename(source)
                    if destination.endswith("/")
                    else destination
                )
                copies[target] = source
    env = dict(rest.split("=", 1) for word, rest in instructions if word == "ENV")
    assert env["FLEX_TEMPLATE_PYTHON_PY_FILE"] == "/template/main.py"
    assert copies["/template/main.py"] == "templates/main.py"
    for name, value in env.items():
        if name.startswith("FLEX_TEMPLATE_") and value.startswith("/"):
            assert value in copies and os.path.isfile(os.path.join(REPO, copies[value])), name
    # the package is pre-installed (see the Dockerfile)
    assert "FLEX_TEMPLATE_PYTHON_SETUP_FILE" not in env
    assert env["PILESHUFFLE_SDK_CONTAINER_IMAGE"] == "${IMAGE}"
    main = open(os.path.join(REPO, "templates", "main.py")).read()
    compile(main, "templates/main.py", "exec")
    assert "from pileshuffle.pipeline import main" in main


def test_dockerignore_keeps_what_the_dockerfile_copies():
    patterns = [
        line.strip()
        for line in open(os.path.join(REPO, ".dockerignore"))
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for word, rest in dockerfile_instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert source.rstrip("/") in kept, source


def test_cloudbuild_builds_the_template_dockerfile():
    import yaml  # PyYAML: comes with apache-beam

    text = open(os.path.join(TEMPLATES, "cloudbuild.yaml")).read()
    config = yaml.safe_load(text)
    args = config["steps"][0]["args"]
    assert config["steps"][0]["name"] == "gcr.io/cloud-builders/docker"
    assert "--file=templates/Dockerfile" in args and args[-1] == "."
    assert "--build-arg=IMAGE=${_IMAGE}" in args and "--tag=${_IMAGE}" in args
    assert config["images"] == ["${_IMAGE}"]


def test_makefile_template_targets_expand():
    done = subprocess.run(
        [
            "make",
            "-n",
            "-C",
            REPO,
            "template-build",
            "template-run",
            "PROJECT=p",
            "REGION=europe-west4",
            "BUCKET=gs://b",
            "INPUT=gs://b/a/*.tfrecord,gs://b/c/*.tfrecord",
            "SEED=3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    image = "europe-west4-docker.pkg.dev/p/pileshuffle/pileshuffle:latest"
    out = done.stdout
    assert f"--config templates/cloudbuild.yaml --substitutions _IMAGE={image} ." in out
    assert (
        "flex-template build gs://b/templates/pileshuffle.json" in out
        and "--metadata-file templates/metadata.json" in out
    )
    assert (
        "--template-file-gcs-location gs://b/templates/pileshuffle.json" in out
        and "--region europe-west4" in out
    )
    parameters = re.search(r"--parameters '\^~\^([^']*)'", out).group(1)
    values = dict(item.split("=", 1) for item in parameters.split("~"))
    assert values["input"] == "gs://b/a/*.tfrecord,gs://b/c/*.tfrecord" and values["seed"] == "3"
    assert values["intermediate"] == "shuffle" and values["sdk_container_image"] == image
    names = {p.name for p in PARAMETERS} | {"sdk_container_image"}
    assert set(values) <= names
    options = PipelineOptions([f"--{k}={v}" for k, v in values.items()])
    assert options.view_as(PileshuffleOptions).input == values["input"]
    assert options.view_as(StandardOptions).runner is None
