"""`python -m pipeline.cli` runs the console script."""

import sys

from . import main

sys.exit(main())
