"""Regenerate the quality figures the README and docs/quality.md show, from `make demo`'s data.

    python bench/quality_figures.py            # -> docs/img/quality-compare.png, docs/img/training-effect.png

Same data and commands as `make demo` (200,000 x 1,000-byte TFRecords in 8 files, seed 1,
"cats then dogs" = byte 6 of the index digits), in bench/.out/quality/. Prints the
policies table (Markdown) for docs/quality.md. Every step is seeded: a re-run writes the
same figures and numbers.
"""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORK = os.path.join(HERE, ".out", "quality")
IMAGES = os.path.join(REPO, "docs", "img")


def pileshuffle(*args, quiet=False):
    subprocess.run(
        [sys.executable, "-m", "pileshuffle", *args],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL if quiet else None,
    )


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    data, output, report = (
        os.path.join(WORK, "input"),
        os.path.join(WORK, "shuffled", "train"),
        os.path.join(WORK, "report"),
    )
    pattern = os.path.join(data, "*.tfrecord")
    pileshuffle(
        "generate",
        "--format",
        "tfrecord",
        "--output_dir",
        data,
        "--records",
        "200000",
        "--files",
        "8",
        "--record_bytes",
        "1000",
        quiet=True,
    )
    pileshuffle("run", "--input", pattern, "--output", output, "--seed", "1", quiet=True)
    pileshuffle(
        "quality",
        "--input",
        pattern,
        "--output",
        output,
        "--report",
        report,
        "--label_bytes",
        "6:7",
        "--compare",
    )
    os.makedirs(IMAGES, exist_ok=True)
    shutil.copy(os.path.join(report, "quality.png"), os.path.join(IMAGES, "quality-compare.png"))
    shutil.copy(os.path.join(report, "training.png"), os.path.join(IMAGES, "training-effect.png"))
    print(open(os.path.join(report, "policies.md")).read())
    print(f"wrote {IMAGES}/quality-compare.png and {IMAGES}/training-effect.png")


if __name__ == "__main__":
    main()
