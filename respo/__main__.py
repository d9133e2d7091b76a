"""`python -m respo ...` runs the command line (see respo.cli)."""

import sys

from respo.cli import main

sys.exit(main())
