"""The sample outputs in README.md and docs/cli.md, printed by the real commands.

A generated sample in the markdown is a marker line and the fenced block right after it:

    <!-- sample: NAME — what it shows (written by `make samples`: docs/samples.py) -->
    ```
    what the sample's commands print
    ```

``SAMPLES`` is the one place that says what each sample runs: its commands (as typed in a
shell), the data they run on (made in a fresh temp folder; paths are relative to it) and which
of their lines it shows. ``python docs/samples.py --write`` (``make samples``) runs them and
rewrites every marked block; ``--check`` (and tests/test_doc_samples.py) runs them and fails on
a block that is not what they print once ``MASKS`` have hidden the figures that vary.

The demo sample runs ``make demo``'s own commands, read from the Makefile, on its data (200 MB:
its figures depend on the size); the others run on a few kB.
"""

import argparse
import dataclasses
import difflib
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/cli.md")  # the files whose marked blocks are generated
MARKER = re.compile(r"^<!-- sample: (?P<name>[\w-]+) .*-->$")
FENCE = "```"
GAP = "..."  # stands for each run of lines a sample leaves out

# What varies between runs and machines, hidden before a block is compared (never when one is
# written: a block shows real figures). Each: (what it is, pattern, what it becomes).
SIZE = r"[\d.]+ (?:bytes|[kMGT]B)"  # a size as the commands print it: 0 bytes, 206.4 MB, 1.2 TB
MASKS = (
    ("a run's time and speed", r"\b[\d.]+ s, [\d.]+ MB/s", "<time> s, <speed> MB/s"),
    ("a progress line's elapsed time, ETA and speed", r"\[\d\d:\d\d<[^\]]*\]", "[<elapsed>]"),
    ("this machine's memory budget", rf"--memory {SIZE}", "--memory <budget>"),
    (
        "the memory this machine has available, and where that figure comes from",
        r"\(auto, from [^)]*\)",
        "(auto, from <available>)",
    ),
    (
        "pass 2's threads (one per core) and the peak they make",
        rf"x \d+ at a time \+ ({SIZE}) = {SIZE} peak",
        r"x <threads> at a time + \1 = <peak> peak",
    ),
    ("the local runner's workers (one per core)", r"\d+ worker\(s\)", "<cores> worker(s)"),
    ("free space on this machine's disk", rf"{SIZE} free", "<space> free"),
)
PROGRESS = re.compile(r"^pileshuffle: (pass \d):")  # a progress line; its pass


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a sample, as typed in a shell (``pileshuffle ...``; quoted patterns stay
    patterns), the exit code it must end with, and ``keep``: a pattern of the lines shown (every
    line when empty); each run of lines left out is shown as one ``GAP``."""

    command: str
    keep: str = ""
    code: int = 0


@dataclasses.dataclass(frozen=True)
class Sample:
    """A block of the docs: ``steps`` run in the folder of ``data`` (a key of ``DATA``); ``about``
    is what the marker says it shows; with ``echo`` each command is shown first, after ``$ ``."""

    name: str
    about: str
    data: str
    steps: tuple
    echo: bool = True


def demo_commands(makefile: pathlib.Path = ROOT / "Makefile") -> list:
    """The ``pileshuffle`` commands of the Makefile's ``demo`` recipe, in order, as a user would
    type them after ``make install`` (``$(BIN)/`` and ``$(DEMO_DIR)`` filled in)."""
    lines = makefile.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("demo:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().replace("$(BIN)/", "").replace("$(DEMO_DIR)", "demo-data"))
    return [line for line in recipe if line.startswith("pileshuffle ")]


DISCARDED = " > /dev/null"  # a demo command whose output make discards: it makes the demo's data


def _write_demo(folder: pathlib.Path):
    """The demo's data, as ``make demo`` generates it."""
    for command in demo_commands():
        if command.endswith(DISCARDED):
            _run(command.removesuffix(DISCARDED), folder, 0)


def _demo_steps(quality_shown: str) -> tuple:
    """The demo's commands whose output make shows; of ``quality``, the lines that match
    ``quality_shown``."""
    return tuple(
        Step(command, quality_shown if command.split()[1] == "quality" else "")
        for command in demo_commands()
        if not command.endswith(DISCARDED)
    )


ANIMALS = {"cat": 900, "dog": 90, "bird": 10}  # records per class, written one class after another


def _write_animals(folder: pathlib.Path):
    """raw/a.jsonl and raw/b.jsonl: ``ANIMALS``' records ``{"i", "animal", "text"}``."""
    animals = [animal for animal, count in ANIMALS.items() for _ in range(count)]
    lines = [
        json.dumps({"i": i, "animal": animal, "text": "x" * (i % 40)}) + "\n"
        for i, animal in enumerate(animals)
    ]
    _write_lines(folder / "raw", lines, 600)


