"""Flex template entry point (``FLEX_TEMPLATE_PYTHON_PY_FILE`` in templates/Dockerfile).

The Dataflow launcher runs ``python main.py --name=value ...`` with the template's
parameters plus Beam's own options (``--runner=DataflowRunner``, ``--project``,
``--temp_location``, ...). This is ``python -m pileshuffle.pipeline``: plan, submit the
job and return without waiting for it (the launcher must not block on the job).
"""

import sys

from pileshuffle.pipeline import main

if __name__ == "__main__":
    sys.exit(main())
