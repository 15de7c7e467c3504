import sys

from pileshuffle.cli import main

sys.exit(main())
