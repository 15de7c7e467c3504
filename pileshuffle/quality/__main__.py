import sys

from pileshuffle.commands.quality import main

sys.exit(main())