def _write_crawl(folder: pathlib.Path):
    """crawl/a.jsonl and crawl/b.jsonl: 2,000 fetched pages, many fetched more than once."""
    pages = [(k * 37) % 1500 if k % 4 else k % 100 for k in range(2000)]
    lines = [
        json.dumps({"url": f"https://example.com/{p}", "text": f"page {p}"}) + "\n" for p in pages
    ]
    _write_lines(folder / "crawl", lines, 1000)


def _write_lines(directory: pathlib.Path, lines: list, cut: int):
    """``lines[:cut]`` as ``directory/a.jsonl``, the rest as ``directory/b.jsonl``."""
    directory.mkdir()
    (directory / "a.jsonl").write_text("".join(lines[:cut]))
    (directory / "b.jsonl").write_text("".join(lines[cut:]))


def _write_locked(folder: pathlib.Path):
    """The animals' data, and out/train's lock held by a run on another host (never taken over)."""
    _write_animals(folder)
    (folder / "out").mkdir()
    holder = {
        "command": "pileshuffle run --input ... --output out/train",
        "host": "host-1",
        "pid": 4242,
        "since": "2026-11-23T20:00:00.000000Z",
        "token": "0" * 32,
    }
    (folder / "out" / "train.pileshuffle-lock").write_text(json.dumps(holder))


def _write_tfrecords(folder: pathlib.Path):
    """data/part-000.tfrecord and data/part-001.tfrecord: 100 records of 100 bytes."""
    from pileshuffle.commands.sample import write_tfrecord

    write_tfrecord(str(folder / "data"), records=100, files=2)


DATA = {
    "demo": _write_demo,
    "animals": _write_animals,
    "crawl": _write_crawl,
    "locked": _write_locked,
    "tfrecords": _write_tfrecords,
}  # folder -> what makes its data

QUALITY_SHOWN = r"^(pileshuffle quality|  (spearman|block chi2|verdict)|report written)"
DEMO_STEPS = _demo_steps(QUALITY_SHOWN)
DEMO_RUN = next(step.command for step in DEMO_STEPS if step.command.startswith("pileshuffle run "))
SAMPLES = (
    Sample(
        "demo",
        "what `make demo` prints; of `quality`, its first line, two statistics, the "
        "verdict and where the report went",
        "demo",
        DEMO_STEPS,
        echo=False,
    ),
    Sample(
        "plan",
        "`plan` on the demo's data",
        "demo",
        (Step("pileshuffle plan --input 'demo-data/input/*.tfrecord' --output out/train"),),
    ),
    Sample(
        "progress",
        "the demo run's start line and each pass's last progress line",
        "demo",
        (Step(DEMO_RUN, r"^pileshuffle:"),),
        echo=False,
    ),
    Sample(
        "info",
        "`info` on the demo's output",
        "demo",
        (Step("pileshuffle info --output demo-data/shuffled/train"),),
    ),
    Sample(
        "checks",
        "three refusals",
        "tfrecords",
        (
            Step(
                "pileshuffle run --input 'data/*' --output out/train --num_pile 3 --sead 5", code=2
            ),
            Step(
                "pileshuffle run --input 'data/*' --output out/train --max_pile_bytes 1KiB", code=2
            ),
            Step("pileshuffle run --input 'data/*' --output out/train --compression zstd", code=2),
        ),
    ),
    Sample(
        "balance",
        "a run's `balance` line",
        "animals",
        (
            Step(
                "pileshuffle run --input 'raw/*.jsonl' --output out/train --label_field animal "
                "--balance uniform",
                r"^balance",
            ),
        ),
    ),
    Sample(
        "dedup",
        "a run's `records` line and `verify`",
        "crawl",
        (
            Step(
                "pileshuffle run --input 'crawl/*.jsonl' --output out/train --dedup exact",
                r"^records",
            ),
            Step("pileshuffle verify --input 'crawl/*.jsonl' --output out/train"),
        ),
    ),
    Sample(
        "lock",
        "a run refused by another host's lock",
        "locked",
        (Step("pileshuffle run --input 'raw/*.jsonl' --output out/train", code=2),),
        echo=False,
    ),
)


def _executable() -> list:
    """The installed ``pileshuffle`` command beside this Python, else its module."""
    beside = pathlib.Path(sys.executable).parent / "pileshuffle"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "pileshuffle"]


