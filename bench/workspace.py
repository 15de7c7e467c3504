"""Where the bench keeps its files, what its rows run under (this interpreter, pileshuffle's CLI),
its units and its log.

Shared by every bench entry (run.py, loader.py, store.py); it imports nothing but the
standard library, so a row's own child process can import it for free.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(HERE, ".data")  # generated data sets, cached between runs (gitignored)
OUT = os.path.join(HERE, ".out")  # outputs, logs and results of the last runs (gitignored)
PY = sys.executable  # rows run under the interpreter the bench runs under (the venv's)
# the peers (DuckDB, Polars, Ray Data, Hugging Face datasets) run in their own venv, never pileshuffle's:
# `make peers` builds it from bench/peers-requirements.txt
PEERS_PY = os.path.join(HERE, ".peers-venv", "bin", "python")
GB = 1e9  # decimal units, as the tables print them
MB = 1e6


def log(message):
    """Progress goes to stderr, so stdout holds only the report."""
    print(message, file=sys.stderr, flush=True)


def pileshuffle_command():
    """argv prefix of pileshuffle's CLI: the venv's script beside PY, else ``PY -m pileshuffle.cli``."""
    script = os.path.join(os.path.dirname(PY), "pileshuffle")
    return [script] if os.path.exists(script) else [PY, "-m", "pileshuffle.cli"]
