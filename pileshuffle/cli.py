"""``pileshuffle run | plan | verify | generate | metadata``."""

import argparse
import json
import logging
import multiprocessing
import os
import sys

USAGE = """usage: pileshuffle COMMAND [options]

commands:
  run       shuffle: the template's pipeline (same options as python -m pileshuffle.pipeline)
  plan      show what a run would do (files, bytes, piles) without running it
  verify    re-read input and output and prove nothing was lost, duplicated or corrupted
  append    add new input files to a pile store (run --layout store) as a new generation
  expire    drop a pile store's oldest generations (--keep_generations N, --before TIME)
  gc        delete a pile store's files that no recent manifest version lists
  materialize  write a pile store's records as the shuffled shards `run` writes
  generate  write sample data whose records carry their index (for trying things out)
  metadata  print the Dataflow flex template's metadata.json

'pileshuffle COMMAND --help' shows a command's options."""


def plan_main(argv):
    from apache_beam.options.pipeline_options import PipelineOptions

    from pileshuffle.errors import PileshuffleError
    from pileshuffle.plan import make_plan

    try:
        plan = make_plan(PipelineOptions(argv))
    except PileshuffleError as error:
        print(f"pileshuffle: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps({
        "files": len(plan.sources),
        "input_bytes": plan.input_bytes,
        "num_piles": plan.num_piles,
        "reason": plan.num_piles_reason,
        "output": plan.output,
        "compression": plan.compression,
        "intermediate": plan.intermediate,
        "work_dir": plan.work_dir,
    }, indent=1))
    return 0


def generate_main(argv):
    from pileshuffle import sample

    parser = argparse.ArgumentParser(prog="pileshuffle generate")
    parser.add_argument("--format", choices=sorted(sample.WRITERS), default="tfrecord")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--record_bytes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = sample.WRITERS[args.format](args.output_dir, args.records, args.files, args.record_bytes, args.seed)
    print("\n".join(paths))
    return 0


def metadata_main(argv):
    from pileshuffle.options import template_metadata

    print(json.dumps(template_metadata(), indent=2))
    return 0


def verify_main(argv):
    from pileshuffle.verify import main as verify

    return verify(argv)


def run_main(argv):
    from pileshuffle.tuning import importing_without_gc, keep_freed_memory

    keep_freed_memory()  # before Beam's import starts threads
    with importing_without_gc():
        from pileshuffle.pipeline import main as run

    return run(argv)


def store_command(name):
    """A pile store command (``pileshuffle.store.commands``), started as ``run`` is."""

    def main(argv):
        from pileshuffle.tuning import importing_without_gc, keep_freed_memory

        keep_freed_memory()  # before Beam's import starts threads
        with importing_without_gc():
            from pileshuffle.store import commands
            import pileshuffle.pipeline  # noqa: F401  (what run imports; the commands use it)

        return getattr(commands, f"{name}_main")(argv)

    return main


COMMANDS = {"run": run_main, "plan": plan_main, "verify": verify_main, "generate": generate_main, "metadata": metadata_main,
            "append": store_command("append"), "expire": store_command("expire"), "gc": store_command("gc"),
            "materialize": store_command("materialize")}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


def entry():
    """The ``pileshuffle`` command: ``main``, then, when it returned and started no child
    process that is still alive, exit without tearing the interpreter down. Every output
    is closed and renamed by then; the teardown (freeing Beam's and Arrow's objects one by
    one, joining their thread pools) took 0.4 s of a 6 s run. An exception exits normally."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocessing.active_children():
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    entry()
