"""pileshuffle: a seeded, deterministic global shuffle for datasets larger than RAM, on Apache Beam.

Also used as Beam's ``--setup_file`` so that Dataflow workers install the same package
(without extras: the workers' Beam SDK container already holds the ``pipeline`` extra's packages).

``pip install pileshuffle``: the reader (``pileshuffle.loader``) alone, no Apache Beam.
``pip install "pileshuffle[pipeline]"``: also the pipeline and the CLI's commands.
"""

import pathlib
import re

import setuptools

# one place for the version: the package reads it from the same file
VERSION_FILE = pathlib.Path(__file__).resolve().parent / "pileshuffle" / "version.py"
VERSION = re.search(r'__version__ = "(.+)"', VERSION_FILE.read_text()).group(1)

# What `pileshuffle.loader` imports: `pip install pileshuffle` is the reader alone.
READER = [
    "pyarrow>=17",
    "numpy>=1.26",
    "google-crc32c>=1.5",  # imported directly (TFRecord CRCs, fingerprints), not only through Beam's gcp extra
]
# What only the pipeline and the CLI's commands import: `pip install "pileshuffle[pipeline]"`.
PIPELINE = [
    "apache-beam[gcp]>=2.77,<3",
    "tqdm>=4.60",  # the pipeline's progress lines
    # fingerprints' per-value CRC32C in one compiled loop (pileshuffle/records/compiled_crc.py: 7-19x one call
    # per value); a worker without it (--setup_file on Beam's own image) hashes one call per value
    "numba>=0.60",
]

setuptools.setup(
    name="pileshuffle",
    version=VERSION,
    description="Global shuffle of TFRecord, Parquet and JSONL datasets larger than RAM (2-pass pile algorithm on Apache Beam)",
    long_description=open("README.md", encoding="utf-8").read()
    if __import__("os").path.exists("README.md")
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["pileshuffle", "pileshuffle.*"]),
    # PEP 561: the package's annotations are for type checkers too
    package_data={"pileshuffle": ["py.typed"]},
    # The reader (pileshuffle.loader) alone: a training host that only reads needs no Beam.
    install_requires=READER,
    extras_require={
        "pipeline": PIPELINE,  # the pipeline and the CLI's commands (run, plan, verify, stores, quality)
        "tf": ["tensorflow-cpu>=2.16"],
        "dask": [
            *PIPELINE,
            "dask>=2024.1",
            "distributed>=2024.1",
        ],  # a Beam runner: nothing without the pipeline
        "torch": ["torch>=2.1", "torchdata>=0.8"],
        "grain": [
            "grain>=0.2.18"
        ],  # ds.grain(): Grain's IterDataset API (JAX itself is not needed)
        "report": [*PIPELINE, "matplotlib>=3.7", "scipy>=1.11"],  # the `quality` command's figures
        "test": [
            *PIPELINE,
            "pytest>=8",
            "pytest-xdist>=3.5",  # make test: two workers, a test file each (CI has 2 cores)
            "pytest-timeout>=2.2",  # a per-test limit against hangs (pytest.ini)
            "hypothesis>=6",
            "ruff==0.17.6",  # make lint: the formatter and linter (ruff.toml); pinned so its output is fixed
            "py-spy>=0.3",  # the bench's stage breakdown (bench/cpu_per_gb.py)
            "scipy>=1.11",
            "duckdb>=1.0",
            "webdataset>=0.2",  # reads the tar shards back as WebDataset users do
            "psutil>=5.9",
            "tensorflow-cpu>=2.16",
            "dask>=2024.1",
            "distributed>=2024.1",
            "torch==2.13.0",  # the CPU-only wheel on these machines; any other version pulls CUDA
            "torchdata>=0.8",
            "matplotlib>=3.7",
            "grain>=0.2.18",
            "gcp-storage-emulator>=2024.1",  # local Cloud Storage for the gs:// tests (fake-gcs-server breaks Beam's batch deletes)
        ],
    },
    entry_points={"console_scripts": ["pileshuffle=pileshuffle.cli:entry"]},
)
