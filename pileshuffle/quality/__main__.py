import sys

from pileshuffle.quality import main

sys.exit(main())
