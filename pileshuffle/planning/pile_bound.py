"""How many piles a run may have on this machine, Beam-free so that the command line refuses
too many before it imports Beam (under 0.1 s, where Beam's import alone took 1.2-2.9 s here).

Each pile costs about ``PILE_BOOKKEEPING_BYTES`` of memory beside its records (a shard to write,
account for and list in the manifest; measured: 196 MB at 1,000 piles, 383 MB at 100,000), and
the bookkeeping of all of them must stay within half the memory this process may take
(``memory_limit``: a container's cgroup limit where there is one; 8 GiB where nothing can be
read). ``--num_piles 1000000000`` once took the whole machine.
"""

import re

from pileshuffle.errors import UsageError
from pileshuffle.io.memory_limit import available_memory

__all__ = ["PILE_BOOKKEEPING_BYTES", "most_piles", "check_num_piles", "check_num_piles_argv"]

PILE_BOOKKEEPING_BYTES = 2048


def most_piles(memory=None) -> int:
    """The most piles whose bookkeeping fits in half of ``memory`` (``memory_limit.Memory``;
    default: what this process may take, a cgroup's headroom or the host's)."""
    memory = memory or available_memory()
    return (memory.available or 16 << 30) // 2 // PILE_BOOKKEEPING_BYTES


def check_num_piles(num_piles: int, auto=None):
    """Refuse (``UsageError``) more piles than ``most_piles``; ``auto()``: what ``--num_piles auto``
    chooses for the input, for the message (None: not known yet)."""
    memory = available_memory()
    most = most_piles(memory)
    if num_piles > most:
        chooses = (
            f"--num_piles auto chooses {auto():,} for this input"
            if auto
            else "--num_piles auto chooses a count that fits the input"
        )
        raise UsageError(
            f"--num_piles {num_piles:,}: each pile costs about {PILE_BOOKKEEPING_BYTES:,} bytes "
            f"of memory beside its records (a shard, accounted for and listed in the manifest), "
            f"{num_piles * PILE_BOOKKEEPING_BYTES / 1e9:,.1f} GB in all, more than half the "
            f"{2 * most * PILE_BOOKKEEPING_BYTES / 1e9:,.1f} GB available here: "
            f"at most {most:,} piles ({chooses}); memory: {memory.source}"
        )


def check_num_piles_argv(argv):
    """``check_num_piles`` of a whole-number ``--num_piles`` on a command line (the last one given;
    anything else is the full option check's, after Beam's import)."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--num_piles"]
    values += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--num_piles=")]
    for value in values[-1:]:
        if re.fullmatch(r"\s*\d+\s*", value):
            check_num_piles(int(value))
