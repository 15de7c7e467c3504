from pileshuffle.cli import entry

entry()