def _run(command: str, folder: pathlib.Path, code: int) -> str:
    """What ``command`` prints on stdout and stderr together, in the order it printed it, run in
    ``folder`` with no shell; it must end with exit code ``code``."""
    words = shlex.split(command)
    assert words[0] == "pileshuffle" and not {">", "|", "&&", ";"} & set(words), command
    done = subprocess.run(
        _executable() + words[1:],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if done.returncode != code:
        raise RuntimeError(f"`{command}` exited {done.returncode}, not {code}:\n{done.stdout}")
    return done.stdout


def finished_progress(lines: list) -> list:
    """``lines`` without the progress lines printed while a pass ran (one every 5 s: how many
    depends on the machine's speed); each pass's last line stays."""

    def superseded(i):
        this = PROGRESS.match(lines[i])
        following = PROGRESS.match(lines[i + 1]) if i + 1 < len(lines) else None
        return bool(this and following and this.group(1) == following.group(1))

    return [line for i, line in enumerate(lines) if not superseded(i)]


def shown_lines(lines: list, keep: str) -> list:
    """The lines that match ``keep`` (all when empty), each run of the others as one ``GAP``."""
    if not keep:
        return lines
    shown = []
    for line in lines:
        if re.search(keep, line):
            shown.append(line)
        elif not shown or shown[-1] != GAP:
            shown.append(GAP)
    return shown


class Session:
    """Runs samples' commands under one temp folder: each data set made once, in a folder of its
    own, and each command run once (a later sample that shows the same command reuses it)."""

    def __init__(self, root: pathlib.Path):
        self.root, self.printed = root, {}

    def folder(self, data: str) -> pathlib.Path:
        folder = self.root / data
        if not folder.exists():
            folder.mkdir(parents=True)
            DATA[data](folder)
        return folder

    def output(self, data: str, step: Step) -> list:
        if (data, step.command) not in self.printed:
            text = _run(step.command, self.folder(data), step.code)
            self.printed[data, step.command] = finished_progress(text.rstrip("\n").split("\n"))
        return self.printed[data, step.command]

    def block(self, sample: Sample) -> str:
        """The sample's marker line and fenced block, as ``--write`` writes them."""
        marker = f"<!-- sample: {sample.name} — {sample.about} (docs/samples.py: make samples) -->"
        lines = [marker, FENCE]
        for step in sample.steps:
            lines += [f"$ {step.command}"] if sample.echo else []
            lines += shown_lines(self.output(sample.data, step), step.keep)
        return "\n".join(lines + [FENCE])


def make_blocks(root: pathlib.Path) -> dict:
    """``{name: block}`` of every sample, its commands run in order under ``root``."""
    session = Session(root)
    return {sample.name: session.block(sample) for sample in SAMPLES}


def marked(text: str) -> list:
    """``[(name, block)]``: the marked blocks of a markdown ``text``, in order."""
    lines = text.split("\n")
    return [(name, "\n".join(lines[start:end])) for name, start, end in _spans(lines)]


def _spans(lines: list) -> list:
    """``[(name, start, end)]``: each marker's line and its fenced block, ``lines[start:end]``."""
    spans = []
    for i, line in enumerate(lines):
        found = MARKER.match(line)
        if found:
            if lines[i + 1 : i + 2] != [FENCE]:
                raise ValueError(f"sample {found['name']}: no ``` line follows its marker")
            spans.append((found["name"], i, lines.index(FENCE, i + 2) + 1))
    return spans


def rewritten(text: str, blocks: dict) -> str:
    """``text`` with every marked block replaced by ``blocks``' (from the last, so spans hold)."""
    lines = text.split("\n")
    for name, start, end in reversed(_spans(lines)):
        if name not in blocks:
            raise ValueError(f"a marker names sample {name!r}, which docs/samples.py lacks")
        lines[start:end] = blocks[name].split("\n")
    return "\n".join(lines)


def masked(block: str) -> str:
    """``block`` with each of ``MASKS`` applied."""
    for _, pattern, replacement in MASKS:
        block = re.sub(pattern, replacement, block)
    return block


def difference(label: str, shown: str, made: str) -> str:
    """A unified diff of ``shown`` (a block of the docs) against ``made`` (what its commands
    print), both masked: "" when they are the same."""
    return "\n".join(
        difflib.unified_diff(
            masked(shown).split("\n"), masked(made).split("\n"), label, "printed", lineterm=""
        )
    )


def differences(texts: dict, blocks: dict) -> list:
    """A diff for each marked block of ``texts`` (``{doc: markdown}``) that is not what its
    sample's commands print (``blocks``: ``{name: block}``)."""
    found = [
        difference(f"{doc}: {name}", shown, blocks.get(name, "(no such sample)"))
        for doc, text in texts.items()
        for name, shown in marked(text)
    ]
    return [diff for diff in found if diff]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite the marked blocks of {DOCS}")
    mode.add_argument("--check", action="store_true", help="exit 1 with diffs if a block differs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pileshuffle-samples-") as root:
        blocks = make_blocks(pathlib.Path(root))
    texts = {doc: (ROOT / doc).read_text() for doc in DOCS}  # read now: the runs took a while
    if args.write:
        for doc, text in texts.items():
            (ROOT / doc).write_text(rewritten(text, blocks))
        return 0
    problems = differences(texts, blocks)
    print("\n\n".join(problems) or "every sample is what its commands print")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
